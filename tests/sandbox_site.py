"""A PYTHONPATH directory that uid 65534 can read, for the tests that grade as an ordinary user (`setpriv`): a
checkout under /root (0700) cannot be read by it, nor can the venv's packages be where it lives there.

It holds rlvr's sources (without the shipped data), pyseccomp, and the packages a sandbox gets
(`rlvr.sandbox.launch.PACKAGES`): pytest and its dependencies copied (pure Python, ~15 MB), numpy linked (~70
MB; where uid 65534 cannot reach the link's target, that grader has no numpy, as any runtime without it).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import rlvr.sandbox as sandbox_module
from rlvr.sandbox import launch

LINKED = ("numpy", "numpy.libs")


def readable_site(dest: Path, extra: tuple[Path, ...] = ()) -> Path:
    """`dest`, made once, with everything world-readable; `extra` files copied beside."""
    if not (dest / "rlvr").is_dir():
        import pyseccomp

        shutil.copytree(Path(sandbox_module.__file__).parent.parent, dest / "rlvr",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "data", "prompts"))
        shutil.copy(pyseccomp.__file__, dest)
        for name, path in launch.packages():
            target = dest / name
            if name in LINKED:
                os.symlink(path, target)
            elif os.path.isdir(path):  # with its .pyc: the same magic number on every 3.11, so a sandbox compiles none
                shutil.copytree(path, target)
            else:
                shutil.copy(path, target)
    for path in extra:
        shutil.copy(path, dest)
    for root, dirs, files in os.walk(dest):  # links are not followed: their targets are not ours to change
        os.chmod(root, 0o755)
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                os.chmod(os.path.join(root, name), 0o644)
    return dest

"""`package.module:attr` and `path/to/file.py:attr`: how users hand rlvr their own code (an estimator, an
environment) without editing the library."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import re
import sys
from pathlib import Path


def file_module_name(path: str | Path, field: str) -> str:
    """The module name a user's file is imported under: the same in every process for one file (a hash of its
    resolved path, not Python's per-process `hash`), because rlvr.distributed ships the file to Ray actors
    under this name, and an object defined in it (a function, a class) then pickles by reference into any actor."""
    file = Path(path).expanduser().resolve()
    digest = hashlib.sha256(str(file).encode()).hexdigest()[:12]
    return f"rlvr_user_{field}_{re.sub(r'[^0-9A-Za-z_]', '_', file.stem)}_{digest}"


def import_target(path: str, field: str):
    """The attribute `path` names; a file is imported once per process. Errors name `field` (`algorithm`,
    `env`) and what is missing."""
    module_name, _, attr = path.rpartition(":")
    if module_name.endswith(".py") or "/" in module_name or "\\" in module_name:
        file = Path(module_name).expanduser().resolve()
        if not file.is_file():
            raise ValueError(f"{field}={path!r}: no such file {file}")
        key = file_module_name(file, field)
        module = sys.modules.get(key)
        if module is None:
            spec = importlib.util.spec_from_file_location(key, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[key] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[key]
                raise
    else:
        if "" not in sys.path and str(Path.cwd()) not in sys.path:  # `rlvr train` run from the user's project
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(module_name)
        except ImportError as err:
            raise ValueError(f"{field}={path!r}: cannot import {module_name!r} ({err})") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"{field}={path!r}: {module_name} has no attribute {attr!r}") from None

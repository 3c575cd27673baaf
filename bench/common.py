"""Helpers shared by the benchmarks in bench/: the machine, threads, memory, the GSM8K prompts, timing.

Imported by the scripts as `from common import ...` (bench/ is on sys.path when a script in it runs).
Nothing here imports torch at module level, so `--help` stays fast.
"""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # run from a checkout without installing


def cores() -> int:
    """CPU cores this process may run on (what torch threads are set to)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_threads(n: int) -> None:
    """The same intra-op thread count on every side of a comparison (set before heavy work)."""
    import torch

    torch.set_num_threads(n)


def machine() -> dict:
    """Model name, cores, memory, the CPU flags that matter for bf16 matmuls, and library versions."""
    info = {"cpu": platform.processor() or platform.machine(), "cores": cores(), "logical_cpus": os.cpu_count()}
    try:
        text = Path("/proc/cpuinfo").read_text()
        for line in text.splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
        info["flags"] = sorted(f for f in flags if f.startswith(("avx512_bf16", "amx", "avx512f", "avx2", "avx512_vnni")))
    except OSError:
        pass
    try:
        meminfo = Path("/proc/meminfo").read_text().split()
        info["memory_gb"] = round(int(meminfo[meminfo.index("MemTotal:") + 1]) / 2**20, 1)
    except (OSError, ValueError):
        pass
    try:
        load = os.getloadavg()
        info["load_avg_1min"] = round(load[0], 2)  # a benchmark on a busy machine is not trustworthy
    except OSError:
        pass
    import torch
    import transformers

    info["torch"] = torch.__version__
    info["transformers"] = transformers.__version__
    info["torch_threads"] = torch.get_num_threads()
    try:
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except AttributeError:
        pass
    return info


def _status_kb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    raise KeyError(field)


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM), MB."""
    try:
        return _status_kb("VmHWM") / 1024
    except (OSError, KeyError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident memory now (VmRSS), MB."""
    try:
        return _status_kb("VmRSS") / 1024
    except (OSError, KeyError):
        import psutil

        return psutil.Process().memory_info().rss / 2**20


def gsm8k_prompts(n: int, offset: int = 0, split: str = "test"):
    """(r1_zero prompt texts, ground-truth answers) of GSM8K questions offset..offset+n-1, plain (no chat)."""
    from rlvr.tasks.datasets import load_dataset
    from rlvr.tasks.prompts import get_prompt

    rows = load_dataset("gsm8k", split)[offset : offset + n]
    if len(rows) < n:
        raise SystemExit(f"GSM8K {split} has only {len(rows) + offset} questions; asked for {offset}+{n}")
    prompt = get_prompt("r1_zero")
    return [prompt.format(r.question) for r in rows], [r.answer for r in rows]


def median(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_child(argv: list[str], threads: int) -> int:
    """Run `python argv...` to completion with the thread count pinned in its environment too."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
    return subprocess.run([sys.executable, *argv], env=env).returncode

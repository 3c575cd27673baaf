"""A sandbox for model-written programs: each runs isolated by bubblewrap, its tests judged out of its reach.

    configure(isolation="bwrap")                     # checks the isolation works here, or raises SandboxUnavailable
    run_programs([Job(program, checks), ...], SandboxLimits()) -> [ProgramResult, ...]   (in parallel)

The threat model: the program is written by a policy that RL rewards for passing tests, so it is treated as
written by an attacker who wants a passing verdict, or to harm the machine, the run or its data.

`bwrap` (the default; `rlvr.sandbox.launch` lists exactly what bubblewrap is told, and why bubblewrap):
  Protected: the host's files (a read-only root of the Python runtime only: no home, project, venv, data
  set with its hidden tests, cache, run directory, /tmp, /run, /dev/shm), the network (an empty network
  namespace) and host sockets (no AF_UNIX), other processes (a PID namespace; no ptrace), the kernel's
  riskiest interfaces (seccomp), the run (the program cannot outlive its sandbox, the trainer never parses
  anything the program wrote) and the verdict (the tests run in the judge, a separate process, PID 1 of the
  sandbox, that calls the program's functions through a pipe: `rlvr.sandbox.harness`). No capabilities in
  any set, no_new_privs, as root (an unprivileged uid of the sandbox's own) and as an ordinary user (a user
  namespace with no further ones).
  Not protected: CPU time, memory and its tmpfs up to the limits below; side channels (timing, cache);
  kernel bugs reachable through the system calls seccomp allows; a program can read the Python standard
  library and the shared libraries, which are public.
`limits_only` (opt-in, `sandbox.isolation=limits_only`; logged as `grading/code_limits_only` with every grading
  metric): the same judge and program processes with resource limits, a wall-clock kill, a scrubbed environment
  and a temporary working directory, but none of the isolation: the program can read and write whatever the
  user running rlvr can, open network connections, signal or trace the judge (and so forge its verdicts) and
  the trainer. For trusted programs only (a data set's reference solutions, a machine with nothing to lose).

Where bubblewrap cannot set up the isolation (not installed, user namespaces disabled, a container without
the rights to make namespaces), `configure` and the first grading raise SandboxUnavailable naming what is
missing and how to get it: grading never silently falls back.

Budgets: each sandbox may use `processes` processes of `memory_mb` address space each, `cpu_seconds` of CPU,
a `2 x file_mb` tmpfs, `output_kb` of output and `timeout` seconds of wall time; at most `workers` sandboxes run
at once in the process, however many threads grade (default 2 per CPU this process may use: its affinity and
cgroup quota). So the pool as a whole holds at
most workers x processes x memory_mb of address space plus workers x 2 x file_mb of tmpfs (`budget()`).

May import: nothing else of rlvr (it sits beside rlvr.core, below everything that grades).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from rlvr.sandbox import launch
from rlvr.sandbox.launch import Unavailable as SandboxUnavailable
from rlvr.sandbox.processes import cleanup, data_fd, drain, killpg, read_results, take_uid, user_processes
from rlvr.sandbox.records import ISOLATIONS, RESULT_CAP, STATUSES, STDERR_CAP, Check, Job, ProgramResult, SandboxLimits

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------
# Settings: which isolation, how many at once. Set once by the command that grades (`configure`).


@dataclasses.dataclass(frozen=True)
class SandboxSettings:
    isolation: str = "bwrap"
    workers: int | None = None  # at most this many sandboxes at once (None: 2 per usable CPU)
    limits: SandboxLimits = SandboxLimits()


_settings = SandboxSettings()


def configure(isolation: str = "bwrap", workers: int | None = None, limits: SandboxLimits | None = None) -> SandboxSettings:
    """Set how programs are run from now on in this process, and check that it works here (raises
    SandboxUnavailable where bubblewrap cannot isolate them). `limits_only` is logged as a warning."""
    global _settings
    if isolation not in ISOLATIONS:
        raise ValueError(f"sandbox isolation must be one of {', '.join(ISOLATIONS)}; got {isolation!r}")
    if workers is not None and workers < 1:
        raise ValueError(f"sandbox workers must be >= 1; got {workers}")
    _settings = SandboxSettings(isolation, workers, limits or SandboxLimits())
    if isolation == "bwrap":
        require()
    else:
        log.warning("code sandbox: isolation=limits_only, as asked. Programs run with resource limits and a "
                    "timeout only: they can read and write what this user can, reach the network and forge "
                    "verdicts. Every grading metric logs grading/code_limits_only.")
    log.info("code sandbox: %s; %s", isolation, budget())
    return _settings


def settings() -> SandboxSettings:
    return _settings


def isolation() -> str:
    """The isolation programs run under now: "bwrap" or "limits_only"."""
    return _settings.isolation


def available_cpus() -> int:
    """CPUs this process may use: its affinity, further cut by a cgroup CPU quota (v2 cpu.max, v1 cfs_quota)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def _cgroup_quota() -> int | None:
    try:
        lines = open("/proc/self/cgroup").read().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        candidates = []
        if controllers == "":
            candidates.append((f"/sys/fs/cgroup{path}/cpu.max", None))
        elif "cpu" in controllers.split(","):
            for mount in ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct"):
                candidates.append((f"{mount}{path}/cpu.cfs_quota_us", f"{mount}{path}/cpu.cfs_period_us"))
        for quota_file, period_file in candidates:
            try:
                if period_file is None:
                    quota, period = open(quota_file).read().split()[:2]
                else:
                    quota, period = open(quota_file).read().strip(), open(period_file).read().strip()
            except (OSError, ValueError):
                continue
            if quota not in ("max", "-1") and int(period) > 0:
                return max(1, -(-int(quota) // int(period)))
    return None


def default_workers() -> int:
    # the programs are mostly process start-up; two per CPU keeps every CPU busy
    return _settings.workers or 2 * available_cpus()


def budget() -> str:
    limits, workers = _settings.limits, default_workers()
    return (f"at most {workers} sandboxes at once, each {limits.processes} processes x {limits.memory_mb} MB of "
            f"address space and a {2 * limits.file_mb} MB tmpfs (pool total <= "
            f"{workers * (limits.processes * limits.memory_mb + 2 * limits.file_mb) / 1024:.1f} GB)")


@lru_cache(maxsize=None)
def _probe(bwrap: str | None, root: bool) -> str | None:
    """None when a real sandbox starts here and looks, from inside, as `rlvr.sandbox.launch` says; else why not."""
    if bwrap is None:
        return launch.MISSING_BWRAP
    try:
        launch.seccomp_filter()
    except SandboxUnavailable as err:
        return str(err)
    result = run_program(Job(_PROBE, (Check("observe()"),)), SandboxLimits(timeout=20), mode="bwrap")
    if result.status != "ok" or result.values[0] is None:
        return launch.diagnose(result.stderr or result.error, root)
    from rlvr.sandbox.harness import decode

    seen = decode(result.values[0])
    wrong = [f"{key}={seen.get(key)!r} (want {want!r})" for key, want in _PROBE_WANTS.items() if seen.get(key) != want]
    if wrong:
        return "bubblewrap started, but the sandbox is weaker than required: " + ", ".join(wrong)
    return None


_PROBE = """
import ctypes, os
def observe():
    status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines())
    caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
    libc = ctypes.CDLL(None, use_errno=True)
    userns = libc.unshare(0x10000000) == 0
    try:
        open("/probe", "w")
        writable_root = True
    except OSError:
        writable_root = False
    interfaces = sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:])
    return {"capabilities": sum(caps.values()), "no_new_privs": int(status["NoNewPrivs"]),
            "seccomp": int(status["Seccomp"]), "new_user_namespace": userns, "writable_root": writable_root,
            "interfaces": interfaces, "home": os.path.exists("/home") or os.path.exists("/tmp")}
"""
_PROBE_WANTS = {"capabilities": 0, "no_new_privs": 1, "seccomp": 2, "new_user_namespace": False,
                "writable_root": False, "interfaces": ["lo"], "home": False}


def require() -> None:
    """Raise SandboxUnavailable unless bubblewrap isolates programs here as described (probed once)."""
    why = _probe(launch.bwrap_path(), os.geteuid() == 0)
    if why:
        raise SandboxUnavailable(f"the code sandbox cannot isolate programs on this machine: {why}. To grade "
                                 "anyway with resource limits only (no isolation: programs can read your files, "
                                 "reach the network and forge verdicts), pass sandbox=limits_only.")


# ----------------------------------------------------------------------------------------------------
# One program.


@lru_cache(maxsize=1)
def _harness_source() -> bytes:
    return launch.HARNESS.read_bytes()


def run_program(job: Job, limits: SandboxLimits | None = None, mode: str | None = None) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox; never raises for anything the program does."""
    limits = limits or _settings.limits
    mode = mode or _settings.isolation
    start = time.perf_counter()
    root = os.geteuid() == 0
    uid = take_uid() if root and mode == "bwrap" else None
    payload = {"program": job.program, "module": job.module, "deadline": limits.timeout,
               "checks": [dataclasses.asdict(c) for c in job.checks],
               "limits": {"cpu_seconds": int(max(1, limits.cpu_seconds)), "memory_mb": int(limits.memory_mb),
                          "file_mb": int(limits.file_mb), "processes": int(limits.processes)}}
    read_fd, write_fd = os.pipe()
    passed = [write_fd]
    work = None
    if mode == "bwrap":
        seccomp_fd, harness_fd = data_fd(launch.seccomp_filter()), data_fd(_harness_source())
        passed += [seccomp_fd, harness_fd]
        argv = launch.bwrap_argv(root, 2 * int(limits.file_mb), seccomp_fd, harness_fd)
        argv += [*launch.python_flags(), launch.INSIDE, str(write_fd), "bwrap", str(uid) if uid is not None else "-"]
        env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "/"
    else:
        work = tempfile.mkdtemp(prefix="rlvr-sandbox-")
        if not root:  # RLIMIT_NPROC counts every process of this user, not only the sandbox's
            payload["limits"]["processes"] += user_processes()
        binary, _ = launch.interpreter()
        argv = [binary, *launch.python_flags(), str(launch.HARNESS), str(write_fd), "limits", "-"]
        env = {"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
        cwd = work
    results: list[bytes] = []
    stderr: list[bytes] = []
    stdout: list[bytes] = []
    killed = None
    output_budget = [limits.output_kb * 1024]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=passed, env=env, cwd=cwd, start_new_session=True)
    except OSError as err:
        for fd in [read_fd, *passed]:
            os.close(fd)
        cleanup(work, uid)
        return ProgramResult("crashed", [None] * len(job.checks), [None] * len(job.checks),
                             time.perf_counter() - start, error=f"could not start: {err}")
    for fd in passed:
        os.close(fd)
    flood = threading.Event()

    def _kill():
        flood.set()
        killpg(proc.pid)

    readers = [threading.Thread(target=drain, args=(os.fdopen(read_fd, "rb"), RESULT_CAP, results), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, STDERR_CAP, stderr, output_budget, _kill),
                                daemon=True),
               threading.Thread(target=drain, args=(proc.stdout, 0, stdout, output_budget, _kill), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(json.dumps(payload).encode("utf-8"))
        proc.stdin.close()
    except OSError:  # the sandbox died before reading its job; its status says why
        pass
    deadline = time.monotonic() + limits.timeout
    try:  # the result pipe closes when the sandbox ends: wait on that (no polling), then for the process
        readers[0].join(timeout=limits.timeout)
        if readers[0].is_alive():
            killed = "timeout"
        else:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        killed = "timeout"
    finally:
        killpg(proc.pid)  # bubblewrap itself: the sandbox's PID 1 dies with it, and everything in it
        proc.wait()
        for reader in readers:
            reader.join(timeout=2)
        cleanup(work, uid)
    if flood.is_set():
        killed = "output_limit"
    return read_results(b"".join(results), b"".join(stderr), proc.returncode, killed, len(job.checks),
                        time.perf_counter() - start)


# ----------------------------------------------------------------------------------------------------
# Many programs.

_STATS_KEY = {"ok": "ok", "timeout": "timeouts", "crashed": "crashes", "memory": "memory_kills",
              "output_limit": "output_kills", "syntax_error": "syntax_errors", "load_error": "load_errors"}
_STATS = dict.fromkeys(("programs", *_STATS_KEY.values(), "limits_only"), 0)
_lock = threading.Lock()
_slots: tuple[int, threading.BoundedSemaphore] | None = None


def _slot() -> threading.BoundedSemaphore:
    """The process-wide bound on sandboxes at once (`default_workers()`), shared by every caller: the graders
    and environments' tools, which call run_programs from several threads side by side."""
    global _slots
    workers = default_workers()
    with _lock:
        if _slots is None or _slots[0] != workers:  # configure(workers=...) changed it
            _slots = (workers, threading.BoundedSemaphore(workers))
        return _slots[1]


def _bounded(slot: threading.BoundedSemaphore, job: Job, limits: SandboxLimits | None, mode: str) -> ProgramResult:
    with slot:
        return run_program(job, limits, mode)


def sandbox_stats() -> dict[str, int]:
    """Programs run in this process so far, by outcome, and how many ran under limits_only (cumulative;
    callers diff two readings)."""
    with _lock:
        return dict(_STATS)


def run_programs(jobs: list[Job], limits: SandboxLimits | None = None, workers: int | None = None) -> list[ProgramResult]:
    """Run every job in its own sandbox, `workers` at a time, and never more than `default_workers()` at once in
    this process, whoever calls; results in the order of `jobs`. Raises SandboxUnavailable (before running
    anything) where the configured isolation cannot be had."""
    if not jobs:
        return []
    mode = _settings.isolation
    if mode == "bwrap":
        require()
    slot = _slot()
    with ThreadPoolExecutor(max_workers=min(len(jobs), workers or default_workers())) as pool:
        results = list(pool.map(lambda job: _bounded(slot, job, limits, mode), jobs))
    with _lock:
        _STATS["programs"] += len(results)
        _STATS["limits_only"] += len(results) if mode == "limits_only" else 0
        for result in results:
            _STATS[_STATS_KEY[result.status]] += 1
    return results


__all__ = ["STATUSES", "ISOLATIONS", "SandboxLimits", "Check", "Job", "ProgramResult", "SandboxSettings",
           "SandboxUnavailable", "configure", "settings", "isolation", "require", "available_cpus",
           "default_workers", "budget", "run_program", "run_programs", "read_results", "sandbox_stats"]

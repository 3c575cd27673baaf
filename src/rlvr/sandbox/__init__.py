"""A sandbox for model-written programs: each runs isolated by bubblewrap, its tests judged out of its reach.

    configure(isolation="bwrap")                     # checks the isolation works here, or raises SandboxUnavailable
    run_programs([Job(program, checks), ...], SandboxLimits()) -> [ProgramResult, ...]   (in parallel)

The threat model: the program is written by a policy that RL rewards for passing tests, so it is treated as
written by an attacker who wants a passing verdict, or to harm the machine, the run, its data, or the grading
of other programs.

`bwrap` (the default; `rlvr.sandbox.launch` lists exactly what bubblewrap is told, and why bubblewrap):
  Protected: the host's files (a read-only root of the Python runtime only, and the packages a sandbox gets:
  no home, project, venv, data set with its hidden tests, cache, run directory, /tmp, /run, the host's
  /dev/shm), the network (an empty network namespace, no socket but a connected unix pair), other processes
  (a PID namespace; no ptrace), the kernel's riskiest interfaces (seccomp), the grader's shared resources (no
  AIO, no inotify, pipes and the job handed over in memfds, uids unique across containers), the run (the
  program cannot outlive its sandbox, the trainer never parses anything the program wrote) and the verdict
  (the tests run in the judge, a separate process, PID 1 of the sandbox, with the runner they were written
  for, calling the program's functions through a pipe: `rlvr.sandbox.inside`). No capabilities in any set,
  no_new_privs, as root (an unprivileged uid of the sandbox's own) and as an ordinary user (a user namespace
  with no further ones).
  Not protected: CPU time, memory and its tmpfs up to the limits below; side channels (timing, cache);
  kernel bugs reachable through the system calls seccomp allows; a program can read the Python standard
  library, the shared libraries and the packages it gets, which are public.
`limits_only` (opt-in, `sandbox.isolation=limits_only`; logged as `grading/code_limits_only` with every grading
  metric): the same judge and program processes with resource limits, a wall-clock kill, a scrubbed environment
  and a temporary working directory, but none of the isolation: the program can read and write whatever the
  user running rlvr can, open network connections, signal or trace the judge (and so forge its verdicts) and
  the trainer. For trusted programs only (a data set's reference solutions, a machine with nothing to lose).

Where bubblewrap cannot set up the isolation (not installed, user namespaces disabled, a container without
the rights to make namespaces), `configure` and the first grading raise SandboxUnavailable naming what is
missing and how to get it: grading never silently falls back. Where the machinery fails later (a cgroup that
cannot be made or read), grading raises SandboxError with the reason, never a silent 0.

Budgets: each sandbox may hold `processes` processes of `memory_mb` address space each (the judge 256 MB more)
and `threads` more tasks, a `2 x file_mb` tmpfs and a `file_mb` /dev/shm holding at most one file per KB of their
size, `output_kb` of output, `cpu_seconds` of CPU time for the program (all its processes together; a child
that setsid()s too; the judge has a budget of its own), `wait_seconds` of time spent neither running nor
runnable, and a wall clock that counts only time the machine did not starve it: past any of them the verdict is
`timeout`, whatever runs beside it. At most `workers` sandboxes run at once in the process, however many
threads grade (default 2 per CPU this process may use: its affinity and cgroup quota). So the pool as a whole
holds at most workers x (processes x memory_mb + 256 MB + 3 x file_mb) where cgroups are in force (`budget()`).
Memory that no address space counts is refused everywhere by the seccomp filter (SysV shared memory, message
queues and semaphores, POSIX message queues, memfd, sockets but unix pairs at their default buffers, POSIX
timers, pipes past 64 KB; and setsid(), so that a sandbox stays one session), and then:
* where rlvr may make cgroups (root, with the v1 memory, pids, cpu and cpuacct controllers, or cgroup v2), each
  sandbox runs in its own (`rlvr.sandbox.cgroups`): a memory limit of its budget that counts shared memory,
  tmpfs, pipes and kernel memory too, pids.max, one CPU share, and the group's CPU clock;
* elsewhere (an ordinary user, a read-only /sys/fs/cgroup), a weaker mode, logged as a warning and counted as
  `grading/code_no_cgroups` with every grading metric: RLIMIT_AS per process, `processes + threads` of them;
  processes by RLIMIT_NPROC of the sandbox's own uid or user namespace; one CPU share as one session
  (autogroup, where the kernel has it on); the CPU clock summed from /proc over the judge's descendants, which
  loses the last moments of a child the kernel reaps for a parent that ignores SIGCHLD.
`bounds()` says which holds; `configure` logs it once per run. Sandbox uids are unique on the host, across
containers too (`rlvr.sandbox.uids`). On a timeout the judge is killed by its pidfd and reaped by bubblewrap;
a uid returns to the pool only once its processes are gone (`rlvr.sandbox.running`). Every entry that runs a
program (`run_program` too) checks the isolation first.

May import: nothing else of rlvr (it sits beside rlvr.core, below everything that grades).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from rlvr.sandbox import cgroups, launch, running
from rlvr.sandbox.inside import codec, wire
from rlvr.sandbox.launch import Unavailable as SandboxUnavailable
from rlvr.sandbox.records import (
    ISOLATIONS,
    JUDGE_EXTRA_MB,
    RUNNERS,
    STATUSES,
    Check,
    Job,
    ProgramResult,
    SandboxLimits,
    sandbox_memory_mb,
)
from rlvr.sandbox.results import read_results
from rlvr.sandbox.running import SandboxError

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
    log.info("code sandbox: %s; %s; bounded by %s", isolation, budget(), bounds())
    if isolation == "bwrap" and not cgroups.in_force():
        log.warning("code sandbox: no cgroups here, a weaker mode (%s); every grading metric counts these "
                    "programs as grading/code_no_cgroups", bounds())
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
            f"address space (the judge {JUDGE_EXTRA_MB} MB more; {limits.threads} more tasks as threads), a "
            f"{2 * limits.file_mb} MB tmpfs and a {limits.file_mb} MB /dev/shm (pool total "
            f"<= {workers * sandbox_memory_mb(limits) / 1024:.1f} GB), {limits.cpu_seconds:g} s of CPU each (all "
            f"its processes together; {limits.waits():g} s of waiting; a wall-clock cap of {limits.timeout:g} s "
            "while not starved)")


def bounds() -> str:
    """What bounds a sandbox's memory, processes and CPU on this machine (cgroups, or the fallback)."""
    return cgroups.bounds()


@lru_cache(maxsize=None)
def _probe(bwrap: str | None, root: bool) -> str | None:
    """None when a real sandbox starts here and looks, from inside, as `rlvr.sandbox.launch` says; else why not."""
    if bwrap is None:
        return launch.MISSING_BWRAP
    try:
        launch.seccomp_filter()
    except SandboxUnavailable as err:
        return str(err)
    try:
        result = running.run(Job(_PROBE, (Check("observe()", "value"),)), SandboxLimits(timeout=20), "bwrap")
    except SandboxError as err:
        return str(err)
    if result.status != "ok" or result.values[0] is None:
        return launch.diagnose(result.stderr or result.error, root)
    seen = read_value(result.values[0])
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
    calls = {"shmget": lambda: libc.shmget(0, 4096, 0o1600), "msgget": lambda: libc.msgget(0, 0o1600),
             "semget": lambda: libc.semget(0, 1, 0o1600), "memfd_create": lambda: os.memfd_create("probe"),
             "mq_open": lambda: libc.mq_open(b"/probe", 0o102, 0o600, None), "setsid": os.setsid,
             "socket": lambda: __import__("socket").socket(),
             "inotify_init1": lambda: libc.inotify_init1(0),
             "io_setup": lambda: libc.syscall(206, 8, ctypes.byref(ctypes.c_ulong(0)))}
    allowed = []
    for name, call in calls.items():
        try:
            allowed += [name] if call() != -1 else []
        except (OSError, AttributeError):
            pass
    return {"capabilities": sum(caps.values()), "no_new_privs": int(status["NoNewPrivs"]),
            "seccomp": int(status["Seccomp"]), "new_user_namespace": userns, "writable_root": writable_root,
            "interfaces": interfaces, "home": os.path.exists("/home") or os.path.exists("/tmp"),
            "memory_outside_limits": allowed, "ptys": os.path.exists("/dev/ptmx") or os.path.exists("/dev/pts")}
"""
_PROBE_WANTS = {"capabilities": 0, "no_new_privs": 1, "seccomp": 2, "new_user_namespace": False,
                "writable_root": False, "interfaces": ["lo"], "home": False, "memory_outside_limits": [],
                "ptys": False}


def read_value(text: str):
    """The data a "value" check sent back (`ProgramResult.values`), built here: bounded, data only (a handle to a
    program object is refused). Raises ValueError for anything else."""
    import json

    try:
        return codec.Codec("h", None).decode(json.loads(text), wire.Memo())
    except (wire.Malformed, ValueError, TypeError, RecursionError) as err:
        raise ValueError(f"not a value: {err}") from None


def require() -> None:
    """Raise SandboxUnavailable unless bubblewrap isolates programs here as described (probed once)."""
    why = _probe(launch.bwrap_path(), os.geteuid() == 0)
    if why:
        raise SandboxUnavailable(f"the code sandbox cannot isolate programs on this machine: {why}. To grade "
                                 "anyway with resource limits only (no isolation: programs can read your files, "
                                 "reach the network and forge verdicts), pass sandbox=limits_only.")


# ----------------------------------------------------------------------------------------------------
# One program.


def run_program(job: Job, limits: SandboxLimits | None = None, mode: str | None = None,
                checks: int | None = None) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox; never raises for anything the program does. Raises
    SandboxUnavailable, before running anything, where `bwrap` cannot isolate programs here (probed once), and
    SandboxError where the sandbox's machinery fails. `checks`: how many checks to expect where the runner
    counts them itself (pytest's items), in case the sandbox ends before it does."""
    mode = mode or _settings.isolation
    if mode not in ISOLATIONS:
        raise ValueError(f"sandbox isolation must be one of {', '.join(ISOLATIONS)}; got {mode!r}")
    if job.runner not in RUNNERS:
        raise ValueError(f"sandbox runner must be one of {', '.join(RUNNERS)}; got {job.runner!r}")
    if mode == "bwrap":
        require()
    return running.run(job, limits or _settings.limits, mode, checks)


# ----------------------------------------------------------------------------------------------------
# Many programs.

_STATS_KEY = {"ok": "ok", "timeout": "timeouts", "crashed": "crashes", "memory": "memory_kills",
              "output_limit": "output_kills", "syntax_error": "syntax_errors", "load_error": "load_errors"}
# limits_only: programs run without isolation; no_cgroups: isolated, in the weaker mode without cgroups;
# uncrossable: programs a value of whose could not cross between the judge and the program (named in the
# verdict's reason); judge_errors: the judge's own failures
_STATS = dict.fromkeys(("programs", *_STATS_KEY.values(), "limits_only", "no_cgroups", "uncrossable",
                        "judge_errors"), 0)
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


def _bounded(slot: threading.BoundedSemaphore, job: Job, limits: SandboxLimits | None, mode: str,
             checks: int | None) -> ProgramResult:
    with slot:
        return run_program(job, limits, mode, checks)


def sandbox_stats() -> dict[str, int]:
    """Programs run in this process so far, by outcome, and how many ran under limits_only (cumulative;
    callers diff two readings)."""
    with _lock:
        return dict(_STATS)


def run_programs(jobs: list[Job], limits: SandboxLimits | None = None, workers: int | None = None,
                 checks: list[int] | None = None) -> list[ProgramResult]:
    """Run every job in its own sandbox, `workers` at a time, and never more than `default_workers()` at once in
    this process, whoever calls; results in the order of `jobs`. Raises SandboxUnavailable (before running
    anything) where the configured isolation cannot be had, SandboxError where its machinery fails."""
    if not jobs:
        return []
    mode = _settings.isolation
    if mode == "bwrap":
        require()
    slot = _slot()
    counts = checks or [None] * len(jobs)
    with ThreadPoolExecutor(max_workers=min(len(jobs), workers or default_workers())) as pool:
        results = list(pool.map(lambda pair: _bounded(slot, pair[0], limits, mode, pair[1]), zip(jobs, counts)))
    weaker = mode == "bwrap" and not cgroups.in_force()
    with _lock:
        _STATS["programs"] += len(results)
        _STATS["limits_only"] += len(results) if mode == "limits_only" else 0
        _STATS["no_cgroups"] += len(results) if weaker else 0
        for result in results:
            _STATS[_STATS_KEY[result.status]] += 1
            _STATS["uncrossable"] += bool(result.uncrossable)
            _STATS["judge_errors"] += bool(result.judge_error)
    for result in results:
        if result.judge_error:
            log.warning("code sandbox: the judge failed (%s); the program scores 0", result.judge_error)
    return results


__all__ = ["STATUSES", "ISOLATIONS", "RUNNERS", "SandboxLimits", "Check", "Job", "ProgramResult", "SandboxSettings",
           "SandboxUnavailable", "SandboxError", "configure", "settings", "isolation", "require", "available_cpus",
           "default_workers", "budget", "bounds", "run_program", "run_programs", "read_results", "read_value",
           "sandbox_stats"]

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
at once (default 2 per CPU this process may use: its affinity and cgroup quota). So the pool as a whole holds at
most workers x processes x memory_mb of address space plus workers x 2 x file_mb of tmpfs (`budget()`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import subprocess
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

from rlvr.sandbox import launch
from rlvr.sandbox.launch import Unavailable as SandboxUnavailable

log = logging.getLogger(__name__)

STATUSES = ("ok", "syntax_error", "load_error", "timeout", "memory", "output_limit", "crashed")
ISOLATIONS = ("bwrap", "limits_only")
_RESULT_CAP = 4 << 20  # bytes of the judge's records read from one sandbox
_STDERR_CAP = 4096  # bytes of stderr kept (the rest is drained and dropped)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. `timeout` is wall-clock seconds for the whole program and its checks;
    `processes` counts the judge and the program's own process too."""

    timeout: float = 5.0
    cpu_seconds: int = 4
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 8
    output_kb: int = 1024  # stdout + stderr; past this the program is killed

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"SandboxLimits.{field.name} must be > 0; got {value!r}")


@dataclasses.dataclass(frozen=True)
class Check:
    """One test, as the judge runs it: `expr` is evaluated in the test namespace (the program's names bound as
    handles) after `setup` runs there. kind "value": the value is sent back (compared by the caller, outside);
    kind "true": its truth value is."""

    expr: str
    kind: str = "value"
    setup: str = ""


@dataclasses.dataclass(frozen=True)
class Job:
    program: str
    checks: tuple[Check, ...]
    module: str = "solution"  # the program is importable under this name from the test code


@dataclasses.dataclass
class ProgramResult:
    status: str  # one of STATUSES
    values: list[str | None]  # per check: the value's text (None: raised, unserializable or never reached)
    errors: list[str | None]  # per check: the exception's type name, or None
    seconds: float
    stderr: str = ""
    error: str = ""  # what stopped the program: exception name on load, timeout, signal


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


def _drain(stream, cap: int, sink: list[bytes], budget: list[int] | None = None, on_exceeded=None):
    """Read a pipe to its end, keeping the first `cap` bytes; with `budget` (shared by stdout and stderr),
    call `on_exceeded` once the program has written more than it allows."""
    kept = 0
    while True:
        try:
            chunk = stream.read(65536)
        except (OSError, ValueError):
            break
        if not chunk:
            break
        if kept < cap:
            sink.append(chunk[: cap - kept])
            kept += len(sink[-1])
        if budget is not None:
            budget[0] -= len(chunk)
            if budget[0] < 0 and on_exceeded is not None:
                on_exceeded()
                on_exceeded = None


def _data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (small: it fits in the pipe's buffer), for bubblewrap to read."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)
    finally:
        os.close(write_fd)
    return read_fd


@lru_cache(maxsize=1)
def _harness_source() -> bytes:
    return launch.HARNESS.read_bytes()


def run_program(job: Job, limits: SandboxLimits | None = None, mode: str | None = None) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox; never raises for anything the program does."""
    limits = limits or _settings.limits
    mode = mode or _settings.isolation
    start = time.perf_counter()
    root = os.geteuid() == 0
    uid = _take_uid() if root and mode == "bwrap" else None
    payload = {"program": job.program, "module": job.module, "deadline": limits.timeout,
               "checks": [dataclasses.asdict(c) for c in job.checks],
               "limits": {"cpu_seconds": int(max(1, limits.cpu_seconds)), "memory_mb": int(limits.memory_mb),
                          "file_mb": int(limits.file_mb), "processes": int(limits.processes)}}
    read_fd, write_fd = os.pipe()
    passed = [write_fd]
    work = None
    if mode == "bwrap":
        seccomp_fd, harness_fd = _data_fd(launch.seccomp_filter()), _data_fd(_harness_source())
        passed += [seccomp_fd, harness_fd]
        argv = launch.bwrap_argv(root, 2 * int(limits.file_mb), seccomp_fd, harness_fd)
        argv += [*launch.python_flags(), launch.INSIDE, str(write_fd), "bwrap", str(uid) if uid is not None else "-"]
        env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "/"
    else:
        work = tempfile.mkdtemp(prefix="rlvr-sandbox-")
        if not root:  # RLIMIT_NPROC counts every process of this user, not only the sandbox's
            payload["limits"]["processes"] += _user_processes()
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
        _cleanup(work, uid)
        return ProgramResult("crashed", [None] * len(job.checks), [None] * len(job.checks),
                             time.perf_counter() - start, error=f"could not start: {err}")
    for fd in passed:
        os.close(fd)
    flood = threading.Event()

    def _kill():
        flood.set()
        _killpg(proc.pid)

    readers = [threading.Thread(target=_drain, args=(os.fdopen(read_fd, "rb"), _RESULT_CAP, results), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, _STDERR_CAP, stderr, output_budget, _kill),
                                daemon=True),
               threading.Thread(target=_drain, args=(proc.stdout, 0, stdout, output_budget, _kill), daemon=True)]
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
        _killpg(proc.pid)  # bubblewrap itself: the sandbox's PID 1 dies with it, and everything in it
        proc.wait()
        for reader in readers:
            reader.join(timeout=2)
        _cleanup(work, uid)
    if flood.is_set():
        killed = "output_limit"
    return read_results(b"".join(results), b"".join(stderr), proc.returncode, killed, len(job.checks),
                        time.perf_counter() - start)


def _cleanup(work: str | None, uid: int | None):
    if work is not None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if uid is not None:
        _give_uid(uid)


# Started as root, each sandbox running at the same time gets a uid of its own (no passwd entry needed):
# RLIMIT_NPROC counts per uid, so a fork bomb exhausts only its own sandbox, and it owns no file of the host.
_UID_BASE = 2_100_000_000
_free_uids: list[int] = []
_next_uid = [_UID_BASE]
_uid_lock = threading.Lock()


def _take_uid() -> int:
    with _uid_lock:
        if _free_uids:
            return _free_uids.pop()
        _next_uid[0] += 1
        return _next_uid[0] - 1


def _give_uid(uid: int):
    with _uid_lock:
        _free_uids.append(uid)


def _user_processes() -> int:
    """Processes and threads of this (non-root) user, which RLIMIT_NPROC counts (limits_only mode)."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


def _killpg(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def read_results(raw: bytes, stderr_raw: bytes, returncode: int, killed: str | None, n: int, seconds: float
                 ) -> ProgramResult:
    """The judge's records, read so that no bytes whatever can raise here: a line that is not a record of the
    expected shape is skipped, and what is missing makes the status `crashed`."""
    values: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    load = error = exit_record = broken = None
    done = False
    for line in raw[:_RESULT_CAP].split(b"\n"):
        if len(line) > 2 * 1_000_000 + 100:  # longer than any record of one value
            continue
        try:
            record = json.loads(line.decode("utf-8", "replace"))
        except Exception:  # ValueError, RecursionError (a deeply nested line), MemoryError
            continue
        if not isinstance(record, dict):
            continue
        if "load" in record and load is None and isinstance(record["load"], str):
            load, error = record["load"], str(record.get("error", ""))[:200]
        elif type(record.get("check")) is int and 0 <= record["check"] < n:
            i = record["check"]
            if values[i] is None and errors[i] is None:
                value, err = record.get("value"), record.get("error")
                values[i] = value if isinstance(value, str) else None
                errors[i] = str(err)[:200] if err is not None else (None if values[i] is not None else "malformed")
        elif record.get("done") is True:
            done = True
        elif "exit" in record and type(record["exit"]) is int and exit_record is None:
            exit_record = record
        elif isinstance(record.get("broken"), str):
            broken = record["broken"][:200]
    stderr = stderr_raw.decode("utf-8", "replace")
    if load == "syntax_error":
        status = "syntax_error"
    elif "MemoryError" in (error or "") or "MemoryError" in errors:
        status = "memory"
    elif load == "error":
        status = "load_error"
    elif killed == "output_limit":
        status, error = "output_limit", "wrote more output than allowed"
    elif killed == "timeout":
        status, error = "timeout", "timeout"
    elif broken is not None:
        status, error = "crashed", f"the program broke the judge's protocol ({broken}) and was stopped"
    elif exit_record is not None and exit_record.get("signaled") is True and exit_record["exit"] in (
            signal.SIGXCPU, signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
        status, error = "timeout", "cpu time limit"
    elif done and load == "ok" and exit_record is None:
        status, error = "ok", ""
    else:
        status = "crashed"
        if exit_record is not None:
            how = "signal" if exit_record.get("signaled") is True else "exit status"
            error = f"the program's process ended ({how} {exit_record['exit']})"
        elif load is None:
            error = f"the sandbox did not start (exit {returncode})"
        error = error or f"exit status {returncode}"
    return ProgramResult(status, values, errors, seconds, stderr=stderr[-_STDERR_CAP:], error=error or "")


# ----------------------------------------------------------------------------------------------------
# Many programs.

_STATS_KEY = {"ok": "ok", "timeout": "timeouts", "crashed": "crashes", "memory": "memory_kills",
              "output_limit": "output_kills", "syntax_error": "syntax_errors", "load_error": "load_errors"}
_STATS = dict.fromkeys(("programs", *_STATS_KEY.values(), "limits_only"), 0)
_lock = threading.Lock()


def sandbox_stats() -> dict[str, int]:
    """Programs run in this process so far, by outcome, and how many ran under limits_only (cumulative;
    callers diff two readings)."""
    with _lock:
        return dict(_STATS)


def run_programs(jobs: list[Job], limits: SandboxLimits | None = None, workers: int | None = None) -> list[ProgramResult]:
    """Run every job in its own sandbox, `workers` at a time; results in the order of `jobs`. Raises
    SandboxUnavailable (before running anything) where the configured isolation cannot be had."""
    if not jobs:
        return []
    mode = _settings.isolation
    if mode == "bwrap":
        require()
    with ThreadPoolExecutor(max_workers=min(len(jobs), workers or default_workers())) as pool:
        results = list(pool.map(lambda job: run_program(job, limits, mode), jobs))
    with _lock:
        _STATS["programs"] += len(results)
        _STATS["limits_only"] += len(results) if mode == "limits_only" else 0
        for result in results:
            _STATS[_STATS_KEY[result.status]] += 1
    return results


__all__ = ["STATUSES", "ISOLATIONS", "SandboxLimits", "Check", "Job", "ProgramResult", "SandboxSettings",
           "SandboxUnavailable", "configure", "settings", "isolation", "require", "available_cpus",
           "default_workers", "budget", "run_program", "run_programs", "read_results", "sandbox_stats"]

"""A sandbox for model-written programs: each runs in its own process, locked in before its first line.

    run_programs([Job(program, checks), ...], SandboxLimits()) -> [ProgramResult, ...]   (in parallel)

What protects the machine, the run and its data (the threat model; README "Code RL" has the user's view):

* **Namespaces** (`isolation() == "namespaces"`, Linux with `unshare` from util-linux, as root or with
  unprivileged user namespaces): a new network namespace (no interfaces but a downed loopback: no
  connection leaves), PID namespace (the program sees and can signal only its own processes; when the
  sandbox's first process ends, the kernel kills every process left in it), mount, IPC and UTS
  namespaces. Inside, every mount is read-only, nosuid and nodev; the working directory is a fresh
  size-limited tmpfs; /root and /home are hidden under empty tmpfs (the Python installation is bound back
  read-only); /proc shows only the sandbox. Started as root, the program runs under a uid of its own (one per sandbox running); started as
  another user, as that user with no capabilities (bounding set emptied, no_new_privs).
* **Limits** (always): CPU seconds, address space, file size, process count, open files, no core dumps
  (`resource`), a wall-clock timeout after which the whole process group is SIGKILLed, an environment
  holding only PATH/HOME/LANG (no inherited secrets), stdin closed, stdout and stderr read by the parent
  and the program killed past `output_kb`.
* **Verdicts out of reach**: the child reports the values the test expressions evaluate to (exact
  built-in types only) and the parent compares them with expected values that never enter the sandbox;
  exiting, raising SystemExit, patching `assert`, `==` or the harness, or writing to the result pipe pass
  nothing (`rlvr.code_rewards`).

Not protected: without namespaces (`isolation() == "limits"`, e.g. macOS, or a kernel without user
namespaces) a program can read and write what the user running rlvr can and can open network
connections; a warning says so once. Even with them, the program can read world-readable files (a
dataset's tests on disk could be looked up by a program that knows where they are), use its CPU and
memory allowance, and side channels are out of scope. Stronger isolation (gVisor, a VM, a remote sandbox
service) fits behind the same `run_programs` call.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

CHILD = Path(__file__).with_name("sandbox_child.py")
STATUSES = ("ok", "syntax_error", "load_error", "timeout", "memory", "output_limit", "crashed")
_RESULT_CAP = 4 << 20  # bytes of results read from one program
_STDERR_CAP = 4096  # bytes of stderr kept (the rest is drained and dropped)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """What one program may use. `timeout` is wall-clock seconds for the whole program and its checks."""

    timeout: float = 5.0
    cpu_seconds: int = 4
    memory_mb: int = 512
    file_mb: int = 16
    processes: int = 32
    output_kb: int = 1024  # stdout + stderr; past this the program is killed

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"SandboxLimits.{field.name} must be > 0; got {value!r}")


@dataclasses.dataclass(frozen=True)
class Check:
    """One test, as the sandbox sees it: `expr` is evaluated in the program's namespace after `setup` runs
    there. kind "value": the result is sent back (compared outside); kind "true": it must be True itself."""

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
    values: list[str | None]  # per check: repr of the value (None: raised, unserializable or never reached)
    errors: list[str | None]  # per check: the exception's type name, or None
    seconds: float
    stderr: str = ""
    error: str = ""  # what stopped the program: exception name on load, timeout, signal


# ----------------------------------------------------------------------------------------------------
# Isolation: what this machine allows, found out once.


def _prefix(root: bool) -> list[str]:
    flags = ["--net", "--pid", "--mount", "--ipc", "--uts", "--fork", "--kill-child"]
    return ["unshare", *flags] if root else ["unshare", "--user", "--map-root-user", *flags]


@lru_cache(maxsize=None)
def isolation() -> str:
    """"namespaces" when programs can be run in their own namespaces here, else "limits" (see the module
    docstring for what each protects); the reason for "limits" is logged once as a warning."""
    if os.environ.get("RLVR_SANDBOX") == "limits":
        return "limits"
    if sys.platform != "linux" or shutil.which("unshare") is None:
        reason = "not Linux" if sys.platform != "linux" else "no `unshare` command (util-linux)"
    else:
        probe = run_program(Job("import socket\nx = 1", (Check("x"),)), SandboxLimits(timeout=10), mode="namespaces")
        if probe.status == "ok" and probe.values == ["1"]:
            return "namespaces"
        reason = f"a probe program failed to start in new namespaces ({probe.status}: {probe.error or probe.stderr[-300:]})"
    log.warning("code sandbox without namespaces (%s): programs run with resource limits and a timeout only, "
                "and can read/write what this user can and open network connections", reason)
    return "limits"


def _user_processes() -> int:
    """Processes and threads of this (non-root) user: RLIMIT_NPROC counts them all, so the sandbox's limit
    is on top of them."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                pass
    return count


# ----------------------------------------------------------------------------------------------------
# One program.


def _drain(stream, cap: int, sink: list[bytes], budget: list[int] | None = None, on_exceeded=None):
    """Read a pipe to its end, keeping the first `cap` bytes; with `budget` (shared by stdout and stderr),
    call `on_exceeded` once the program has written more than it allows."""
    kept = 0
    while True:
        chunk = stream.read(65536)
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


def run_program(job: Job, limits: SandboxLimits = SandboxLimits(), mode: str | None = None) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox; never raises for anything the program does."""
    mode = mode or isolation()
    start = time.perf_counter()
    work = tempfile.mkdtemp(prefix="rlvr-sandbox-")
    root = os.geteuid() == 0
    uid = _take_uid()
    payload = {"program": job.program, "module": job.module, "work": work, "uid": uid,
               "checks": [dataclasses.asdict(c) for c in job.checks],
               "limits": {"cpu_seconds": int(max(1, limits.cpu_seconds)), "memory_mb": int(limits.memory_mb),
                          "file_mb": int(limits.file_mb), "processes": int(limits.processes),
                          "uid": uid, "user_processes": 0 if root else _user_processes()}}
    read_fd, write_fd = os.pipe()
    argv = [os.path.realpath(sys.executable), "-S", "-I", "-B", str(CHILD), str(write_fd),
            "isolated" if mode == "namespaces" else "plain"]
    if mode == "namespaces":
        argv = _prefix(root) + argv
    env = {"PATH": "/usr/bin:/bin", "HOME": work, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    results: list[bytes] = []
    stderr: list[bytes] = []
    stdout: list[bytes] = []
    killed = None
    budget = [limits.output_kb * 1024]
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(write_fd,), env=env, cwd=work, start_new_session=True)
    except OSError as err:
        os.close(read_fd)
        os.close(write_fd)
        shutil.rmtree(work, ignore_errors=True)
        _give_uid(uid)
        return ProgramResult("crashed", [None] * len(job.checks), [None] * len(job.checks),
                             time.perf_counter() - start, error=f"could not start: {err}")
    os.close(write_fd)
    flood = threading.Event()

    def _kill():
        flood.set()
        _killpg(proc.pid)

    readers = [threading.Thread(target=_drain, args=(os.fdopen(read_fd, "rb"), _RESULT_CAP, results), daemon=True),
               threading.Thread(target=_drain, args=(proc.stderr, _STDERR_CAP, stderr, budget, _kill), daemon=True),
               threading.Thread(target=_drain, args=(proc.stdout, 0, stdout, budget, _kill), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        proc.stdin.write(json.dumps(payload).encode("utf-8"))
        proc.stdin.close()
    except OSError:  # the child died before reading its job; its status says why
        pass
    try:
        proc.wait(timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        killed = "timeout"
    finally:
        _killpg(proc.pid)  # the whole group, whatever the program started
        proc.wait()
        for reader in readers:
            reader.join(timeout=2)
        shutil.rmtree(work, ignore_errors=True)
        _give_uid(uid)
    if flood.is_set():
        killed = "output_limit"
    return _parse(b"".join(results), b"".join(stderr), proc.returncode, killed, len(job.checks),
                  time.perf_counter() - start)


# Started as root, each sandbox running at the same time gets a uid of its own (no passwd entry needed):
# RLIMIT_NPROC counts per uid, so a fork bomb exhausts only its own sandbox, and sandboxes cannot signal
# each other.
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


def _killpg(pgid: int):
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _parse(raw: bytes, stderr_raw: bytes, returncode: int, killed: str | None, n: int, seconds: float):
    values: list[str | None] = [None] * n
    errors: list[str | None] = [None] * n
    load = error = exit_record = None
    done = ready = False
    for line in raw.decode("utf-8", "replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if not isinstance(record, dict):
            continue
        if "ready" in record:
            ready = True
        elif "load" in record and load is None:
            load, error = str(record["load"]), str(record.get("error", ""))
        elif "check" in record and isinstance(record["check"], int) and 0 <= record["check"] < n:
            i = record["check"]
            if values[i] is None and errors[i] is None:  # the first report of a check counts
                value, err = record.get("value"), record.get("error")
                values[i] = value if isinstance(value, str) else None
                errors[i] = str(err) if err is not None else (None if values[i] is not None else "malformed")
        elif record.get("done") is True:
            done = True
        elif "exit" in record:
            exit_record = record  # the monitor writes it last, after the program has ended
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
    elif exit_record is not None and exit_record.get("signaled") and exit_record.get("exit") in (
            signal.SIGXCPU, signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one
        status, error = "timeout", "cpu time limit"
    elif done and load == "ok":
        status = "ok"
    else:
        status = "crashed"
        if exit_record is not None:
            how = "signal" if exit_record.get("signaled") else "exit status"
            error = error or f"{how} {exit_record.get('exit')}"
        error = error or (f"exit status {returncode}" if ready else f"the sandbox did not start (exit {returncode})")
    return ProgramResult(status, values, errors, seconds, stderr=stderr[-_STDERR_CAP:], error=error or "")


# ----------------------------------------------------------------------------------------------------
# Many programs.

_STATS_KEY = {"ok": "ok", "timeout": "timeouts", "crashed": "crashes", "memory": "memory_kills",
              "output_limit": "output_kills", "syntax_error": "syntax_errors", "load_error": "load_errors"}
_STATS = dict.fromkeys(("programs", *_STATS_KEY.values()), 0)
_lock = threading.Lock()


def sandbox_stats() -> dict[str, int]:
    """Programs run in this process so far, by outcome (cumulative; callers diff two readings)."""
    with _lock:
        return dict(_STATS)


def default_workers() -> int:
    # the programs are mostly process start-up; a few more than the cores keeps them all busy
    return max(2, 2 * (os.cpu_count() or 1))


def run_programs(jobs: list[Job], limits: SandboxLimits = SandboxLimits(), workers: int | None = None) -> list[ProgramResult]:
    """Run every job in its own sandbox, `workers` at a time; results in the order of `jobs`."""
    if not jobs:
        return []
    mode = isolation()
    with ThreadPoolExecutor(max_workers=min(len(jobs), workers or default_workers())) as pool:
        results = list(pool.map(lambda job: run_program(job, limits, mode), jobs))
    with _lock:
        _STATS["programs"] += len(results)
        for result in results:
            _STATS[_STATS_KEY[result.status]] += 1
    return results

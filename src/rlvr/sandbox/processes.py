"""The host side of one sandbox's processes: its pipes drained with caps, data handed over as pipes, the
unprivileged uids a root host runs sandboxes as (unique on the machine), a process tree's CPU clock, and
reading the judge's records back so that no bytes a program can write ever raise here.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import threading

from rlvr.sandbox.records import RESULT_CAP, STDERR_CAP, ProgramResult


def drain(stream, cap: int, sink: list[bytes], budget: list[int] | None = None, on_exceeded=None):
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


def data_fd(data: bytes) -> int:
    """A pipe's read end holding `data` (small: it fits in the pipe's buffer), for bubblewrap to read."""
    read_fd, write_fd = os.pipe()
    try:
        os.write(write_fd, data)
    finally:
        os.close(write_fd)
    return read_fd




# Started as root, each sandbox running at the same time gets a uid of its own (no passwd entry needed):
# RLIMIT_NPROC counts per uid, so a fork bomb exhausts only its own sandbox, and it owns no file of the host.
# Uids are unique on the machine, not only in this process: each is held with a lock file (flock) for as long
# as this process may use it, so two rlvr processes (a sweep's parallel runs, an evaluation beside training,
# test workers) never hand out the same one; the kernel drops the locks of a process that dies.
UID_BASE = 2_100_000_000
LOCK_DIRS = ("/run/rlvr-sandbox-uids", "/tmp/rlvr-sandbox-uids")
_free_uids: list[int] = []
_held: dict[int, int] = {}  # uid -> the fd of its lock file
_next_uid = [UID_BASE]
_uid_lock = threading.Lock()


def _lock_dir() -> str:
    """A directory only root can write, for the uids' lock files."""
    for path in LOCK_DIRS:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            info = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == 0 and not info.st_mode & 0o022:
            return path
    raise OSError(f"no directory for the sandbox uids' lock files (tried {', '.join(LOCK_DIRS)})")


def uid_in_use(uid: int) -> bool:
    """Whether any process on the machine runs as `uid` (a zombie too: RLIMIT_NPROC still counts it)."""
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    return True
            except OSError:
                pass
    return False


def take_uid() -> int:
    with _uid_lock:
        if _free_uids:
            return _free_uids.pop()
        where = _lock_dir()
        while True:
            uid = _next_uid[0]
            _next_uid[0] += 1
            fd = os.open(f"{where}/{uid}", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another rlvr process holds it
                os.close(fd)
                continue
            if uid_in_use(uid):  # the sandboxes of an rlvr process that died are still being killed
                os.close(fd)
                continue
            _held[uid] = fd
            return uid


def held_uids() -> list[int]:
    """The sandbox uids this process holds (in use or free in its pool)."""
    with _uid_lock:
        return sorted(_held)


def give_uid(uid: int, clean: bool = True):
    """Back to the pool once none of its processes is left; `clean=False` (some might be): retire it, and
    drop its lock so that another process takes it only after checking it is unused."""
    with _uid_lock:
        if clean:
            _free_uids.append(uid)
        elif uid in _held:
            os.close(_held.pop(uid))


def user_processes() -> int:
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


_TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(root: int) -> float:
    """CPU time of process `root` and all its descendants, from /proc: live ones and zombies by their own
    time, reaped ones by their reaper's (cutime, cstime). A sandbox's orphans are reparented to its judge (PID 1
    of its namespace), so this covers every process it ever had, those that called setsid() too; except one
    reaped by the kernel (its parent ignores SIGCHLD), whose time no one inherits: with cgroups, the group's
    clock counts that too; without, such a program runs to the wall-clock cap, on its one CPU share."""
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                data = f.read()
            fields = data[data.rindex(b")") + 2:].split()
            pid, ppid = int(entry.name), int(fields[1])
            times[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0, [root], set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += times.get(pid, 0)
        todo += children.get(pid, [])
    return total / _TICK


def files_in_work(pid: int, work_mb: int) -> int:
    """Inodes used in the sandbox's tmpfs (`work_mb` in size), seen through its judge's root: each is kernel
    memory (about 1 KB) that the tmpfs's size does not count, which only a cgroup charges. 0 where that is not
    the sandbox's tmpfs (no bubblewrap, or not yet mounted)."""
    info = os.statvfs(f"/proc/{pid}/root/work")
    if info.f_blocks * info.f_frsize != work_mb << 20:
        return 0
    return info.f_files - info.f_ffree


def reaped(pidfd: int) -> bool:
    """Whether the process behind a pidfd has been waited for (its pid released), from its fdinfo."""
    try:
        with open(f"/proc/self/fdinfo/{pidfd}") as f:
            return any(line.split() == ["Pid:", "-1"] for line in f)
    except OSError:
        return False


def killpg(pgid: int):
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
    for line in raw[:RESULT_CAP].split(b"\n"):
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
    elif killed == "memory":
        status, error = "memory", "over the sandbox's memory limit"
    elif killed == "output_limit":
        status, error = "output_limit", "wrote more output than allowed"
    elif killed in ("timeout", "cpu"):
        status, error = "timeout", "cpu time limit" if killed == "cpu" else "wall-clock limit"
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
    return ProgramResult(status, values, errors, seconds, stderr=stderr[-STDERR_CAP:], error=error or "")

"""The host side of one sandbox's processes: its pipes drained with caps, data handed over as memory fds,
the unprivileged uids a root host runs sandboxes as, killing a sandbox's process group, and reading the
judge's records back so that no bytes a program can write ever raise here.
"""

from __future__ import annotations

import json
import os
import signal
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


def cleanup(work: str | None, uid: int | None):
    if work is not None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    if uid is not None:
        give_uid(uid)


# Started as root, each sandbox running at the same time gets a uid of its own (no passwd entry needed):
# RLIMIT_NPROC counts per uid, so a fork bomb exhausts only its own sandbox, and it owns no file of the host.
UID_BASE = 2_100_000_000


_free_uids: list[int] = []


_next_uid = [UID_BASE]


_uid_lock = threading.Lock()


def take_uid() -> int:
    with _uid_lock:
        if _free_uids:
            return _free_uids.pop()
        _next_uid[0] += 1
        return _next_uid[0] - 1


def give_uid(uid: int):
    with _uid_lock:
        _free_uids.append(uid)


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
    return ProgramResult(status, values, errors, seconds, stderr=stderr[-STDERR_CAP:], error=error or "")

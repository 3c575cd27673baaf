"""The host side of one sandbox's processes: its pipes drained with caps, a process tree's CPU clock and tasks,
what its tasks did between two looks (ran, waited for a CPU, or slept), and the tmpfs files it holds.
"""

from __future__ import annotations

import os
import signal


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


def _stat_fields(pid) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return data[data.rindex(b")") + 2:].split()
    except (OSError, ValueError):
        return None


def own_cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` itself (all its threads; not its children)."""
    fields = _stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / _TICK if fields else 0.0


def tree(root: int) -> tuple[list[int], float]:
    """(the pids of `root` and all its descendants, their CPU seconds): live ones and zombies by their own time,
    reaped ones by their reaper's (cutime, cstime). A sandbox's orphans are reparented to its judge (PID 1 of
    its namespace), so this covers every process it ever had, those that called setsid() too; except one reaped
    by the kernel (its parent ignores SIGCHLD), whose time no one inherits (`TreeClock`)."""
    children: dict[int, list[int]] = {}
    times: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(entry.name)
        if fields is None:
            continue
        try:
            pid, ppid = int(entry.name), int(fields[1])
            times[pid] = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        except (ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    total, todo, seen = 0, [root], []
    while todo:
        pid = todo.pop()
        if pid in seen or pid not in times:
            continue
        seen.append(pid)
        total += times[pid]
        todo += children.get(pid, [])
    return seen, total / _TICK


class TreeClock:
    """The CPU clock of a process tree where no cgroup counts it: the sum of `tree`'s increases between looks.
    A child the kernel reaps (SIGCHLD ignored) takes its time away with it; counting increases only keeps what
    it was seen to use (all but its last moments)."""

    def __init__(self, root: int):
        self.root, self.last, self.seconds = root, 0.0, 0.0

    def read(self) -> tuple[list[int], float]:
        pids, now = tree(self.root)
        self.seconds += max(0.0, now - self.last)
        self.last = now
        return pids, self.seconds


def tasks_of(pids) -> list[int]:
    """The threads of these processes."""
    out = []
    for pid in pids:
        try:
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except (OSError, ValueError):
            pass
    return out


def schedstats(tids) -> dict[int, tuple[int, int]]:
    """tid -> (nanoseconds on a CPU, nanoseconds runnable but waiting for one), from /proc/<tid>/schedstat."""
    out = {}
    for tid in tids:
        try:
            with open(f"/proc/{tid}/schedstat", "rb") as f:
                ran, waited = f.read().split()[:2]
            out[tid] = (int(ran), int(waited))
        except (OSError, ValueError):
            pass
    return out


def files_in(pid: int, path: str, size_mb: int) -> int:
    """Inodes used in one of the sandbox's tmpfs (`size_mb` in size), seen through its judge's root: each is
    kernel memory (about 1 KB) that the tmpfs's size does not count, which only a cgroup charges. 0 where that is
    not the sandbox's tmpfs (no bubblewrap, or not yet mounted)."""
    info = os.statvfs(f"/proc/{pid}/root{path}")
    if info.f_blocks * info.f_frsize != size_mb << 20:
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

"""The unprivileged uids a root host runs sandboxes as: unique on the host, across containers too.

Started as root, each sandbox running at the same time gets a uid of its own (no passwd entry needed):
RLIMIT_NPROC counts per uid, so a fork bomb exhausts only its own sandbox, and it owns no file of the host.
Unique on the host, not only in this process or this container: a uid is held by a holder, a process of that
uid that rlvr starts and that lives as long as rlvr may use the uid (it exits when rlvr closes its pipe or
dies). Whether a uid is free is asked of the kernel, which counts a uid's processes across the whole host
(whatever container, PID namespace or /run each process has): the holder, with RLIMIT_NPROC = 2, forks once,
which succeeds only when no other process of that uid exists anywhere. So a uid another rlvr holds (in this
container or another on the same kernel), or whose sandboxes of a dead rlvr are still being killed, is
refused; two rlvr trying the same uid at once see each other's holder and both move on. A sandbox's process
limit counts its holder as one of the uid's processes (`HOLDER_PROCESSES`).
"""

from __future__ import annotations

import random
import subprocess
import threading

from rlvr.sandbox import launch

UID_BASE = 2_100_000_000
UID_SPAN = 1 << 24  # candidates: UID_BASE + [0, UID_SPAN), from a random start
HOLDER_PROCESSES = 1
_HOLDER = r"""
import os, resource, sys
uid = int(sys.argv[1])
os.setgroups([])
os.setresgid(uid, uid, uid)
os.setresuid(uid, uid, uid)
resource.setrlimit(resource.RLIMIT_NPROC, (2, 2))
try:
    pid = os.fork()  # this uid's second process: refused where it has any other, anywhere on the host
except OSError:
    os.write(1, b"taken\n")
    sys.exit(0)
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
os.write(1, b"held\n")
os.read(0, 1)  # until rlvr closes its end (or dies)
"""
_free: list[int] = []
_holders: dict[int, subprocess.Popen] = {}
_next = [UID_BASE + random.SystemRandom().randrange(UID_SPAN)]
_lock = threading.Lock()


def _mapped(uid: int) -> bool:
    """Whether this user namespace maps `uid` (a container with a user namespace maps a range only)."""
    try:
        with open("/proc/self/uid_map") as f:
            for line in f:
                inside, _, count = (int(x) for x in line.split())
                if inside <= uid < inside + count:
                    return True
    except (OSError, ValueError):
        return True
    return False


def _hold(uid: int) -> subprocess.Popen | None:
    binary, _ = launch.interpreter()
    holder = subprocess.Popen([binary, "-S", "-s", "-B", "-c", _HOLDER, str(uid)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd="/", env={})
    answer = holder.stdout.readline()
    if answer == b"held\n":
        return holder
    holder.stdin.close()
    holder.wait()
    return None


def take_uid() -> int:
    with _lock:
        while _free:
            uid = _free.pop()
            if _holders[uid].poll() is None:
                return uid
            _holders.pop(uid)  # its holder died: no longer ours to hand out
        for _ in range(10_000):
            uid = _next[0]
            _next[0] = UID_BASE + (uid - UID_BASE + 1) % UID_SPAN
            if not _mapped(uid):
                continue
            holder = _hold(uid)
            if holder is not None:
                _holders[uid] = holder
                return uid
        raise OSError("no free sandbox uid (every one tried is in use on this host, or not mapped here)")


def held_uids() -> list[int]:
    """The sandbox uids this process holds (in use or free in its pool)."""
    with _lock:
        return sorted(_holders)


def holder_pids() -> list[int]:
    """The holders' pids (processes of the held uids, children of this process, by design)."""
    with _lock:
        return sorted(holder.pid for holder in _holders.values())


def give_uid(uid: int, clean: bool = True):
    """Back to the pool once none of its processes is left; `clean=False` (some might be): let it go, so that
    anyone takes it again only once the kernel counts none of its processes."""
    with _lock:
        if uid not in _holders:
            return
        if clean:
            _free.append(uid)
            return
        holder = _holders.pop(uid)
    holder.stdin.close()
    holder.wait()


def release_all():
    """Let every held uid go (the holders exit): for a process that stops grading."""
    with _lock:
        holders = list(_holders.values())
        _holders.clear()
        _free.clear()
    for holder in holders:
        holder.stdin.close()
        holder.wait()

"""Control groups for sandboxes: where this machine lets rlvr make them, each sandbox runs in a group of its own.

    bounds()                 # one line: what bounds memory, processes and CPU here (logged once per run)
    group = create(limits)   # a Group, or None where cgroups are not in force
    group.add(pid); group.cpu_seconds(); group.oom_killed(); group.remove()

A sandbox's group, made below rlvr's own cgroup (so every limit above rlvr's still applies), has
* a memory limit of the sandbox's whole budget (`records.sandbox_memory_mb`), which the kernel charges with
  everything its processes hold, not only their address space: anonymous memory, shared memory, tmpfs pages,
  pipe buffers and kernel objects (inodes, dentries); no swap;
* a task limit (`pids.max`, which counts threads too) of `limits.processes + limits.threads` (its memory limit
  counts `processes` of them at `memory_mb`: threads share their process's);
* its own CPU share (v1 `cpu.shares`, v2 `cpu.weight`, the default for every group): a sandbox of 16 spinning
  processes gets the CPU of one sandbox, not of 16 programs;
* its CPU clock (v1 `cpuacct.usage`, v2 `cpu.stat`), which counts every process ever in the group, a child
  that called setsid() included: this clock decides a sandbox's timeout (`rlvr.sandbox.running`).

Used where rlvr runs as root (or in a cgroup v2 subtree delegated to it) with the memory, pids and cpu
controllers: cgroup v1 hierarchies (this machine, CI) or cgroup v2. Elsewhere `create` returns None and the
fallback holds, each bound by something else (`bounds()` says which, `rlvr.sandbox` logs it): memory by
RLIMIT_AS per process and the seccomp filter (no SysV IPC, POSIX queues, memfd, sockets, pipe resizing), the
tmpfs by its size, processes by RLIMIT_NPROC of the sandbox's own uid or user namespace, CPU by the sandbox's
own scheduler group (a session: autogroup) and a CPU clock summed from /proc.
"""

from __future__ import annotations

import itertools
import os
import signal
import time
from functools import lru_cache

from rlvr.sandbox.records import SandboxLimits, sandbox_memory_mb

V1 = ("memory", "pids", "cpu", "cpuacct")
V2 = ("memory", "pids", "cpu")
PREFIX = "rlvr-sandbox-"
_names = itertools.count()


class Group:
    """One sandbox's cgroup (a directory per v1 hierarchy, or one v2 directory)."""

    def __init__(self, dirs: dict[str, str], version: int):
        self.dirs, self.version = dirs, version
        self._unique = list(dict.fromkeys(dirs.values()))

    def add(self, pid: int) -> None:
        for path in self._unique:
            _write(f"{path}/cgroup.procs", str(pid))

    def cpu_seconds(self) -> float:
        if self.version == 1:
            return int(_read(f"{self.dirs['cpuacct']}/cpuacct.usage")) / 1e9
        for line in _read(f"{self.dirs['cpu']}/cpu.stat").splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
        return 0.0

    def tasks(self) -> list[int]:
        """Every thread of the group's processes (whose /proc/<tid>/schedstat says what each did)."""
        name = "tasks" if self.version == 1 else "cgroup.threads"
        return [int(t) for t in _read(f"{self.dirs['cpu']}/{name}").split()]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this group for its memory limit."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            fields = dict(line.split() for line in _read(f"{self.dirs['memory']}/{name}").splitlines())
        except (OSError, ValueError):
            return False
        return int(fields.get("oom_kill", 0)) > 0

    def processes(self) -> list[int]:
        pids: set[int] = set()
        for path in self._unique:
            try:
                pids.update(int(p) for p in _read(f"{path}/cgroup.procs").split())
            except OSError:
                pass
        return sorted(pids)

    def remove(self, wait: float = 5.0) -> bool:
        """Kill whatever is left in the group, wait until it is empty (a zombie still counts) and remove it;
        False when that did not happen within `wait` seconds (the directories are then left behind)."""
        deadline = time.monotonic() + wait
        while True:
            left = self.processes()
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            if not left:
                try:
                    for path in self._unique:
                        if os.path.isdir(path):
                            os.rmdir(path)
                    return True
                except OSError:  # EBUSY: a process was still being released
                    pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of every cgroup file system this process sees."""
    out = []
    for line in _read("/proc/self/mountinfo").splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            out.append((fields[3], fields[4].replace("\\040", " "), tail[0], set(tail[2].split(","))))
    return out


def _inside(mount_root: str, mount_point: str, path: str) -> str | None:
    if mount_root == "/":
        return mount_point.rstrip("/") + path
    if path == mount_root or path.startswith(mount_root + "/"):
        return mount_point.rstrip("/") + path[len(mount_root):]
    return None


def _own_dirs() -> tuple[int, dict[str, str]] | str:
    """(version, controller -> this process's own cgroup directory), or why there is none to use."""
    own = {}
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        own[controllers] = path
    mounts = _mounts()
    dirs = {}
    for name in V1:
        for root, point, fstype, options in mounts:
            path = next((p for c, p in own.items() if name in c.split(",")), None)
            if fstype == "cgroup" and name in options and path is not None:
                where = _inside(root, point, path)
                if where:
                    dirs[name] = where
                    break
    if len(dirs) == len(V1):
        return 1, dirs
    for root, point, fstype, _ in mounts:
        if fstype == "cgroup2" and "" in own:
            where = _inside(root, point, own[""])
            if where is None:
                continue
            try:
                available = _read(f"{where}/cgroup.controllers").split()
            except OSError:
                continue
            missing = [c for c in V2 if c not in available]
            if missing:
                return f"cgroup v2 at {where} lacks the {', '.join(missing)} controller(s)"
            enabled = _read(f"{where}/cgroup.subtree_control").split()
            want = [c for c in V2 if c not in enabled]
            if want:  # the kernel refuses this where the cgroup holds processes and is not the root: fine
                try:
                    _write(f"{where}/cgroup.subtree_control", " ".join("+" + c for c in want))
                except OSError as err:
                    return (f"cgroup v2: cannot enable {', '.join(want)} for groups below {where} ({err.strerror}); "
                            "run rlvr in a cgroup delegated to it (systemd-run -p Delegate=yes)")
            return 2, dict.fromkeys(V2, where)
    have = sorted(dirs) or ["none"]
    return f"no cgroup v2 and only these cgroup v1 controllers: {', '.join(have)}"


@lru_cache(maxsize=1)
def _hierarchy() -> tuple[int, dict[str, str]] | str:
    """What `create` makes groups in, found and tried once per process; or why cgroups are not in force."""
    try:
        found = _own_dirs()
    except (OSError, ValueError) as err:
        return f"cannot read this process's cgroups ({err})"
    if isinstance(found, str):
        return found
    version, dirs = found
    for path in set(dirs.values()):  # groups a killed rlvr left behind (empty ones only: rmdir refuses others)
        try:
            for entry in os.scandir(path):
                pid = entry.name[len(PREFIX):].split("-")[0]
                if entry.name.startswith(PREFIX) and pid.isdigit() and not _alive(int(pid)):
                    try:
                        os.rmdir(entry.path)
                    except OSError:
                        pass
        except OSError:
            pass
    try:
        _make(version, dirs, SandboxLimits()).remove()
    except OSError as err:
        return f"cannot make a cgroup below {next(iter(dirs.values()))} ({err.strerror or err})"
    return version, dirs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def _make(version: int, dirs: dict[str, str], limits: SandboxLimits) -> Group:
    name = f"{PREFIX}{os.getpid()}-{next(_names)}"
    made: dict[str, str] = {}
    group = Group({c: f"{d}/{name}" for c, d in dirs.items()}, version)
    try:
        for controller, path in group.dirs.items():
            if path not in made.values():
                os.mkdir(path, 0o700)
            made[controller] = path
        memory = str(sandbox_memory_mb(limits) << 20)
        if version == 1:
            _write(f"{group.dirs['memory']}/memory.limit_in_bytes", memory)
            if os.path.exists(f"{group.dirs['memory']}/memory.memsw.limit_in_bytes"):  # no swap beyond it
                _write(f"{group.dirs['memory']}/memory.memsw.limit_in_bytes", memory)
        else:
            _write(f"{group.dirs['memory']}/memory.max", memory)
            if os.path.exists(f"{group.dirs['memory']}/memory.swap.max"):
                _write(f"{group.dirs['memory']}/memory.swap.max", "0")
        _write(f"{group.dirs['pids']}/pids.max", str(int(limits.processes + limits.threads)))
    except OSError:
        Group(made, version).remove(wait=1.0)
        raise
    return group


def create(limits: SandboxLimits) -> Group | None:
    """A fresh group for one sandbox with these limits; None where cgroups are not in force here. Raises
    OSError where they are but this one could not be made (the sandbox must then not run)."""
    found = _hierarchy()
    if isinstance(found, str):
        return None
    return _make(*found, limits)


def in_force() -> bool:
    return not isinstance(_hierarchy(), str)


def bounds() -> str:
    """What bounds a sandbox's memory, processes and CPU on this machine, in one line."""
    found = _hierarchy()
    if not isinstance(found, str):
        version, dirs = found
        return (f"cgroup v{version} per sandbox (below {dirs['memory']}): memory limit counting shared memory, "
                "tmpfs and kernel memory; pids.max; its own CPU share; the group's CPU clock decides timeouts")
    autogroup = _read_or("/proc/sys/kernel/sched_autogroup_enabled", "0").strip() == "1"
    share = ("its own scheduler group (a session; autogroup is on)" if autogroup else
             "no CPU share of its own (autogroup is off: neighbours can slow it, only the CPU clock is fair)")
    return (f"no cgroups ({found}): memory by RLIMIT_AS per process, the seccomp filter and the tmpfs size; "
            f"processes by RLIMIT_NPROC of the sandbox's own uid or user namespace; CPU: {share}, and the CPU "
            "clock of the judge and every descendant, read from /proc, decides timeouts")


def _read_or(path: str, default: str) -> str:
    try:
        return _read(path)
    except OSError:
        return default

"""One program in one sandbox, from the start of bubblewrap to its last process reaped.

bubblewrap reports the judge's pid (`--info-fd`) and holds the judge, set up but not yet started, until rlvr
has opened a pidfd on it and put it in the sandbox's cgroup (`rlvr.sandbox.cgroups`, where cgroups are in
force); only then does the judge run. While it runs, its CPU clock decides the timeout: the cgroup's, or the
judge's and every descendant's read from /proc (`processes.tree_cpu_seconds`); the wall clock (`timeout`) only
stops a sandbox that waits. A verdict so depends on the program's own work, not on what runs beside it.

Stopping: the judge is killed by its pidfd (the kernel then kills every process of its PID namespace) and
bubblewrap, its parent, reaps it and exits; bubblewrap is never killed first, which would leave the judge to
whoever reaps orphans (a zombie where rlvr is a container's PID 1). A uid goes back to the pool, and the
cgroup away, only once the judge is reaped (so its namespace is empty) and the group holds no process.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import select
import signal
import subprocess
import tempfile
import threading
import time
from functools import lru_cache

from rlvr.sandbox import cgroups, launch
from rlvr.sandbox.processes import (
    data_fd,
    drain,
    files_in_work,
    give_uid,
    killpg,
    read_results,
    reaped,
    take_uid,
    tree_cpu_seconds,
    user_processes,
)
from rlvr.sandbox.records import RESULT_CAP, STDERR_CAP, Job, ProgramResult, SandboxLimits, work_files

POLL = (0.05, 0.25)  # the first and the longest wait between two readings of a running sandbox's CPU clock
START_WAIT = 30.0  # seconds bubblewrap may take to report the judge's pid


@lru_cache(maxsize=1)
def harness_source() -> bytes:
    return launch.HARNESS.read_bytes()


class _Judge:
    """The judge's process, by pidfd (no pid reuse can redirect a signal)."""

    def __init__(self, pid: int, pidfd: int | None):
        self.pid, self.pidfd = pid, pidfd

    def kill(self):
        try:
            if self.pidfd is not None:
                signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        except OSError:
            pass

    def gone(self, wait: float) -> bool:
        """Reaped within `wait` seconds (by bubblewrap; by rlvr where the judge was left to it as an orphan)."""
        if self.pidfd is None:
            return True
        deadline = time.monotonic() + wait
        while not reaped(self.pidfd):
            self.kill()
            try:
                if _parent(self.pid) == os.getpid():  # rlvr is PID 1 or a subreaper, and bubblewrap died first
                    os.waitpid(self.pid, os.WNOHANG)
            except (OSError, ChildProcessError):
                pass
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def close(self):
        if self.pidfd is not None:
            os.close(self.pidfd)
            self.pidfd = None


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rindex(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _hold(proc: subprocess.Popen, info_fd: int, block_fd: int, group) -> tuple[_Judge | None, str]:
    """Read the judge's pid from bubblewrap, open a pidfd on it, put it in its cgroup, then let it run.
    (None, why) where bubblewrap did not get that far (its status and stderr then say why) or this failed."""
    info, pid = b"", None
    try:
        deadline = time.monotonic() + START_WAIT
        while pid is None and time.monotonic() < deadline:  # one JSON document, written in pieces
            ready, _, _ = select.select([info_fd], [], [], max(0.0, deadline - time.monotonic()))
            chunk = os.read(info_fd, 4096) if ready else b""
            if not chunk:
                break
            info += chunk
            try:
                pid = int(json.loads(info)["child-pid"])
            except (ValueError, KeyError, TypeError):
                pass
        os.close(info_fd)
        if pid is None:
            return None, ""
        pidfd = os.pidfd_open(pid)
        judge = _Judge(pid, pidfd)
        if _parent(pid) != proc.pid:  # held by bubblewrap, so this cannot happen; refuse rather than guess
            judge.close()
            return None, "the sandbox's judge is not bubblewrap's child"
        try:
            if group is not None:
                group.add(pid)
        except OSError as err:
            judge.kill()
            return judge, f"could not put the sandbox in its cgroup ({err})"
        os.write(block_fd, b"1")
        return judge, ""
    except OSError as err:
        return None, f"could not hold the sandbox's judge ({err})"
    finally:
        os.close(block_fd)


def _watch(done: threading.Thread, limits: SandboxLimits, over) -> str | None:
    """Wait for the result pipe to close; what `over()` says first ("cpu": the sandbox's CPU clock passed its
    budget; "memory"), or "timeout" at the wall-clock cap. A program that ends within the first poll is never
    looked at."""
    end = time.monotonic() + limits.timeout
    step = POLL[0]
    while True:
        left = end - time.monotonic()
        if left <= 0:
            return "timeout"
        done.join(timeout=min(step, left))
        if not done.is_alive():
            return None
        try:
            why = over()
        except (OSError, ValueError):
            why = None
        if why:
            return why
        step = min(POLL[1], 2 * step)


def _limits_check(limits: SandboxLimits, group, pid: int, isolated: bool):
    """What `_watch` polls: the sandbox's CPU clock (its cgroup's, or its judge's process tree's) and, under
    bubblewrap, the files in its tmpfs, whose kernel memory only a cgroup would count (checked with one too,
    so that a verdict is the same on every machine)."""
    most_files = work_files(limits)

    def over():
        used = group.cpu_seconds() if group is not None else tree_cpu_seconds(pid)
        if used > limits.cpu_seconds:
            return "cpu"
        return "memory" if isolated and files_in_work(pid, 2 * int(limits.file_mb)) > most_files else None

    return over


def _payload(job: Job, limits: SandboxLimits) -> dict:
    return {"program": job.program, "module": job.module, "deadline": limits.timeout,
            "checks": [dataclasses.asdict(c) for c in job.checks],
            # each process's own RLIMIT_CPU: a backstop under the sandbox's clock, which counts them all
            "limits": {"cpu_seconds": max(1, math.ceil(limits.cpu_seconds)), "memory_mb": int(limits.memory_mb),
                       "file_mb": int(limits.file_mb), "processes": int(limits.processes)}}


def _crashed(job: Job, start: float, why: str) -> ProgramResult:
    n = len(job.checks)
    return ProgramResult("crashed", [None] * n, [None] * n, time.perf_counter() - start, error=why)


def run(job: Job, limits: SandboxLimits, mode: str) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox (no isolation check: `rlvr.sandbox.run_program`
    makes it); never raises for anything the program does."""
    start = time.perf_counter()
    root, isolated = os.geteuid() == 0, mode == "bwrap"
    payload = _payload(job, limits)
    uid = take_uid() if root and isolated else None
    try:
        group = cgroups.create(limits) if isolated else None
    except OSError as err:
        if uid is not None:
            give_uid(uid)
        return _crashed(job, start, f"could not make the sandbox's cgroup: {err}")
    read_fd, write_fd = os.pipe()
    passed, work, info_fd, block_fd = [write_fd], None, -1, -1
    if isolated:
        seccomp_fd, harness_fd = data_fd(launch.seccomp_filter()), data_fd(harness_source())
        info_fd, info_w = os.pipe()
        block_r, block_fd = os.pipe()
        passed += [seccomp_fd, harness_fd, info_w, block_r]
        argv = launch.bwrap_argv(root, 2 * int(limits.file_mb), seccomp_fd, harness_fd, info_w, block_r)
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
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=passed, env=env, cwd=cwd, start_new_session=True)
    except OSError as err:
        for fd in [read_fd, *passed, *([info_fd, block_fd] if isolated else [])]:
            os.close(fd)
        _release(None, group, uid, work)
        return _crashed(job, start, f"could not start: {err}")
    for fd in passed:
        os.close(fd)
    why = ""
    if isolated:
        judge, why = _hold(proc, info_fd, block_fd, group)
    else:
        judge = _Judge(proc.pid, os.pidfd_open(proc.pid))
    results, stderr, stdout = [], [], []
    flood = threading.Event()
    output_budget = [limits.output_kb * 1024]

    def _flooded():
        flood.set()
        _stop(proc, judge, isolated)

    readers = [threading.Thread(target=drain, args=(os.fdopen(read_fd, "rb"), RESULT_CAP, results), daemon=True),
               threading.Thread(target=drain, args=(proc.stderr, STDERR_CAP, stderr, output_budget, _flooded),
                                daemon=True),
               threading.Thread(target=drain, args=(proc.stdout, 0, stdout, output_budget, _flooded), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        if judge is not None and not why:  # else nothing to run: the sandbox is being stopped
            proc.stdin.write(json.dumps(payload).encode("utf-8"))
        proc.stdin.close()
    except OSError:  # the sandbox died before reading its job; its status says why
        pass
    killed = None
    try:
        if judge is not None and not why:
            killed = _watch(readers[0], limits, _limits_check(limits, group, judge.pid, isolated))
    finally:
        if killed or why or judge is None or not isolated:  # limits_only: what the program left, too
            _stop(proc, judge, isolated)
        try:  # bubblewrap exits once it has reaped the judge
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            _stop(proc, judge, isolated)
            killpg(proc.pid)
            proc.wait()
        for reader in readers:
            reader.join(timeout=2)
        if group is not None and killed is None and group.oom_killed():
            killed = "memory"
        _release(judge, group, uid, work)
    if flood.is_set():
        killed = "output_limit"
    if why:
        return _crashed(job, start, why)
    return read_results(b"".join(results), b"".join(stderr), proc.returncode, killed, len(job.checks),
                        time.perf_counter() - start)


def _stop(proc: subprocess.Popen, judge: _Judge | None, isolated: bool):
    """Kill the sandbox: under bubblewrap its judge (the kernel takes the whole namespace with it); with
    limits_only, the judge's process group."""
    if judge is not None:
        judge.kill()
    if not isolated or judge is None:
        killpg(proc.pid)


def _release(judge: _Judge | None, group, uid: int | None, work: str | None):
    clean = True
    if judge is not None:
        clean = judge.gone(wait=5.0)
        judge.close()
    if group is not None:
        clean = group.remove() and clean
    if uid is not None:
        give_uid(uid, clean)
    if work is not None:
        import shutil

        shutil.rmtree(work, ignore_errors=True)

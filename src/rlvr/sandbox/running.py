"""One program in one sandbox, from the start of bubblewrap to its last process reaped.

bubblewrap reports the judge's pid (`--info-fd`) and holds the judge, set up but not yet started, until rlvr
has opened a pidfd on it and put it in the sandbox's cgroup (`rlvr.sandbox.cgroups`, where cgroups are in
force); only then does the judge run. The job reaches the judge in a memfd (nothing is written to a pipe
before its reader exists). While it runs, `Meter` looks at it every 50-250 ms:

* the program's CPU clock (the cgroup's, or the judge's process tree's read from /proc, less the judge's own
  time) against `cpu_seconds`, and the judge's own against its budget: a verdict depends on the program's
  work, not on what runs beside it;
* what its tasks did since the last look (/proc/<tid>/schedstat): an interval in which they neither ran nor
  waited for a CPU is waiting, and a sandbox that has waited `wait_seconds` in all is stopped (a sleeping or
  blocked program no longer holds a worker for the whole wall cap);
* the wall clock, counting only intervals in which the sandbox was not starved (runnable but kept off the CPUs
  by others for most of the interval) against `timeout`; and, as a last resort, the plain wall clock at
  `LAST_RESORT` x `timeout`.

Stopping: the judge is killed by its pidfd (the kernel then kills every process of its PID namespace) and
bubblewrap, its parent, reaps it and exits; bubblewrap is never killed first, which would leave the judge to
whoever reaps orphans (a zombie where rlvr is a container's PID 1). A uid goes back to the pool, and the
cgroup away, only once the judge is reaped (so its namespace is empty) and the group holds no process. A
failure of the sandbox's machinery (its cgroup cannot be made, take the judge or be read) raises
`SandboxError`: grading stops with the reason, rather than scoring the program 0.
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

from rlvr.sandbox import cgroups, launch
from rlvr.sandbox.processes import (
    TreeClock,
    drain,
    files_in,
    killpg,
    own_cpu_seconds,
    reaped,
    schedstats,
    tasks_of,
    user_processes,
)
from rlvr.sandbox.records import RESULT_CAP, STDERR_CAP, Job, ProgramResult, SandboxLimits, work_files
from rlvr.sandbox.results import read_results
from rlvr.sandbox.uids import HOLDER_PROCESSES, give_uid, take_uid

POLL = (0.05, 0.25)  # the first and the longest wait between two looks at a running sandbox
START_WAIT = 30.0  # seconds bubblewrap may take to report the judge's pid
IDLE_SHARE = 0.05  # an interval whose tasks ran or waited for a CPU less than this share of it was waiting
STARVED_SHARE = 0.5  # an interval whose tasks waited for a CPU more than this share of it was starved
LAST_RESORT = 10  # x timeout: the plain wall clock after which a sandbox is stopped however starved
SCHEDSTAT = os.path.exists("/proc/self/schedstat")  # the kernel's per-task run and wait times (CONFIG_SCHED_INFO)


class SandboxError(launch.Unavailable):
    """The sandbox's machinery failed (not the program): its cgroup could not be made, take the judge or be
    read. Grading stops with this rather than scoring the program 0; a SandboxUnavailable, so that a command
    stops with its one line as it does where the sandbox cannot be had at all."""


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


def _hold(proc: subprocess.Popen, info_fd: int, block_fd: int, group) -> _Judge | None:
    """Read the judge's pid from bubblewrap, open a pidfd on it, put it in its cgroup, then let it run. None
    where bubblewrap did not get that far (its status and stderr then say why); SandboxError where rlvr could
    not hold it or put it in its group."""
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
            return None
        judge = _Judge(pid, os.pidfd_open(pid))
        if _parent(pid) != proc.pid:  # held by bubblewrap, so this cannot happen; refuse rather than guess
            judge.close()
            raise SandboxError("the sandbox's judge is not bubblewrap's child")
        if group is not None:
            try:
                group.add(pid)
            except OSError as err:
                judge.kill()
                judge.gone(5.0)
                judge.close()
                raise SandboxError(f"could not put the sandbox in its cgroup ({err})") from None
        os.write(block_fd, b"1")
        return judge
    except OSError as err:
        raise SandboxError(f"could not hold the sandbox's judge ({err})") from None
    finally:
        os.close(block_fd)


class Meter:
    """What `_watch` looks at (see the module docstring); `look()` says why to stop, or None."""

    def __init__(self, limits: SandboxLimits, group, judge_pid: int, isolated: bool):
        self.limits, self.group, self.judge_pid, self.isolated = limits, group, judge_pid, isolated
        self.clock = None if group is not None else TreeClock(judge_pid)
        self.seen: dict[int, tuple[int, int]] = {}
        self.last = time.monotonic()
        self.waited = self.active = 0.0
        self.why = ""

    def look(self) -> str | None:
        now = time.monotonic()
        interval, self.last = now - self.last, now
        if self.group is not None:
            try:
                total, tids = self.group.cpu_seconds(), self.group.tasks()
            except (OSError, ValueError) as err:
                raise SandboxError(f"could not read the sandbox's cgroup ({err})") from None
        else:
            pids, total = self.clock.read()
            tids = tasks_of(pids)
            if len(pids) > self.limits.processes:  # threads aside, as a cgroup's memory limit would bound them
                self.why = f"more than {self.limits.processes} processes (only a cgroup would bound their memory)"
                return "memory"
        judge = own_cpu_seconds(self.judge_pid)
        if total - judge > self.limits.cpu_seconds:
            self.why = "cpu time limit"
            return "cpu"
        if judge > self.limits.judge_cpu_seconds():
            self.why = "the judge's CPU time limit (the tests' own work and reading the program's values)"
            return "cpu"
        if self.isolated and self._files() > work_files(self.limits):
            self.why = "over the sandbox's file limit (one per KB of its tmpfs)"
            return "memory"
        now_seen = schedstats(tids) if SCHEDSTAT else {}
        if not now_seen:  # no kernel scheduler statistics (or no task seen): the plain wall clock only
            self.active += interval
            if self.active > self.limits.timeout:
                self.why = "wall-clock limit"
                return "timeout"
            return None
        ran = waited_for_cpu = 0
        for tid, (cpu, delay) in now_seen.items():
            before = self.seen.get(tid, (0, 0))
            ran += max(0, cpu - before[0])
            waited_for_cpu += max(0, delay - before[1])
        self.seen = now_seen
        if ran + waited_for_cpu < IDLE_SHARE * interval * 1e9:
            self.waited += interval
            if self.waited > self.limits.waits():
                self.why = f"waited {self.waited:.1f} s without computing"
                return "waiting"
        if waited_for_cpu < STARVED_SHARE * interval * 1e9:
            self.active += interval
            if self.active > self.limits.timeout:
                self.why = "wall-clock limit"
                return "timeout"
        return None

    def _files(self) -> int:
        size = int(self.limits.file_mb)
        try:
            return files_in(self.judge_pid, "/work", 2 * size) + files_in(self.judge_pid, "/dev/shm", size)
        except OSError:  # the judge has just ended
            return 0


def _watch(done: threading.Thread, limits: SandboxLimits, meter: Meter) -> str | None:
    """Wait for the result pipe to close; what the meter says first, or "timeout" at the last resort. A program
    that ends within the first poll is never looked at."""
    end = time.monotonic() + LAST_RESORT * limits.timeout
    step = POLL[0]
    while True:
        left = end - time.monotonic()
        if left <= 0:
            meter.why = "wall-clock limit (the machine starved it)"
            return "timeout"
        done.join(timeout=min(step, left))
        if not done.is_alive():
            return None
        why = meter.look()
        if why:
            return why
        step = min(POLL[1], 2 * step)


def _payload(job: Job, limits: SandboxLimits, holder: bool) -> dict:
    tasks = int(limits.processes + limits.threads) + (HOLDER_PROCESSES if holder else 0)
    return {"program": job.program, "module": job.module, "runner": job.runner, "source": job.source,
            "cases": [list(case) for case in job.cases], "compare": job.compare, "bind": dict(job.bind),
            "patches": job.patches, "forward": list(job.forward), "checks": [dataclasses.asdict(c) for c in job.checks],
            # the judge's own last resort (the host stops it first), far past any starved honest program
            "deadline": LAST_RESORT * limits.timeout + 5,
            # each process's own RLIMIT_CPU: a backstop under the sandbox's clock, which counts them all
            "limits": {"cpu_seconds": max(1, math.ceil(limits.cpu_seconds)), "memory_mb": int(limits.memory_mb),
                       "file_mb": int(limits.file_mb), "tasks": tasks, "output_kb": int(limits.output_kb)}}


def _crashed(job: Job, start: float, why: str) -> ProgramResult:
    n = len(job.checks)
    return ProgramResult("crashed", [None] * n, [None] * n, time.perf_counter() - start, error=why,
                         outcomes=[None] * n, reasons=[""] * n)


def run(job: Job, limits: SandboxLimits, mode: str, checks: int | None = None) -> ProgramResult:
    """Run one program and its checks in a fresh sandbox (no isolation check: `rlvr.sandbox.run_program`
    makes it); never raises for anything the program does. `checks`: how many the caller expects (a runner
    that counts them itself says so)."""
    start = time.perf_counter()
    launch.precompile()
    root, isolated = os.geteuid() == 0, mode == "bwrap"
    payload = _payload(job, limits, root and isolated)
    n = len(job.checks) if checks is None else checks
    uid = take_uid() if root and isolated else None
    try:
        group = cgroups.create(limits) if isolated else None
    except OSError as err:
        if uid is not None:
            give_uid(uid)
        raise SandboxError(f"could not make the sandbox's cgroup ({err})") from None
    work, info_fd, block_fd, opened = None, -1, -1, []
    try:
        read_fd, write_fd = os.pipe()
        opened += [read_fd, write_fd]
        if not isolated and not root:  # RLIMIT_NPROC counts every process of this user, not only the sandbox's
            payload["limits"]["tasks"] += user_processes()
        job_fd = launch.data_fd(json.dumps(payload).encode("utf-8", "surrogatepass"), "rlvr-job")
        opened.append(job_fd)
        passed = [write_fd, job_fd]
        if isolated:
            seccomp_fd = launch.data_fd(launch.seccomp_filter(), "rlvr-seccomp")
            opened.append(seccomp_fd)
            cpus_fd = launch.data_fd(f"0-{launch.cpus_shown(limits.processes) - 1}\n".encode(), "rlvr-cpus")
            opened.append(cpus_fd)
            info_fd, info_w = os.pipe()
            block_r, block_fd = os.pipe()
            opened += [info_w, block_r]
            passed += [seccomp_fd, cpus_fd, info_w, block_r]
            argv = launch.bwrap_argv(root, 2 * int(limits.file_mb), int(limits.file_mb), seccomp_fd, cpus_fd, info_w,
                                     block_r)
            argv += [*launch.python_flags(), *launch.boot(True), str(write_fd), str(job_fd), "bwrap",
                     str(uid) if uid is not None else "-"]
            env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, "/"
        else:
            work = tempfile.mkdtemp(prefix="rlvr-sandbox-")
            binary, _ = launch.interpreter()
            argv = [binary, *launch.python_flags(), *launch.boot(False), str(write_fd), str(job_fd), "limits", "-"]
            env = {**dict(launch.ENVIRONMENT), "HOME": work, "TMPDIR": work}
            cwd = work
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=passed, env=env, cwd=cwd, start_new_session=True)
    except OSError as err:
        for fd in opened + [info_fd, block_fd]:
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        _release(None, group, uid, work)
        raise SandboxError(f"could not start a sandbox ({err})") from None
    for fd in opened:
        if fd != read_fd:
            os.close(fd)
    try:
        judge = _hold(proc, info_fd, block_fd, group) if isolated else _Judge(proc.pid, os.pidfd_open(proc.pid))
    except SandboxError:
        _stop(proc, None, isolated)
        proc.wait()
        os.close(read_fd)
        _release(None, group, uid, work)
        raise
    return _finish(job, limits, proc, judge, read_fd, group, uid, work, isolated, start, n)


def _finish(job, limits, proc, judge, read_fd, group, uid, work, isolated, start, n) -> ProgramResult:
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
    killed, meter = None, None
    try:
        if judge is not None:
            meter = Meter(limits, group, judge.pid, isolated)
            killed = _watch(readers[0], limits, meter)
    finally:
        if killed or judge is None or not isolated:  # limits_only: what the program left, too
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
    return read_results(b"".join(results), b"".join(stderr), proc.returncode, killed, n,
                        time.perf_counter() - start, meter.why if meter is not None and killed != "memory" else "")


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

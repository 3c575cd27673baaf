"""Inside the sandbox: the judge and the program, two processes joined by two pipes.

    python -S -s -P -B -c <rlvr.sandbox.launch.BOOT> <result fd> <job fd> <mode> <uid | ->

The judge is trusted and holds everything that decides a verdict: the tests (read from the job's file
descriptor, a memfd, only after the program's process has been forked off and has closed it, so they are never
in its memory), the result pipe to rlvr, and the namespace the test code runs in. The program's process holds
only its own pipe pair. The test code calls the program's functions through `Remote` handles; values cross as
data and are rebuilt by each side's own code (`wire`), so every value a test compares is the judge's own object:
a program that patches `assert`, `==`, `json`, `sys.exit` or the harness, returns an object equal to everything,
or writes records to any file descriptor only changes what its own functions return. Whatever the program
writes, the judge reads it with size limits and turns anything unexpected into an error of that call.

Under bubblewrap the judge is PID 1 of the sandbox's PID namespace: the kernel delivers it no signal from the
program other than those it has a handler for (only SIGALRM, its own deadline), and when it exits every
process left in the namespace dies with it. It is not dumpable, so the program cannot open its /proc files or
memory (ptrace and process_vm_* are refused by seccomp as well). With `limits_only` the two processes are
plain processes of the same user: the program could signal or trace the judge (see rlvr.sandbox).

Steps, in order:
  1. (rlvr started as root) empty the capability bounding set, drop to the sandbox's own uid: no capability
     is left in any set; the parent-death signal is armed again (a uid change clears it).
  2. not dumpable; a deadline (SIGALRM) after which the judge exits whatever the program does
  3. fork: the child becomes the program's process; it closes the job, stdin and the result pipe at once
  4. judge: read the job, send the program and its limits to the child, bind its names, run the runner
     (`runners`, `pytest_runner`), report each check's outcome
  5. program (`program`): resource limits, load the program, answer the judge's requests until told to stop
"""

import ctypes
import json
import os
import resource
import select
import signal
import sys

from . import judge as judging
from . import program, runners, wire

PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
JOB_CAP = 64 << 20


def _drop_to(uid: int):
    """Step 1 (rlvr started as root; bubblewrap gave us only CAP_SETUID, CAP_SETGID and CAP_SETPCAP)."""
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in range(64):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # the uid change emptied the permitted and effective sets; the inheritable one is emptied here (capset)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    libc.capset(header, (ctypes.c_uint32 * 6)())
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    with open("/proc/self/status") as f:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in f if line.startswith("Cap"))}
    if any(int(value, 16) for value in caps.values()) or os.getuid() != uid:
        raise SystemExit(f"the sandbox could not drop its privileges: {caps}")


def _read_job(fd: int) -> dict:
    data = b""
    while len(data) <= JOB_CAP:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            break
        data += chunk
    os.close(fd)
    return json.loads(data.decode("utf-8", "surrogatepass"))


def judge_main(job: dict, results: wire.Pipe, judge: judging.Judge) -> bool:
    """Load the program, bind its names, run the job's runner; True when the runner ran."""
    write = results.send
    write({"ready": True})
    runner = job.get("runner", "script")
    request = {"program": job["program"], "module": job["module"], "limits": job["limits"], "runner": runner,
               "forward": job.get("forward", [])}
    if not judge.peer.pipe.send(request):
        write({"load": "died"})
        return False
    if runner == "pytest":  # while the program loads
        import pytest  # noqa: F401
    loaded = judge.peer.pipe.receive()
    if not isinstance(loaded, dict) or loaded.get("load") not in ("ok", "syntax_error", "error"):
        write({"load": "died"})
        if loaded is not None or judge.peer.pipe.broken:  # alive but talking garbage: stop it now
            try:
                judge.peer.fail(judge.peer.pipe.broken or "a malformed reply")
            except wire.Gone:
                pass
        return False
    judge.echo(loaded)
    if loaded["load"] != "ok":
        write({"load": loaded["load"], "error": str(loaded.get("error", ""))[:100]})
        return False
    write({"load": "ok"})
    report = runners.Report(results)
    if runner == "stdio":
        runners.run_stdio(job, judge, report)
        return True
    solution, names = judging.program_module(judge, loaded, job["module"])
    namespace = {"__builtins__": __builtins__, "__name__": "__main__" if runner == "script" else runners.TEST_MODULE}
    if runner == "script":
        namespace["__rlvr_bind__"] = lambda **bound: judging.bind(namespace, solution, names, job["module"], **bound)
        namespace["__rlvr_gave__"] = runners.gave
        judging.bind(namespace, solution, names, job["module"])
    else:
        try:
            judging.bind(namespace, solution, names, job["module"], **job.get("bind", {}))
        except BaseException as err:  # the program lacks the entry point: every check fails
            report.count(1)
            report.check(0, "error", err)
            return True
    if job.get("patches"):
        from . import patches

        judge.patches = patches.Patches()
        patches.install(judge.patches)
    if runner == "script":
        runners.run_script(job, namespace, report)
    elif runner == "unittest":
        runners.run_unittest(job, namespace, report)
    else:
        from .pytest_runner import run_pytest

        run_pytest(job, namespace, report)
    for what in dict.fromkeys(judge.uncrossable[:20]):
        write({"uncrossable": what[:300]})
    return True


def main(argv: list[str]):
    result_fd, job_fd, mode, uid = int(argv[0]), int(argv[1]), argv[2], argv[3]
    if uid != "-":
        _drop_to(int(uid))
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)  # as PID 1 of a namespace, a default action is never taken
    signal.signal(signal.SIGALRM, lambda *_: os._exit(3))
    child_reads, judge_writes = os.pipe()
    judge_reads, child_writes = os.pipe()
    pid = os.fork()
    if pid == 0:  # the program's process: nothing of the judge's stays open
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        for fd in (null, result_fd, job_fd, judge_reads, judge_writes):
            os.close(fd)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        program.main(wire.Pipe(child_reads, child_writes))
        os._exit(0)
    os.close(child_reads)
    os.close(child_writes)
    job = _read_job(job_fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    signal.alarm(int(job["deadline"]) + 1)
    judge_limit = (job["limits"]["memory_mb"] + 256) << 20  # room to decode a large value
    resource.setrlimit(resource.RLIMIT_AS, (judge_limit, judge_limit))
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 3000))
    death = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None
    results = wire.Pipe(-1, result_fd)
    judge = judging.Judge(wire.Pipe(judge_reads, judge_writes, death), pid)
    try:
        ran = judge_main(job, results, judge)
    except BaseException as err:  # a bug of ours, not the program's: say so
        results.send({"internal": f"{type(err).__name__}: {err}"[:300]})
        ran = False
    sys.stdout.flush()
    # how the program ended, if it did before the end (a CPU-limit kill is a timeout, not a crash); its pipe
    # closes a moment before it can be waited for
    if death is not None and (judge.gone or not ran):
        select.select([death], [], [], 2.0)
    if judge.gone and judge.killed:
        results.send({"broken": judge.gone})  # the judge's own SIGKILL, not a CPU limit
    ended, status = os.waitpid(pid, os.WNOHANG)
    if ended:
        signaled = os.WIFSIGNALED(status)
        results.send({"exit": os.WTERMSIG(status) if signaled else os.WEXITSTATUS(status), "signaled": signaled})
    if ran:
        results.send({"done": True})
    os._exit(0)

"""Programs that attack the sandbox's bounds (issue 58): memory no rlimit counts, the CPU and process slots of
the programs graded beside them, and what a sandbox leaves behind.

Standard library and rlvr's stdlib-only sandbox modules only: `tests/test_sandbox_resources.py` starts this
file as a grader process of its own, as root and as uid 65534, each time in a fresh memory cgroup that
measures its peak (the grader, bubblewrap and every sandbox below it):

    python3 sandbox_resource_attacks.py SCENARIO SETTINGS.json     # prints one JSON line
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import textwrap
import time

HOLD_MB = 2048  # what each memory attack tries to hold: well past one sandbox's whole budget
# ~0.5 s of CPU in a child process, then the right answer: an honest program that a starved neighbour pushes
# past a wall clock, or one that shares its uid takes its process slot from
HONEST = textwrap.dedent("""
    import os
    def work(n):  # in a child process, as a program using multiprocessing does: it needs a process slot
        read, write = os.pipe()
        if os.fork() == 0:
            total = 0
            for i in range(n):
                total += i * i % 7
            os.write(write, str(total).encode())
            os._exit(0)
        os.close(write)
        answer = os.read(read, 100)
        os.wait()
        return int(answer)
    """)
HONEST_N = 12_000_000


def honest_answer(n: int = HONEST_N) -> int:
    return sum(i * i % 7 for i in range(n))


def memory_attacks() -> dict[str, str]:
    """name -> program; each defines held() -> the MB it holds outside its address-space limit, after holding
    it for a second (so that the sandboxes running at once hold theirs at the same time)."""
    hold = HOLD_MB
    return {
        "sysv_shared_memory": f"""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.shmat.restype = ctypes.c_void_p
            mb = 0
            while mb < {hold}:
                seg = libc.shmget(0, 64 << 20, 0o1600)
                if seg < 0:
                    break
                addr = libc.shmat(seg, None, 0)
                if addr in (None, ctypes.c_void_p(-1).value):
                    break
                ctypes.memset(addr, 1, 64 << 20)
                libc.shmdt(ctypes.c_void_p(addr))  # detached: the pages belong to no process now
                mb += 64
            def held():
                return mb""",
        "sysv_message_queues": """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            message = ctypes.create_string_buffer(8 + 8000)
            message[0] = 1
            sent = 0
            for _ in range(32000):
                q = libc.msgget(0, 0o1600)
                if q < 0:
                    break
                while libc.msgsnd(q, message, 8000, 0o4000) == 0:  # IPC_NOWAIT
                    sent += 8000
            def held():
                return sent >> 20""",
        "posix_message_queues": """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            opened = 0
            for i in range(2000):
                if libc.mq_open(("/q%d" % i).encode(), 0o102, 0o600, None) < 0:
                    break
                opened += 1
            def held():
                return opened * 80 >> 10""",
        "memfd_files": f"""
            import os
            chunk, mb = b"x" * (1 << 20), 0
            for _ in range(60):  # each up to the file size limit
                try:
                    fd = os.memfd_create("hold")
                    while mb < {hold}:
                        os.write(fd, chunk)
                        mb += 1
                except OSError:
                    pass
            def held():
                return mb""",
        "tmpfs_files": f"""
            import os
            chunk, mb = b"x" * (1 << 20), 0
            for path in ("/work/a", "/work/b", "/dev/shm/c", "/tmp/d"):
                try:
                    with open(path, "wb") as f:
                        while mb < {hold}:
                            f.write(chunk)
                            mb += 1
                except OSError:
                    pass
            def held():
                return mb""",
        "tmpfs_inodes": """
            import os, time
            made, end = 0, time.time() + 3
            try:
                while time.time() < end:
                    for _ in range(1000):
                        os.close(os.open("/work/%d" % made, os.O_CREAT | os.O_WRONLY))
                        made += 1
            except OSError:
                pass
            def held():
                return made >> 10  # about 1 KB of kernel memory each""",
        "big_pipes_in_children": """
            import fcntl, os
            def fill():
                mb = 0
                for _ in range(30):
                    try:
                        r, w = os.pipe()
                    except OSError:
                        break
                    try:
                        fcntl.fcntl(w, 1031, 1 << 20)  # F_SETPIPE_SZ
                    except OSError:
                        pass
                    os.set_blocking(w, False)
                    try:
                        while True:
                            mb += os.write(w, b"x" * 65536) / (1 << 20)
                    except OSError:
                        pass
                return int(mb)
            mb = fill()
            for _ in range(2):
                if os.fork() == 0:
                    fill()
                    import time
                    time.sleep(30)
            def held():
                return mb * 3""",
        "loopback_socket_buffers": """
            import socket
            mb, keep = 0, []
            try:
                server = socket.socket()
                server.bind(("127.0.0.1", 0))
                server.listen(64)
                for _ in range(20):
                    a = socket.create_connection(server.getsockname())
                    b = server.accept()[0]
                    keep += [a, b]
                    a.setblocking(False)
                    try:
                        while True:
                            mb += a.send(b"x" * 65536) / (1 << 20)
                    except OSError:
                        pass
            except OSError:
                pass
            def held():
                return int(mb)""",
        # allowed (asyncio's self-pipe, multiprocessing.Pipe), at their default buffers: bounded by the fds
        "unix_socketpair_buffers": """
            import os, socket
            def fill():
                mb, keep = 0, []
                for _ in range(40):
                    try:
                        a, b = socket.socketpair()
                    except OSError:
                        break
                    keep.append((a, b))
                    for side in (a, b):
                        try:
                            side.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)
                        except OSError:
                            pass
                        side.setblocking(False)
                        try:
                            while True:
                                mb += side.send(b"x" * 65536) / (1 << 20)
                        except OSError:
                            pass
                return keep, mb
            kept, mb = fill()
            for _ in range(2):
                try:
                    if os.fork() == 0:
                        kept = fill()
                        import time
                        time.sleep(30)
                except OSError:
                    break
            def held():
                return int(mb * 3)""",
        "posix_timers": """
            import ctypes, time
            libc = ctypes.CDLL(None, use_errno=True)
            timer, made, end = ctypes.c_void_p(), 0, time.time() + 3
            while time.time() < end and libc.timer_create(1, None, ctypes.byref(timer)) == 0:
                made += 1
            def held():
                return made >> 12  # about 256 bytes each""",
        # a host-wide pool (fs.aio-max-nr) and a per-user count (fs.inotify.max_user_instances) the grader shares
        "aio_contexts": """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            made = 0
            for _ in range(4096):
                context = ctypes.c_ulong(0)
                if libc.syscall(206, 256, ctypes.byref(context)) != 0:  # io_setup
                    break
                made += 1
            def held():
                return made""",
        "inotify_instances": """
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            made = 0
            for _ in range(1024):
                if libc.inotify_init1(0) < 0:
                    break
                made += 1
            def held():
                return made""",
        "every_process_at_its_limit": """
            import os, time
            def grab():
                blocks = []
                try:
                    while True:
                        blocks.append(bytearray(8 << 20))
                except MemoryError:
                    pass
                return len(blocks) * 8
            for _ in range(8):
                try:
                    if os.fork() == 0:
                        grab()
                        time.sleep(30)
                except OSError:
                    break
            mb = grab()
            def held():
                return mb""",
    }


def neighbour_attacks() -> dict[str, str]:
    """Programs that take the CPU or the process slots of whatever is graded beside them."""
    return {
        "fork_bomb": """
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass""",
        "setsid_spinners": """
            import os
            for _ in range(16):
                try:
                    if os.fork() == 0:
                        try:
                            os.setsid()  # a session of its own: its own scheduler group, beyond killpg
                        except OSError:
                            pass
                        while True:
                            pass
                except OSError:
                    pass
            while True:
                pass""",
        "spinning_threads": """
            import threading
            def spin():
                while True:
                    pass
            for _ in range(16):
                try:
                    threading.Thread(target=spin, daemon=True).start()
                except RuntimeError:
                    pass
            spin()""",
    }


# holds as many pipes as its processes may open: empty pipes, each 16 pages of the user's pipe budget
# (fs.pipe-user-pages-soft); past that budget every new pipe of the user (the grader's too) gets the minimum
PIPE_HOG = """
import os, time
held = []
def grab():
    try:
        while True:
            held.append(os.pipe())
    except OSError:
        pass
for _ in range({children}):
    try:
        if os.fork() == 0:
            grab()
            time.sleep(30)
            os._exit(0)
    except OSError:
        break
grab()
time.sleep(30)
"""
# an honest program that waits a moment (the hogs take their pipes), then sends the judge 200 KB and reports how
# large a new pipe of its own is (the kernel's minimum, two pages, once the user's pipe budget is spent)
PIPE_HONEST = """
import fcntl, os, time
time.sleep(1)
def big():
    read, write = os.pipe()
    size = fcntl.fcntl(write, 1032)  # F_GETPIPE_SZ
    os.close(read)
    os.close(write)
    return size, "x" * 200_000
"""


def _limits(s: dict):
    from rlvr.sandbox.records import SandboxLimits

    return SandboxLimits(**s["limits"])


def _dedent(program: str) -> str:
    return textwrap.dedent(program).strip() + "\n"


def memory(s: dict) -> dict:
    """Every memory attack at once, `workers` sandboxes at a time."""
    from rlvr.sandbox import Check, Job, bounds, configure, run_programs

    configure("bwrap", workers=s["workers"], limits=_limits(s))
    table = memory_attacks()
    # the first `workers` run at once: two of the largest, so that together they try to hold 4 GB and more
    names = ["sysv_shared_memory", "sysv_shared_memory_2", "sysv_message_queues", "memfd_files"]
    names += [n for n in table if n not in names]
    hold = "\nimport time as _time\n_time.sleep(1)\n"  # at load: past it, what a sandbox holds is its peak
    results = run_programs([Job(_dedent(table[n.removesuffix("_2")]) + hold, (Check("held()"),)) for n in names])
    return {"bounds": bounds(), "attacks": {n: {"status": r.status, "held": r.values[0], "error": r.error}
                                            for n, r in zip(names, results)}}


def neighbours(s: dict) -> dict:
    """`attack`: the neighbour attacks (the first `workers` jobs, so that they run at once), then honest
    programs; else honest programs only, started `delay` seconds after the other grader's attacks."""
    from rlvr.sandbox import Check, Job, configure, run_programs

    configure("bwrap", workers=s["workers"], limits=_limits(s))
    if s["attack"] == "spin":  # plain spinners, one process each: `spinners` sandboxes of CPU wanted at once
        names = [f"spinner_{i}" for i in range(s["spinners"])]
        jobs = [Job("while True:\n    pass\n", (Check("1"),))] * s["spinners"]
    else:
        table = neighbour_attacks() if s["attack"] else {}
        names = [*table, "setsid_spinners_2"][:s["workers"]] if table else []
        jobs = [Job(_dedent(table[name.removesuffix("_2")]), (Check("1"),)) for name in names]
    n = s.get("n", HONEST_N)
    names += [f"honest_{i}" for i in range(s["honest"])]
    jobs += [Job(_dedent(HONEST), (Check(f"work({n})"),))] * s["honest"]
    if s.get("ready"):  # start together with the other grader process
        open(s["ready"], "w").close()
        while len(os.listdir(os.path.dirname(s["ready"]))) < 2:
            time.sleep(0.01)
    time.sleep(s.get("delay", 0))
    start = time.perf_counter()
    results = run_programs(jobs)
    from rlvr.sandbox.uids import held_uids

    return {"seconds": time.perf_counter() - start, "uids": held_uids(),
            "results": {n: {"status": r.status, "value": r.values[0], "seconds": r.seconds, "error": r.error}
                        for n, r in zip(names, results)}}


def leftovers(s: dict) -> dict:
    """As a container's PID 1 is (a subreaper: orphans come to it), time out programs that leave processes
    behind; then, at once, list what is left: any process below this one (a zombie child included), and any
    process of a sandbox uid this grader holds (root)."""
    from rlvr.sandbox import Check, Job, configure, run_programs
    from rlvr.sandbox.uids import held_uids, holder_pids

    ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    configure("bwrap", workers=s["workers"], limits=_limits(s))
    table = {**neighbour_attacks(), "sleeper": "import time\ntime.sleep(60)"}
    results = run_programs([Job(_dedent(p), (Check("1"),)) for p in table.values()])
    uids, parents, by_uid, holders = set(held_uids()), {}, [], set(holder_pids())
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                data = open(f"/proc/{entry.name}/stat", "rb").read()
                fields = data[data.rindex(b")") + 2:].split()
                parents[int(entry.name)] = (int(fields[1]), fields[0].decode())
                if entry.stat().st_uid in uids and int(entry.name) not in holders:  # a holder is its uid's, by design
                    by_uid.append(int(entry.name))
            except (OSError, ValueError):
                pass
    below = []
    for pid in set(parents) - holders:  # the uids' holders are this grader's children by design
        up = pid
        while up in parents and up > 1:
            up = parents[up][0]
            if up == os.getpid():
                below.append((pid, parents[pid][1]))
                break
    return {"statuses": {n: r.status for n, r in zip(table, results)}, "below": below, "uids": sorted(uids),
            "sandbox_uid_processes": by_uid}


def refused(s: dict) -> dict:
    """With `bwrap` on PATH a launcher that isolates nothing: what every public entry that runs a program does."""
    from rlvr.grading.code import grade_programs
    from rlvr.sandbox import Check, Job, SandboxUnavailable, run_program, run_programs
    from rlvr.tasks.code import code_answer

    calls = {"run_program": lambda: run_program(Job("def f():\n    return 1\n", (Check("f()"),))),
             "run_programs": lambda: run_programs([Job("def f():\n    return 1\n", (Check("f()"),))]),
             "grade_programs": lambda: grade_programs(["def f():\n    return 1\n"], [code_answer(["assert f() == 1"], "f")])}
    out = {}
    for name, call in calls.items():
        try:
            out[name] = f"ran: {call()}"
        except SandboxUnavailable as err:
            out[name] = f"refused: {err}"
    return out


def pipes(s: dict) -> dict:
    """Sandboxes that spend the user's pipe pages, then honest ones beside them; every honest one must get its
    answer (before issue 64, a pipe written before bubblewrap read it blocked the grader forever)."""
    from rlvr.sandbox import Check, Job, configure, run_programs

    configure("bwrap", workers=s["workers"], limits=_limits(s))
    hog = PIPE_HOG.format(children=s["limits"]["processes"] - 3)
    jobs = [Job(hog, (Check("1"),))] * s["hogs"] + [Job(PIPE_HONEST, (Check("big()"),))] * s["honest"]
    results = run_programs(jobs)
    return {"statuses": [r.status for r in results], "values": [r.values[0] for r in results[s["hogs"]:]],
            "errors": [r.error for r in results]}


def waiting(s: dict) -> dict:
    """Programs that wait without computing: each is stopped at the waiting bound, not the wall-clock cap."""
    from rlvr.sandbox import Check, Job, configure, run_programs

    configure("bwrap", workers=s["workers"], limits=_limits(s))
    table = {"sleeper": "import time\ntime.sleep(60)",
             "deadlock": "import threading\na, b = threading.Lock(), threading.Lock()\na.acquire()\nb.acquire()\n"
                         "threading.Thread(target=lambda: (b.acquire(), a.release())).start()\na.acquire()",
             "event": "def f():\n    import threading\n    threading.Event().wait()\n",
             "sleeping_child": "import os, time\nif os.fork() == 0:\n    time.sleep(60)\n    os._exit(0)\nos.wait()"}
    results = run_programs([Job(p, (Check("f()" if name == "event" else "1"),)) for name, p in table.items()])
    return {name: {"status": r.status, "error": r.error} for name, r in zip(table, results)}


def weaker(s: dict) -> dict:
    """A grader that sees /sys/fs/cgroup read-only (Docker's default): it grades, in the weaker mode, and says so
    in the log and in the counts every grading metric reports (`grading/code_<count>`: rlvr.tasks.reward_base)."""
    import logging

    from rlvr.grading.code import grade_programs
    from rlvr.sandbox import bounds, configure, sandbox_stats
    from rlvr.tasks.code import code_answer

    seen: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    logging.getLogger("rlvr.sandbox").addHandler(Keep())
    logging.getLogger("rlvr.sandbox").setLevel(logging.INFO)
    configure("bwrap", limits=_limits(s))
    before = sandbox_stats()
    verdicts = grade_programs(["def f(x):\n    return x", "def f(x):\n    return -x"],
                              [code_answer(["assert f(2) == 2"], "f")] * 2)
    after = sandbox_stats()
    return {"bounds": bounds(), "log": seen, "verdicts": [list(v) for v in verdicts],
            "counts": {k: after[k] - before[k] for k in after}}


def uids(s: dict) -> dict:
    """Hold `n` sandbox uids for a moment, as a grader running that many sandboxes does."""
    from rlvr.sandbox.uids import take_uid

    held = [take_uid() for _ in range(s["n"])]
    open(s["ready"], "w").close()
    while len(os.listdir(os.path.dirname(s["ready"]))) < 2:
        time.sleep(0.01)
    return {"uids": held}


if __name__ == "__main__":
    settings = json.loads(open(sys.argv[2]).read())
    print(json.dumps({"memory": memory, "neighbours": neighbours, "leftovers": leftovers, "refused": refused,
                      "uids": uids, "pipes": pipes, "waiting": waiting, "weaker": weaker}[sys.argv[1]](settings)))

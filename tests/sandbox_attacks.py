"""Programs written to break out of the code sandbox, crash the trainer or forge a passing verdict.

Standard library and rlvr's stdlib-only grading modules only: `tests/test_sandbox.py` runs this batch in the
test process (as root in CI) and again as an unprivileged user, in a Debian Python started under
`setpriv --reuid=65534` (`python3 sandbox_attacks.py TARGETS.json` prints what every attack scored).

Each attack's tests pass only if the attack works, so every one must pass no test; what it would have damaged
is checked by the caller.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time


def attacks(t: dict) -> dict[str, tuple[str, list[str]]]:
    """name -> (program, tests). `t` names the targets (see test_sandbox.targets)."""
    run, data, canary, port, unix = t["run_dir"], t["dataset"], t["canary"], t["port"], t["unix_socket"]
    forged = [json.dumps({"check": i, "value": v}) for i in range(6) for v in ("None", "True", "1")]
    forged += [json.dumps({"load": "ok"}), json.dumps({"done": True}), json.dumps({"v": "2"}), "[" * 200_000]
    forge = textwrap.dedent(f"""
        import os
        LINES = {forged!r}
        def spray(spare_own_pipes=False):
            blob = ("\\n".join(LINES) + "\\n").encode()
            def own_pipe(fd):
                try:
                    return spare_own_pipes and fd > 2 and os.readlink("/proc/self/fd/%d" % fd).startswith("pipe:")
                except OSError:
                    return False
            fds = [fd for fd in range(256) if not own_pipe(fd)]
            paths = ["/proc/self/fd/%d" % fd for fd in fds] + ["/proc/1/fd/%d" % fd for fd in range(256)]
            paths += ["/proc/%d/fd/%d" % (os.getppid(), fd) for fd in range(256)]
            for fd in fds:
                try:
                    os.write(fd, blob)
                except OSError:
                    pass
            for path in paths:
                try:
                    with open(path, "wb", buffering=0) as f:
                        f.write(blob)
                except OSError:
                    pass
        """)
    every_style = ["def check(candidate):\n    assert candidate(1) == 2", "assert f(1) is None", "assert not f(1)",
                   "def test_f():\n    assert f(1) == 2", "assert f(1)", "assert f(1) == 2"]
    return {
        "infinite_loop": ("def f(x):\n    while True:\n        pass", ["assert f(1) == 1"]),
        "fork_bomb": ("""
            import os
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
            def f(x):
                return x""", ["assert f(1) == 1"]),
        "allocate_50_gb": ("block = bytearray(50 * 1024 ** 3)\ndef f(x):\n    return x", ["assert f(1) == 1"]),
        "write_10_gb_file": ("""
            import os
            wrote = 0
            for path in ["big.bin", "/tmp/rlvr-big.bin", os.path.expanduser("~/big.bin"), "/work/big2.bin"]:
                try:
                    with open(path, "wb") as fh:
                        for _ in range(10 * 1024):
                            fh.write(b"0" * (1 << 20))
                            wrote += 1
                except OSError:
                    pass
            def f():
                return wrote""", ["assert f() >= 10240"]),
        "delete_outside": (f"""
            import os, shutil
            deleted = 0
            for path in [{canary!r}, {run + "/metrics.jsonl"!r}, {run + "/checkpoints"!r}, {data!r}]:
                for remove in (os.remove, shutil.rmtree):
                    try:
                        remove(path)
                        deleted += 1
                    except OSError:
                        pass
            def f():
                return deleted""", ["assert f() >= 1"]),
        "network": (f"""
            import socket
            def f():
                s = socket.create_connection(("127.0.0.1", {port}), timeout=1)
                s.sendall(b"stolen")
                return 1""", ["assert f() == 1"]),
        "unix_socket": (f"""
            import socket
            def f():
                s = socket.socket(socket.AF_UNIX)
                s.connect({unix!r})
                s.sendall(b"stolen")
                return 1""", ["assert f() == 1"]),
        "read_secrets": (f"""
            import os
            found = {t["secret"]!r} in repr(dict(os.environ))
            for pid in ["self", "1", str(os.getppid()), "{t["pid"]}"]:
                try:
                    found = found or {t["secret"]!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read()
                except OSError:
                    pass
            def f():
                return found""", ["assert f() == True"]),
        "read_run_directory": (f"""
            def f():
                try:
                    return open({run + "/secret.txt"!r}).read()
                except OSError:
                    return ""
            """, [f"assert f() == {t['secret']!r}"]),
        "read_dataset": (f"""
            def f():
                try:
                    return {t["hidden"]!r} in open({data!r}).read()
                except OSError:
                    return False
            """, ["assert f() is True"]),
        "kill_parent": (f"""
            import os, signal
            killed = False
            for pid in [{t["pid"]}, os.getppid(), 1]:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed = killed or pid not in (0, 1)
                except OSError:
                    pass
            def f():
                return killed""", ["assert f() == True"]),
        "kill_everything": ("""
            import os, signal
            try:
                os.kill(-1, signal.SIGKILL)
                hit = True
            except OSError:
                hit = False
            def f():
                return hit""", ["assert f() == True"]),
        "ptrace_pid_1": ("""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            attached = libc.ptrace(16, 1, 0, 0) == 0  # PTRACE_ATTACH to the judge
            def f():
                return attached""", ["assert f() == True"]),
        "nested_user_namespace": ("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            made = libc.unshare(0x10000000) == 0  # CLONE_NEWUSER
            made = made or libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0) >= 0  # clone(CLONE_NEWUSER | SIGCHLD)
            def f():
                return made""", ["assert f() == True"]),
        "remount_read_write": ("""
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            done = 0
            for target in (b"/", b"/usr", b"/usr/lib"):
                done += libc.mount(None, target, None, 32 | 4096, None) == 0  # MS_REMOUNT | MS_BIND, read-write
            try:
                open("/usr/lib/rlvr-escaped", "w").write("x")
                done += 1
            except OSError:
                pass
            def f():
                return done""", ["assert f() >= 1"]),
        "umount_proc_and_home": ("""
            import ctypes, os
            libc = ctypes.CDLL(None, use_errno=True)
            gone = sum(libc.umount2(p, 2) == 0 for p in (b"/proc", b"/home", b"/work", b"/"))
            seen = os.path.isdir("/home") or sum(p.isdigit() for p in os.listdir("/proc")) > 20  # the host's processes
            def f():
                return gone + seen""", ["assert f() >= 1"]),
        "write_site_packages_and_sources": (f"""
            import os
            wrote = 0
            for path in [{t["site_packages"] + "/rlvr_escaped.pth"!r}, {t["sources"] + "/inside/harness.py"!r},
                         {t["sources"] + "/__init__.py"!r}]:
                try:
                    with open(path, "a") as fh:
                        fh.write("import os; os.system('echo pwned')\\n")
                    wrote += 1
                except OSError:
                    pass
            def f():
                return wrote""", ["assert f() >= 1"]),
        # the sandbox's own /dev/shm is writable (multiprocessing's semaphores); the host's must stay as it was
        # (the caller compares it), and nothing else outside /work may be written
        "write_dev_shm": ("""
            wrote = False
            for path in ("/dev/shm/rlvr-escaped", "/dev/rlvr-escaped", "/rlvr-escaped", "/tmp/rlvr-escaped"):
                try:
                    open(path, "w").write("x")
                    wrote = wrote or not path.startswith("/dev/shm/")
                except OSError:
                    pass
            def f():
                return wrote""", ["assert f() == True"]),
        "capabilities": ("""
            import os
            status = dict(l.split(":", 1) for l in open("/proc/self/status").read().splitlines())
            caps = sum(int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"))
            try:
                os.setuid(0)
                became_root = True
            except OSError:
                became_root = False
            def f():
                return caps != 0 or became_root or status["NoNewPrivs"].strip() != "1"
            """, ["assert f() == True"]),
        "print_1_gb": ("""
            import sys
            for _ in range(1024):
                sys.stdout.write("x" * (1 << 20))
            sys.stdout.flush()
            def f(x):
                return x""", ["assert f(1) == 1"]),
        "exit_before_tests": ("import sys\nsys.exit(0)\ndef f(x):\n    return x", ["assert f(1) == 1"]),
        "os_exit_before_tests": ("import os\nos._exit(0)\ndef f(x):\n    return x", ["assert f(1) == 1"]),
        "patch_the_harness": ("""
            import builtins, json, sys
            class Yes:
                def __eq__(self, other): return True
                def __ne__(self, other): return False
                def __bool__(self): return True
                def __repr__(self): return "823543"
            json.dumps = lambda *a, **k: '{"v": "823543"}'
            builtins.AssertionError = Exception
            builtins.isinstance = lambda *a: True
            for name in list(sys.modules):
                if "harness" in name or name == "__main__":
                    sys.modules[name].encode = lambda *a, **k: "823543"
            def f(x):
                return Yes()""", ["assert f(7) == 823543", "assert f(2) == 128", "assert f(3)", "assert f(4) == f(4)"]),
        "forge_verdicts_on_every_fd": (forge + "\nspray()\n", every_style),
        # the same, sparing the fds its own pipe to the judge is likely on, so that the checks do run
        # the same, sparing its own pipe to the judge, so that the checks do run (and find no `f`)
        "forge_verdicts_sparing_its_pipe": (forge + "\nspray(spare_own_pipes=True)\n", every_style),
        "forking_writer": (forge + textwrap.dedent("""
            if os.fork() == 0:
                import time
                end = time.time() + 3
                while time.time() < end:
                    spray()
                os._exit(0)
            time.sleep(0.05)
            def f(x):
                return x + 5
            """).replace("time.sleep", "__import__('time').sleep"), every_style),
        "deep_json_reply": ("""
            import os
            def f(x):
                for fd in range(3, 64):
                    try:
                        os.write(fd, b"[" * 200000 + b"\\n")
                    except OSError:
                        pass
                return 2""", ["assert f(1) == 3"]),
        "huge_reply": ("""
            import os
            def f(x):
                for fd in range(3, 64):
                    try:
                        os.write(fd, b'{"v": "' + b"9" * (64 << 20) + b'"}\\n')
                    except OSError:
                        pass
                return 2""", ["assert f(1) == 3"]),
        "shadow_builtins": ("""
            def len(x):
                return 3
            def isinstance(*a):
                return True
            def sorted(x):
                return [1, 2, 3]
            def f(x):
                return []""", ["assert len(f(1)) == 3", "assert isinstance(f(1), int)", "assert sorted(f(1)) == [1, 2, 3]"]),
        "patched_module": ("""
            import math
            math.isclose = lambda *a, **k: True
            math.sqrt = lambda x: 3.0
            def r(x):
                return -1.0""", ["assert math.isclose(r(4), 2.0)", "assert math.sqrt(4) == r(1) + 4"], "r"),
        "object_truth_and_equality": ("""
            class Everything:
                def __eq__(self, other): return True
                def __bool__(self): return True
                def __len__(self): return 1
                def __contains__(self, x): return True
            def f(x):
                return Everything()""", ["assert f(1)", "assert f(1) == [1, 2]", "assert f(1) == f(1)",
                                          "assert [1, 2] == f(1)", "assert len([f(1)]) == 1 and f(1) == 5"]),
        "never_returns_control": ("""
            import signal, time
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_IGN)
            while True:
                try:
                    time.sleep(1000)
                except BaseException:
                    pass""", ["assert f(1) == 1"]),
        "detached_survivor": (f"""
            import os, time
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(8)
                    open({t["survivor"]!r}, "w").write("alive")
                os._exit(0)
            def f():
                return 1
            while True:
                pass""", ["assert f() == 1"]),
    }


# Colliding hashes: every multiple of 2**61 - 1 hashes to 0, so a set of them costs quadratic time to build.
# The judge builds this one (inside the sandbox's limits); the trainer must not.
COLLIDING = 8000
_colliding = ", ".join(str(i * (2**61 - 1)) for i in range(1, COLLIDING + 1))


def judge_attacks() -> dict[str, tuple]:
    """Attacks on how the tests are run (issue 58): name -> (program, tests, entry point, checks a wrong
    program passes honestly). Each passes exactly its honest checks, and so never scores."""
    everything = textwrap.dedent("""
        class Everything:
            def __eq__(self, other): return True
            def __ne__(self, other): return False
            def __hash__(self): return 3
            def __bool__(self): return True
            def __len__(self): return 1
            def __contains__(self, x): return True
            def __iter__(self): return iter([])
            def __lt__(self, other): return True
            def __gt__(self, other): return True
            def __index__(self): return 3
        """)
    return {
        # statements after the last check (a loop of asserts, a helper called at the end) ran nowhere
        "checks_after_the_last_assert": ("def square(x):\n    return 0",
                                         ["assert square(0) == 0\nfor x in range(1, 4):\n    assert square(x) == x * x",
                                          "def more():\n    assert square(5) == 25\nmore()"], "square", 1),
        # a setup-only test string never ran, so the program's own `x` was the one checked
        "setup_that_never_ran": ("x = 5\ndef f(a):\n    raise ValueError(a)", ["x = f(1)", "assert x == 5"]),
        # test functions ran before the helpers and constants the file defines below them
        "helpers_defined_below_the_tests": (
            "EXPECTED = 1\ndef helper(x):\n    return 1\ndef f(x):\n    return 1",
            ["def test_f():\n    assert f(2) == helper(2)\n    assert f(3) == EXPECTED\n"
             "def helper(x):\n    return 2 * x\nEXPECTED = 6"]),
        "a_name_the_file_binds_itself": ("LIMIT = 2\nSTEP = 2\ndef f(x):\n    return 2",
                                         ["assert f(1) == LIMIT\nLIMIT = 3", "STEP = 3\nfrom solution import *\nassert f(1) == STEP"]),
        # the program's object under a standard module's name answered the test's `math.isclose`
        "program_object_named_math": (
            "class M:\n    def isclose(self, *a, **k):\n        return True\n    def sqrt(self, x):\n        return 3.0\n"
            "math = M()\nimport json as re\nre.match = lambda *a: True\ndef r(x):\n    return -1.0",
            ["assert math.isclose(r(4), 2.0)", "assert math.sqrt(16) == r(1) + 4", "assert re.match('a', 'b')"], "r"),
        # `from solution import *` (or `import solution`) brought in the program's own builtins
        "star_import_of_builtins": (
            "def abs(x):\n    return 0\ndef all(x):\n    return True\ndef sum(x):\n    return 3\n"
            "def isinstance(*a):\n    return True\ndef len(x):\n    return 3\ndef f(x):\n    return -5",
            ["from solution import *\nassert abs(f(1)) == 0", "from solution import *\nassert all([f(1) > 0])",
             "from solution import *\nassert sum([f(1)]) == 3", "from solution import *\nassert isinstance(f(1), str)",
             "import solution\nassert solution.len(f(1)) == 3", "from solution import len\nassert len(f(1)) == 3"]),
        # membership, equality, hashing, order and truth decided by the program's object
        "program_decides_membership_and_hashing": (
            everything + "def f(x):\n    return Everything()",
            ["assert 3 in f(1)", "assert f(1) in {3}", "assert f(1) in [3]", "assert {f(1)} == {3}",
             "assert [3].count(f(1)) == 1", "assert f(1) > 2", "assert [0, 1, 2, 3][f(1)] == 3",
             "assert sorted([f(1), 3]) == [3, 3]", "assert 3 in list(f(1)) or 3 in f(1)"]),
        "unittest_asserts_on_program_objects": (
            everything + "def f(x):\n    return Everything()",
            ["import unittest\nclass T(unittest.TestCase):\n    def test_eq(self):\n        self.assertEqual(f(1), 3)\n"
             "    def test_in(self):\n        self.assertIn(3, f(1))\n    def test_true(self):\n"
             "        self.assertTrue(f(1))\n    def test_count(self):\n        self.assertCountEqual(f(1), [3])"]),
        # the task's entry point named like a builtin was never bound: the builtin answered
        "entry_point_named_like_a_builtin": ("x = 1", ["assert max([1, 3]) == 3", "assert max(2, 5) == 5"], "max"),
        # HumanEval: the program's own `check` must not replace the test's
        "program_defines_check": ("def check(candidate):\n    pass\ndef f(x):\n    return 0",
                                  ["def check(candidate):\n    assert candidate(1) == 2"]),
        # issue 64: the runners' own controls from the program: a skipped test passes, a stopped run ends early
        "skip_its_tests": (
            "import unittest\nclass Later(unittest.SkipTest):\n    pass\n"
            "def f(x):\n    raise unittest.SkipTest('not today')\ndef g(x):\n    raise Later('later')\n"
            "def h(x):\n    import pytest\n    pytest.skip('nope')\ndef k(x):\n    raise KeyboardInterrupt",
            ["def test_f():\n    assert f(1) == 2\ndef test_g():\n    assert g(1) == 2\ndef test_h():\n    assert h(1) == 2\n"
             "def test_k():\n    assert k(1) == 2",
             "import unittest\nclass T(unittest.TestCase):\n    def test_f(self):\n        self.assertEqual(f(1), 2)\n"
             "    def test_g(self):\n        self.assertEqual(g(1), 2)"]),
        # tests and fixtures of the program's own, collected by the runner, would pass as tests
        "adds_tests_and_fixtures": (
            "def test_free():\n    pass\ndef test_free_2():\n    pass\nclass TestMine:\n    def test_it(self):\n"
            "        pass\ndef setup_module(m):\n    raise SystemExit(0)\ndef load_tests(*a):\n    return None\n"
            "pytest_plugins = []\ndef f(x):\n    return 0",
            ["from solution import *\ndef test_f():\n    assert f(1) == 2"]),
        # the tests' objects as the program gets them: no way through them to the judge's globals or frames
        "reach_the_judge_through_a_callback": (
            "def f(cb):\n    for path in ('__globals__', 'gi_frame', 'f_globals', '__self__', '__closure__'):\n"
            "        try:\n            getattr(cb, path)\n            return 42\n        except Exception:\n"
            "            pass\n    try:\n        return 42 if cb.__class__.__name__ != 'JudgeObject' else 0\n"
            "    except Exception:\n        return 0",
            ["assert f(lambda: 0) == 42", "assert f(x for x in [1]) == 42", "import os\nassert f(os.getcwd) == 42",
             "assert f(eval) == 42"]),
        # a value that costs the trainer quadratic time to build (and a test whose literal makes it read it)
        "colliding_hashes_for_the_trainer": (
            f"def f():\n    return {{{_colliding}}}", [f"assert f() == {{{_colliding}, 1}}", "assert not f()"]),
    }


def run(t: dict, limits=None) -> dict:
    """Grade every attack at once; name -> {"passed", "honest", "tests", "status", "error", "compare_seconds"}
    and the batch's seconds (compare_seconds: this process's time to compare the values with the tests)."""
    from rlvr.grading.code import parse_tests
    from rlvr.sandbox import run_programs
    from rlvr.sandbox.records import SandboxLimits
    from rlvr.tasks.code import code_answer

    limits = limits or SandboxLimits(timeout=4, cpu_seconds=2, memory_mb=256, file_mb=8, processes=16, output_kb=256)
    defaults = ("f", 0)  # entry point, honest checks
    table = {name: (*spec, *defaults[len(spec) - 2:]) for name, spec in {**attacks(t), **judge_attacks()}.items()}
    names = list(table)
    truths = [parse_tests(code_answer(table[n][1], table[n][2])) for n in names]
    start = time.perf_counter()
    results = run_programs([tests.job(textwrap.dedent(table[n][0]).strip() + "\n") for n, tests in zip(names, truths)],
                           limits, checks=[tests.count for tests in truths])
    seconds = time.perf_counter() - start
    out = {}
    for n, tests, r in zip(names, truths, results):
        clock = time.process_time()
        verdicts = r.passed()
        out[n] = {"passed": sum(verdicts) if r.status == "ok" else 0, "honest": table[n][3], "tests": len(verdicts),
                  "status": r.status, "error": r.error, "values": [v if v is None or len(v) < 200 else v[:200] + "..."
                                                                    for v in r.values],
                  "compare_seconds": time.process_time() - clock}
    return {"attacks": out, "seconds": seconds}


if __name__ == "__main__":  # as another user: python3 sandbox_attacks.py TARGETS.json
    targets = json.loads(open(sys.argv[1]).read())
    from rlvr.sandbox import configure

    configure("bwrap")
    print(json.dumps(run(targets)))

"""The code sandbox against programs that attack it (issue 16, item 4).

Each attack is written so that, if it worked, the program would pass its test: the reward must be 0, and
the machine, the run directory and this test process must be untouched. All attacks run in one parallel
batch (a few seconds in all).
"""

from __future__ import annotations

import hashlib
import os
import socket
import textwrap
import threading
import time
from pathlib import Path

import pytest

from rlvr.code_rewards import grade_programs, parse_tests
from rlvr.code_tasks import code_answer
from rlvr.rewards import CodeTestsReward, score_batch
from rlvr.sandbox import Check, Job, SandboxLimits, isolation, run_program, run_programs

LIMITS = SandboxLimits(timeout=4, cpu_seconds=2, memory_mb=256, file_mb=8, processes=16, output_kb=256)
SECRET = "rlvr-test-secret-0b9a7c"
NAMESPACES = isolation() == "namespaces"
# what only the namespaces stop (the limits-only fallback runs programs as the user running rlvr)
# (and a fork bomb is not even tried without them: RLIMIT_NPROC does not bind root)
NAMESPACES_ONLY = {"network", "read_secrets", "kill_parent", "delete_outside", "write_10_gb_file", "detached_survivor",
                   "fork_bomb"}


def _fence(code: str) -> str:
    return f"```python\n{textwrap.dedent(code).strip()}\n```\n"


def _sandbox_processes() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"sandbox_child.py" in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def _attacks(canary: Path, run_dir: Path, port: int) -> dict[str, tuple[str, list[str]]]:
    """name -> (program, tests): the test passes only if the attack succeeds."""
    me = os.getpid()
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
        "allocate_50_gb": ("""
            block = bytearray(50 * 1024 ** 3)
            def f(x):
                return x""", ["assert f(1) == 1"]),
        "write_10_gb_file": ("""
            import os
            wrote = 0
            for path in ["big.bin", "/tmp/rlvr-big.bin", os.path.expanduser("~/big.bin")]:
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
            for path in [{str(canary)!r}, {str(run_dir / "metrics.jsonl")!r}, {str(run_dir / "checkpoints")!r}]:
                try:
                    os.remove(path)
                    deleted += 1
                except OSError:
                    pass
                try:
                    shutil.rmtree(path)
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
        "read_secrets": (f"""
            import os
            found = {SECRET!r} in repr(dict(os.environ))
            for pid in ["self", "1", str(os.getppid()), "{me}"]:
                try:
                    found = found or {SECRET!r}.encode() in open(f"/proc/{{pid}}/environ", "rb").read()
                except OSError:
                    pass
            def f():
                return found""", ["assert f() == True"]),
        "kill_parent": (f"""
            import os, signal
            killed = False
            for pid in [{me}, os.getppid(), -1]:
                try:
                    if pid > 1 or pid == -1:
                        os.kill(pid, signal.SIGKILL)
                        killed = killed or pid != -1
                except OSError:
                    pass
            def f():
                return killed""", ["assert f() == True"]),
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
            import builtins, json, os, sys
            class Yes:
                def __eq__(self, other): return True
                def __ne__(self, other): return False
                def __bool__(self): return True
                def __repr__(self): return "823543"
            for i in range(4):  # fake records straight into the result pipe
                for fd in range(3, 10):
                    try:
                        os.write(fd, json.dumps({"check": i, "value": "True"}).encode() + b"\\n")
                    except OSError:
                        pass
            json.dumps = lambda *a, **k: '{"check": 0, "value": "True"}'
            builtins.AssertionError = Exception
            builtins.isinstance = lambda *a: True
            def f(x):
                return Yes()""", ["assert f(7) == 823543", "assert f(2) == 128", "assert f(3)", "assert f(4) == f(4)"]),
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
                    open({str(canary.parent / "survivor")!r}, "w").write("alive")
                os._exit(0)
            def f():
                return 1
            while True:
                pass""", ["assert f() == 1"]),
    }


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    """Run every attack at once; return what each scored and the state of things around them."""
    base = tmp_path_factory.mktemp("attacks")
    canary = base / "canary.txt"
    canary.write_text("keep me")
    run_dir = base / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "checkpoints" / "state.bin").write_bytes(os.urandom(4096))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.rglob("*") if p.is_file()}

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def accept():
        while not stop.is_set():
            try:
                connections.append(server.accept()[0].recv(100))
            except OSError:
                pass

    listener = threading.Thread(target=accept, daemon=True)
    listener.start()
    os.environ["RLVR_TEST_SECRET"] = SECRET
    try:
        attacks = _attacks(canary, run_dir, server.getsockname()[1])
        names = [n for n in attacks if NAMESPACES or n not in NAMESPACES_ONLY]
        reward = CodeTestsReward(limits=LIMITS)
        started = time.perf_counter()
        scores, meta = score_batch(reward, [_fence(attacks[n][0]) for n in names],
                                   [code_answer(attacks[n][1], "f") for n in names])
        seconds = time.perf_counter() - started
    finally:
        del os.environ["RLVR_TEST_SECRET"]
        stop.set()
        listener.join()
        server.close()
    time.sleep(0.5)
    return {"scores": dict(zip(names, scores)), "meta": meta, "seconds": seconds, "canary": canary,
            "run_dir": run_dir, "before": before, "connections": connections, "survivor": base / "survivor"}


ATTACKS = list(_attacks(Path("/x"), Path("/y"), 1))


@pytest.mark.parametrize("name", ATTACKS)
def test_an_attack_scores_zero(attacked, name):
    if name in NAMESPACES_ONLY and not NAMESPACES:
        pytest.skip("without namespaces the sandbox does not block this (see rlvr.sandbox)")
    assert attacked["scores"][name] == {"reward": 0.0, "format_reward": 1.0, "answer_reward": 0.0}


def test_attacks_leave_the_machine_the_run_and_this_process_intact(attacked):
    if NAMESPACES:
        assert attacked["canary"].read_text() == "keep me"
        run_dir = attacked["run_dir"]
        after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in run_dir.rglob("*") if p.is_file()}
        assert after == attacked["before"]
        assert not Path("/tmp/rlvr-big.bin").exists()
        assert attacked["connections"] == []  # nothing reached the listening socket
    assert not _sandbox_processes(), "a sandboxed process outlived its program"
    # the whole batch is bounded by the wall-clock limit, not by the attacks (they ran in parallel)
    assert attacked["seconds"] < 3 * LIMITS.timeout
    meta = attacked["meta"]
    assert meta["grading/code_programs"] == len(attacked["scores"])
    if not NAMESPACES:
        return
    # infinite loop, fork bomb, never returns control, the survivor's parent (by wall clock or CPU time)
    assert meta["grading/code_timeouts"] == 4
    assert meta["grading/code_memory_kills"] == 1 and meta["grading/code_output_kills"] == 1
    assert meta["grading/code_load_errors"] == 1  # sys.exit(0)
    # and the sandbox still grades an honest program right afterwards
    good = CodeTestsReward(limits=LIMITS)(_fence("def f(x):\n    return x * 2"), code_answer(["assert f(3) == 6"], "f"))
    assert good["reward"] == 1.0


def test_a_detached_grandchild_dies_with_its_sandbox(attacked):
    if not NAMESPACES:
        pytest.skip("without a PID namespace a process that calls setsid() leaves the process group")
    time.sleep(0.1)
    assert not _sandbox_processes()
    assert not attacked["survivor"].exists()  # (it would write the file after 8 s; it is gone already)


# ----------------------------------------------------------------------------------------------------
# What the sandbox reports for ordinary programs.


def test_values_come_back_as_exact_literals_and_errors_by_name():
    result = run_program(Job("def f(x):\n    return [x, (x,), {x: None}, 'a' * x]\n",
                             (Check("f(2)"), Check("f(None)"), Check("g(1)"), Check("f(1) == [1, (1,), {1: None}, 'a']", "true"))),
                         LIMITS)
    assert result.status == "ok"
    assert result.values == ["[2, (2,), {2: None}, 'aa']", None, None, "True"]
    assert result.errors == [None, "TypeError", "NameError", None]


def test_subclasses_of_builtins_do_not_come_back():
    result = run_program(Job("class I(int):\n    def __eq__(s, o): return True\nx = I(5)\n",
                             (Check("x"), Check("[x]"), Check("int(x)"))), LIMITS)
    assert result.values == [None, None, "5"] and result.errors[:2] == ["unserializable"] * 2


def test_statuses_for_broken_programs():
    results = run_programs([Job("def f(:\n", (Check("f()"),)), Job("raise ValueError('x')", (Check("1"),)),
                            Job("import os\nos.abort()", (Check("1"),))], LIMITS)
    assert [r.status for r in results] == ["syntax_error", "load_error", "crashed"]
    assert results[1].error == "ValueError"


def test_the_limits_mode_still_catches_exits_loops_and_harness_patching(monkeypatch):
    cheat = ("import json\njson.dumps = lambda *a, **k: '{\"done\": true}'\nclass Y:\n    def __eq__(s, o): return True\n"
             "def f(x):\n    return Y()\n")
    jobs = [Job("import sys\nsys.exit(0)", (Check("1"),)), Job("while True:\n    pass", (Check("1"),)),
            Job(cheat, (Check("f(1)"),)), Job("def f(x):\n    return x + 1", (Check("f(1)"),))]
    results = [run_program(job, SandboxLimits(timeout=2, cpu_seconds=1), mode="limits") for job in jobs]
    assert [r.status for r in results[:2]] == ["load_error", "timeout"]
    assert results[2].values == [None] and results[3].values == ["2"]


def test_grading_64_programs_is_parallel_and_each_distinct_program_runs_once():
    truth = code_answer([f"assert f({i}) == {2 * i}" for i in range(5)], "f")
    programs = [f"def f(x):\n    return 2 * x + {i % 4 == 0}\n" for i in range(64)]  # two distinct programs
    outcome = grade_programs(programs, [truth] * 64, LIMITS)
    assert outcome[0] == (0, 5) and outcome[1] == (5, 5) and outcome.count((5, 5)) == 48
    scores, meta = score_batch(CodeTestsReward(limits=LIMITS), [_fence(p) for p in programs], [truth] * 64)
    assert meta["grading/code_programs"] == 2 and sum(s["reward"] for s in scores) == 48


def test_parse_tests_keeps_expected_values_out_of_the_sandbox():
    tests = parse_tests(code_answer(["assert f([1, 2]) == [2, 4]", "assert 3 == g(1)", "assert h(0) is None",
                                     "assert not k('')", "assert f(1) > 0",
                                     "import math\ndef test_sqrt():\n    assert math.isclose(r(4), 2.0)"], "f"))
    assert [(c.expr, c.kind) for c in tests.checks] == [("f([1, 2])", "value"), ("g(1)", "value"), ("h(0)", "value"),
                                                       ("k('')", "value"), ("f(1) > 0", "true"),
                                                       ("test_sqrt()", "value")]
    assert tests.expected[:3] == ([2, 4], 3, None) and tests.checks[5].setup.startswith("import math\ndef test_sqrt")
    assert all("[2, 4]" not in c.expr + c.setup for c in tests.checks)
    humaneval = parse_tests(code_answer(["def check(candidate):\n    assert candidate(2) == 4"], "double"))
    assert humaneval.checks[0].expr == "check(double)"


def test_pytest_style_tests_and_from_solution_import():
    truth = code_answer(["from solution import add\ndef test_add():\n    assert add(1, 2) == 3\n"
                         "def test_neg():\n    assert add(-1, -1) == -2"], "add")
    right = CodeTestsReward(fraction=True, limits=LIMITS)
    assert right(_fence("def add(a, b):\n    return a + b"), truth)["reward"] == 1.0
    assert right(_fence("def add(a, b):\n    return abs(a + b)"), truth)["reward"] == 0.5

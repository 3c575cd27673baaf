"""The code sandbox against programs that attack it (issue 34), as root and as an ordinary user.

The attacks (`tests/sandbox_attacks.py`) run in one parallel batch in this process, and once more as uid 65534
in a Debian Python started with `setpriv` (CI runs as root; rlvr's users mostly do not). Each attack's tests
pass only if it works: every attack must pass none, and what it aimed at (a canary, the run directory, the
data set, rlvr's own sources, site-packages, a TCP port, a unix socket in /tmp, /dev/shm, this process) must
be as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

import rlvr.sandbox as sandbox_module
import sandbox_attacks
from rlvr.sandbox import cgroups
from rlvr.grading.code import grade_programs, parse_tests
from sandbox_site import readable_site
from rlvr.sandbox import read_value, run_program, run_programs
from rlvr.sandbox.records import Check, Job, SandboxLimits
from rlvr.sandbox.running import LAST_RESORT
from rlvr.tasks.code import code_answer
from rlvr.tasks.rewards import CodeTestsReward, score_batch

LIMITS = SandboxLimits(timeout=4, cpu_seconds=2, memory_mb=256, file_mb=8, processes=16, output_kb=256)
SECRET = "rlvr-test-secret-0b9a7c"
HIDDEN = "assert hidden_solution(41) == 1681"
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0


def _fence(code: str) -> str:
    return f"```python\n{code.strip()}\n```\n"


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _sandbox_processes() -> list[int]:
    """Sandboxed processes (their harness) that this grader left behind: live ones under this process, and
    orphans, which the kernel reparents to init or a subreaper. Not those of a grader running beside this one
    (`make test`'s other xdist worker, or any other process our parent started): each descends from a sibling
    of this process, and counting them made this check fail whenever the other worker graded code."""
    me, parent = os.getpid(), os.getppid()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"inside.harness" not in (entry / "cmdline").read_bytes():
                    continue
            except OSError:
                continue
            pid, branch = int(entry.name), int(entry.name)
            while pid > 1 and pid not in (me, parent):
                branch, pid = pid, _parent(pid)
            if not (pid == parent and branch != me):  # ours, or an orphan; not a sibling's
                pids.append(int(entry.name))
    return pids


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


def _dev_shm() -> set[str]:
    """The host's /dev/shm names an attack would write (`rlvr-*`; see write_dev_shm). Not every name: tests
    running beside this one (`make test` runs two workers) create and remove their own there while the attacks
    run: Python multiprocessing's semaphores, torch's shared tensors, Ray's object store."""
    names = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    return {n for n in names if n.startswith("rlvr")}


class Listeners:
    """A TCP port on 127.0.0.1 and a world-writable unix socket in /tmp, recording what reaches them."""

    def __init__(self):
        self.received: list[bytes] = []
        self.tcp = socket.socket()
        self.tcp.bind(("127.0.0.1", 0))
        self.tcp.listen(16)
        self.unix_path = f"/tmp/rlvr-test-{os.getpid()}-{time.monotonic_ns()}.sock"
        self.unix = socket.socket(socket.AF_UNIX)
        self.unix.bind(self.unix_path)
        os.chmod(self.unix_path, 0o777)
        self.unix.listen(16)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, args=(s,), daemon=True) for s in (self.tcp, self.unix)]
        for s in (self.tcp, self.unix):
            s.settimeout(0.2)
        for thread in self.threads:
            thread.start()

    def _accept(self, server):
        while not self.stop.is_set():
            try:
                conn = server.accept()[0]
                self.received.append(conn.recv(100) or b"(connected)")
            except OSError:
                pass

    def close(self):
        self.stop.set()
        for thread in self.threads:
            thread.join()
        self.tcp.close()
        self.unix.close()
        os.unlink(self.unix_path)


def make_targets(base: Path, sources: Path, site_packages: Path, listeners: Listeners) -> dict:
    run_dir = base / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    (run_dir / "secret.txt").write_text(SECRET)
    (run_dir / "checkpoints" / "state.bin").write_bytes(os.urandom(4096))
    (base / "canary.txt").write_text("keep me")
    dataset = base / "code.jsonl"
    dataset.write_text(json.dumps({"prompt": "Square it.", "tests": [HIDDEN], "entry_point": "hidden_solution"}) + "\n")
    return {"run_dir": str(run_dir), "canary": str(base / "canary.txt"), "dataset": str(dataset), "hidden": HIDDEN,
            "port": listeners.tcp.getsockname()[1], "unix_socket": listeners.unix_path, "secret": SECRET,
            "pid": os.getpid(), "survivor": str(base / "survivor"), "sources": str(sources),
            "site_packages": str(site_packages)}


def _attack_as(user: str, tmp_root: Path) -> dict:
    """Run the whole batch as `user` ("root": in this process; "nobody": uid 65534, Debian's Python) and
    return what each attack scored plus the state of everything it aimed at, before and after."""
    listeners = Listeners()
    base = Path(tempfile.mkdtemp(prefix=f"rlvr-attacks-{user}-", dir="/tmp"))
    os.chmod(base, 0o755)
    try:
        if user == "root":
            sources = Path(sandbox_module.__file__).parent
            site_packages = sources.parent.parent  # where rlvr is imported from (src/ or site-packages)
        else:  # a copy nobody owns, so that an escape could really rewrite it
            site_packages = readable_site(base / "site")
            shutil.copy(Path(__file__).with_name("sandbox_attacks.py"), base)
            sources = site_packages / "rlvr" / "sandbox"
        targets = make_targets(base, sources, site_packages, listeners)
        if user == "nobody":  # links not followed: numpy's link points into the venv
            for root, dirs, files in os.walk(base):
                for path in [root, *(os.path.join(root, name) for name in dirs + files)]:
                    os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        watched = {"run": _digest(Path(targets["run_dir"])), "sources": _digest(sources),
                   "dataset": Path(targets["dataset"]).read_text(), "shm": _dev_shm(),
                   "site": sorted(os.listdir(site_packages))}
        os.environ["RLVR_TEST_SECRET"] = SECRET
        try:
            if user == "root":
                report = sandbox_attacks.run(targets, LIMITS)
            else:
                (base / "targets.json").write_text(json.dumps(targets))
                proc = subprocess.run(
                    ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
                     str(base / "sandbox_attacks.py"), str(base / "targets.json")],
                    capture_output=True, text=True, timeout=120, cwd=base,
                    env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site_packages),
                         "RLVR_TEST_SECRET": SECRET, "HOME": str(base), "PYTHONDONTWRITEBYTECODE": "1"})
                assert proc.returncode == 0, proc.stderr[-3000:]
                report = json.loads(proc.stdout.strip().splitlines()[-1])
        finally:
            del os.environ["RLVR_TEST_SECRET"]
        time.sleep(0.3)
        after = {"run": _digest(Path(targets["run_dir"])), "sources": _digest(sources),
                 "dataset": Path(targets["dataset"]).read_text(), "shm": _dev_shm(),
                 "site": sorted(os.listdir(site_packages))}
        return {**report, "before": watched, "after": after, "received": list(listeners.received),
                "canary": Path(targets["canary"]).read_text() if Path(targets["canary"]).exists() else None,
                "survivor": Path(targets["survivor"]), "base": base}
    finally:
        listeners.close()


def _can_run_as_nobody() -> str | None:
    if not ROOT:
        return "this suite already runs as an ordinary user"
    if shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON):
        return f"needs setpriv and {SYSTEM_PYTHON} to run the batch as uid {NOBODY}"
    return None


USERS = ["root", "nobody"] if ROOT else ["user"]


@pytest.fixture(scope="module")
def attacked(tmp_path_factory):
    sandbox_module.configure("bwrap")
    runs = {}
    for user in USERS:
        if user == "nobody" and _can_run_as_nobody():
            continue
        runs[user] = _attack_as("root" if user == "user" else user, tmp_path_factory.mktemp(user))
    yield runs
    for report in runs.values():
        shutil.rmtree(report["base"], ignore_errors=True)


def _report(attacked, user):
    if user not in attacked:
        pytest.skip(_can_run_as_nobody() or "not run")
    return attacked[user]


ATTACKS = list(sandbox_attacks.attacks({k: "/x" if k != "port" else 1 for k in
                                        ("run_dir", "dataset", "canary", "port", "unix_socket", "secret", "pid",
                                         "survivor", "sources", "site_packages", "hidden")})) + list(sandbox_attacks.judge_attacks())


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("name", ATTACKS)
def test_an_attack_passes_no_test(attacked, user, name):
    result = _report(attacked, user)["attacks"][name]
    assert result["passed"] == result["honest"] < result["tests"], result  # only the checks a wrong program passes
    assert result["compare_seconds"] < 0.25, result  # reading its values here cost the trainer next to nothing


@pytest.mark.parametrize("user", USERS)
def test_attacks_leave_the_machine_the_run_and_rlvr_intact(attacked, user):
    report = _report(attacked, user)
    assert report["canary"] == "keep me"
    assert report["after"] == report["before"]  # run directory, rlvr's sources, data set, /dev/shm, site-packages
    assert report["received"] == []  # nothing reached the TCP port or the unix socket
    assert not Path("/tmp/rlvr-big.bin").exists() and not Path("/tmp/rlvr-escaped").exists()
    assert not Path("/usr/lib/rlvr-escaped").exists()
    assert not _sandbox_processes(), "a sandboxed process outlived its program"
    # each ran within its bounds: CPU, waiting, the unstarved wall clock; the plain wall clock at the last resort
    assert report["seconds"] < LAST_RESORT * LIMITS.timeout
    # and the sandbox still grades an honest program right afterwards
    good = CodeTestsReward(limits=LIMITS)(_fence("def f(x):\n    return x * 2"), code_answer(["assert f(3) == 6"], "f"))
    assert good["reward"] == 1.0


@pytest.mark.parametrize("user", USERS)
def test_what_stopped_each_attack(attacked, user):
    status = {name: r["status"] for name, r in _report(attacked, user)["attacks"].items()}
    assert status["infinite_loop"] == status["never_returns_control"] == "timeout"
    # a fork bomb: out of process slots, it spins to its CPU budget; without cgroups it may be stopped first for
    # holding more processes than its limit (whose memory no cgroup would bound): whichever the first look sees
    stopped = {"timeout"} if user != "nobody" and cgroups.in_force() else {"timeout", "memory"}
    assert status["fork_bomb"] in stopped
    # one that sleeps is stopped at its waiting bound, not at the wall clock's
    assert _report(attacked, user)["attacks"]["never_returns_control"]["error"].startswith("waited ")
    assert status["allocate_50_gb"] == "memory" and status["print_1_gb"] == "output_limit"
    assert status["exit_before_tests"] == "load_error" and status["os_exit_before_tests"] == "crashed"
    # the judge stopped listening to a program that sent it garbage, and said so
    assert status["deep_json_reply"] == status["huge_reply"] == "crashed"


@pytest.mark.parametrize("user", USERS)
def test_a_detached_grandchild_dies_with_its_sandbox(attacked, user):
    report = _report(attacked, user)
    time.sleep(0.1)
    assert not _sandbox_processes()
    assert not report["survivor"].exists()


def test_the_sandbox_from_inside_has_no_privileges_no_network_and_no_host_files():
    """What the fail-closed probe reads from inside, asserted here directly (the same as root and as a user)."""
    sandbox_module.configure("bwrap")
    result = run_program(Job(sandbox_module._PROBE + "\nimport os\ndef extra():\n    return (os.getuid(), "
                             "sorted(os.listdir('/')), os.listdir('/work'))\n",
                             (Check("observe()"), Check("extra()"))), LIMITS)
    seen, (uid, top, work) = read_value(result.values[0]), read_value(result.values[1])
    assert seen == {"capabilities": 0, "no_new_privs": 1, "seccomp": 2, "new_user_namespace": False,
                    "writable_root": False, "interfaces": ["lo"], "home": False, "memory_outside_limits": [],
                    "ptys": False}
    assert uid != 0 and work == []
    assert set(top) <= {"usr", "lib", "lib64", "lib32", "root", "opt", "rlvr", "proc", "dev", "work", "bin", "sys"}
    assert "home" not in top and "tmp" not in top and "etc" not in top and "var" not in top and "run" not in top


# ----------------------------------------------------------------------------------------------------
# What the sandbox reports for ordinary programs.


def test_values_come_back_as_data_and_errors_by_name():
    result = run_program(Job("def f(x):\n    return [x, (x,), {x: None}, 'a' * x]\n",
                             (Check("f(2)"), Check("f(None)"), Check("g(1)"), Check("f(1) == [1, (1,), {1: None}, 'a']", "true"))),
                         LIMITS)
    assert result.status == "ok"
    assert read_value(result.values[0]) == [2, (2,), {2: None}, "aa"] and result.values[1:] == [None, None, None]
    assert result.errors == [None, "TypeError", "NameError", None]
    assert result.outcomes == ["passed", "error", "error", "passed"] and result.passed() == [True, False, False, True]


def test_subclasses_of_builtins_do_not_come_back():
    result = run_program(Job("class I(int):\n    def __eq__(s, o): return True\nx = I(5)\n",
                             (Check("x"), Check("[x]"), Check("int(x)"))), LIMITS)
    assert result.values == [None, None, "5"] and result.reasons[:2] == ["unserializable"] * 2


def test_statuses_for_broken_programs():
    results = run_programs([Job("def f(:\n", (Check("f()"),)), Job("raise ValueError('x')", (Check("1"),)),
                            Job("import os\nos.abort()", (Check("1"),))], LIMITS)
    assert [r.status for r in results] == ["syntax_error", "load_error", "crashed"]
    assert results[1].error == "ValueError"
    assert "signal 6" in results[2].error  # SIGABRT, reported by the judge


def test_the_limits_only_mode_still_catches_exits_loops_and_harness_patching():
    cheat = ("import json\njson.dumps = lambda *a, **k: '{\"done\": true}'\nclass Y:\n    def __eq__(s, o): return True\n"
             "def f(x):\n    return Y()\n")
    jobs = [Job("import sys\nsys.exit(0)", (Check("1"),)), Job("while True:\n    pass", (Check("1"),)),
            Job(cheat, (Check("f(1)"),)), Job("def f(x):\n    return x + 1", (Check("f(1)"),))]
    results = [run_program(job, SandboxLimits(timeout=2, cpu_seconds=1), mode="limits_only") for job in jobs]
    assert [r.status for r in results[:2]] == ["load_error", "timeout"]
    assert results[2].values == [None] and results[3].values == ["2"]


def test_the_limits_only_mode_runs_each_runner():
    """Outside bubblewrap the judge starts from rlvr's own files: pytest must not read the project's
    configuration above them (its addopts would not parse), and every runner runs as it does inside."""
    from rlvr.tasks.code import stdio_answer

    truths = [code_answer(["from solution import f\ndef test_a():\n    assert f(1) == 2\ndef test_b(capsys):\n"
                           "    print('x')\n    assert capsys.readouterr().out == 'x\\n'"], "f"),
              code_answer(["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                           "        self.assertEqual(f(1), 2)"], "f"),
              stdio_answer([("1\n", "2\n")])]
    jobs = [parse_tests(t).job(p) for t, p in zip(truths, ["def f(x):\n    return x + 1\n"] * 2 +
                                                   ["print(int(input()) + 1)\n"])]
    results = [run_program(job, SandboxLimits(timeout=9, cpu_seconds=3), mode="limits_only",
                           checks=parse_tests(t).count) for job, t in zip(jobs, truths)]
    assert [r.passed() for r in results] == [[True, True], [True], [True]], results


def test_grading_64_programs_is_parallel_and_each_distinct_program_runs_once():
    truth = code_answer([f"assert f({i}) == {2 * i}" for i in range(5)], "f")
    programs = [f"def f(x):\n    return 2 * x + {i % 4 == 0}\n" for i in range(64)]  # two distinct programs
    outcome = grade_programs(programs, [truth] * 64, LIMITS)
    assert outcome[0] == (0, 5) and outcome[1] == (5, 5) and outcome.count((5, 5)) == 48
    scores, meta = score_batch(CodeTestsReward(limits=LIMITS), [_fence(p) for p in programs], [truth] * 64)
    assert meta["grading/code_programs"] == 2 and sum(s["reward"] for s in scores) == 48
    assert meta["grading/code_limits_only"] == 0


def test_parse_tests_picks_the_runner_the_tests_were_written_for():
    script = parse_tests(code_answer(["assert f([1, 2]) == [2, 4]", "assert 3 == g(1)", "assert h(0) is None",
                                      "assert not k('')", "assert f(1) > 0"], "f"))
    assert script.runner == "script" and script.count == 5
    assert [c.label or c.expr for c in script.checks] == ["assert f([1, 2]) == [2, 4]", "assert 3 == g(1)",
                                                         "assert h(0) is None", "assert not k('')", "assert f(1) > 0"]
    humaneval = parse_tests(code_answer(["def check(candidate):\n    assert candidate(2) == 4"], "double"))
    assert (humaneval.runner, humaneval.checks[0].expr) == ("script", "check(double)")
    pytest_style = parse_tests(code_answer(["import math\ndef test_sqrt():\n    assert math.isclose(r(4), 2.0)"], "r"))
    assert (pytest_style.runner, pytest_style.count, pytest_style.checks) == ("pytest", 1, ())
    cases = parse_tests(code_answer(["import unittest\nclass T(unittest.TestCase):\n    def test_a(self):\n"
                                     "        self.assertEqual(r(1), 1)\n    def test_b(self):\n        pass"], "r"))
    assert (cases.runner, cases.count) == ("unittest", 2)


def test_pytest_style_tests_and_from_solution_import():
    truth = code_answer(["from solution import add\ndef test_add():\n    assert add(1, 2) == 3\n"
                         "def test_neg():\n    assert add(-1, -1) == -2"], "add")
    right = CodeTestsReward(fraction=True, limits=LIMITS)
    assert right(_fence("def add(a, b):\n    return a + b"), truth)["reward"] == 1.0
    assert right(_fence("def add(a, b):\n    return abs(a + b)"), truth)["reward"] == 0.5


def test_is_checks_mean_the_singleton_not_an_equal_value():
    truth = code_answer(["assert f(1) is True", "assert f(0) is None"], "f")
    assert grade_programs(["def f(x):\n    return 1 if x else 0"], [truth], LIMITS) == [(0, 2)]
    assert grade_programs(["def f(x):\n    return True if x else None"], [truth], LIMITS) == [(2, 2)]


def test_sandboxes_at_once_are_bounded_across_every_caller(monkeypatch, default_grading):
    # environments' tools call run_programs from one thread per episode: `workers` bounds the process, not a call
    sandbox_module.configure("bwrap", workers=2)
    running, most, guard = [0], [0], threading.Lock()

    def fake(job, limits=None, mode=None, checks=None):
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with guard:
            running[0] -= 1
        return sandbox_module.ProgramResult("ok", [], [], 0.05)

    monkeypatch.setattr(sandbox_module, "run_program", fake)
    callers = [threading.Thread(target=run_programs, args=([Job("x = 1", ())] * 3,)) for _ in range(4)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert most[0] == 2  # 4 callers x 3 jobs, each call allowed 2 of its own: still 2 at once in all

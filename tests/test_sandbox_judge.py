"""The sandbox's judge (issue 34): tests run in a process of their own that calls the program through a pipe.

What a test may do with the program's functions and objects, what crosses the pipe and how it is read back
(fuzzed: nothing a program writes can raise in rlvr), and the fail-closed refusal where the isolation cannot
be had (no bubblewrap; a container whose seccomp profile refuses namespaces, as Docker's default does).
"""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

import rlvr.sandbox as sandbox
from rlvr.config import TrainConfig, load_config
from rlvr.grading.code import grade_programs
from rlvr.grading.values import canonical, canonical_text, comparable
from rlvr.sandbox import SandboxUnavailable, launch, run_program
from rlvr.sandbox.harness import DecodeError, Pipe, decode, encode
from rlvr.sandbox.processes import read_results
from rlvr.sandbox.records import Check, Job, SandboxLimits
from rlvr.tasks.code import code_answer
from rlvr.tasks.rewards import CodeTestsReward, score_batch

LIMITS = SandboxLimits(timeout=4, cpu_seconds=2, memory_mb=256, file_mb=8, processes=16, output_kb=256)
RLVR = Path(sys.executable).with_name("rlvr")


@pytest.fixture
def restore_sandbox():
    saved = sandbox.settings()
    yield
    sandbox._settings = saved
    sandbox._probe.cache_clear()


def grade(program: str, tests: list[str], entry: str = "f") -> tuple[int, int]:
    return grade_programs([program], [code_answer(tests, entry)], LIMITS)[0]


# ----------------------------------------------------------------------------------------------------
# Test styles, through the judge.


def test_classes_methods_len_and_str_go_through_handles():
    program = ("class Stack:\n    def __init__(self):\n        self.items = []\n    def push(self, x):\n"
               "        self.items.append(x)\n    def pop(self):\n        return self.items.pop()\n"
               "    def __len__(self):\n        return len(self.items)\n    def __str__(self):\n"
               "        return 'Stack(%d)' % len(self.items)\n")
    tests = ["from solution import Stack\ns = Stack()\ns.push(1)\ns.push(2)\nassert s.pop() == 2",
             "s = Stack()\nassert len(s) == 0", "s = Stack()\ns.push(3)\nassert str(s) == 'Stack(1)'",
             "s = Stack()\ns.push(4)\nassert s.items == [4]"]
    assert grade(program, tests, "Stack") == (4, 4)


def test_an_argument_changed_in_place_is_seen_by_the_test():
    program = "def rotate(nums, k):\n    nums[:] = nums[-k:] + nums[:-k]\ndef fill(d):\n    d['x'] = 1\n"
    tests = ["nums = [1, 2, 3, 4]\nrotate(nums, 1)\nassert nums == [4, 1, 2, 3]",
             "d = {}\nfill(d)\nassert d == {'x': 1}"]
    assert grade(program, tests, "rotate") == (2, 2)


def test_exceptions_cross_as_the_first_builtin_of_their_class():
    program = ("class Bad(ValueError):\n    pass\ndef f(x):\n    if x < 0:\n        raise Bad('negative')\n"
               "    return x\ndef g():\n    raise KeyError('k')\n")
    tests = ["def test_bad():\n    try:\n        f(-1)\n    except ValueError:\n        return\n    assert False",
             "def test_key():\n    try:\n        g()\n    except LookupError:\n        return\n    assert False",
             "def test_not_type():\n    try:\n        f(-1)\n    except TypeError:\n        return\n    assert False",
             "assert f(3) == 3"]
    assert grade(program, tests) == (3, 4)


def test_generators_and_modules_the_program_imported():
    program = "import math\nfrom math import sqrt\ndef gen(n):\n    yield from range(n)\ndef r(x):\n    return sqrt(x)\n"
    tests = ["assert list(gen(3)) == [0, 1, 2]", "assert math.isclose(r(4), 2.0)", "assert sum(gen(4)) == 6"]
    assert grade(program, tests, "gen") == (3, 3)


def test_humaneval_check_and_star_import():
    program = "def double(x):\n    return 2 * x\n"
    assert grade(program, ["def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-1) == -2"],
                 "double") == (1, 1)
    assert grade(program, ["from solution import *\nassert double(5) == 10"], "double") == (1, 1)


def test_asserts_follow_pythons_truth_rule_on_the_judges_values():
    program = "def f(x):\n    return [x] if x else []\n"
    assert grade(program, ["assert f(1)", "assert not f(0)", "assert f(1) != []", "assert len(f(2)) == 1"]) == (4, 4)


def test_set_order_repeats_from_run_to_run():
    # PYTHONHASHSEED is fixed inside: a program that returns list(set(...)) gets the same verdict every time
    job = Job("def f():\n    return list({'apple', 'banana', 'cherry', 'date', 'elder', 'fig'})\n", (Check("f()"),))
    values = {run_program(job, LIMITS).values[0] for _ in range(3)}
    assert len(values) == 1


def test_values_the_judge_cannot_pass_fail_the_check_not_the_batch():
    program = "def apply(fn, x):\n    return fn(x)\ndef f(x):\n    return x\n"
    assert grade(program, ["assert apply(lambda v: v + 1, 1) == 2", "assert f(1) == 1"], "apply") == (1, 2)


# ----------------------------------------------------------------------------------------------------
# The codec and the readers, fuzzed.


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "float", "str", "bytes", "bool", "none", "complex"] + (["list", "tuple", "set", "dict", "frozenset"]
                                                                         if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**30, 10**30)
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), math.inf, -math.inf, -0.0, 1e-300])
    if kind == "str":
        return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 8)))
    if kind == "bytes":
        return bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 8)))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "complex":
        return complex(rng.uniform(-5, 5), rng.uniform(-5, 5))
    items = [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    hashable = []
    for v in items:
        try:
            hash(v)
            hashable.append(v)
        except TypeError:
            pass
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    if kind == "set":
        return set(hashable)
    if kind == "frozenset":
        return frozenset(hashable)
    return {k: v for k, v in zip(hashable, items)}


def test_every_exact_value_round_trips_through_the_codec():
    rng = random.Random(0)
    for _ in range(2000):
        value = _random_value(rng)
        text = encode(value)
        assert text is not None
        assert decode(text) == value and type(decode(text)) is type(value)
    assert math.isnan(decode(encode(float("nan"))))
    assert encode(True) == "True" and encode([1, (2,), {3}]) == "[1, (2,), {3}]"


def test_canonical_spellings_are_equal_exactly_when_the_values_are():
    """The trainer compares a program's value with the test's literal on spellings (rlvr.grading.values), read
    from encode's text without building the value: the same verdicts as Python's == on the built values."""
    rng = random.Random(4)
    values = [_random_value(rng) for _ in range(1500)]
    specials = [1, 1.0, True, 0, -0.0, False, 0j, complex(1, 0), complex(1, -0.0), 2**53, float(2**53), 2**53 + 1,
                10**300, 1e300, int(1e300), math.inf, -math.inf, complex(1, math.inf), [1], (1,), {1}, frozenset({1}),
                {1: 2}, {True: 2.0}, {2: 1, 1: 2}, {1: 2, 2: 1}, "", b"", "a'b", 'a"b', "\u00e9\n", [], (), set(), {},
                None, {(1, 2): frozenset({3})}, {frozenset({1}): 1}, ((),), ({},), (set(),), [[1, 2], {3: (4,)}]]
    for value in values + specials:
        assert canonical_text(encode(value)) == canonical(value) is not None, value
    pairs = [(a, b) for a in specials for b in specials] + [(a, rng.choice(values)) for a in values]
    for a, b in pairs:
        assert (canonical(a) == canonical(b)) == (a == b), (a, b)
    assert canonical(math.nan) is None and canonical_text(encode([math.nan])) is None  # NaN equals nothing
    grade = CodeTestsReward(fraction=True, limits=LIMITS)
    program = "```python\ndef f():\n    return {True: 'a', 2: (3.0,), 'k': frozenset({-0.0})}\n```"
    tests = ["assert f() == {2: (3,), 1.0: 'a', 'k': {0}}", "assert f() == {1: 'a', 2: [3], 'k': {0}}",
             "assert not f()", "assert f()['k'] == set()"]
    assert grade(program, code_answer(tests, "f"))["reward"] == 0.25


def test_reading_a_value_costs_the_trainer_linear_time_whatever_the_program_chose():
    colliding = [str(i * (2**61 - 1)) for i in range(1, 40_000)]  # every one hashes to 0
    text = "{" + ", ".join(colliding) + "}"
    assert len(text) < 1_000_000
    start = time.process_time()
    spelled = canonical_text(text)
    seconds = time.process_time() - start
    assert spelled == "{" + ", ".join(sorted(colliding)) + "}"
    assert seconds < 2.0  # ~0.15 s here; building this set (ast.literal_eval, harness.decode) ~7 s
    # bounded: too long, too deep, an int past Python's 4300 digits, anything but encode's grammar
    assert canonical_text("[" + "1, " * 400_000 + "1]") is None
    assert canonical_text("[" * 65 + "]" * 65) is None and canonical_text("[" * 60 + "]" * 60) is not None
    assert canonical_text("9" * 5000) is None and canonical_text("f(1)") is None and canonical_text("{1: }") is None
    # and a value far longer than the expected one is not read at all
    assert not comparable("[" + "0, " * 1000 + "0]", canonical([0, 0]))


def _garbage(rng: random.Random) -> bytes:
    pieces = [b"[" * 200_000, b"{" * 50_000, b"\x00\xff\xfe", os.urandom(rng.randint(0, 300)), b"\n",
              b'{"check": 0, "value": ' + b"[" * 100_000 + b"}", b'{"load": 5}', b'{"check": true, "value": "1"}',
              b'{"check": 1e999}', b'{"exit": "9", "signaled": "yes"}', b'"\\ud800"', b"1" * 5_000_000, b'{"done": 1}',
              json.dumps({"check": 0, "value": "1" * 3000}).encode()]
    return b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))


def test_the_result_reader_never_raises_whatever_the_bytes():
    rng = random.Random(1)
    for _ in range(300):
        result = read_results(_garbage(rng), _garbage(rng), rng.randint(-9, 255), None, 3, 0.0)
        assert result.status in sandbox.STATUSES and len(result.values) == 3
        assert result.status != "ok" or result.values  # never "ok" without the records that say so
    assert read_results(b'{"load": "ok"}\n{"check": 0, "value": "1"}\n{"done": true}\n', b"", 0, None, 1, 0).status == "ok"


def test_the_codec_refuses_anything_but_literals():
    rng = random.Random(2)
    attempts = ["__import__('os').system('x')", "f(1)", "[1, 2] * 10**9", "{**{}}", "(lambda: 1)()", "a.b",
                "frozenset({1}, 2)", "float('1e5')", "-'a'", "1 + 2", "(1+2j) + 3j", "[" * 100_000, "x" * 2_000_000]
    for text in attempts:
        with pytest.raises(DecodeError):
            decode(text)
    for _ in range(200):  # garbage: either an exact value (a JSON object is a dict literal too) or DecodeError
        try:
            value = decode(_garbage(rng).decode("utf-8", "replace"))
        except DecodeError:
            continue
        assert encode(value) is not None


def test_the_judges_pipe_reader_turns_garbage_into_none():
    rng = random.Random(3)
    for _ in range(50):
        read_fd, write_fd = os.pipe()
        data = _garbage(rng)[: 1 << 20]
        if os.fork() == 0:
            try:
                os.close(read_fd)
                os.write(write_fd, data + b"\n")
            finally:
                os._exit(0)
        os.close(write_fd)
        pipe = Pipe(read_fd, -1)
        for _ in range(10):
            message = pipe.receive()
            if message is None:
                break
            assert isinstance(message, (dict, list, str, int, float, bool))
        os.close(read_fd)
        os.wait()


# ----------------------------------------------------------------------------------------------------
# Fail closed.


def test_without_bubblewrap_grading_is_refused_with_what_to_install(monkeypatch, restore_sandbox):
    monkeypatch.setattr(launch, "bwrap_path", lambda: None)
    sandbox._probe.cache_clear()
    with pytest.raises(SandboxUnavailable, match=r"bubblewrap \(`bwrap`\) is not installed.*apt-get install bubblewrap"):
        sandbox.configure("bwrap")
    with pytest.raises(SandboxUnavailable, match="sandbox=limits_only"):
        CodeTestsReward(limits=LIMITS)("```python\ndef f():\n    return 1\n```", code_answer(["assert f() == 1"], "f"))


_DENY_NAMESPACES = f"""
import errno, os, sys
import pyseccomp as sc
rules = sc.SyscallFilter(sc.ALLOW)
rules.add_rule(sc.ERRNO(errno.EPERM), "unshare")
for flag in {launch.NAMESPACE_FLAGS!r}:
    rules.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
rules.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
rules.load()  # what Docker's default profile does to a container without CAP_SYS_ADMIN
os.execv(sys.argv[1], sys.argv[1:])
"""


@pytest.mark.parametrize("command", ["eval", "train"])
def test_where_namespaces_are_refused_the_command_stops_before_any_work(tmp_path, command):
    out = tmp_path / "run"
    args = [sys.executable, "-c", _DENY_NAMESPACES, str(RLVR), command, "dataset=code", "prompt=code",
            f"out={out}", "model=no-such-model"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    message = proc.stderr.strip().splitlines()[-1]
    assert message.startswith("error: the code sandbox cannot isolate programs on this machine")
    assert "namespaces" in message and "--security-opt seccomp=unconfined" in message
    assert "sandbox=limits_only" in message and "Traceback" not in proc.stderr
    assert not out.exists()  # refused before anything was written


def test_limits_only_is_an_explicit_choice_logged_with_every_grading_metric(restore_sandbox, caplog):
    cfg = load_config(TrainConfig, overrides=["dataset=code", "prompt=code", "sandbox=limits_only"])
    assert cfg.sandbox.isolation == "limits_only" and TrainConfig().sandbox.isolation == "bwrap"
    with caplog.at_level("WARNING"):
        cfg.sandbox.apply()
    assert "isolation=limits_only" in caplog.text
    programs = ["```python\ndef f(x):\n    return x\n```", "```python\ndef f(x):\n    return -x\n```"]
    scores, meta = score_batch(CodeTestsReward(limits=LIMITS), programs, [code_answer(["assert f(2) == 2"], "f")] * 2)
    assert [s["reward"] for s in scores] == [1.0, 0.0]
    assert meta["grading/code_limits_only"] == 2 == meta["grading/code_programs"]


def test_the_pool_follows_the_cpus_this_process_may_use(monkeypatch, restore_sandbox):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(sandbox, "_cgroup_quota", lambda: None)
    assert sandbox.available_cpus() == 1 and sandbox.default_workers() == 2
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(sandbox, "_cgroup_quota", lambda: 3)  # cpu.max "300000 100000"
    assert sandbox.available_cpus() == 3
    sandbox._settings = sandbox.SandboxSettings(workers=5)
    assert sandbox.default_workers() == 5
    assert "at most 5 sandboxes at once, each 8 processes x 512 MB" in sandbox.budget()

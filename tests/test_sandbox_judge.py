"""The sandbox's judge (issues 34, 64): tests run in a process of their own that calls the program through a pipe.

What a test may do with the program's functions and objects, how values cross the pipes (rebuilt as their
standard types by each side's own code, fuzzed: nothing a program writes can raise in rlvr or build anything in
the trainer), and the fail-closed refusal where the isolation cannot be had (no bubblewrap; a container whose
seccomp profile refuses namespaces, as Docker's default does).
"""

from __future__ import annotations

import collections
import decimal
import fractions
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import rlvr.sandbox as sandbox
from rlvr.config import TrainConfig, load_config
from rlvr.grading.code import grade_programs
from rlvr.grading.values import read_str
from rlvr.sandbox import SandboxUnavailable, launch, read_value, run_program
from rlvr.sandbox.inside.codec import Codec
from rlvr.sandbox.inside.wire import Malformed, Memo, Pipe
from rlvr.sandbox.records import Check, Job, SandboxLimits
from rlvr.sandbox.results import read_results
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
             "s = Stack()\nassert len(s) == 0 and not s", "s = Stack()\ns.push(3)\nassert str(s) == 'Stack(1)' and s",
             "s = Stack()\ns.push(4)\nassert s.items == [4]"]
    assert grade(program, tests, "Stack") == (4, 4)


def test_an_argument_changed_in_place_is_seen_by_the_test_at_every_depth_with_aliases_kept():
    program = ("def rotate(nums, k):\n    nums[:] = nums[-k:] + nums[:-k]\ndef fill(d):\n    d['x'] = 1\n"
               "def deep(rows):\n    rows[0].append(9)\n    rows[1]['k'].add(3)\n    rows.append(rows[0])\n"
               "    return rows[0]\n")
    tests = ["nums = [1, 2, 3, 4]\nrotate(nums, 1)\nassert nums == [4, 1, 2, 3]",
             "d = {}\nfill(d)\nassert d == {'x': 1}",
             # the test keeps references to nested rows; the program changes them and aliases one of them
             "row, inner = [1], {'k': {2}}\nrows = [row, inner]\nback = deep(rows)\n"
             "assert row == [1, 9] and inner['k'] == {2, 3} and rows[0] is row and rows[2] is row and back is row"]
    assert grade(program, tests, "rotate") == (3, 3)


def test_exceptions_cross_by_their_class_chain():
    program = ("class Bad(ValueError):\n    pass\nclass Worse(Bad):\n    def __init__(self, code):\n"
               "        super().__init__(f'code {code}')\n        self.code = code\n"
               "def f(x):\n    if x < 0:\n        raise Worse(7)\n    return x\ndef g():\n    raise KeyError('k')\n")
    tests = ["def test_bad():\n    try:\n        f(-1)\n    except ValueError:\n        return\n    assert False",
             "def test_key():\n    try:\n        g()\n    except LookupError:\n        return\n    assert False",
             "def test_not_type():\n    try:\n        f(-1)\n    except TypeError:\n        return\n    assert False",
             "import pytest\nfrom solution import Bad, Worse\ndef test_own_classes():\n    with pytest.raises(Bad, match='code 7') as e:\n"
             "        f(-1)\n    assert type(e.value) is Worse and e.value.code == 7 and issubclass(Worse, Bad)",
             "assert f(3) == 3"]
    # pytest's run: four tests (the module's own assert runs as it is imported), test_not_type fails
    assert grade(program, tests) == (3, 4)


def test_generators_callables_and_modules_the_program_imported():
    program = ("import math\nfrom math import sqrt\ndef gen(n):\n    yield from range(n)\ndef r(x):\n    return sqrt(x)\n"
               "def apply(fn, *args, key=None):\n    return fn(*args) if key is None else sorted(args, key=key)\n")
    tests = ["assert list(gen(3)) == [0, 1, 2]", "assert math.isclose(r(4), 2.0)", "assert sum(gen(4)) == 6",
             "g = gen(5)\nassert next(g) == 0 and next(g) == 1 and list(g) == [2, 3, 4]",
             "assert apply(lambda a, b: a * b, 3, 4) == 12", "assert apply(None, 'bb', 'a', key=len) == ['a', 'bb']",
             "calls = []\nassert apply(calls.append, 5) is None and calls == [5]"]
    assert grade(program, tests, "gen") == (7, 7)


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


def test_a_value_that_cannot_cross_fails_its_check_and_is_named_in_the_reason():
    program = "def apply(fn, x):\n    return fn(x)\ndef f(x):\n    return x\n"
    verdict = grade(program, ["import sys\nassert apply(lambda v: v, sys) is sys", "assert f(1) == 1"], "apply")
    assert verdict == (1, 2)
    assert "cannot cross between the tests and the program: a module cannot be passed to the program" in verdict.reason


# ----------------------------------------------------------------------------------------------------
# The codec and the readers, fuzzed.


def _random_value(rng: random.Random, depth: int = 0):
    kinds = ["int", "bigint", "float", "str", "bytes", "bool", "none", "complex", "fraction", "decimal", "range"] + (
        ["list", "tuple", "set", "dict", "frozenset", "counter", "ordered", "default", "deque", "bytearray", "point"]
        if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "int":
        return rng.randint(-10**15, 10**15)
    if kind == "bigint":
        return rng.choice([-1, 1]) * rng.randint(2**63, 10**5000)
    if kind == "float":
        return rng.choice([rng.uniform(-1e6, 1e6), math.inf, -math.inf, -0.0, 1e-300, 5e-324])
    if kind == "str":
        return "".join(chr(rng.choice([rng.randint(0, 0x2FF), 0xD800, 0x1F600])) for _ in range(rng.randint(0, 8)))
    if kind in ("bytes", "bytearray"):
        data = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 8)))
        return data if kind == "bytes" else bytearray(data)
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "none":
        return None
    if kind == "complex":
        return complex(rng.uniform(-5, 5), rng.uniform(-5, 5))
    if kind == "fraction":
        return fractions.Fraction(rng.randint(-99, 99), rng.randint(1, 99))
    if kind == "decimal":
        return decimal.Decimal(rng.choice(["0.1", "-3.14159", "1E+5", "-Infinity", "0.000"]))
    if kind == "range":
        return range(rng.randint(-5, 5), rng.randint(-5, 20), rng.choice([1, 2, -1]))
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
    if kind == "deque":
        return collections.deque(items, maxlen=rng.choice([None, 10]))
    if kind == "point":
        return POINT(items[0] if items else 1, tuple(items))
    pairs = list(zip(hashable, items))
    if kind == "counter":
        return collections.Counter({k: rng.randint(-3, 9) for k, _ in pairs})
    if kind == "ordered":
        return collections.OrderedDict(pairs)
    if kind == "default":
        return collections.defaultdict(rng.choice([list, int, None]), pairs)
    return dict(pairs)


POINT = collections.namedtuple("Point", "x y")


def _same(a, b) -> bool:
    """Equal and of the same type at every depth (NaN equals NaN here)."""
    if type(a) is not type(b) and not (type(a).__name__ == type(b).__name__ == "Point"):
        return False
    if isinstance(a, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, decimal.Decimal):
        return str(a) == str(b)
    if isinstance(a, (list, tuple, collections.deque)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a) and (
            not isinstance(a, collections.defaultdict) or a.default_factory is b.default_factory)
    return a == b


def _crossed(value):
    """The value as the other side rebuilds it: encoded by one codec, sent as JSON text, decoded by another."""
    text = json.dumps(Codec("p", None).encode(value, Memo()))
    return Codec("j", None).decode(json.loads(text), Memo())


def test_every_value_of_the_standard_types_crosses_as_itself():
    rng = random.Random(0)
    for _ in range(2000):
        value = _random_value(rng)
        assert _same(_crossed(value), value), value
    counts = _crossed(collections.Counter("abracadabra"))
    assert counts.most_common(1) == [("a", 5)] and counts["z"] == 0  # a Counter, not a dict
    views = _crossed({"a": 1}.keys()), _crossed({"a": 1}.values()), _crossed({"a": 1}.items())
    assert views[0] == {"a"} and list(views[1]) == [1] and views[2] == {("a", 1)}
    shared = [1]
    back = _crossed([shared, shared, (shared,)])
    assert back[0] is back[1] is back[2][0] and back[0] == [1]  # aliases stay aliases
    cycle = []
    cycle.append(cycle)
    assert _crossed(cycle)[0] is _crossed(cycle)[0][0] or True
    looped = _crossed(cycle)
    assert looped[0] is looped


def test_exceptions_and_their_classes_are_rebuilt_with_their_bases():
    class Bad(ValueError):
        pass

    err = Bad("no", 3)
    err.code = 7
    program_side = Codec("p", None)
    node = json.loads(json.dumps(program_side.encode(err, Memo())))
    judge_side = Codec("j", None)
    back = judge_side.decode(node, Memo())
    assert isinstance(back, ValueError) and type(back).__name__ == "Bad" and back.args == ("no", 3)
    assert back.code == 7 and str(back) == str(err)
    again = judge_side.decode(json.loads(json.dumps(program_side.encode(Bad("x"), Memo()))), Memo())
    assert type(again) is type(back)  # one class per class of the program's
    # and the class given back is the program's own again
    assert program_side.decode(json.loads(json.dumps(judge_side.encode(type(back), Memo()))), Memo()) is Bad
    assert type(_crossed(KeyError("k"))) is KeyError and type(_crossed(json.JSONDecodeError("m", "d", 0))) is \
        json.JSONDecodeError


def test_read_str_builds_nothing_but_one_string():
    assert read_str(json.dumps("a\nb")) == "a\nb" and read_str('["l", 1, "a"]') is None and read_str("[") is None
    assert read_str(json.dumps("x" * 2_000_000)) is None  # past the cap: not read at all


def test_the_decoder_refuses_anything_but_its_grammar():
    attempts = [["?", 1], ["l"], ["l", 1, ["@", 2]], ["@", 5], ["d", 1, 1], ["i", "zz"], ["B", "exec"], ["B", "__import__"],
                ["B", "str.__class__"], ["X", "s", "os", "system"], ["j", 1], ["p", 1], ["c", "1", 2], {"a": 1},
                ["r", 1.5, 2, 1], ["q", 1, -1], ["s", 1, ["l", 2]], ["l", 1, ["l", 1]], ["fr", 1, 0],
                ["x", ["X", "s", "builtins", "print"], [], {}, ""], ["X", "b", "len"], ["dk", ["l", 1]]]
    judge_side = Codec("j", None)
    for node in attempts:
        with pytest.raises(Malformed):
            judge_side.decode(node, Memo())
    deep = ["t"]
    for _ in range(300):
        deep = ["t", deep]
    with pytest.raises(Malformed):
        judge_side.decode(deep, Memo())
    rng = random.Random(2)
    for _ in range(300):  # garbage: either a value or Malformed, nothing else
        try:
            node = json.loads(_garbage(rng).decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            continue
        try:
            judge_side.decode(node, Memo())
        except Malformed:
            pass


def _garbage(rng: random.Random) -> bytes:
    pieces = [b"[" * 200_000, b"{" * 50_000, b"\x00\xff\xfe", os.urandom(rng.randint(0, 300)), b"\n",
              b'{"check": 0, "outcome": "passed", "value": ' + b"[" * 100_000 + b"}", b'{"load": 5}',
              b'{"check": true, "value": "1"}', b'{"check": 1e999}', b'{"exit": "9", "signaled": "yes"}',
              b'"\\ud800"', b"1" * 5_000_000, b'{"done": 1}', b'{"count": 99999999}', b'{"count": 3}',
              b'["l", 1, ["@", 1]]', b'["X", "p", 3, "E", "E", "m", [["X", "p", 3]]]',
              json.dumps({"check": 0, "value": "1" * 3000}).encode()]
    return b"".join(rng.choice(pieces) for _ in range(rng.randint(1, 6)))


def test_the_result_reader_never_raises_whatever_the_bytes():
    rng = random.Random(1)
    for _ in range(300):
        result = read_results(_garbage(rng), _garbage(rng), rng.randint(-9, 255), None, 3, 0.0)
        assert result.status in sandbox.STATUSES and len(result.values) == len(result.outcomes)
        assert result.status != "ok" or result.outcomes  # never "ok" without the records that say so
    good = b'{"load": "ok"}\n{"count": 2}\n{"check": 0, "outcome": "passed"}\n{"check": 1, "outcome": "xfailed"}\n{"done": true}\n'
    result = read_results(good, b"", 0, None, 1, 0)
    assert result.status == "ok" and result.passed() == [True, True]


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


def test_a_value_check_sends_data_only():
    result = run_program(Job("class P:\n    pass\ndef f():\n    return {'a': [1, (2,)]}\ndef g():\n    return P()\n",
                             (Check("f()"), Check("g()"))), LIMITS)
    assert read_value(result.values[0]) == {"a": [1, (2,)]} and result.values[1] is None
    with pytest.raises(ValueError):
        read_value('["p", 1, "P", ""]')  # a handle is not data


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

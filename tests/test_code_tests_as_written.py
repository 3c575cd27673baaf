"""Code tests run as written (issues 58, 64): a test file executes with the runner it was written for, the
task's entry point is the program's, no program object is bound under a builtin's or a standard module's
name, the judge decides membership on its own values, and test files whose checks cannot run are refused.

Each behaviour is checked both ways through the sandbox: the right program passes, the wrong one that the
old runner passed does not (`tests/sandbox_attacks.py` has the attacks themselves, as root and as uid 65534).
"""

from __future__ import annotations

import json

import pytest

from rlvr.grading.code import grade_programs
from rlvr.grading.code_tests import CodeTestsError, parse_tests
from rlvr.sandbox.records import SandboxLimits
from rlvr.tasks.code import code_answer, load_code_jsonl
from rlvr.tasks.records import DataError

LIMITS = SandboxLimits(timeout=4, cpu_seconds=2, memory_mb=256, file_mb=8, processes=16, output_kb=256)


def grade(programs: list[str], tests: list[str], entry: str | None = "f") -> list[tuple[int, int]]:
    return grade_programs(programs, [code_answer(tests, entry)] * len(programs), LIMITS)


def kinds(tests: list[str], entry: str | None = "f") -> list[tuple[str, str]]:
    return [(c.label or c.expr, c.kind) for c in parse_tests(code_answer(tests, entry)).checks]


# ----------------------------------------------------------------------------------------------------
# The file runs in order, then its test functions.


def test_every_top_level_statement_runs_and_statements_that_assert_are_checks():
    tests = ["assert square(0) == 0\nfor x in range(1, 4):\n    assert square(x) == x * x",
             "def more():\n    assert square(5) == 25\nmore()",
             "results = [square(x) for x in (6, 7)]\nprint('done')"]
    assert kinds(tests, "square") == [("assert square(0) == 0", "run"), ("for x in range(1, 4):\n    assert square(x) == x * x", "run"),
                                      ("more()", "run"), ("results = [square(x) for x in (6, 7)]\nprint('done')", "run")]
    right, wrong, fails_late = "def square(x):\n    return x * x", "def square(x):\n    return 0", (
        "def square(x):\n    if x == 7:\n        raise ValueError\n    return x * x")
    # the last statements are a check too: they must run to the end (the wrong square gets through them)
    assert grade([right, wrong, fails_late], tests, "square") == [(4, 4), (2, 4), (3, 4)]


def test_test_functions_run_after_the_helpers_and_constants_defined_below_them():
    tests = ["def test_f():\n    assert f(2) == helper(2)\n    assert f(3) == EXPECTED\n"
             "def helper(x):\n    return 2 * x\nEXPECTED = 6"]
    right = "def f(x):\n    return 2 * x"
    supplies_them = "EXPECTED = 1\ndef helper(x):\n    return 1\ndef f(x):\n    return 1"
    assert grade([right, supplies_them], tests) == [(1, 1), (0, 1)]


def test_a_name_the_file_binds_is_never_the_programs_not_even_before_it_does():
    tests = ["assert f(1) == LIMIT\nLIMIT = 3", "x = f(1)", "assert x == 5"]
    assert grade(["LIMIT = 2\nx = 5\ndef f(a):\n    return 2"], tests) == [(0, 2)]
    assert grade(["def f(a):\n    return 5"], ["LIMIT = 5\nassert f(1) == LIMIT", "x = f(1)", "assert x == 5"]) == [(2, 2)]
    # nor can a star import put the program's value over the file's own, unless the file asks for it by name
    star = ["STEP = 3\nfrom solution import *\nassert f(1) == STEP", "from solution import LIMIT\nassert f(1) == LIMIT"]
    assert grade(["STEP = 2\nLIMIT = 2\ndef f(a):\n    return 2"], star) == [(1, 2)]


def test_a_statement_that_raises_stops_the_file_and_a_failing_check_does_not():
    tests = ["assert f(1) == 1", "y = f(-1)", "assert f(2) == 2", "assert True"]
    raises_on_negative = "def f(x):\n    if x < 0:\n        raise ValueError\n    return x"
    assert grade([raises_on_negative, "def f(x):\n    return x"], tests) == [(1, 3), (3, 3)]
    assert grade(["def f(x):\n    return 0 if x == 1 else x"], tests) == [(2, 3)]


def test_pytest_classes_unittest_cases_and_humaneval_check_run_as_their_runners_would():
    tests = ["import unittest\nclass Case(unittest.TestCase):\n    def setUp(self):\n        self.n = 2\n"
             "    def test_a(self):\n        self.assertEqual(f(self.n), 3)\n    def test_b(self):\n"
             "        self.assertIn(3, [f(2)])\n    def helper(self):\n        pass",
             "class TestF:\n    def test_c(self):\n        assert f(0) == 1"]
    assert parse_tests(code_answer(tests, "f")).runner == "pytest"  # pytest runs both kinds of class
    assert grade(["def f(x):\n    return x + 1", "def f(x):\n    return x"], tests) == [(3, 3), (0, 3)]
    humaneval = ["def check(candidate):\n    assert candidate(10) == 11"]
    assert kinds(humaneval) == [("check(f)", "run")]
    assert grade(["def f(x):\n    return x + 1", "def f(x):\n    return x"], humaneval) == [(1, 1), (0, 1)]
    # a file that calls check itself gets no second call
    assert kinds(["def check(candidate):\n    assert candidate(1) == 2\ncheck(f)"]) == [("check(f)", "run")]


# ----------------------------------------------------------------------------------------------------
# Names: the entry point is the program's; no program object under a builtin's or a module's name.


def test_the_entry_point_is_the_programs_even_when_named_like_a_builtin():
    tests = ["assert max([1, 3]) == 3", "assert min([4, 2]) == 2"]
    mine = "def max(xs):\n    best = xs[0]\n    for x in xs:\n        best = x if x > best else best\n    return best"
    assert grade([mine, "x = 1", "def max(xs):\n    return 0"], tests, "max") == [(2, 2), (0, 2), (1, 2)]
    # `from solution import *` brings the entry point in, and the program's other builtin-named names not
    star = ["from solution import *\nassert max([5]) == 5 and abs(-2) == 2"]
    assert grade([mine + "\ndef abs(x):\n    return 0"], star, "max") == [(1, 1)]


def test_no_program_object_is_bound_under_a_builtins_or_a_standard_modules_name():
    attack = ("import json as re\nclass M:\n    def isclose(self, *a, **k):\n        return True\nmath = M()\n"
              "def len(x):\n    return 3\ndef all(x):\n    return True\ndef f(x):\n    return -1.0")
    # each passes only if the program's object answers
    tests = ["assert math.isclose(f(4), 2.0)", "from solution import *\nassert len([f(1)]) == 3",
             "import solution\nassert solution.all([False])", "assert re.match('x', 'abc')"]
    assert grade([attack], tests) == [(0, 4)]
    honest = ["assert math.isclose(f(4), 2.0)", "from solution import *\nassert len([f(1)]) == 1"]
    assert grade(["import math\ndef f(x):\n    return math.sqrt(x)"], honest) == [(2, 2)]


def test_tests_that_rely_on_the_solutions_import_get_the_real_module():
    tests = ["assert math.isclose(r(4), 2.0)", "assert collections.Counter(r(1) for _ in range(2))[1.0] == 2"]
    assert grade(["import math\ndef r(x):\n    return math.sqrt(x)", "def r(x):\n    return x ** 0.5",
                  "import math\nmath.isclose = lambda *a, **k: True\ndef r(x):\n    return 0.0"], tests, "r") == [
        (2, 2), (2, 2), (0, 2)]


def test_membership_is_decided_in_the_judge_on_the_values_the_program_gives():
    tests = ["assert 3 in f(5)", "assert 7 not in f(5)", "assert 'b' in g()"]
    honest = "def f(n):\n    return range(n)\ndef g():\n    return {'a': 1, 'b': 2}.keys()"
    claims = ("class All:\n    def __contains__(self, x):\n        return True\n    def __iter__(self):\n"
              "        return iter([])\ndef f(n):\n    return All()\ndef g():\n    return All()")
    assert grade([honest, claims], tests) == [(3, 3), (1, 3)]  # `7 not in` an empty iteration holds


# ----------------------------------------------------------------------------------------------------
# Refused when read (a data set is refused when it loads).


@pytest.mark.parametrize("tests, entry, message", [
    (["def helper():\n    assert f(1) == 2"], "f", r"the asserts in helper\(\) never run"),
    (["def check(candidate):\n    assert candidate(1) == 2"], None, r"the asserts in check\(\) never run"),
    (["class TestF:\n    def __init__(self):\n        pass\n    def test_a(self):\n        assert f(1) == 2"], "f",
     r"the tests in TestF never run: pytest does not collect a class with an __init__"),
    (["def test_f():\n    yield 1"], "f", r"test_f\(\) is a generator \(a yield test\), which pytest refuses"),
    (["import requests\ndef test_f():\n    assert f(1) == 2"], "f", r"the tests import 'requests', which the sandbox does not have"),
    (["from .solution import f\nassert f(1) == 2"], "f", r"a relative import"),
    (["x = f(1)\nprint(x)"], "f", r"no assert statement or test function"),
    (["async def test_f():\n    assert f(1) == 2"], "f", r"is a coroutine"),
    (["assert f(1) == 2"], "class", r"the entry point must be a Python name"),
])
def test_test_files_whose_checks_cannot_run_are_refused_with_the_reason(tests, entry, message):
    with pytest.raises(CodeTestsError, match=message):
        parse_tests(code_answer(tests, entry))


def test_a_data_set_with_such_tests_is_refused_when_it_loads(tmp_path):
    path = tmp_path / "tasks.jsonl"
    rows = [{"prompt": "Double it.", "tests": ["assert f(1) == 2"], "entry_point": "f"},
            {"prompt": "Double it.", "tests": "import requests\n\ndef test_f():\n    assert f(1) == 2\n", "entry_point": "f"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"tasks\.jsonl:2: field 'tests': the tests import 'requests'"):
        load_code_jsonl(path)

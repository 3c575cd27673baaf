"""The runners the judge runs a test file with, each as that runner decides (pytest's own is `pytest_runner`):

* "script": checks the host read from the file (`rlvr.grading.code_tests`), run in order in one namespace as a
  script runs, except that a failing check does not stop the next: MBPP's asserts, HumanEval's check.
* "unittest": the file as a module (not `__main__`: its `unittest.main()` trailer stays idle, as under
  `python -m unittest`), its TestCases loaded and run by unittest's own loader and suite, module and class
  fixtures, subTest, skip and expectedFailure included; each test method is one check.
* "stdio": the program run as a script once per input, its output compared here by the task's rule.

Every check ends as one record: {"check": i, "outcome": passed | failed | error | skipped | xfailed | xpassed,
"error": the exception's class, "reason": a line}; a runner that decides how many checks there are says so first
({"count": n}). A run the runner calls failed with no failing check (an error in a module fixture) adds one
failing check for the run itself.
"""

import math
import sys
import types

from . import judge as judging
from . import codec, wire

TEST_MODULE = "test_solution"
OK = frozenset({"passed", "skipped", "xfailed", "xpassed"})


class Report:
    def __init__(self, pipe: wire.Pipe):
        self.pipe, self.sent = pipe, 0

    def count(self, n: int):
        self.pipe.send({"count": n})

    def check(self, i: int, outcome: str, why: BaseException | str | None = None, value=None, error=None):
        """One check's outcome; `why` an exception (its class and message) or a reason in words (`error`: the
        class of the exception behind it)."""
        record = {"check": i, "outcome": outcome}
        if isinstance(why, BaseException):
            record["error"] = type(why).__name__
            try:
                text = str(why)
            except BaseException:
                text = ""
        else:
            text = "" if why is None else str(why)
            if error:
                record["error"] = str(error)
        if text:
            record["reason"] = " ".join(text.split())[:300]
        if value is not None:
            record["value"] = value
        self.pipe.send(record)
        self.sent += 1


def data_text(value) -> str | None:
    """A value as wire text made of data only (a "value" check: the probe's dict, python_tool's string)."""
    import json

    try:
        return json.dumps(codec.Codec("h", None, lambda obj: "not data").encode(value, wire.Memo()))
    except (wire.Uncrossable, ValueError, TypeError, RecursionError):
        return None


def gave(value, want: str, expr: str) -> str:
    """The message of a failed `assert <expr> == <literal>` (rlvr.grading.code_script rewrites it to say this)."""
    try:
        text = repr(value)
    except BaseException:
        text = f"a {type(value).__name__}"
    return f"{expr} gave {text if len(text) <= 200 else text[:197] + '...'}, expected {want}"


def run_script(job: dict, namespace: dict, report: Report):
    """As a script runs: a check's setup (the statements before it) that raises stops the file, and that check
    and every later one fail; a failing check does not stop the ones after it. Kind "value" sends its
    expression's value back, "true" passes when it is truthy, "run" when its statements complete."""
    stopped = None  # the exception that stopped the file
    for i, check in enumerate(job["checks"]):
        if stopped is None and check.get("setup"):
            try:
                exec(compile(check["setup"], f"{TEST_MODULE}.py", "exec"), namespace)
            except BaseException as err:  # wire.Gone too
                stopped = err
        if stopped is not None:
            report.check(i, "error", stopped)
            continue
        try:
            if check["kind"] == "run":
                exec(compile(check["expr"], f"{TEST_MODULE}.py", "exec"), namespace)
                report.check(i, "passed")
            elif check["kind"] == "value":
                value = eval(compile(check["expr"], f"{TEST_MODULE}.py", "eval"), namespace)
                text = data_text(value)
                report.check(i, "passed", value=text) if text is not None else report.check(i, "error", "unserializable")
            else:  # "true": the assert's own rule, truthiness, on a value of the judge's
                value = eval(compile(check["expr"], f"{TEST_MODULE}.py", "eval"), namespace)
                report.check(i, "passed") if value else report.check(i, "failed", error="AssertionError")
        except BaseException as err:  # wire.Gone too: this check and every later one fail
            report.check(i, "failed" if isinstance(err, AssertionError) else "error", err)


def run_unittest(job: dict, namespace: dict, report: Report):
    import unittest

    module = types.ModuleType(TEST_MODULE)
    module.__dict__.update(namespace)
    module.__name__, module.__file__ = TEST_MODULE, f"{TEST_MODULE}.py"
    sys.modules[TEST_MODULE] = module
    try:
        exec(compile(job["source"], f"{TEST_MODULE}.py", "exec"), module.__dict__)
    except BaseException as err:  # an import error: unittest runs nothing of the file
        report.count(1)
        report.check(0, "error", err)
        return
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    tests = _flatten(suite)
    index = {id(t): i for i, t in enumerate(tests)}
    report.count(len(tests))
    result = _Result(index)
    suite.run(result)
    failed = False
    for i in range(len(tests)):
        outcome, error = result.outcomes.get(i, ("error", "never ran (a fixture of its class or module failed)"))
        report.check(i, outcome, error)
        failed = failed or outcome not in OK
    if not result.wasSuccessful() and not failed:  # a module or class fixture's error alone fails the run
        report.count(len(tests) + 1)
        report.check(len(tests), "error", result.session_error or "the run failed")


def _flatten(suite) -> list:
    out = []
    for test in suite:
        out += _flatten(test) if hasattr(test, "__iter__") else [test]
    return out


def _result_class():
    import unittest

    class Result(unittest.TestResult):
        def __init__(self, index):
            super().__init__()
            self.index, self.outcomes, self.session_error = index, {}, None

        def _set(self, test, outcome, error=None):
            i = self.index.get(id(test))
            if i is None:  # a fixture's error (setUpModule, setUpClass): the run fails
                self.session_error = self.session_error or f"{test}: {_reason(error)}"
                return
            if self.outcomes.get(i, ("passed",))[0] in OK:  # a failed subtest stays failed
                self.outcomes[i] = (outcome, _reason(error) and f"{_name(test)}: {_reason(error)}")

        def addSuccess(self, test):
            super().addSuccess(test)
            self._set(test, "passed")

        def addError(self, test, err):
            super().addError(test, err)
            self._set(test, "error", err)

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._set(test, "failed", err)

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._set(test, "skipped")

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._set(test, "xfailed")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._set(test, "failed", "unexpected success")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                i = self.index.get(id(test))
                if i is not None:
                    failed = issubclass(err[0], test.failureException)
                    self.outcomes[i] = ("failed" if failed else "error", f"{_name(test)} {subtest._subDescription()}: "
                                                                         f"{_reason(err)}")

    return Result


def _Result(index):
    return _result_class()(index)


def _name(test) -> str:
    return test.id().split(".", 1)[-1]


def _reason(error):
    if error is None or isinstance(error, str):
        return error
    kind, value = error[0], error[1]
    return f"{kind.__name__}: {' '.join(str(value).split())[:280]}"


# ----------------------------------------------------------------------------------------------------
# stdin/stdout tasks.

COMPARES = ("exact", "whitespace", "float")
FLOAT_TOLERANCE = 1e-6


def same_output(got: str, want: str, rule: str) -> bool:
    """exact: the same text; whitespace: the same whitespace-separated tokens; float: those tokens, where both are
    numbers equal within 1e-6 (absolute, or relative to the expected)."""
    if rule == "exact":
        return got == want
    mine, theirs = got.split(), want.split()
    if len(mine) != len(theirs):
        return False
    if rule == "whitespace":
        return mine == theirs
    for a, b in zip(mine, theirs):
        if a == b:
            continue
        try:
            x, y = float(a), float(b)
        except ValueError:
            return False
        if not (math.isfinite(x) and math.isfinite(y)) or abs(x - y) > FLOAT_TOLERANCE * max(1.0, abs(y)):
            return False
    return True


def run_stdio(job: dict, judge: judging.Judge, report: Report):
    rule, cap = job.get("compare", "whitespace"), int(job["limits"].get("output_kb", 1024)) * 1024
    for i, (stdin, want) in enumerate(job["cases"]):
        try:
            reply = judge.peer.request({"op": "script", "stdin": stdin, "cap": cap})
            got, status, signaled, cut = judge.result(reply, wire.Memo())
        except BaseException as err:  # wire.Gone: every later case fails too
            report.check(i, "error", err)
            continue
        if cut:
            report.check(i, "failed", f"wrote more than {cap >> 10} KB")
        elif signaled or status:
            report.check(i, "error", f"exited with {'signal ' + str(signaled) if signaled else 'status ' + str(status)}")
        elif same_output(got, want, rule):
            report.check(i, "passed")
        else:
            report.check(i, "failed", f"wrong output ({rule} comparison)")

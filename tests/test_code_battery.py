"""Issue 64's battery: rlvr's verdict on each right and wrong program equals the real runner's (pytest, unittest,
the script itself, the program on each input), as root and as uid 65534, and every right program scores 1.

The programs are in `tests/code_battery.py`: values of the standard types (Counter, defaultdict, OrderedDict,
namedtuples, Fraction, Decimal, deques, views, generators), scripts of asserts and HumanEval's check, pytest
files (fixtures, parametrize, marks, xunit setup, classes, callbacks and test-defined objects), unittest files
(the `unittest.main()` trailer, module and class fixtures, subTest, skip, expectedFailure, mocks), what the
program's process must offer (threads, asyncio, multiprocessing, numpy, capsys, patched input and stdin, mocks
and monkeypatches of its internals and of standard modules), and stdin/stdout programs under each comparison.
rlvr grades each group once per user (one batch of sandboxes); the real runners run once, in subprocesses.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import code_battery
from sandbox_site import readable_site

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
ROOT = os.geteuid() == 0
USERS = ["root", "nobody"] if ROOT else ["user"]
BATTERY = code_battery.cases()
BY_NAME = {c.name: c for c in BATTERY}


def _nobody_skip() -> str | None:
    if not ROOT:
        return "this suite already runs as an ordinary user"
    if shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON):
        return f"needs setpriv and {SYSTEM_PYTHON} to grade as uid {NOBODY}"
    return None


@pytest.fixture(scope="module")
def graded():
    """user -> rlvr's verdicts on the whole battery."""
    out = {"root" if ROOT else "user": code_battery.rlvr_verdicts(BATTERY)}
    if ROOT and not _nobody_skip():
        base = Path(tempfile.mkdtemp(prefix="rlvr-battery-nobody-", dir="/tmp"))
        try:
            os.chmod(base, 0o777)
            site = readable_site(base / "site", (Path(code_battery.__file__),))
            report = base / "verdicts.json"
            done = subprocess.run(
                ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", SYSTEM_PYTHON,
                 str(site / "code_battery.py"), "grade", str(report)], capture_output=True, text=True, timeout=900,
                cwd=base, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(site),
                               "HOME": str(base), "PYTHONDONTWRITEBYTECODE": "1"})
            assert done.returncode == 0, done.stderr[-3000:]
            out["nobody"] = json.loads(report.read_text())
        finally:
            shutil.rmtree(base, ignore_errors=True)
    return out


@pytest.fixture(scope="module")
def real():
    return code_battery.real_verdicts(BATTERY)


def test_the_battery_holds_what_the_issue_asks():
    right = [c for c in BATTERY if c.right]
    wrong = [c for c in BATTERY if not c.right]
    assert len(right) >= 60 and len(wrong) >= 25, (len(right), len(wrong))
    from rlvr.grading.code_tests import parse_tests

    runners = {parse_tests(code_battery.ground_truth(c)).runner for c in BATTERY}
    assert runners == {"script", "pytest", "unittest", "stdio"}
    assert len(BY_NAME) == len(BATTERY)


@pytest.mark.parametrize("user", USERS)
@pytest.mark.parametrize("name", list(BY_NAME))
def test_rlvr_gives_the_real_runners_verdict(graded, real, user, name):
    if user not in graded:
        pytest.skip(_nobody_skip() or "not graded")
    case = BY_NAME[name]
    report = graded[user]
    if case.needs and case.needs not in report["packages"]:
        pytest.skip(f"this grader's runtime has no {case.needs}")
    passed, total, reason = report["verdicts"][name]
    assert code_battery.agree(case, [passed, total], real[name]), (passed, total, reason, real[name])
    if case.right:
        assert passed == total >= 1, reason
    else:
        assert passed < total and reason, reason

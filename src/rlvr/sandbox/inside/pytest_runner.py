"""pytest, run in the judge on a test file held in memory.

pytest is given one path, `test_solution.py` beside this file (read-only in the sandbox, empty): a plugin makes
its module from the job's source instead, with pytest's own assertion rewriting, in a namespace holding the
program's names as the judge binds them (`judge.bind`). Everything else is pytest's: collection, fixtures
(built-in ones too: capsys, monkeypatch, tmp_path), parametrize, marks (skip, skipif, xfail), xunit setup and
teardown at every level, classes, unittest TestCases, `approx`, `raises`. No conftest, no plugins from
entry points, no cache, no terminal output. Each collected item is one check; a collection error fails them
all; a session that fails with no failing item (a session fixture's teardown) adds one failing check.
"""

import ast
import os
import sys
import types

from .runners import OK, TEST_MODULE, Report

STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{TEST_MODULE}.py")
# no configuration file (none is read from the directories above: with limits_only they are the project's), no
# cache (nothing written), no terminal output, no conftest; the plugins that only report elsewhere are off (the
# others stay: unittest's support reads debugging's options)
ARGS = ["--noconftest", "--import-mode=importlib", "-c", os.devnull, "--rootdir", os.path.dirname(STUB),
        *[arg for name in ("cacheprovider", "terminal", "doctest", "junitxml", "pastebin") for arg in ("-p", f"no:{name}")]]


def run_pytest(job: dict, namespace: dict, report: Report):
    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    source = job["source"]

    class MemoryModule(pytest.Module):
        def _getobj(self):
            module = types.ModuleType(TEST_MODULE)
            module.__dict__.update(namespace)
            module.__name__, module.__file__ = TEST_MODULE, str(self.path)
            sys.modules[TEST_MODULE] = module
            tree = ast.parse(source, str(self.path))
            rewrite_asserts(tree, source.encode("utf-8", "surrogatepass"), self.path, self.config)
            exec(compile(tree, str(self.path), "exec"), module.__dict__)
            self.config.pluginmanager.consider_module(module)
            return module

    class Collect:
        def __init__(self):
            self.items: list[str] = []
            self.outcomes: dict[str, tuple] = {}
            self.collect_errors: list[str] = []

        @pytest.hookimpl(tryfirst=True)
        def pytest_pycollect_makemodule(self, module_path, parent):
            return MemoryModule.from_parent(parent, path=module_path)

        def pytest_collectreport(self, report):
            if report.failed:
                self.collect_errors.append(_last_line(report.longreprtext))

        def pytest_collection_finish(self, session):
            self.items = [item.nodeid for item in session.items]

        @pytest.hookimpl(wrapper=True)
        def pytest_runtest_makereport(self, item, call):
            made = yield
            if call.excinfo is not None:
                made.rlvr_error = call.excinfo.typename
            return made

        def pytest_runtest_logreport(self, report):
            xfail = hasattr(report, "wasxfail")
            if report.when == "call":
                outcome = ("xpassed" if xfail else "passed") if report.passed else (
                    ("xfailed" if xfail else "skipped") if report.skipped else "failed")
            elif report.failed:
                outcome = "error"
            elif report.skipped:
                outcome = "xfailed" if xfail else "skipped"
            else:
                return
            held = self.outcomes.get(report.nodeid)
            if held is None or held[0] in OK:  # a failure stays
                reason = ""
                if outcome not in OK:
                    crash = getattr(getattr(report.longrepr, "reprcrash", None), "message", None)
                    text = " ".join(str(crash).split()) if crash else _last_line(report.longreprtext)
                    reason = f"{report.nodeid.split('::', 1)[-1]}: {text}"[:300]
                self.outcomes[report.nodeid] = (outcome, getattr(report, "rlvr_error", None), reason)

    collect = Collect()
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    try:
        status = int(pytest.main([STUB, *ARGS], plugins=[collect]))
    except BaseException as err:  # pytest itself could not run: every check fails
        report.count(1)
        report.check(0, "error", err)
        return
    items = collect.items
    if not items:
        report.count(1)
        if collect.collect_errors or status not in (0,):
            why = collect.collect_errors[0] if collect.collect_errors else f"no tests ran (pytest exit status {status})"
            report.check(0, "error", why)
        else:
            report.check(0, "skipped")  # the whole file skipped: pytest's run passes
        return
    report.count(len(items))
    failed = False
    for i, nodeid in enumerate(items):
        outcome, error, reason = collect.outcomes.get(nodeid, ("error", None, f"{nodeid}: never ran"))
        report.check(i, outcome, reason or None, error=error)
        failed = failed or outcome not in OK
    if status != 0 and not failed:
        report.count(len(items) + 1)
        report.check(len(items), "error", (collect.collect_errors or [f"pytest exit status {status}"])[0])


def _last_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""

"""How a code ground truth's tests run: with the runner they were written for, as that runner decides.

The ground truth is `{"entry_point": ..., "tests": [<Python source>, ...]}` (`rlvr.tasks.code.code_answer`), or
`{"stdio": [[stdin, stdout], ...], "compare": ...}` for a program that reads its input and prints its answer
(`rlvr.tasks.code.stdio_answer`). Its sources are one test file; the runner is chosen from what it holds:

* "pytest" (run by pytest itself in the judge, `rlvr.sandbox.inside.pytest_runner`): a file that defines
  `test*` functions or `Test*` classes: KodCode's rows, fixtures, parametrize, marks, xunit setup and teardown
  at every level, classes; also a file that mixes those with unittest TestCases.
* "unittest" (unittest's own loader and suite): a file whose tests are TestCases only, trailer
  `unittest.main()` or not.
* "script" (`rlvr.grading.code_script`): asserts and statements, HumanEval's `check(candidate)` (pytest's
  helpers, `pytest.approx`, may be used in them).
* "stdio": the program run as a script on each input, its output compared by `compare`: "exact" (the same
  text), "whitespace" (the default: the same whitespace-separated tokens) or "float" (those tokens, numbers
  equal within 1e-6 absolute or relative to the expected).

The namespace, before the file's first statement (the judge's `bind`): the program's top-level names except a
builtin's, a standard module's, a name the test runners read (`test*`, `Test*`, `setUpModule`, `load_tests`,
...) or a name the file binds itself (those stay the file's: a constant defined below a test cannot be the
program's, nor can `from solution import *` replace it unless the file asks the program for that name, `from
solution import name`); the task's entry point, always, even when named like a builtin (`max`), and a program
without it fails every check; and the real standard module for every standard module name the file uses
without importing it (MBPP tests that call `math.isclose` on the solution's import get `math`, not whatever
the program bound to that name).

Refused here, with the reason (`CodeTestsError`; a data set is refused when it loads): no test at all; a
function holding asserts that nothing calls; a test that is a coroutine or a generator, or in a class with an
`__init__` (pytest fails or skips it for every program); an import of anything but the standard library, the program's module (`solution`) and the
packages a sandbox gets (pytest, numpy where the grader has it); a relative import.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import keyword
import symtable
import sys
from functools import lru_cache

from rlvr.grading.code_script import ScriptError, script_checks, walk_here
from rlvr.sandbox import launch
from rlvr.sandbox.records import Check, Job

MODULE = "solution"  # the program's module name in the tests (`from solution import f`): Job's default
BIND = "__rlvr_bind__"  # the judge's binding call (rlvr.sandbox.inside.harness), the first thing a script runs
STDLIB = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))
COMPARES = ("exact", "whitespace", "float")
_MOCKS = ("mock", "monkeypatch", "patch")
# what a test file looks at besides the program's output, by the words that look at it
_FORWARD = {"warnings": ("warn", "recwarn"), "logging": ("caplog", "assertLogs", "assertNoLogs", "logging")}


class CodeTestsError(ValueError):
    """A ground truth that is not a code test specification, or a test file whose checks cannot run."""


@dataclasses.dataclass(frozen=True)
class CodeTests:
    """A ground truth read for the sandbox: the runner, what it runs, and how many checks to expect (pytest
    counts its own items; this is its estimate, in case the sandbox ends first)."""

    runner: str
    checks: tuple[Check, ...] = ()  # "script": the checks, in order
    source: str = ""  # "pytest", "unittest": the test file
    cases: tuple = ()  # "stdio": (stdin, expected stdout) pairs
    compare: str = "whitespace"
    entry_point: str | None = None
    bind: tuple = ()  # (name, value) pairs for the judge's bind()
    patches: bool = False  # the tests may patch what the program uses (mock, monkeypatch)
    count: int = 1
    forward: tuple = ()  # what the tests look at besides the output: "warnings", "logging"

    def job(self, program: str) -> Job:
        return Job(program, self.checks, MODULE, self.runner, self.source, self.cases, self.compare, self.bind,
                   self.patches, self.forward)

    def label(self, i: int) -> str:
        """What check `i` is, in the tests' terms (the reasons the judge gives name pytest's and unittest's)."""
        if self.runner == "script" and i < len(self.checks):
            return self.checks[i].label or self.checks[i].expr
        if self.runner == "stdio" and i < len(self.cases):
            return f"input {i + 1}"
        return f"test {i + 1}"


def _names(source: str) -> tuple[set[str], set[str]]:
    """(names the file binds at module level, names it reads as globals), from the compiler's own tables."""
    try:
        table = symtable.symtable(source, "<tests>", "exec")
    except SyntaxError as err:
        raise CodeTestsError(f"a test is not valid Python ({err.msg})") from None
    bound = {s.get_name() for s in table.get_symbols() if s.is_local()}
    read = {s.get_name() for s in table.get_symbols() if s.is_referenced() and not s.is_local()}
    todo = list(table.get_children())
    while todo:
        child = todo.pop()
        todo.extend(child.get_children())
        for s in child.get_symbols():
            if s.is_declared_global() and s.is_assigned():
                bound.add(s.get_name())
            elif s.is_global() and s.is_referenced():
                read.add(s.get_name())
    return bound, read


def _asked_of_the_program(tree: ast.Module) -> set[str]:
    """The names the file takes from the program's module by name: `from solution import f`, `solution.f`."""
    aliases = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
               if a.name == MODULE}
    asked = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module == MODULE for a in n.names}
    asked |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
              and n.value.id in aliases}
    return asked - {"*"}


def _imports(tree: ast.Module) -> set[str]:
    """The top-level packages the file imports; refuses a relative import and one the sandbox does not have."""
    sandbox = {name for name, _ in launch.packages()}
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise CodeTestsError("a relative import in the tests (import the program as `solution`)")
        names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                 else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
        for name in names:
            top = name.split(".")[0]
            if top != MODULE and top not in STDLIB and top not in sandbox:
                raise CodeTestsError(f"the tests import {top!r}, which the sandbox does not have (the standard "
                                     f"library, the program as {MODULE!r}, and {', '.join(sorted(sandbox))})")
            found.add(top)
    return found


def _runner(trees: list[ast.Module]) -> str:
    tests = cases = False
    for tree in trees:
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                tests = True
            elif isinstance(node, ast.ClassDef):
                if any((isinstance(b, ast.Name) and b.id in ("TestCase", "IsolatedAsyncioTestCase")) or
                       (isinstance(b, ast.Attribute) and b.attr in ("TestCase", "IsolatedAsyncioTestCase"))
                       for b in node.bases):
                    cases = True
                elif node.name.startswith("Test"):
                    tests = True
    if tests:
        return "pytest"
    return "unittest" if cases else "script"


def _refuse_unrunnable(tree: ast.Module):
    """Tests pytest fails for every program: coroutines (no plugin awaits them) and generators (yield tests)."""
    def tests_in(body, prefix=""):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                yield prefix + node.name, node
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                yield from tests_in(node.body, node.name + ".")

    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test") and any(
                isinstance(m, ast.FunctionDef) and m.name == "__init__" for m in node.body) and not any(
                "TestCase" in ast.unparse(b) for b in node.bases):
            raise CodeTestsError(f"the tests in {node.name} never run: pytest does not collect a class with an "
                                 "__init__")
    for name, fn in tests_in(tree.body):
        if any(isinstance(d, (ast.Name, ast.Attribute, ast.Call)) and "fixture" in ast.unparse(d) for d in fn.decorator_list):
            continue
        if isinstance(fn, ast.AsyncFunctionDef):
            raise CodeTestsError(f"the test {name}() is a coroutine, which nothing would await")
        if any(isinstance(n, (ast.Yield, ast.YieldFrom)) for statement in fn.body for n in walk_here(statement)):
            raise CodeTestsError(f"the test {name}() is a generator (a yield test), which pytest refuses")


def _estimate(trees: list[ast.Module]) -> int:
    count = 0
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                cases = 1
                for d in node.decorator_list:
                    if isinstance(d, ast.Call) and "parametrize" in ast.unparse(d.func) and len(d.args) >= 2 \
                            and isinstance(d.args[1], (ast.List, ast.Tuple)):
                        cases *= max(1, len(d.args[1].elts))
                count += cases
    return max(1, count)


def _spec(ground_truth: str) -> dict:
    try:
        spec = json.loads(ground_truth)
    except (ValueError, TypeError):
        raise CodeTestsError(f"not a code test specification (JSON with 'tests'): {str(ground_truth)[:80]!r}") from None
    if not isinstance(spec, dict):
        raise CodeTestsError(f"not a code test specification (JSON with 'tests'): {str(ground_truth)[:80]!r}")
    entry = spec.get("entry_point")
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier() and not keyword.iskeyword(entry)
                                  and not entry.startswith("__")):
        raise CodeTestsError(f"the entry point must be a Python name; got {entry!r}")
    return spec


def _stdio(spec: dict) -> CodeTests:
    cases = spec.get("stdio")
    if not isinstance(cases, list) or not cases or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(x, str) for x in c) for c in cases):
        raise CodeTestsError("a stdin/stdout ground truth needs a non-empty 'stdio' list of [stdin, stdout] pairs")
    compare = spec.get("compare", "whitespace")
    if compare not in COMPARES:
        raise CodeTestsError(f"compare must be one of {', '.join(COMPARES)}; got {compare!r}")
    return CodeTests("stdio", cases=tuple((a, b) for a, b in cases), compare=compare, count=len(cases))


@lru_cache(maxsize=4096)
def parse_tests(ground_truth: str) -> CodeTests:
    """How a code ground truth's tests run (see the module docstring).

    >>> t = parse_tests('{"entry_point": "f", "tests": ["assert f(2) == 4", "assert not f(0)"]}')
    >>> t.runner, [c.kind for c in t.checks], t.count
    ('script', ['run', 'run'], 2)
    >>> parse_tests('{"entry_point": "f", "tests": ["def test_f():\\\\n    assert f(2) == 4"]}').runner
    'pytest'
    """
    spec = _spec(ground_truth)
    if "stdio" in spec:
        return _stdio(spec)
    entry, sources = spec.get("entry_point"), spec.get("tests")
    if not isinstance(sources, list) or not sources:
        raise CodeTestsError(f"a code ground truth needs a non-empty 'tests' list: {str(ground_truth)[:80]!r}")
    sources = [str(source) for source in sources]
    trees, bound, read, asked = [], set(), set(), set()
    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
            raise CodeTestsError(f"a test is not valid Python ({getattr(err, 'msg', err)}): {source[:80]!r}") from None
        try:
            _imports(tree)
            _refuse_unrunnable(tree)
        except CodeTestsError as err:
            raise CodeTestsError(f"{err}: {source[:80]!r}") from None
        names = _names(source)
        bound |= names[0]
        read |= names[1]
        asked |= _asked_of_the_program(tree)
        trees.append(tree)
    import builtins

    available = STDLIB | {name for name, _ in launch.packages()}
    modules = sorted(n for n in read - bound if n in available and n != entry and not hasattr(builtins, n))
    bind = {"entry_point": entry, "modules": modules, "test_names": sorted(bound), "asked": sorted(asked & bound)}
    text = "\n".join(sources)
    patches = any(word in text for word in _MOCKS)
    forward = tuple(what for what, words in _FORWARD.items() if any(word in text for word in words))
    runner = _runner(trees)
    if runner != "script":
        return CodeTests(runner, source="\n\n".join(sources), entry_point=entry, bind=tuple(bind.items()),
                         patches=patches, count=_estimate(trees) if runner == "pytest" else _count_cases(trees),
                         forward=forward)
    try:
        checks = script_checks(trees, entry)
    except ScriptError as err:
        raise CodeTestsError(f"{err}: {ground_truth[:80]!r}") from None
    prelude = f"{BIND}(" + ", ".join(f"{k}={v!r}" for k, v in bind.items()) + ")"
    checks[0] = dataclasses.replace(checks[0], setup="\n".join(filter(None, [prelude, checks[0].setup])))
    return CodeTests("script", tuple(checks), entry_point=entry, patches=patches, count=len(checks), forward=forward)


def _count_cases(trees: list[ast.Module]) -> int:
    return max(1, sum(1 for tree in trees for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                      for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
                      and m.name.startswith("test")))

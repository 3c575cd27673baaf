"""How a code ground truth's tests are read into the judge's checks: as pytest or plain Python would run them.

The ground truth is `{"entry_point": ..., "tests": [<Python source>, ...]}` (`rlvr.tasks.code.code_answer`).
Its sources are one test file, run in order in one namespace, as a script runs:

* every top-level statement runs, in order. A top-level `assert` is a check; so is any other top-level
  statement holding an assert (a loop of asserts) or calling a function of the file that asserts (a helper
  call, `check(f)`): it passes when it completes. Other statements (imports, helpers, constants, setup) run
  before the check that follows them; one that raises stops the file, and every check after it fails.
* then, as pytest collects them, each `test*` function (in the order defined), each `test*` method of a
  `Test*` class (a fresh instance each) or of a unittest.TestCase (`TestCase(name).debug()`: setUp, the
  test, tearDown), and HumanEval's `check(<entry point>)` unless the file calls `check` itself. So helpers
  and constants the file defines below its test functions exist when they run.
* statements after the last check that do something (a call) are one more check, so they run too.

`assert <expr> == <literal>` (either side; also `is None/True/False`, `not <expr>`) sends `<expr>`'s value
back and compares it here (`rlvr.grading.values`): the literal never enters the sandbox. Any other check is
decided in the judge on its own plain values.

The namespace, before the file's first statement (`__rlvr_bind__`, the judge's): the program's top-level
names except a builtin's, a standard module's or a name the file binds itself (those stay the file's: a
constant defined below a test cannot be the program's, nor can `from solution import *` replace it unless
the file asks the program for that name, `from solution import name`); the task's entry point, always, even
when named like a builtin (`max`), and a program without it fails every check; and the real standard module
for every standard module name the file uses without importing it (MBPP tests that call `math.isclose` on
the solution's import get `math`, not whatever the program bound to that name).

Refused here, with the reason (`CodeTestsError`; a data set is refused when it loads): no check at all; a
function holding asserts that nothing calls (its checks would never run); a test function that takes
arguments (pytest fixtures, parametrize); an import of anything but the standard library and the
program's module (`solution`), such as pytest; a relative import.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import keyword
import symtable
import sys
from functools import lru_cache

from rlvr.grading.values import canonical
from rlvr.sandbox.records import Check

MODULE = "solution"  # the program's module name in the tests (`from solution import f`): Job's default
BIND = "__rlvr_bind__"  # the judge's binding call (rlvr.sandbox.harness), the first thing a test file runs
FALSY = object()  # expected: any falsy value (`assert not f(x)`)
STDLIB = frozenset(n for n in sys.stdlib_module_names if not n.startswith("_"))
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


@dataclasses.dataclass(frozen=True)
class Is:
    """Expected: this very singleton (`assert f(x) is None`), not merely an equal value (1 == True)."""

    value: object


class CodeTestsError(ValueError):
    """A ground truth that is not a code test specification, or a test file whose checks cannot run."""


@dataclasses.dataclass(frozen=True)
class CodeTests:
    """A ground truth read for the sandbox: the checks it runs and what each must equal (kept outside)."""

    checks: tuple[Check, ...]
    expected: tuple  # per check: a literal, FALSY, Is(singleton), or True for kinds "true" and "run"
    entry_point: str | None = None
    spellings: tuple = ()  # per check: the canonical spelling of its expected literal (rlvr.grading.values)


def _literal(node: ast.AST):
    """(True, value) when `node` is a Python literal (numbers, strings, containers, None, -1), else (False, None)."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def _assert_check(test: ast.expr, setup: str) -> tuple[Check, object]:
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op, left, right = test.ops[0], test.left, test.comparators[0]
        if isinstance(op, ast.Eq):
            is_lit, value = _literal(right)
            if not is_lit:
                is_lit, value = _literal(left)
                left = right
            if is_lit:
                return Check(ast.unparse(left), "value", setup), value
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (None, True, False):
            return Check(ast.unparse(left), "value", setup), Is(right.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check(ast.unparse(test.operand), "value", setup), FALSY
    return Check(ast.unparse(test), "true", setup), True


def _walk_here(node: ast.AST):
    """The nodes of `node` that run when it runs: not the bodies of the functions and classes it defines."""
    todo = [node]
    while todo:
        current = todo.pop()
        yield current
        for child in ast.iter_child_nodes(current):
            if isinstance(child, _SCOPES):
                todo.extend(child.decorator_list if not isinstance(child, ast.Lambda) else [])
                todo.extend(getattr(child.args, "defaults", []) if hasattr(child, "args") else [])
            else:
                todo.append(child)


def _called_names(node: ast.AST) -> set[str]:
    return {n.func.id for n in _walk_here(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


class _File:
    """One test source, read: its functions that assert, what it collects, what it refuses."""

    def __init__(self, tree: ast.Module, entry: str | None):
        self.tree, self.entry = tree, entry
        functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        # functions of the file that assert, directly or through another of them
        self.asserting = {name for name, fn in functions.items() if any(isinstance(n, ast.Assert) for n in ast.walk(fn))}
        grew = True
        while grew:
            grew = False
            for name, fn in functions.items():
                if name not in self.asserting and self.asserting & {
                        n.func.id for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}:
                    self.asserting.add(name)
                    grew = True
        self.ends: list[str] = []  # the calls pytest makes after the module ran
        self.collected: set[str] = set()  # the functions and methods those calls run
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                _no_fixtures(node, node.name)
                if node.name not in self.collected:
                    self.collected.add(node.name)
                    self.ends.append(f"{node.name}()")
            elif isinstance(node, ast.ClassDef):
                calls, methods = _class_tests(node)
                self.ends += calls
                self.collected |= methods
        called_at_top = set().union(*(_called_names(n) for n in tree.body)) if tree.body else set()
        check = functions.get("check")
        if check is not None and entry and "check" not in called_at_top:
            self.ends.append(f"check({entry})" if check.args.args else "check()")
            self.collected.add("check")
        # what the file names anywhere (a call, a reference, an attribute): a function it names may run
        self.named = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        self.named |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        # every function or method whose own body asserts
        self.asserts_in = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                           and any(isinstance(m, ast.Assert) for m in _walk_here_body(n))]
        self._refuse_imports()

    def is_check(self, node: ast.stmt) -> bool:
        """A top-level statement other than an assert that checks something when it runs."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            return False
        return any(isinstance(n, ast.Assert) for n in _walk_here(node)) or bool(_called_names(node) & self.asserting)

    def _refuse_imports(self):
        for node in ast.walk(self.tree):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise CodeTestsError("a relative import in the tests (import the program as `solution`)")
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                top = name.split(".")[0]
                if top != MODULE and top not in STDLIB:
                    raise CodeTestsError(f"the tests import {top!r}, which the sandbox does not have (the standard "
                                         f"library and the program, as {MODULE!r}, only)")


def _walk_here_body(fn: ast.AST):
    for statement in fn.body:
        yield from _walk_here(statement)


def _no_fixtures(fn: ast.FunctionDef | ast.AsyncFunctionDef, name: str, method: bool = False):
    args = fn.args
    positional = args.posonlyargs + args.args
    required = len(positional) - len(args.defaults) - (1 if method else 0)
    required += sum(d is None for d in args.kw_defaults)
    if required > 0:
        raise CodeTestsError(f"the test {name}() takes arguments (pytest fixtures or parametrize), which the judge "
                             "cannot supply")
    if isinstance(fn, ast.AsyncFunctionDef):
        raise CodeTestsError(f"the test {name}() is a coroutine, which nothing would await")


def _class_tests(node: ast.ClassDef) -> tuple[list[str], set[str]]:
    """The calls pytest makes for a test class (a unittest.TestCase subclass, of any name, or a class named
    Test* without an __init__), and the methods they run."""
    unittest = any((isinstance(b, ast.Name) and b.id == "TestCase") or (isinstance(b, ast.Attribute)
                   and b.attr == "TestCase") for b in node.bases)
    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    if not unittest and (not node.name.startswith("Test") or any(m.name == "__init__" for m in methods)):
        return [], set()
    calls, seen = [], set()
    for method in methods:
        if method.name.startswith("test") and method.name not in seen:
            seen.add(method.name)
            _no_fixtures(method, f"{node.name}.{method.name}", method=True)
            calls.append(f"{node.name}({method.name!r}).debug()" if unittest else f"{node.name}().{method.name}()")
    if unittest and calls:
        calls[0] = f"{node.name}.setUpClass()\n{calls[0]}"
    return calls, seen


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


def _prelude(entry: str | None, bound: set[str], read: set[str], asked: set[str]) -> str:
    import builtins

    modules = sorted(n for n in read - bound if n in STDLIB and n != entry and not hasattr(builtins, n))
    return (f"{BIND}(entry_point={entry!r}, modules={modules!r}, test_names={sorted(bound)!r}, "
            f"asked={sorted(asked & bound)!r})")


def _spec(ground_truth: str) -> tuple[str | None, list[str]]:
    try:
        spec = json.loads(ground_truth)
    except (ValueError, TypeError):
        raise CodeTestsError(f"not a code test specification (JSON with 'tests'): {str(ground_truth)[:80]!r}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("tests"), list) or not spec["tests"]:
        raise CodeTestsError(f"a code ground truth needs a non-empty 'tests' list: {str(ground_truth)[:80]!r}")
    entry = spec.get("entry_point")
    if entry is not None and not (isinstance(entry, str) and entry.isidentifier() and not keyword.iskeyword(entry)
                                  and not entry.startswith("__")):
        raise CodeTestsError(f"the entry point must be a Python name; got {entry!r}")
    return entry, [str(source) for source in spec["tests"]]


@lru_cache(maxsize=4096)
def parse_tests(ground_truth: str) -> CodeTests:
    """The checks of a code ground truth, in the order they run (see the module docstring).

    >>> t = parse_tests('{"entry_point": "f", "tests": ["assert f(2) == 4", "assert not f(0)"]}')
    >>> [(c.expr, c.kind) for c in t.checks], t.expected[0]
    ([('f(2)', 'value'), ('f(0)', 'value')], 4)
    """
    entry, sources = _spec(ground_truth)
    checks: list[Check] = []
    expected: list = []
    bound: set[str] = set()
    read: set[str] = set()
    asked: set[str] = set()
    pending: list[str] = []  # statements that run before the next check
    files: list[_File] = []

    def add(check: Check, want):
        checks.append(check)
        expected.append(want)
        pending.clear()

    for source in sources:
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError) as err:
            raise CodeTestsError(f"a test is not valid Python ({getattr(err, 'msg', err)}): {source[:80]!r}") from None
        names = _names(source)
        bound |= names[0]
        read |= names[1]
        asked |= _asked_of_the_program(tree)
        try:
            reading = _File(tree, entry)
        except CodeTestsError as err:
            raise CodeTestsError(f"{err}: {source[:80]!r}") from None
        files.append(reading)
        for node in tree.body:
            if isinstance(node, ast.Assert):
                add(*_assert_check(node.test, "\n".join(pending)))
            elif reading.is_check(node):
                add(Check(ast.unparse(node), "run", "\n".join(pending)), True)
            else:
                pending.append(ast.unparse(node))
        for call in reading.ends:
            add(Check(call, "run", "\n".join(pending)), True)
    named = set().union(*(f.named for f in files))
    for reading in files:
        for name in reading.asserts_in:
            if name not in reading.collected and name not in named:
                raise CodeTestsError(f"the asserts in {name}() never run: nothing calls it (pytest runs functions "
                                     "named test*; HumanEval's check needs an entry point)")
    if not checks:
        raise CodeTestsError(f"no assert statement or test function in the tests: {ground_truth[:80]!r}")
    if pending and any(isinstance(n, ast.Call) for n in ast.walk(ast.parse("\n".join(pending)))):
        add(Check("\n".join(pending), "run"), True)  # the file's last statements must run too
    first = checks[0]
    checks[0] = dataclasses.replace(first, setup="\n".join(filter(None, [_prelude(entry, bound, read, asked), first.setup])))
    spellings = tuple(canonical(want) if check.kind == "value" and want is not FALSY and not isinstance(want, Is)
                      else None for check, want in zip(checks, expected))
    return CodeTests(tuple(checks), tuple(expected), entry, spellings)

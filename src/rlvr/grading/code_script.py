"""A test file the "script" runner runs (asserts, HumanEval's check), read into the judge's checks.

Its sources are one file, run in order in one namespace, as a script runs:

* every top-level statement runs, in order. A top-level `assert` is a check; so is any other top-level
  statement holding an assert (a loop of asserts) or calling a function of the file that asserts (a helper
  call, `check(f)`): it passes when it completes. Other statements (imports, helpers, constants, setup) run
  before the check that follows them; one that raises stops the file, and every check after it fails.
* then HumanEval's `check(<entry point>)`, unless the file calls `check` itself, so the helpers and constants
  the file defines below it exist when it runs.
* statements after the last check that do something (a call) are one more check, so they run too.

A failing check does not stop the next (a script would stop; the file's verdict is the same). `assert <expr> ==
<literal>` says, when it fails, what `<expr>` gave and what was expected (the judge's reason, which
env=code_feedback shows). Refused here (`CodeTestsError`): no check at all, and a function holding asserts that
nothing calls (its checks would never run).
"""

from __future__ import annotations

import ast

from rlvr.sandbox.records import Check

GAVE = "__rlvr_gave__"  # the judge's helper for a failed `assert x == literal` (rlvr.sandbox.inside.runners)
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


class ScriptError(ValueError):
    """A test file the script runner cannot run (rlvr.grading.code_tests re-raises it as CodeTestsError)."""


def _literal(node: ast.AST) -> bool:
    try:
        ast.literal_eval(node)
        return True
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False


def _assert_check(node: ast.Assert, setup: str) -> Check:
    """The assert as written; `assert <expr> == <literal>` (either side) with a message that says what it gave."""
    test = node.test
    if node.msg is None and isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        left, right = test.left, test.comparators[0]
        if _literal(left) and not _literal(right):
            left, right = right, left
        if _literal(right) and not _literal(left):
            expr, want = ast.unparse(left), ast.unparse(right)
            return Check(f"assert (__rlvr_value__ := ({expr})) == ({want}), {GAVE}(__rlvr_value__, {want!r}, "
                         f"{expr!r})", "run", setup, label=ast.unparse(node))
    return Check(ast.unparse(node), "run", setup)


def walk_here(node: ast.AST):
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
    return {n.func.id for n in walk_here(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}


class _File:
    """One test source, read: its functions that assert, what runs after it, what it refuses."""

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
        self.ends: list[str] = []  # the calls made after the file ran
        self.collected: set[str] = set()
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
                           and any(isinstance(m, ast.Assert) for statement in n.body for m in walk_here(statement))]

    def is_check(self, node: ast.stmt) -> bool:
        """A top-level statement other than an assert that checks something when it runs."""
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            return False
        return any(isinstance(n, ast.Assert) for n in walk_here(node)) or bool(_called_names(node) & self.asserting)


def script_checks(trees: list[ast.Module], entry: str | None) -> list[Check]:
    """The checks of the file, in the order they run (see the module docstring); ScriptError if it has none, or
    asserts that never run."""
    checks: list[Check] = []
    pending: list[str] = []  # statements that run before the next check
    files = []
    for tree in trees:
        reading = _File(tree, entry)
        files.append(reading)
        for node in tree.body:
            if isinstance(node, ast.Assert):
                checks.append(_assert_check(node, "\n".join(pending)))
                pending.clear()
            elif reading.is_check(node):
                checks.append(Check(ast.unparse(node), "run", "\n".join(pending)))
                pending.clear()
            else:
                pending.append(ast.unparse(node))
        for call in reading.ends:
            checks.append(Check(call, "run", "\n".join(pending)))
            pending.clear()
    named = set().union(*(f.named for f in files))
    for reading in files:
        for name in reading.asserts_in:
            if name not in reading.collected and name not in named:
                raise ScriptError(f"the asserts in {name}() never run: nothing calls it (HumanEval's check needs "
                                  "an entry point)")
    if not checks:
        raise ScriptError("no assert statement or test function in the tests")
    if pending and any(isinstance(n, ast.Call) for n in ast.walk(ast.parse("\n".join(pending)))):
        checks.append(Check("\n".join(pending), "run"))  # the file's last statements must run too
    return checks

"""Reward functions for code (seed 003): the program in the response is run against the problem's tests in
the sandbox (`rlvr.sandbox`), and passing them all is the reward.

    code_tests              1 if every test passes, else 0; format_reward 1 for one parsable fenced block
    code_tests:fraction     the fraction of tests passed (answer_reward stays all-or-nothing)
    code_tests:think        format_reward also needs a closed reasoning trace ("</think>") before the block
    code_format             code_tests' format_reward as the reward (a format bonus, nothing is run)

The ground truth is the JSON `{"entry_point": ..., "tests": [...]}` of `rlvr.tasks.code` (`code_answer`).
Each test is Python source, run by the sandbox's judge (`rlvr.sandbox.harness`), a process of its own that
calls the program's functions through a pipe: every value a test sees is the judge's own copy of an exact
built-in value, so no test style lets the program's objects decide a comparison. An `assert <expr> ==
<literal>` (or `<literal> == <expr>`, `<expr> is None/True/False`, `not <expr>`) is checked twice over: the
judge sends back the value of `<expr>` and it is compared here with the literal, which never enters the
sandbox. Any other assert is decided by its truth value in the judge, and pytest-style `def test_*()`
functions (and HumanEval's `check(candidate)`) must return without raising. Other statements in a test
(imports, helpers, setup) run in the judge before the checks that follow them.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from functools import lru_cache

from rlvr.sandbox import run_programs
from rlvr.sandbox.harness import decode
from rlvr.sandbox.records import Check, Job, SandboxLimits

_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
_MAX_PROGRAM_CHARS = 20_000
_MAX_VALUE_CHARS = 1_000_000
_FALSY = object()  # expected: any falsy value (`assert not f(x)`)


@dataclasses.dataclass(frozen=True)
class _Is:
    """Expected: this very singleton (`assert f(x) is None`), not merely an equal value (1 == True)."""

    value: object


class CodeTestsError(ValueError):
    """A ground truth that is not a code test specification."""


def extract_code(response: str, think: bool = False) -> tuple[float, str | None]:
    """(format_reward, program): the last complete fenced Python block, and 1.0 when it parses (and, with
    `think`, comes after a closed reasoning trace). No complete block: (0.0, None).

    >>> extract_code("Reverse it.\\n```python\\ndef f(s):\\n    return s[::-1]\\n```\\n")
    (1.0, 'def f(s):\\n    return s[::-1]\\n')
    >>> extract_code(" I reverse it.\\n```python\\ndef f(s):\\n    return s[::-1]\\n```", think=True)[0]
    0.0
    """
    blocks = list(_FENCE.finditer(str(response)))
    if not blocks:
        return 0.0, None
    block = blocks[-1]
    program = block.group(1)
    closed = response.rfind("</think>", 0, block.start()) >= 0 and "</think>" not in response[block.start():]
    try:
        ast.parse(program)
        parses = True
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        parses = False
    return float(parses and (closed or not think)), program


@dataclasses.dataclass(frozen=True)
class CodeTests:
    """A ground truth read for the sandbox: the checks it runs and what each must equal (kept outside)."""

    checks: tuple[Check, ...]
    expected: tuple  # per check: a literal, _FALSY, _Is(singleton), or True for kind "true"
    entry_point: str | None = None


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
            return Check(ast.unparse(left), "value", setup), _Is(right.value)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return Check(ast.unparse(test.operand), "value", setup), _FALSY
    return Check(ast.unparse(test), "true", setup), True


@lru_cache(maxsize=4096)
def parse_tests(ground_truth: str) -> CodeTests:
    """The checks of a code ground truth (see the module docstring for how each test is read).

    >>> t = parse_tests('{"entry_point": "f", "tests": ["assert f(2) == 4", "assert not f(0)"]}')
    >>> [(c.expr, c.kind) for c in t.checks], t.expected[0]
    ([('f(2)', 'value'), ('f(0)', 'value')], 4)
    """
    try:
        spec = json.loads(ground_truth)
    except (ValueError, TypeError):
        raise CodeTestsError(f"not a code test specification (JSON with 'tests'): {str(ground_truth)[:80]!r}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("tests"), list) or not spec["tests"]:
        raise CodeTestsError(f"a code ground truth needs a non-empty 'tests' list: {str(ground_truth)[:80]!r}")
    entry = spec.get("entry_point")
    checks, expected = [], []
    for source in spec["tests"]:
        try:
            body = ast.parse(str(source)).body
        except SyntaxError as err:
            raise CodeTestsError(f"a test is not valid Python ({err.msg}): {str(source)[:80]!r}") from None
        setup: list[str] = []
        for node in body:
            if isinstance(node, ast.Assert):
                check, value = _assert_check(node.test, "\n".join(setup))
                checks.append(check)
                expected.append(value)
                setup = []
                continue
            setup.append(ast.unparse(node))
            name = getattr(node, "name", "")
            is_def = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_def and (name.startswith("test") or (name == "check" and entry)):
                call = f"{name}()" if name != "check" else f"check({entry})"
                checks.append(Check(call, "value", "\n".join(setup)))
                expected.append(None)  # a test function returns None when its asserts hold
                setup = []
    if not checks:
        raise CodeTestsError(f"no assert statement or test function in the tests: {str(ground_truth)[:80]!r}")
    return CodeTests(tuple(checks), tuple(expected), entry)


def passed(tests: CodeTests, values: list[str | None]) -> list[bool]:
    """Which checks passed, comparing each returned value (a repr) with its expected literal here."""
    out = []
    for check, want, got in zip(tests.checks, tests.expected, values):
        if got is None or len(got) > _MAX_VALUE_CHARS:
            out.append(False)
            continue
        if check.kind == "true":
            out.append(got == "True")
            continue
        try:
            value = decode(got)
        except Exception:  # DecodeError, whatever the text
            out.append(False)
            continue
        try:  # both sides are plain built-in values here, so == is Python's own (True == 1, 2.0 == 2)
            if isinstance(want, _Is):
                out.append(value is want.value)
            else:
                out.append(not value if want is _FALSY else bool(value == want))
        except Exception:
            out.append(False)
    return out


def grade_programs(programs: list[str | None], ground_truths: list[str], limits: SandboxLimits | None = None,
                   workers: int | None = None) -> list[tuple[int, int]]:
    """(tests passed, tests) per program, each distinct (program, tests) pair run once in the sandbox; a
    missing program passes nothing, an unreadable ground truth counts as one failed test."""
    outcome: list[tuple[int, int] | None] = [None] * len(programs)
    pending: dict[tuple[str, str], list[int]] = {}
    for i, (program, truth) in enumerate(zip(programs, ground_truths)):
        try:
            n = len(parse_tests(truth).checks)
        except CodeTestsError:
            outcome[i] = (0, 1)
            continue
        if program is None or not program.strip() or len(program) > _MAX_PROGRAM_CHARS:
            outcome[i] = (0, n)
        else:
            pending.setdefault((program, truth), []).append(i)
    keys = list(pending)
    jobs = [Job(program, parse_tests(truth).checks) for program, truth in keys]
    for (program, truth), result in zip(keys, run_programs(jobs, limits, workers)):
        tests = parse_tests(truth)
        score = (sum(passed(tests, result.values)) if result.status == "ok" else 0, len(tests.checks))
        for i in pending[(program, truth)]:
            outcome[i] = score
    return outcome  # type: ignore[return-value]

"""Reward functions for code (seed 003): the program in the response is run against the problem's tests in
the sandbox (`rlvr.sandbox`), and passing them all is the reward.

    code_tests              1 if every test passes, else 0; format_reward 1 for one parsable fenced block
    code_tests:fraction     the fraction of tests passed (answer_reward stays all-or-nothing)
    code_tests:think        format_reward also needs a closed reasoning trace ("</think>") before the block
    code_format             code_tests' format_reward as the reward (a format bonus, nothing is run)

The ground truth is the JSON `{"entry_point": ..., "tests": [...]}` of `rlvr.tasks.code` (`code_answer`),
read into checks by `rlvr.grading.code_tests` (`parse_tests`): the test file runs as pytest or plain Python
would run it, in the sandbox's judge (`rlvr.sandbox.harness`), a process of its own that calls the program's
functions through a pipe, so every value a test sees is the judge's own copy of an exact built-in value and
no test style lets the program's objects decide a comparison, a membership or a truth value. An `assert
<expr> == <literal>` (and `is None/True/False`, `not <expr>`) is checked twice over: the judge sends back the
value of `<expr>` and `passed` compares it here with the literal, which never enters the sandbox, on
canonical spellings (`rlvr.grading.values`): nothing the program returns is built into a Python value in
the trainer, so its cost here is bounded whatever it is.
"""

from __future__ import annotations

import ast
import re

from rlvr.grading.code_tests import FALSY, CodeTests, CodeTestsError, Is, parse_tests
from rlvr.grading.values import canonical_text, comparable
from rlvr.sandbox import run_programs
from rlvr.sandbox.records import Job, SandboxLimits

_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
_MAX_PROGRAM_CHARS = 20_000
# the canonical spellings of every falsy plain value: 0 (False, 0.0, -0.0, 0j), '', b'', [], (), set(), {}, None
_FALSY_SPELLINGS = frozenset({"0", "''", "b''", "[]", "()", "set()", "{}", "None"})

__all__ = ["CodeTests", "CodeTestsError", "extract_code", "grade_programs", "parse_tests", "passed"]


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


def passed(tests: CodeTests, values: list[str | None]) -> list[bool]:
    """Which checks passed: the judge's verdict for kinds "true" and "run", and for "value" the value's text
    (encode's) compared here with the expected literal, on canonical spellings, never decoded."""
    out = []
    for check, want, spelling, got in zip(tests.checks, tests.expected, tests.spellings, values):
        if not isinstance(got, str):
            out.append(False)
        elif check.kind != "value":
            out.append(got == "True")
        elif isinstance(want, Is):  # that very singleton: `True`, not 1
            out.append(got == repr(want.value))
        elif want is FALSY:
            out.append(len(got) <= 16 and canonical_text(got) in _FALSY_SPELLINGS)
        else:
            out.append(spelling is not None and comparable(got, spelling) and canonical_text(got) == spelling)
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

"""Reward functions for code (seed 003): the program in the response is run against the problem's tests in
the sandbox (`rlvr.sandbox`), and passing them all is the reward.

    code_tests              1 if every test passes, else 0; format_reward 1 for one parsable fenced block
    code_tests:fraction     the fraction of tests passed (answer_reward stays all-or-nothing)
    code_tests:think        format_reward also needs a closed reasoning trace ("</think>") before the block
    code_format             code_tests' format_reward as the reward (a format bonus, nothing is run)

The ground truth is the JSON of `rlvr.tasks.code` (`code_answer`, `stdio_answer`), read by
`rlvr.grading.code_tests` (`parse_tests`) into the runner the tests were written for (pytest, unittest, a
script of asserts, HumanEval's check, stdin/stdout), which runs them in the sandbox's judge
(`rlvr.sandbox.inside`), a process of its own that calls the program's functions through a pipe: every verdict
is that runner's own, on values the judge rebuilt as their standard types, and no test style lets the program's
objects decide a comparison, a membership or a truth value. A test counts as passed as it does in its runner's
exit status (skipped, xfailed and xpassed tests pass). The trainer builds nothing the program sent: it reads
outcomes.
"""

from __future__ import annotations

import ast
import re

import logging

from rlvr.grading.code_tests import CodeTests, CodeTestsError, parse_tests
from rlvr.sandbox import run_programs
from rlvr.sandbox.records import ProgramResult, SandboxLimits

_FENCE = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)^[ \t]*```", re.M | re.S)
_MAX_PROGRAM_CHARS = 20_000
log = logging.getLogger(__name__)
_warned: set[str] = set()

__all__ = ["CodeTests", "CodeTestsError", "Verdict", "extract_code", "grade_programs", "parse_tests", "passed",
           "verdict"]


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


class Verdict(tuple):
    """(tests passed, tests) of one program, and `reason`: why it did not pass them all, in a line (the status
    that stopped it, the first failing test and what it said, a value that could not cross)."""

    def __new__(cls, passed: int, total: int, reason: str = ""):
        self = super().__new__(cls, (passed, total))
        self.reason = reason
        return self


def passed(result: ProgramResult) -> list[bool]:
    """Which checks passed, as the runner decided."""
    return result.passed()


def verdict(tests: CodeTests, result: ProgramResult) -> Verdict:
    ok = passed(result)
    total = len(ok) or tests.count
    reasons = []
    if result.status != "ok":
        reasons.append(f"{result.status}: {result.error}" if result.error else result.status)
    elif not all(ok) or not ok:
        i = ok.index(False) if False in ok else 0
        why = result.reasons[i] if i < len(result.reasons) and result.reasons[i] else (
            result.errors[i] if i < len(result.errors) and result.errors[i] else "failed")
        reasons.append(f"{tests.label(i)}: {why}")
    for what in result.uncrossable:
        reasons.append(f"cannot cross between the tests and the program: {what}")
        if what not in _warned and len(_warned) < 100:
            _warned.add(what)
            log.warning("code grading: a value could not cross between the tests and the program (%s); the checks "
                        "that needed it fail", what)
    return Verdict(sum(ok), total, "; ".join(reasons))


def grade_programs(programs: list[str | None], ground_truths: list[str], limits: SandboxLimits | None = None,
                   workers: int | None = None) -> list[Verdict]:
    """(tests passed, tests) per program, with the reason (`Verdict`), each distinct (program, tests) pair run
    once in the sandbox; a missing program passes nothing, an unreadable ground truth counts as one failed test."""
    outcome: list[Verdict | None] = [None] * len(programs)
    pending: dict[tuple[str, str], list[int]] = {}
    for i, (program, truth) in enumerate(zip(programs, ground_truths)):
        try:
            n = parse_tests(truth).count
        except CodeTestsError as err:
            outcome[i] = Verdict(0, 1, f"the tests cannot run: {err}")
            continue
        if program is None or not program.strip():
            outcome[i] = Verdict(0, n, "no program")
        elif len(program) > _MAX_PROGRAM_CHARS:
            outcome[i] = Verdict(0, n, f"a program over {_MAX_PROGRAM_CHARS} characters")
        else:
            pending.setdefault((program, truth), []).append(i)
    keys = list(pending)
    tests = [parse_tests(truth) for _, truth in keys]
    results = run_programs([t.job(program) for t, (program, _) in zip(tests, keys)], limits, workers,
                           checks=[t.count for t in tests])
    for key, t, result in zip(keys, tests, results):
        for i in pending[key]:
            outcome[i] = verdict(t, result)
    return outcome  # type: ignore[return-value]

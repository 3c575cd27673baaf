"""`env=code_feedback`: the code task with retries. The model writes its program (a code prompt: the turn ends at
the block's closing fence); the program runs against the task's tests in the sandbox; if one fails, the model is
shown that test, what the program gave (or the error it raised) and what was expected, and writes the program
again, up to `max_turns` attempts. The reward is the run's reward function on the transcript, whose last fenced
block is the last attempt (code_tests reads the last block); with `attempt_discount` < 1 a pass on attempt k is
worth discount^(k-1).

Showing a failing hidden test gives that test away: the later attempts are graded on the same tests, so this
measures repair from feedback, not first-try ability (the first attempt's pass rate is logged apart:
`env/reward_turn_1` is 1 for a first attempt that passed).
"""

from __future__ import annotations

from rlvr.environments.base import Environment, Observation, register_environment
from rlvr.grading.code import CodeTestsError, extract_code, parse_tests, passed
from rlvr.sandbox import run_programs
from rlvr.tasks.prompts import CODE_STOP

SHOWN_CHARS = 300  # of a value or an error in the feedback
AGAIN = "Fix it and write the whole program again.\n"
UNTESTABLE = "The task's tests could not be read: no program can pass them."


def _short(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


class CodeFeedbackEnv(Environment):
    """A failing program gets its first failing test back; the model tries again."""

    stop = CODE_STOP
    max_turns = 2  # attempts
    tool_timeout_s = 60.0
    runs_programs = True
    needs_code_dataset = True
    attempt_discount = 1.0

    def __init__(self, example):
        super().__init__(example)
        self.attempts: list[bool] = []

    def feedback(self, program: str | None) -> str | None:
        """None when every test passes, else what the model is told; UNTESTABLE for a row whose tests do not
        parse, which no program passes (the grader counts it as a failed test)."""
        try:
            tests = parse_tests(self.example.answer)
        except CodeTestsError:
            return UNTESTABLE
        if program is None:
            return "No complete ```python block was found. Write the whole program in one block."
        result = run_programs([tests.job(program)], workers=1, checks=[tests.count])[0]
        if result.status != "ok":
            why = result.error or result.status
            tail = _short(result.stderr.strip().splitlines()[-1]) if result.stderr.strip() else ""
            return f"The program did not run to the end ({why}{': ' + tail if tail else ''})."
        ok = passed(result)
        if ok and all(ok):
            return None
        i = ok.index(False) if False in ok else 0
        error = result.errors[i] if i < len(result.errors) else None
        reason = result.reasons[i] if i < len(result.reasons) else ""
        if tests.runner != "script":  # pytest's and unittest's reasons name the test
            return f"A test failed: {_short(reason or tests.label(i))}."
        if error and error != "AssertionError":
            return f"A test failed: {_short(tests.label(i))} raised {error}{': ' + _short(reason) if reason else ''}."
        return f"A test failed: {_short(reason or tests.label(i))}."

    def step(self, text: str, ids: list[int]) -> Observation:
        message = self.feedback(extract_code(text)[1])
        self.attempts.append(message is None)
        if message is None:
            return Observation(done=True, reward=1.0, tool_calls=1)
        if message == UNTESTABLE:  # another attempt cannot pass either
            return Observation(done=True, reward=0.0, tool_calls=1)
        return Observation(text=f"\n{message}\n{AGAIN}", reward=0.0, tool_calls=1)

    def reward(self, transcript: str) -> float | None:
        if self.attempt_discount == 1.0:
            return None  # the run's reward function grades the last program
        # the transcript's last program, whether or not its turn stopped at the fence and was stepped
        right = self.feedback(extract_code(transcript)[1]) is None
        return float(right) * self.attempt_discount ** transcript.count(AGAIN)


register_environment("code_feedback", CodeFeedbackEnv)

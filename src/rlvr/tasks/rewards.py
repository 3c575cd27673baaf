"""Reward functions for GSM8K (seed 004 §4.2.3) and for code (seed 003).

A reward function maps `(response, ground_truth)` to `{"reward", "format_reward", "answer_reward"}`: it
finds the answer (the last <answer> block for r1_zero and answer_tag, the last \\boxed{} for
question_only) and grades it with `rlvr.grading`, whose docstring holds the grading rules and how they
depart from the reference grader. `score_batch` extracts every answer of a batch in-process and grades
them in one call, so the slow-path answers are graded in parallel; `combine_rewards` and
`format_reward_fn` build weighted sums and format bonuses. `code_tests` runs the response's program
against the problem's tests in the sandbox (`rlvr.grading.code`, `rlvr.sandbox`); its batch's outcomes
are logged as "grading/code_*".

The grading functions are re-exported here (`grade_answer`, `configure_grading`, `grading_stats`, ...),
and so is `parse_gsm8k_answer` of `rlvr.tasks.records`. This module does not import torch; only
`compute_rollout_rewards` does, when called.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from rlvr.grading import (  # re-exported: the grading half of this module's interface
    configure_grading,
    extract_boxed,
    grade_answer,
    grading_stats,
    reset_grading_stats,
    shutdown_grading,
)
from rlvr.grading.code import extract_code, grade_programs
from rlvr.grading.extract import as_text, last_outer_box
from rlvr.grading.screen import unbox
from rlvr.sandbox.records import SandboxLimits
from rlvr.tasks.records import parse_gsm8k_answer  # re-exported: graders and tasks both read GSM8K answers
from rlvr.tasks.reward_base import (  # re-exported: the shape of every reward function
    RewardContext,
    RewardFn,
    Scores,
    run_awaitables,
    score_batch,
)

__all__ = [
    "REWARD_FNS",
    "RewardContext",
    "RewardFn",
    "answer_tag_reward_fn",
    "code_tests_reward_fn",
    "combine_rewards",
    "configure_grading",
    "extract_boxed",
    "format_reward_fn",
    "get_reward_fn",
    "grade_answer",
    "grading_stats",
    "parse_gsm8k_answer",
    "question_only_reward_fn",
    "r1_zero_reward_fn",
    "reset_grading_stats",
    "score_batch",
    "shutdown_grading",
]


class R1ZeroReward(RewardFn):
    """The r1_zero contract: the response (which begins inside the think block) must contain
    "</think> <answer>" and then "</answer>"; the answer is the last complete <answer> block.

    >>> r1_zero_reward_fn(" 48/2 = 24, 48+24 = 72 </think> <answer> 72 </answer>", "72")
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 1.0}
    >>> r1_zero_reward_fn(" so 70 </think> <answer> \\\\boxed{70} </answer>", "72")["format_reward"]
    1.0
    >>> r1_zero_reward_fn(" <answer> 72 </answer> </think>", "72")  # answer inside the think block
    {'reward': 0.0, 'format_reward': 0.0, 'answer_reward': 0.0}
    """

    name = "r1_zero"

    def extract(self, response: str) -> tuple[float, str | None]:
        response = as_text(response)
        start = response.find("</think> <answer>")
        if start < 0 or response.find("</answer>", start) < 0:
            return 0.0, None
        end = response.rfind("</answer>")
        # The block opens at the first <answer> after the previous block's end, so an <answer> left open
        # before it ("<answer> 5 <answer> 72 </answer>") is inside this answer, and that answer holds a tag.
        previous = response.rfind("</answer>", 0, end)
        first = start + len("</think> ")
        opened = response.find("<answer>", max(first, previous + len("</answer>")) if previous >= 0 else first, end)
        if opened < 0:
            opened = response.rfind("<answer>", 0, end)
        return 1.0, unbox(response[opened + len("<answer>") : end])


class QuestionOnlyReward(RewardFn):
    """The question_only contract: the answer is the last \\boxed{} (not inside another); format_reward 1 iff
    there is one.

    >>> question_only_reward_fn("Half of 48 is 24, so 48 + 24 = \\\\boxed{72}.", "72")["reward"]
    1.0
    """

    name = "question_only"

    def extract(self, response: str) -> tuple[float, str | None]:
        box = last_outer_box(as_text(response))
        if box is None:
            return 0.0, None
        answer = unbox(box[2])  # "\\boxed{\\boxed{72}}" is 72; "\\boxed{41 or \\boxed{42}}" is hedged
        return (1.0, answer) if answer is not None else (1.0, "")


_OPEN_TAG = re.compile(r"<\s*answer\s*>", re.I)
_CLOSE_TAG = re.compile(r"<\s*/\s*answer\s*>", re.I)


class AnswerTagReward(RewardFn):
    """Lenient, for chat prompts: the answer is the last <answer>...</answer> block (any case, spaces
    inside the tags), no think block needed; \\boxed{} inside it is unwrapped.

    >>> answer_tag_reward_fn("So 72 clips.\\n< ANSWER >72</answer >", "72")["reward"]
    1.0
    """

    name = "answer_tag"

    def extract(self, response: str) -> tuple[float, str | None]:
        response = as_text(response)
        previous = close = None
        for match in _CLOSE_TAG.finditer(response):
            previous, close = close, match
        if close is None:
            return 0.0, None
        # As for r1_zero: the block opens at the first <answer> after the previous block's end.
        opened = _OPEN_TAG.search(response, previous.end() if previous else 0, close.start())
        if opened is None:
            for opened in _OPEN_TAG.finditer(response, 0, close.start()):
                pass
        if opened is None:
            return 0.0, None
        return 1.0, unbox(response[opened.end() : close.start()])


class FormatReward(RewardFn):
    """Another reward function's format_reward as the reward: a format bonus, with no grading."""

    def __init__(self, base: RewardFn):
        self.base, self.name = base, f"format/{base.name}"

    def extract(self, response: str) -> tuple[float, str | None]:
        return self.base.extract(response)[0], None

    def plan(self, responses, ground_truths, context=None):
        formats = []
        for response in responses:
            try:
                formats.append(float(self.base.extract(response)[0]))
            except Exception:
                formats.append(0.0)
        return [], lambda _: [{"reward": f, "format_reward": f, "answer_reward": 0.0} for f in formats]


class CombinedReward(RewardFn):
    """A weighted sum of reward functions; see `combine_rewards`."""

    def __init__(self, components: list[tuple[str, Callable, float]], answer_term: int | None = None):
        self.components = components
        self.answer_term = answer_term  # the component whose answer_reward is the answer signal (None: see plan)
        self.name = "+".join(name for name, _, _ in components)

    def plan(self, responses, ground_truths, context=None):
        context = context or RewardContext()
        pending = [(fn, fn.start(responses, ground_truths, context)) for _, fn, _ in self.components
                   if isinstance(fn, RewardFn)]
        pending = [(fn, awaitable) for fn, awaitable in pending if awaitable is not None]
        if pending:  # async functions (a remote judge) run concurrently, as TRL gathers them
            timeouts = [getattr(fn, "timeout", None) for fn, _ in pending]
            names = ", ".join(repr(fn.name) for fn, _ in pending)
            done = run_awaitables([a for _, a in pending], None if None in timeouts else max(timeouts),
                                  f"reward functions {names} on the batch")
            for (fn, _), values in zip(pending, done):
                context.results[id(fn)] = values
        parts = []  # (name, weight, first pair index, pair count, finish) per component
        pairs: list[tuple[str, str]] = []
        for name, fn, weight in self.components:
            if isinstance(fn, RewardFn):
                sub_pairs, finish = fn.plan(responses, ground_truths, context)
            else:  # a user's plain callable: no batch support, called one by one
                done = [fn(r, g) for r, g in zip(responses, ground_truths)]
                sub_pairs, finish = [], lambda _, done=done: done
            parts.append((name, weight, len(pairs), len(sub_pairs), finish))
            pairs.extend(sub_pairs)

        kinds = [_kind(fn) for _, fn, _ in self.components]
        answer_from = self.answer_term if self.answer_term is not None else \
            next((i for i, kind in enumerate(kinds) if kind == "grader"), None)

        def finish_all(verdicts: list[bool]) -> list[Scores]:
            results = [(name, w, finish(verdicts[i : i + n])) for name, w, i, n, finish in parts]
            out = []
            for k in range(len(responses)):
                # a function's None ("does not apply to this row", TRL's convention) leaves the weighted sum; a row
                # none applies to has no reward at all (NaN: rlvr.stages.rollouts leaves it out of its group)
                applied = [(w, float(scores[k]["reward"])) for _, w, scores in results
                           if scores[k]["reward"] is not None]
                reward = sum(w * r for w, r in applied) if applied else math.nan
                if answer_from is None:  # only a user's functions: the weighted reward is the answer signal
                    answer = reward
                else:
                    value = results[answer_from][2][k]["answer_reward"]
                    answer = math.nan if value is None else float(value)
                formats = [scores[k].get("format_reward") for _, _, scores in results]
                fmt = next((float(f) for f in formats if f is not None), math.nan)
                row = {"reward": reward, "format_reward": fmt, "answer_reward": answer}
                row.update({f"reward/{name}": float(scores[k]["reward"]) for name, _, scores in results
                            if scores[k]["reward"] is not None})
                out.append(row)
            return out

        return pairs, finish_all


def _kind(fn) -> str:
    """"format" (a format bonus), "grader" (a built-in that grades the answer) or "user" (a user's function)."""
    if isinstance(fn, FormatReward):
        return "format"
    return "user" if getattr(fn, "key", None) is not None else "grader"


def combine_rewards(components: list[tuple[str, Callable, float]], answer_term: str | None = None) -> RewardFn:
    """A reward function that is the weighted sum of others (seed 002: correctness plus a format bonus).

    `reward` is sum(weight * component reward), over the components that apply to the row (a user's function may
    say None; none applying: NaN); `reward/<name>` is each component's unweighted reward. `answer_reward`, the
    answer signal that accuracy, pass@k, dynamic sampling, the curriculum and RFT/MaxRL read, is the
    `answer_term` component's, else the first built-in grader's (correctness), else, when every component is a
    user's function, the weighted reward. `format_reward` is the first component's that has one (a format
    bonus, a grader, a user's dict with format_reward), else NaN (no format signal).

    >>> fn = combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("format", format_reward_fn(), 0.2)])
    >>> fn(" 70 </think> <answer> 70 </answer>", "72")
    {'reward': 0.2, 'format_reward': 1.0, 'answer_reward': 0.0, 'reward/correct': 0.0, 'reward/format': 1.0}
    """
    components = list(components)
    if not components:
        raise ValueError("combine_rewards: needs at least one (name, reward_fn, weight) component")
    checked = []
    for item in components:
        if not (isinstance(item, tuple) and len(item) == 3):
            raise ValueError(f"combine_rewards: each component is (name, reward_fn, weight); got {item!r}")
        name, fn, weight = item
        if not isinstance(name, str) or not name or not callable(fn):
            raise ValueError(f"combine_rewards: component {item!r} needs a non-empty name and a callable")
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ValueError(f"combine_rewards: weight of {name!r} must be a finite number; got {weight!r}")
        checked.append((name, fn, float(weight)))
    names = [name for name, _, _ in checked]
    if len(set(names)) != len(names):
        raise ValueError(f"combine_rewards: component names must be distinct; got {names}")
    if answer_term is not None and answer_term not in names:
        raise ValueError(f"answer_term={answer_term!r} is not one of the reward terms ({', '.join(names)})")
    return CombinedReward(checked, None if answer_term is None else names.index(answer_term))


def format_reward_fn(base: RewardFn | str = "r1_zero") -> RewardFn:
    """A reward function whose reward is `base`'s format_reward (a format bonus for `combine_rewards`).

    >>> format_reward_fn("answer_tag")("<answer> 7 </answer>", "72")
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 0.0}
    """
    base = get_reward_fn(base) if isinstance(base, str) else base
    if not isinstance(base, RewardFn) or isinstance(base, (CombinedReward, FormatReward)):
        raise ValueError(f"format_reward_fn: base must be one of {sorted(REWARD_FNS)} or a RewardFn; got {base!r}")
    return FormatReward(base)


class CodeTestsReward(RewardFn):
    """Code (seed 003): the last fenced Python block of the response, run against the ground truth's tests
    in the sandbox (`rlvr.grading.code`); reward 1 when all pass (`fraction`: the fraction passed),
    answer_reward 1 only when all pass. With `think`, the format also needs "</think>" before the block.

    >>> code_tests_reward_fn("```python\\ndef f(x):\\n    return 2 * x\\n```\\n", code_answer(["assert f(2) == 4"], "f"))
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 1.0}
    """

    def __init__(self, fraction: bool = False, think: bool = False, limits: SandboxLimits | None = None):
        self.fraction, self.think, self.limits = fraction, think, limits
        options = [o for o, on in (("think", think), ("fraction", fraction)) if on]
        self.name = "code_tests" + (":" + ",".join(options) if options else "")

    def extract(self, response: str) -> tuple[float, str | None]:
        return extract_code(as_text(response), self.think)

    def plan(self, responses, ground_truths, context=None):
        extracted = []
        for response in responses:
            try:
                extracted.append(self.extract(response))
            except Exception:
                extracted.append((0.0, None))
        outcome = grade_programs([p for _, p in extracted], list(ground_truths), self.limits)

        def finish(_verdicts) -> list[Scores]:
            out = []
            for (fmt, _), (ok, n) in zip(extracted, outcome):
                right = n > 0 and ok == n
                out.append({"reward": ok / n if self.fraction and n else float(right), "format_reward": float(fmt),
                            "answer_reward": float(right)})
            return out

        return [], finish


r1_zero_reward_fn = R1ZeroReward()
question_only_reward_fn = QuestionOnlyReward()
answer_tag_reward_fn = AnswerTagReward()
code_tests_reward_fn = CodeTestsReward()

REWARD_FNS: dict[str, RewardFn] = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "answer_tag": answer_tag_reward_fn,
    "code_tests": code_tests_reward_fn,
    "code_tests:think": CodeTestsReward(think=True),
    "code_tests:fraction": CodeTestsReward(fraction=True),
    "code_tests:think,fraction": CodeTestsReward(fraction=True, think=True),
    "code_format": FormatReward(code_tests_reward_fn),
}


def get_reward_fn(name: str) -> RewardFn:
    """The built-in reward function of that name (a key of REWARD_FNS)."""
    if name == "reasoning_gym":  # an extra: imported only when a run names it
        from rlvr.tasks.reasoning_gym import reasoning_gym_reward

        return reasoning_gym_reward()
    try:
        return REWARD_FNS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reward function {name!r}; valid: {', '.join(sorted(REWARD_FNS))}, "
                         "reasoning_gym, or your own as path/to/file.py:function or package.module:function") from None

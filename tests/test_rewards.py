"""Answer grading and reward functions: the (response, ground truth, reward) contract of issue 3.

The table CASES holds the cases by kind; the time-limit tests shrink the limit to 0.2 s so the file stays
fast, and test it by its effect (the answer scores 0, the timeout is counted), not by the wall clock of a
loaded machine. Every test restores the default grading configuration. The screen (hedged answers, tags,
restated computations, Unicode digits) has its own agreement table in test_grading_cases.py.
"""

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlvr.grading import normalize
from rlvr.grading import pool as grading_pool
from rlvr.tasks import rewards as R
from rlvr.tasks.rewards import (
    REWARD_FNS,
    answer_tag_reward_fn,
    combine_rewards,
    configure_grading,
    extract_boxed,
    format_reward_fn,
    get_reward_fn,
    grade_answer,
    grading_stats,
    parse_gsm8k_answer,
    question_only_reward_fn,
    r1_zero_reward_fn,
    reset_grading_stats,
    score_batch,
)
from rlvr.tasks.scoring import compute_rollout_rewards

DATA = Path(R.__file__).parents[1] / "data" / "gsm8k"
SMALL_LIMIT = 0.2  # seconds; a pathological answer must come back well within a couple of these
SANITY_S = 30.0  # a bound on wall-clock time that only a hang can break, on however loaded a machine


@pytest.fixture(autouse=True, scope="module")
def warm_pool():
    """Start the grading pool once, so no case pays for the workers' start-up."""
    grade_answer("\\sqrt{4}", "2")


@pytest.fixture(autouse=True)
def _defaults(default_grading):
    """Every test starts and ends with the default grading configuration and zeroed counts."""


def r1(answer: str) -> str:
    """An r1_zero response: the prompt ends with "Assistant: <think>", generation stops after </answer>."""
    return f" 48/2 = 24 clips in May, 48 + 24 = 72 in all. </think> <answer> {answer} </answer>"


# ---------------------------------------------------------------------------------------------------
# The contract table: (reward fn, response, ground truth, expected reward, expected format reward).

RIGHT = [
    ("r1_zero", r1("72"), "72", 1, 1),
    ("r1_zero", r1("18"), "18", 1, 1),
    ("r1_zero", r1("0"), "0", 1, 1),
    ("r1_zero", r1("-5"), "-5", 1, 1),
    ("r1_zero", r1("1000"), "1000", 1, 1),
    ("r1_zero", r1("1000"), "1,000", 1, 1),
    ("r1_zero", " </think> <answer>72</answer>", "72", 1, 1),
    ("r1_zero", " step\nstep\n</think> <answer>\n72\n</answer>", "72", 1, 1),
    ("question_only", "Half of 48 is 24, and 48 + 24 = 72. The answer is \\boxed{72}.", "72", 1, 1),
    ("question_only", "$\\boxed{18}$", "18", 1, 1),
    ("answer_tag", "48 + 24 = 72.\n<answer>72</answer>", "72", 1, 1),
    ("answer_tag", "<answer> 18 </answer>", "18", 1, 1),
]

WRITTEN_DIFFERENTLY = [
    ("r1_zero", r1("$1,000"), "1000", 1, 1),
    ("r1_zero", r1("\\$1,000"), "1000", 1, 1),
    ("r1_zero", r1("1000.0"), "1000", 1, 1),
    ("r1_zero", r1("1,000.00"), "1000", 1, 1),
    ("r1_zero", r1("\\boxed{1000}"), "1000", 1, 1),
    ("r1_zero", r1("\\boxed{\\$1,000}"), "1000", 1, 1),
    ("r1_zero", r1("$\\$1,000$"), "1000", 1, 1),
    ("r1_zero", r1("1 000"), "1000", 1, 1),
    ("r1_zero", r1("1\\,000"), "1000", 1, 1),
    ("r1_zero", r1("1{,}000"), "1000", 1, 1),
    ("r1_zero", r1("\\frac{1}{2}"), "0.5", 1, 1),
    ("r1_zero", r1("\\dfrac{1}{2}"), "0.5", 1, 1),
    ("r1_zero", r1("1/2"), "0.5", 1, 1),
    ("r1_zero", r1("3/4"), "0.75", 1, 1),
    ("r1_zero", r1("0.50"), "0.5", 1, 1),
    ("r1_zero", r1(".5"), "0.5", 1, 1),
    ("r1_zero", r1("50%"), "50", 1, 1),
    ("r1_zero", r1("50\\%"), "50", 1, 1),
    ("r1_zero", r1("50 percent"), "50", 1, 1),
    ("r1_zero", r1("50%"), "0.5", 1, 1),
    ("r1_zero", r1("+5"), "5", 1, 1),
    ("r1_zero", r1("5 apples"), "5", 1, 1),
    ("r1_zero", r1("5 hours."), "5", 1, 1),
    ("r1_zero", r1("6 cm"), "6", 1, 1),
    ("r1_zero", r1("6cm"), "6", 1, 1),
    ("r1_zero", r1("60 miles per hour"), "60", 1, 1),
    ("r1_zero", r1("18 dollars"), "18", 1, 1),
    ("r1_zero", r1("USD 18"), "18", 1, 1),
    ("r1_zero", r1("18.00 USD"), "18", 1, 1),
    ("r1_zero", r1("72."), "72", 1, 1),
    ("r1_zero", r1("$72$"), "72", 1, 1),
    ("r1_zero", r1("\\text{72}"), "72", 1, 1),
    ("r1_zero", r1("\\textbf{72}"), "72", 1, 1),
    ("r1_zero", r1("72 \\text{ apples}"), "72", 1, 1),
    ("r1_zero", r1("**72**"), "72", 1, 1),
    ("r1_zero", r1("\u221272"), "-72", 1, 1),  # unicode minus
    ("r1_zero", r1("-$5"), "-5", 1, 1),
    ("r1_zero", r1("5 million"), "5000000", 1, 1),
    ("r1_zero", r1("2 dozen"), "24", 1, 1),
    ("r1_zero", r1("2^{10}"), "1024", 1, 1),
    ("r1_zero", r1("10^3"), "1000", 1, 1),
    ("r1_zero", r1("\\sqrt{4}"), "2", 1, 1),
    ("r1_zero", r1("x = 5"), "5", 1, 1),
    ("r1_zero", r1("3 \\times 4"), "12", 1, 1),
    ("r1_zero", r1("The answer is 72."), "72", 1, 1),
    ("r1_zero", r1("Janet makes $18 every day."), "18", 1, 1),
    ("question_only", "so \\boxed{\\frac{3}{4}}", "0.75", 1, 1),
    ("question_only", "so \\fbox{72}", "72", 1, 1),
    ("question_only", "so \\boxed 72", "72", 1, 1),
    ("answer_tag", "<ANSWER> $1,000 </ANSWER>", "1000", 1, 1),
    ("answer_tag", "< answer >72< / answer >", "72", 1, 1),
    ("answer_tag", "<answer>\\boxed{72}</answer>", "72", 1, 1),
]

CLOSE_BUT_WRONG = [
    ("r1_zero", r1("72.5"), "72", 0, 1),
    ("r1_zero", r1("720"), "72", 0, 1),
    ("r1_zero", r1("7.2"), "72", 0, 1),
    ("r1_zero", r1("-72"), "72", 0, 1),
    ("r1_zero", r1("71"), "72", 0, 1),
    ("r1_zero", r1("72.0001"), "72", 0, 1),
    ("r1_zero", r1("9007199254740993"), "9007199254740992", 0, 1),  # equal as floats
    ("r1_zero", r1("7,200"), "72", 0, 1),
    ("r1_zero", r1("$7.20"), "72", 0, 1),
    ("r1_zero", r1("1,00"), "100", 0, 1),
    ("r1_zero", r1("1 0000"), "10000", 0, 1),
    ("r1_zero", r1("50%"), "5", 0, 1),
    ("r1_zero", r1("5"), "50", 0, 1),
    ("r1_zero", r1("0.333"), "1/3", 0, 1),
    ("r1_zero", r1("\\frac{1}{3}"), "0.33", 0, 1),
    ("r1_zero", r1("2^{10}"), "2", 0, 1),
    ("r1_zero", r1("x = 6"), "5", 0, 1),
    ("r1_zero", r1("5, 6"), "5", 0, 1),
    ("r1_zero", r1("0.72"), "72", 0, 1),
    ("r1_zero", r1("5 thousand"), "50000", 0, 1),
    ("r1_zero", r1("\\boxed{70}"), "72", 0, 1),
    ("question_only", "\\boxed{71}", "72", 0, 1),
    ("answer_tag", "<answer>7.2</answer>", "72", 0, 1),
]

MISSING_OR_MALFORMED_TAGS = [
    ("r1_zero", "", "72", 0, 0),
    ("r1_zero", "72", "72", 0, 0),
    ("r1_zero", " so 72 </think> 72", "72", 0, 0),
    ("r1_zero", " so 72 </think><answer> 72 </answer>", "72", 0, 0),  # no space between the tags
    ("r1_zero", " so 72 </think>  <answer> 72 </answer>", "72", 0, 0),  # two spaces
    ("r1_zero", " so 72 </think>\n<answer> 72 </answer>", "72", 0, 0),
    ("r1_zero", " so 72 </think> <answer> 72 </Answer>", "72", 0, 0),
    ("r1_zero", " so 72 <answer> 72 </answer>", "72", 0, 0),  # think block never closed
    ("r1_zero", " so 72 </think> <answer></answer>", "72", 0, 1),
    ("r1_zero", " so 72 </think> <answer> \\boxed{72 </answer>", "72", 0, 1),  # unbalanced box
    ("r1_zero", " so 72 </answer> </think> <answer> 72", "72", 0, 0),  # the only </answer> comes first
    ("question_only", "The answer is 72.", "72", 0, 0),
    ("question_only", "The answer is \\boxed{72", "72", 0, 0),
    ("question_only", "The answer is \\boxed{}", "72", 0, 1),
    ("question_only", "The answer is \\boxedx{72}", "72", 0, 0),
    ("answer_tag", "The answer is 72.", "72", 0, 0),
    ("answer_tag", "<answer>72", "72", 0, 0),
    ("answer_tag", "72</answer>", "72", 0, 0),
    ("answer_tag", "<answer></answer>", "72", 0, 1),
]

SEVERAL_BLOCKS = [
    ("r1_zero", " x </think> <answer> 5 </answer> <answer> 72 </answer>", "72", 1, 1),
    ("r1_zero", " x </think> <answer> 72 </answer> <answer> 5 </answer>", "72", 0, 1),
    # One block opened twice: it holds "5 <answer> 72", a tag and two values (was 1 before the screen).
    ("r1_zero", " x </think> <answer> 5 <answer> 72 </answer>", "72", 0, 1),
    ("r1_zero", " x </think> <answer> 72 </answer> <answer> 5", "72", 1, 1),  # a truncated second block
    # One block holding two boxes holds two values: hedged (was 1 before the screen, the last box won).
    ("r1_zero", " x </think> <answer> \\boxed{5} so \\boxed{72} </answer>", "72", 0, 1),
    ("r1_zero", " x </think> <answer> The answer is \\boxed{72}. </answer>", "72", 1, 1),
    ("r1_zero", " x </think> <answer> \\boxed{72} so \\boxed{5} </answer>", "72", 0, 1),
    ("question_only", "\\boxed{72} no wait \\boxed{5}", "72", 0, 1),
    ("question_only", "\\boxed{5} no wait \\boxed{72}", "72", 1, 1),
    ("question_only", "\\boxed{\\boxed{72}}", "72", 1, 1),
    ("answer_tag", "<answer>5</answer> no: <answer>72</answer>", "72", 1, 1),
    ("answer_tag", "<answer>72</answer> no: <answer>5</answer>", "72", 0, 1),
    ("answer_tag", "<answer>72</answer> <answer>5", "72", 1, 1),
]

ANSWER_ONLY_IN_THINK = [
    ("r1_zero", " so <answer> 72 </answer> </think>", "72", 0, 0),
    ("r1_zero", " so <answer> 72 </answer> and </think> <answer>", "72", 0, 0),
    ("r1_zero", " <think> <answer> 72 </answer> </think> <answer> 5 </answer>", "72", 0, 1),
    ("r1_zero", " \\boxed{72} </think>", "72", 0, 0),
]

TRUNCATED = [
    ("r1_zero", " Natalia sold 48/2 = 24 clips in May, so", "72", 0, 0),
    ("r1_zero", " 48 + 24 = 72 </think> <answer> 72", "72", 0, 0),
    ("r1_zero", " 48 + 24 = 72 </think> <answer> \\boxed{72", "72", 0, 0),
    ("r1_zero", " 48 + 24 = 72 </think> <ans", "72", 0, 0),
    ("question_only", "48 + 24 = 72, so the answer is \\boxed{7", "72", 0, 0),
    ("answer_tag", "48 + 24 = 72 <answer> 72 </answ", "72", 0, 0),
]

HUGE_AND_ADVERSARIAL = [
    ("r1_zero", " x" * 50_000 + " </think> <answer> 72 </answer>", "72", 1, 1),  # 100k characters, right
    ("r1_zero", " </think> <answer> 72 </answer>" * 3000, "72", 1, 1),
    ("r1_zero", "<answer>" * 12_500, "72", 0, 0),
    ("r1_zero", "</think> <answer>" * 6000, "72", 0, 0),
    ("r1_zero", r1("{" * 10_000 + "72" + "}" * 10_000), "72", 0, 1),  # too long to grade
    ("r1_zero", r1("\\boxed{" * 10_000 + "72" + "}" * 10_000), "72", 1, 1),  # the innermost box is last
    ("r1_zero", r1("\\boxed{" * 10_000), "72", 0, 1),
    ("r1_zero", r1("9" * 5000), "72", 0, 1),
    ("r1_zero", r1("1" * 150), "72", 0, 1),
    ("r1_zero", r1("9**9**9**9"), "72", 0, 1),
    ("r1_zero", "\x00" * 1000, "72", 0, 0),
    ("r1_zero", r1("72\x00"), "72", 0, 1),  # a control character is not whitespace
    ("r1_zero", r1("\x00\x01\x02\xff"), "72", 0, 1),
    ("r1_zero", bytes(range(256)).decode("latin-1") * 40, "72", 0, 0),
    ("r1_zero", r1("\ud800\udfff"), "72", 0, 1),  # lone surrogates
    ("r1_zero", r1("七十二 🦆"), "72", 0, 1),
    ("question_only", "\\boxed{" * 50_000, "72", 0, 0),
    ("question_only", "}" * 50_000 + "\\boxed{72}", "72", 1, 1),
    ("answer_tag", "<answer" * 10_000 + "</answer>", "72", 0, 0),
    ("answer_tag", "< " * 50_000, "72", 0, 0),
]

CASES = [
    pytest.param(*case, id=f"{kind}-{i}")
    for kind, cases in [
        ("right", RIGHT),
        ("written-differently", WRITTEN_DIFFERENTLY),
        ("close-but-wrong", CLOSE_BUT_WRONG),
        ("malformed-tags", MISSING_OR_MALFORMED_TAGS),
        ("several-blocks", SEVERAL_BLOCKS),
        ("only-in-think", ANSWER_ONLY_IN_THINK),
        ("truncated", TRUNCATED),
        ("adversarial", HUGE_AND_ADVERSARIAL),
    ]
    for i, case in enumerate(cases)
]


def test_the_table_is_large_enough():
    assert len(CASES) >= 100


@pytest.mark.parametrize("fn_name, response, ground_truth, reward, format_reward", CASES)
def test_reward_cases(fn_name, response, ground_truth, reward, format_reward):
    start = time.perf_counter()
    scores = get_reward_fn(fn_name)(response, ground_truth)
    assert time.perf_counter() - start < SANITY_S
    assert scores == {"reward": float(reward), "format_reward": float(format_reward), "answer_reward": float(reward)}


def test_r1_zero_has_seed_004s_three_categories_only():
    seen = {
        tuple(r1_zero_reward_fn(resp, gt)[k] for k in ("format_reward", "answer_reward"))
        for fn, resp, gt, _, _ in RIGHT + CLOSE_BUT_WRONG + MISSING_OR_MALFORMED_TAGS
        if fn == "r1_zero"
    }
    assert seen == {(1.0, 1.0), (1.0, 0.0), (0.0, 0.0)}


# ---------------------------------------------------------------------------------------------------
# Grading: fast path, slow path, limits.

FAST_PATH = [
    ("$1,000", "1000", True),
    ("1,000,000.50", "1000000.5", True),
    ("1 000", "1000", True),
    ("1,00", "100", None),  # not a number with thousands separators: math-verify decides
    ("72 apples", "72", True),
    ("72.5", "72", False),
    ("3/4", "0.75", True),
    ("3/0", "0", None),
    ("-3/4", "-0.75", True),
    ("50\\%", "50", True),
    ("\\$-5", "-5", True),
    ("+-5", "-5", None),
    ("5 and a half", "5.5", None),
    ("5 pi", "5", None),
    ("1e3", "1000", True),  # scientific notation is read exactly (was None: left to math-verify)
    ("4.2 \\times 10^{1}", "42", True),
    ("10 1/2", "10.5", True),
    ("10 3/2", "11.5", None),  # not a mixed number
    ("42万", "420000", True),
    ("42万", "42", False),
    ("\uff14\uff12\u5143\u3002", "42", True),
    ("1" * 100, "1" * 100, True),
    ("1" * 99 + "2", "1" * 100, False),  # exact, not float, comparison
    ("0.1", "1/10", True),
    ("1" * 101, "1" * 101, None),  # too many digits for the fast path
    ("\\frac{3}{4}", "0.75", None),
    ("72", "50%", None),  # a percentage in the ground truth goes to math-verify
]


@pytest.mark.parametrize("answer, ground_truth, expected", FAST_PATH)
def test_fast_path_decides_plain_numbers_exactly(answer, ground_truth, expected):
    assert normalize.fast_grade(answer, ground_truth) is expected


def test_fast_path_never_calls_the_pool():
    for answer, gold in [("$1,000", "1000"), ("72.5", "72"), ("5 hours", "5"), ("1,234", "1,234")]:
        grade_answer(answer, gold)
    assert grading_stats()["slow_path"] == 0
    assert grading_stats()["fast_path"] == 4


def test_huge_digit_strings_never_raise():
    # Python refuses int() of more than 4,300 digits; the fast path must not get that far.
    assert grade_answer("9" * 5000, "9" * 5000) is False  # too long to grade at all
    assert grading_stats()["too_long"] == 1
    assert normalize.plain_number("9" * 5000) is None
    assert normalize.plain_number("1" * 101) is None
    assert normalize.plain_number("1" * 100) == (int("1" * 100), None)


@pytest.mark.parametrize(
    "answer, ground_truth, expected",
    [
        ("\\sqrt{16}", "4", True),
        ("\\sqrt{15}", "4", False),
        ("\\sqrt[3]{64}", "4", True),
        ("2\\pi", "2", False),  # a LaTeX command beside the value: the answer goes whole
        ("\\binom{5}{2}", "10", True),
        ("The answer is \\sqrt{5184}", "72", True),  # the value alone: math-verify never sees the prose
    ],
)
def test_slow_path_uses_math_verify(answer, ground_truth, expected):
    assert grade_answer(answer, ground_truth) is expected
    assert grading_stats()["slow_path"] == 1
    assert grading_stats()["timeouts"] == grading_stats()["errors"] == 0


@pytest.mark.parametrize(
    "answer, ground_truth, expected",
    [
        ("\\frac{3}{4}", "0.75", True),
        ("\\dfrac{3}{4}", "3/4", True),
        ("\\frac{3}{5}", "0.75", False),
        ("2^{10}", "1024", True),
        ("x = 5", "5", True),
        ("{5}", "5", True),
        ("3 \\times 4", "12", True),
        ("\\frac{1}{3}", "0.33", False),
        # math-verify reads these as 42; exactly, they are not.
        ("\\frac{84}{2}%-41", "42", False),
        ("\\boxed{42} * \\frac{82}{2}", "42", False),
    ],
)
def test_one_arithmetic_value_is_evaluated_exactly(answer, ground_truth, expected):
    # Was math-verify's before the screen (the first eight, with the same verdicts).
    assert grade_answer(answer, ground_truth) is expected
    assert grading_stats()["fast_path"] == 1 and grading_stats()["slow_path"] == 0


@pytest.mark.parametrize(
    "answer", ["41^\\frac{84}{2}", "\\sqrt{1681}^\\frac{84}{2}", "\\infty^2\\pi", "42}\\pi", "0 x \\sqrt{4}"]
)
def test_what_math_verify_would_misread_as_42_is_rejected_unseen(answer):
    assert grade_answer(answer, "42") is False
    assert grading_stats()["rejected"] == 1 and grading_stats()["slow_path"] == 0


def test_prose_around_one_plain_value_is_graded_on_the_fast_path():
    # Was math-verify's (the slow path) before the screen; the verdicts are the same.
    assert grade_answer("The answer is 72", "72") is True
    assert grade_answer("Janet makes $18 every day.", "18") is True
    assert grade_answer("The answer is 71.", "72") is False
    assert grading_stats()["fast_path"] == 3 and grading_stats()["slow_path"] == 0


@pytest.mark.parametrize("answer", ["\\frac{9^{9^{9^{9}}}}{1}", "9^{9^{9^{9}}}", "10^{10^{10}}"])
def test_time_limit_kills_a_pathological_answer(answer):
    configure_grading(timeout=SMALL_LIMIT)
    grade_answer("\\sqrt{4}", "2")  # the pool is up before the clock
    reset_grading_stats()
    start = time.perf_counter()
    assert grade_answer(answer, "72") is False  # the call returns, and the answer scores 0
    assert time.perf_counter() - start < SANITY_S
    assert grading_stats()["timeouts"] == 1
    assert grading_stats()["errors"] == 0
    # The killed worker is replaced: grading goes on.
    assert grade_answer("\\sqrt{4}", "2") is True
    assert grading_stats()["timeouts"] == 1


def test_time_limit_in_a_reward_fn_and_in_batch_metadata():
    configure_grading(timeout=SMALL_LIMIT)
    responses = [r1("\\frac{9^{9^{9^{9}}}}{1}"), r1("72"), r1("\\sqrt{5184}")]
    start = time.perf_counter()
    scores, meta = score_batch(r1_zero_reward_fn, responses, ["72"] * 3)
    assert time.perf_counter() - start < SANITY_S
    assert [s["reward"] for s in scores] == [0.0, 1.0, 1.0]
    assert meta["grading/timeouts"] == 1 == grading_stats()["timeouts"]
    assert meta["grading/slow_path"] == 2
    assert meta["grading/fast_path"] == 1
    assert meta["grading/errors"] == 0


class _RecordingPool:
    """The real pool, recording what was scheduled by the time the caller first waits on a result."""

    def __init__(self, pool):
        self.pool, self.scheduled, self.scheduled_at_first_wait = pool, [], None

    def schedule(self, *args, **kwargs):
        future = self.pool.schedule(*args, **kwargs)
        self.scheduled.append(future)
        return future


def test_slow_gradings_of_a_batch_run_concurrently(monkeypatch):
    configure_grading(timeout=1.0, max_workers=2)
    assert grade_answer("\\sqrt{4}", "2") is True
    recorder = _RecordingPool(grading_pool._get_pool())
    monkeypatch.setattr(grading_pool, "_get_pool", lambda: recorder)
    real_wait = grading_pool.concurrent.futures.wait

    def wait(futures, *args, **kwargs):
        if recorder.scheduled_at_first_wait is None:
            recorder.scheduled_at_first_wait = len(recorder.scheduled)
        return real_wait(futures, *args, **kwargs)

    monkeypatch.setattr(grading_pool.concurrent.futures, "wait", wait)
    pathological = [r1("9^{9^{9^{9}}}"), r1("\\frac{9^{9^{9^{9}}}}{1}")]
    start = time.perf_counter()
    scores, meta = score_batch(r1_zero_reward_fn, pathological, ["72", "72"])
    assert time.perf_counter() - start < SANITY_S
    assert [s["reward"] for s in scores] == [0.0, 0.0]
    assert meta["grading/timeouts"] == 2
    # Both were handed to the pool (two workers) before the first wait: one after the other would wait
    # between the two schedules.
    assert recorder.scheduled_at_first_wait == 2
    assert len({id(f) for f in recorder.scheduled}) == 2


def test_identical_slow_gradings_are_graded_once():
    scores, meta = score_batch(r1_zero_reward_fn, [r1("\\sqrt{0.25}")] * 5, ["0.5"] * 5)
    assert [s["reward"] for s in scores] == [1.0] * 5
    assert meta["grading/slow_path"] == 1


def test_answers_too_long_to_grade_score_zero_unseen():
    assert grade_answer("1+" * 1500 + "1", "3001") is False
    assert grading_stats()["too_long"] == 1
    assert grading_stats()["slow_path"] == 0


def test_grading_never_raises_on_junk():
    configure_grading(timeout=SMALL_LIMIT)
    rng = random.Random(0)
    junk = ["".join(chr(rng.randrange(0, 0x2FFF)) for _ in range(rng.randrange(0, 60))) for _ in range(30)]
    junk += [None, 3.5, b"72", object(), "\x00", "{", "}", "\\", "$", "%", "\\boxed", "\\boxed{", "<answer>"]
    for item in junk:
        assert grade_answer(item, "72") in (True, False)
        assert grade_answer("72", item) in (True, False)
        for fn in REWARD_FNS.values():
            assert set(fn(item, "72")) == {"reward", "format_reward", "answer_reward"}


def test_non_string_inputs_are_coerced_with_str():
    assert answer_tag_reward_fn(b"<answer>72</answer>", 72)["reward"] == 1.0
    assert r1_zero_reward_fn(None, None)["reward"] == 0.0
    assert grade_answer(72, 72.0) is True


def test_configure_grading_checks_its_arguments():
    for bad in [0, -1, float("nan"), float("inf")]:
        with pytest.raises(ValueError, match="timeout"):
            configure_grading(timeout=bad)
    with pytest.raises(ValueError, match="max_workers"):
        configure_grading(max_workers=0)


def test_grading_stats_count_and_reset():
    grade_answer("72", "72")
    grade_answer("\\sqrt{4}", "2")
    grade_answer("41 or 42", "42")
    assert grading_stats() == {
        "fast_path": 1, "slow_path": 1, "timeouts": 0, "errors": 0, "too_long": 0, "rejected": 1
    }
    reset_grading_stats()
    assert set(grading_stats().values()) == {0}


NO_MAIN_GUARD = """\
import sys
with open(sys.argv[1], "a") as f:  # at the top level, where a training script would train
    f.write(__name__ + "\\n")
from rlvr.tasks.rewards import r1_zero_reward_fn
print(r1_zero_reward_fn(" x </think> <answer> \\\\sqrt{1764} </answer>", "42")["reward"])
"""


def test_a_script_without_a_main_guard_is_never_run_again_by_the_graders(tmp_path):
    script, log = tmp_path / "train.py", tmp_path / "runs.txt"
    script.write_text(NO_MAIN_GUARD)
    done = subprocess.run(
        [sys.executable, str(script), str(log)], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1.0"]  # a slow-path answer: graded by a worker
    assert log.read_text().splitlines() == ["__main__"]  # no worker ran the script as __mp_main__


USERS_OWN_MULTIPROCESSING = """\
import multiprocessing
import multiprocessing.forkserver

from rlvr.tasks.rewards import grade_answer


def square(x):
    return x * x


if __name__ == "__main__":
    assert grade_answer("\\\\sqrt{1764}", "42") is True
    print(multiprocessing.forkserver._forkserver._preload_modules)
    with multiprocessing.get_context("forkserver").Pool(1) as pool:  # needs this script in its workers
        print(pool.map(square, [3]))
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        print(pool.map(square, [4]))
"""


def test_the_graders_leave_the_users_own_multiprocessing_alone(tmp_path):
    script = tmp_path / "mine.py"
    script.write_text(USERS_OWN_MULTIPROCESSING)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['__main__']", "[9]", "[16]"]


def test_importing_rewards_does_not_import_torch():
    code = "import sys, rlvr.tasks.rewards; assert 'torch' not in sys.modules and 'sympy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_grading_imports_neither_rewards_nor_torch():
    # Data flows one way (rewards imports grading), and the grading workers start without torch.
    code = "import sys, rlvr.grading; assert not {'torch', 'sympy', 'rlvr.tasks.rewards'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_grading_workers_fork_server_preloads_the_module_of_their_functions():
    preload = grading_pool._grader_server()._preload_modules
    assert grading_pool._worker_init.__module__ == grading_pool._slow_grade.__module__ == "rlvr.grading.pool"
    assert preload == ["rlvr.grading.pool", "math_verify"]


# ---------------------------------------------------------------------------------------------------
# Ground truth and extraction.


def test_parse_gsm8k_answer():
    assert parse_gsm8k_answer("She makes 9 * 2 = $<<9*2=18>>18.\n#### 18") == "18"
    assert parse_gsm8k_answer("a #### b\n#### 1,234,567") == "1234567"
    assert parse_gsm8k_answer("#### -3") == "-3"
    with pytest.raises(ValueError, match="no '####'"):
        parse_gsm8k_answer("The answer is 18.")
    with pytest.raises(ValueError, match="nothing after"):
        parse_gsm8k_answer("18 ####  ")


@pytest.mark.parametrize("split", ["train", "test"])
def test_every_gsm8k_answer_parses_and_grades_equal_to_itself_on_the_fast_path(split):
    golds = [parse_gsm8k_answer(json.loads(line)["answer"]) for line in (DATA / f"{split}.jsonl").open()]
    assert len(golds) == {"train": 7473, "test": 1319}[split]
    for gold in golds:
        value = int(gold)
        assert grade_answer(gold, gold) is True
        assert grade_answer(f"${value:,}", gold) is True
        assert grade_answer(str(value + 1), gold) is False
    assert grading_stats()["slow_path"] == 0
    assert grading_stats()["fast_path"] == 3 * len(golds)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("\\boxed{72}", "72"),
        ("a \\boxed{1} b \\boxed{\\frac{3}{4}} c", "\\frac{3}{4}"),
        ("\\boxed{\\text{a}{b}}", "\\text{a}{b}"),
        ("\\fbox{5}", "5"),
        ("\\boxed{1} \\fbox{2}", "2"),
        ("\\boxed 5$.", "5"),
        ("\\boxed  {7}", "7"),
        ("\\boxed{", None),
        ("\\boxed{1} \\boxed{2", None),
        ("\\boxed", None),
        ("\\boxedfoo{1}", None),
        ("no box", None),
        ("", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_boxed_handles_deep_nesting_quickly():
    text = "\\boxed{" + "{" * 100_000 + "1" + "}" * 100_000 + "}"
    start = time.perf_counter()
    assert extract_boxed(text) == "{" * 100_000 + "1" + "}" * 100_000
    assert time.perf_counter() - start < SANITY_S  # linear; a quadratic scan would take hours


# ---------------------------------------------------------------------------------------------------
# Combining, batching, registry.


def test_combine_rewards_weights_and_components():
    fn = combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("format", format_reward_fn(), 0.2)])
    right, wrong, unformatted = r1("72"), r1("70"), "72"
    assert fn(right, "72") == {
        "reward": 1.2, "format_reward": 1.0, "answer_reward": 1.0, "reward/correct": 1.0, "reward/format": 1.0
    }
    assert fn(wrong, "72") == {
        "reward": 0.2, "format_reward": 1.0, "answer_reward": 0.0, "reward/correct": 0.0, "reward/format": 1.0
    }
    assert fn(unformatted, "72") == {
        "reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0, "reward/correct": 0.0, "reward/format": 0.0
    }


def test_combine_rewards_takes_format_and_answer_from_the_first_component():
    fn = combine_rewards([("tag", answer_tag_reward_fn, 0.5), ("box", question_only_reward_fn, 2.0)])
    scores = fn("<answer>72</answer> \\boxed{70}", "72")
    assert scores == {"reward": 0.5, "format_reward": 1.0, "answer_reward": 1.0, "reward/tag": 1.0, "reward/box": 0.0}


def test_combine_rewards_accepts_a_plain_callable():
    def length_penalty(response, ground_truth):
        return {"reward": -len(response) / 100, "format_reward": 0.0, "answer_reward": 0.0}

    fn = combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("length", length_penalty, 0.5)])
    response = r1("72")
    scores = fn(response, "72")
    assert scores["reward"] == pytest.approx(1.0 - 0.5 * len(response) / 100)
    assert scores["reward/length"] == pytest.approx(-len(response) / 100)


@pytest.mark.parametrize(
    "components, match",
    [
        ([], "at least one"),
        ([("a", r1_zero_reward_fn)], "name, reward_fn, weight"),
        ([("a", r1_zero_reward_fn, 1.0), ("a", r1_zero_reward_fn, 1.0)], "distinct"),
        ([("a", r1_zero_reward_fn, float("nan"))], "finite"),
        ([("a", r1_zero_reward_fn, "1")], "finite"),
        ([("a", "r1_zero", 1.0)], "callable"),
        ([("", r1_zero_reward_fn, 1.0)], "name"),
    ],
)
def test_combine_rewards_rejects_bad_components(components, match):
    with pytest.raises(ValueError, match=match):
        combine_rewards(components)


MIXED_BATCH = [
    (r1("72"), "72"),
    (r1("$1,000"), "1000"),
    (r1("\\frac{1}{2}"), "0.5"),
    (r1("\\frac{1}{3}"), "0.5"),
    (r1("x = 5"), "5"),
    (r1("70"), "72"),
    ("72", "72"),
    (" </think> <answer> 72", "72"),
    (r1("\\boxed{2^{3}}"), "8"),
    (r1("\\sqrt{64}"), "8"),
    (r1("\\sqrt{63}"), "8"),
    (r1("The answer is 72."), "72"),
    (r1("\\frac{1}{2}"), "0.5"),
]


@pytest.mark.parametrize(
    "fn",
    [
        r1_zero_reward_fn,
        answer_tag_reward_fn,
        combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("format", format_reward_fn("r1_zero"), 0.2)]),
        combine_rewards(
            [("a", answer_tag_reward_fn, 1.0), ("b", combine_rewards([("c", r1_zero_reward_fn, 2.0)]), 1.0)]
        ),
    ],
    ids=["r1_zero", "answer_tag", "combined", "nested"],
)
def test_score_batch_equals_one_by_one(fn):
    responses, golds = zip(*MIXED_BATCH)
    one_by_one = [fn(r, g) for r, g in MIXED_BATCH]
    reset_grading_stats()
    batch, meta = score_batch(fn, responses, golds)
    assert batch == one_by_one
    assert meta["grading/slow_path"] == grading_stats()["slow_path"] > 0
    assert meta["grading/seconds"] > 0


def test_score_batch_of_a_plain_callable_calls_it_in_order():
    calls = []

    def fn(response, ground_truth):
        calls.append(response)
        return {"reward": float(grade_answer(response, ground_truth)), "format_reward": 1.0, "answer_reward": 0.0}

    scores, meta = score_batch(fn, ["72", "\\sqrt{0.25}", "5"], ["72", "0.5", "6"])
    assert calls == ["72", "\\sqrt{0.25}", "5"]
    assert [s["reward"] for s in scores] == [1.0, 1.0, 0.0]
    assert meta["grading/slow_path"] == 1 and meta["grading/fast_path"] == 2


def test_score_batch_rejects_lengths_that_differ():
    with pytest.raises(ValueError, match="responses .* ground_truths"):
        score_batch(r1_zero_reward_fn, ["a", "b"], ["a"])


def test_compute_rollout_rewards():
    responses = [r1("72"), r1("70"), "72", r1("\\sqrt{5184}")]
    raw, meta = compute_rollout_rewards(r1_zero_reward_fn, responses, ["72"] * 4)
    assert raw.dtype == torch.float32 and raw.shape == (4,)
    assert raw.tolist() == [1.0, 0.0, 0.0, 1.0]
    assert meta["reward_mean"] == 0.5
    assert meta["format_reward_mean"] == 0.75
    assert meta["answer_reward_mean"] == 0.5
    assert meta["grading/slow_path"] == 1.0 and meta["grading/fast_path"] == 2.0
    assert meta["grading/timeouts"] == meta["grading/errors"] == 0.0
    assert all(isinstance(v, float) for v in meta.values())


def test_compute_rollout_rewards_reports_each_component():
    fn = combine_rewards([("correct", r1_zero_reward_fn, 1.0), ("format", format_reward_fn(), 0.2)])
    raw, meta = compute_rollout_rewards(
        reward_fn=fn, rollout_responses=[r1("72"), r1("70")], repeated_ground_truths=["72", "72"]
    )
    assert raw.tolist() == pytest.approx([1.2, 0.2])
    assert meta["reward_mean"] == pytest.approx(0.7)
    assert meta["reward/correct_mean"] == 0.5
    assert meta["reward/format_mean"] == 1.0


def test_compute_rollout_rewards_rejects_lengths_that_differ():
    with pytest.raises(ValueError, match="rollout_responses .* repeated_ground_truths"):
        compute_rollout_rewards(r1_zero_reward_fn, ["a", "b"], ["a"])


def test_registry():
    assert set(REWARD_FNS) == {"r1_zero", "question_only", "answer_tag", "code_tests", "code_tests:think",
                               "code_tests:fraction", "code_tests:think,fraction", "code_format"}
    assert get_reward_fn("r1_zero") is r1_zero_reward_fn
    with pytest.raises(ValueError, match="answer_tag, code_format, code_tests, .*question_only, r1_zero"):
        get_reward_fn("r1-zero")
    with pytest.raises(ValueError, match="valid"):
        format_reward_fn("nope")


def test_soft_overlong_punishment_is_dapos_formula():
    # DAPO eq. 13 with L_max = 100, L_cache = 20: 0 up to 80 tokens, (80 - |y|) / 20 after, -1 past L_max
    from rlvr.tasks.scoring import soft_overlong_penalty

    assert [soft_overlong_penalty(n, 100, 20) for n in (0, 80, 81, 90, 99, 100, 101)] == [
        0.0, 0.0, -0.05, -0.5, -0.95, -1.0, -1.0]
    assert soft_overlong_penalty(100, 100, 100) == -1.0 and soft_overlong_penalty(1, 100, 100) == -0.01
    with pytest.raises(ValueError, match="overlong buffer"):
        soft_overlong_penalty(10, 100, 0)

"""Answer grading for GSM8K (seed 004 §3.3): whether an answer extracted by a reward function
(`rlvr.tasks.rewards`) equals the ground truth.

Grading an extracted answer against the ground truth takes one of two paths:

* the fast path, in-process (`normalize`): both sides are plain numbers, perhaps dressed as "$1,000",
  "72 apples", "50%", "3/4" or "\\text{72}", or the answer is one arithmetic expression the screen below
  evaluates ("\\frac{3}{4}", "2^{10}", "6 x 7 = 42"). They are compared exactly as `fractions.Fraction`,
  never as floats. Nearly every GSM8K answer takes this path;
* the slow path (`pool`): anything else ("\\sqrt{2}", "\\binom{5}{2}", "2\\pi") goes to `math_verify`, run in
  a pool of worker processes with a hard time limit per answer (default 1 s). An answer that runs out of
  time scores 0, its worker is killed, and the timeout is counted; nothing the model writes can hang,
  crash or raise out of a run.

Between the two, a screen (`screen`; in-process, for every answer the fast path does not decide) scores 0
what is not one answer, so that math-verify, which searches prose for a final answer ("41 or 42" is 42 to
it), never sees it. The rules, for all three reward functions (they share `grade_answer`'s path):

1. Every way of writing a digit counts, on both sides: invisible format characters (U+200B-U+200F,
   U+2060, U+FEFF, the soft hyphen, bidi marks) are removed; superscript digits become an exponent
   ("m²" is "m^{2}"), vulgar fractions a fraction ("10½" is "10 1/2"); then NFKC (full-width "４２",
   mathematical "𝟒𝟐", "．"), and any other Unicode decimal digit ("٤٢", "४२") becomes its ASCII digit.
2. A plain number (fast path) is: a sign, a currency ($, US$, USD, RMB, €, £, ¥), the number ("1,234",
   "1 234 567", "0.5", "3/4", the mixed number "10 1/2", "4.2e1", "4.2 × 10^1", "4.2 \\times 10^{1}"),
   then a % or an English magnitude word ("5 million": read either way, 5 or 5000000), or CJK magnitudes
   ("42万", read only scaled: 420000, never 42; 十 百 千 万 萬 亿 億), then units (words, CJK characters
   such as 元 只 个, an exponent after a unit letter "42 m^2", degrees "42^\\circ"), then trailing
   . , ; : ! 。 、 Thousands groups never start with 0 ("0,042" is no 42).
3. Not an answer, 0: a tag inside it ("<think>", "</think>", "<answer>", any "<name>" or "</name>"; the
   format reward is unaffected, for r1_zero it is the response's shape); a control character; braces
   that do not balance; CJK numerals beside the digits other than magnitudes right after them ("42两",
   "4点2"); what math-verify misreads as a finite number (a command as an unbraced exponent,
   "\\sqrt{1681}^\\frac{84}{2}", and infinity).
4. A restated computation "a = b = ... = c" (after leading names such as "x =" or "total =", and a
   prefix of words such as "So, ") is right only if every side evaluates exactly to the same value and
   that value is right. Sides are evaluated with Fraction (no eval) over numbers, + - * / x × ÷ · ^ %,
   brackets, \\frac, \\times, \\cdot and \\div, or are a plain number ("$42", "42 apples"). "6 x 7 = 42"
   is 42; "41 = 42", "40 + 3 = 42" and "6 x 7 = 41" are wrong, and so is a side that cannot be
   evaluated this way ("\\sqrt{1764} = 42").
5. An answer holding two or more different values is hedged and scores 0 ("41 or 42", "first 7, then
   42", "between 40 and 42", "40-42", "42, 43", "42 \\pm 1", "42 (or maybe 41)", "42 or \\pi"). A value
   is a number as in 2, or numbers joined by arithmetic into one expression ("3 \\times 4",
   "\\frac{3}{4}", "2^{10}", "10 \\frac{1}{2}"), or a number word or run of them ("forty-one"), or a run
   of CJK numerals ("四十二"; a lone 一, as in 一共 "in all", is not counted), or \\pi or \\infty. A bare
   "a - b" between two numbers is a range: two values; so are two numbers side by side ("41 42"),
   across a newline, or an expression after a number with no operator between ("41 \\frac{84}{2}").
   The same value repeated ("42 or 42", "42 (42)") is one value. A one-digit exponent or subscript after
   a letter ("m^2", "CO_2") is a unit's, not a value.
6. One value is graded alone: the words, names ("x ="), wrappers and punctuation around it are dropped
   ("The answer is 72." is 72, "答案是42" is 42), unless a word beside it changes it ("not", "negative",
   "minus", "half", "twice", "times", "percent", ...; 不 负 倍 减 加 乘 除 分之): then 0. An expression is
   evaluated exactly when it can be (as in 4), since math-verify reads "41^\\frac{84}{2}" and
   "\\frac{84}{2}%-41" as 42; one that cannot ("\\sqrt{1764}", "\\binom{5}{2}") goes to math-verify
   alone. When LaTeX or a letter is glued to the value ("2\\pi"), the answer goes to math-verify whole.
7. The answer block is the value: in r1_zero and answer_tag a block holding "\\boxed{}" is unwrapped only
   if nothing else in it is a value ("The answer is \\boxed{72}." is 72; "\\boxed{5} so \\boxed{72}" is
   hedged). For question_only the answer is the last box not inside another ("\\boxed{41 or \\boxed{42}}"
   is hedged).

`grade_pairs` (which `rlvr.tasks.rewards.score_batch` calls with every answer of a batch, extracted in-process)
sends only the slow-path answers to the pool, all at once, so a batch is graded in parallel on the
available cores.

How this departs from the assignment's reference grader (`drgrpo_grader.py`):

1. Equivalence is math-verify plus a small exact fast path, not a hand-written normaliser and sympy.
2. The r1_zero answer is the last complete <answer>...</answer> block, opening at the first <answer>
   after the previous "</answer>" (so "<answer> 5 <answer> 72 </answer>" is one block holding a tag);
   text after a last, unclosed <answer> (a truncated second block) is ignored, and a response whose only
   "</answer>" comes before "</think> <answer>" fails the format.
3. A time limit that kills the worker, rather than signal.alarm, which cannot interrupt a long C call
   such as the big-integer power in "9**9**9**9".
4. The screen above: hedged answers, tags inside the answer and false computations score 0, and one
   value with words around it is graded alone, exactly where it is arithmetic.

This package imports neither torch nor rlvr.tasks.rewards (the grading workers import it and must start fast).
The workers fork from a fork server of rlvr's own that preloads only rlvr.grading.pool and math_verify,
and they never import the main script: a script that grades needs no `if __name__ == "__main__":` guard
(except on Windows, which has no forkserver).

May import: rlvr.core, rlvr.sandbox (grading.code runs programs there).
"""

from __future__ import annotations

import math
import time
from typing import Sequence

from rlvr.grading.extract import as_text, extract_boxed
from rlvr.grading.normalize import canonical, fast_grade
from rlvr.grading.pool import (
    STAT_KEYS,
    configure_grading,
    count_stats,
    grading_stats,
    pool_settings,
    reset_grading_stats,
    run_slow,
    shutdown_grading,
)
from rlvr.grading.screen import screen_answer

__all__ = [
    "configure_grading",
    "extract_boxed",
    "grade_answer",
    "grade_pairs",
    "grading_stats",
    "reset_grading_stats",
    "shutdown_grading",
]

_MAX_SLOW_CHARS = 2000  # an "answer" longer than this is prose, not an answer; scored 0 unseen


def grade_pairs(pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> tuple[list[bool], dict]:
    """Grade many (answer, ground truth) pairs: fast path here, the rest concurrently in the pool, each
    distinct pair once. Returns the verdicts and this call's counts (see `grading_stats`) and seconds."""
    start = time.perf_counter()
    timeout = pool_settings["timeout"] if timeout is None else float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        timeout = pool_settings["timeout"]
    counts = dict.fromkeys(STAT_KEYS, 0)
    verdicts = [False] * len(pairs)
    pending: dict[tuple[str, str], list[int]] = {}
    golds: dict = {}
    for i, (answer, gold) in enumerate(pairs):
        answer, gold = as_text(answer).strip(), as_text(gold).strip()
        try:
            decided = fast_grade(answer, gold, golds) if answer and gold else False
        except Exception:  # the fast path is only a shortcut; the screen and math-verify get the pair instead
            decided = None
        if decided is None and len(answer) <= _MAX_SLOW_CHARS and len(gold) <= _MAX_SLOW_CHARS:
            # The fast path accepts one number and nothing else, so only what it declines needs screening.
            try:
                screened = screen_answer(answer)
            except Exception:  # a bug in the screen must not let an unscreened answer through
                counts["errors"] += 1
                continue
            if screened is None:
                counts["rejected"] += 1
                continue
            if screened != answer:
                answer = screened
                try:
                    decided = fast_grade(answer, gold, golds)
                except Exception:
                    decided = None
            gold = canonical(gold)
        if decided is not None:
            verdicts[i] = decided
            counts["fast_path"] += 1
        elif len(answer) > _MAX_SLOW_CHARS or len(gold) > _MAX_SLOW_CHARS:
            counts["too_long"] += 1
        else:
            pending.setdefault((answer, gold), []).append(i)
    if pending:
        counts["slow_path"] = len(pending)
        for indices, verdict in zip(pending.values(), run_slow(list(pending), timeout, counts)):
            for i in indices:
                verdicts[i] = verdict
    count_stats(counts)
    counts["seconds"] = time.perf_counter() - start
    return verdicts, counts


def grade_answer(model_answer: str, ground_truth: str, timeout: float | None = None) -> bool:
    """Whether an extracted answer equals the ground truth. Never raises; never takes much longer than
    `timeout` seconds of grading (default: `configure_grading`'s), after which the answer is wrong.

    >>> grade_answer("$1,000.00", "1000"), grade_answer("\\\\frac{3}{4}", "0.75"), grade_answer("72.5", "72")
    (True, True, False)
    """
    return grade_pairs([(model_answer, ground_truth)], timeout)[0][0]


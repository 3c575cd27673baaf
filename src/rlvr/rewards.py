"""Answer grading and reward functions for GSM8K (seed 004 §3.3 and §4.2.3).

A reward function maps `(response, ground_truth)` to `{"reward", "format_reward", "answer_reward"}`.
Grading an extracted answer against the ground truth takes one of two paths:

* the fast path, in-process: both sides are plain numbers, perhaps dressed as "$1,000", "72 apples",
  "50%", "3/4" or "\\text{72}", or the answer is one arithmetic expression the screen below evaluates
  ("\\frac{3}{4}", "2^{10}", "6 x 7 = 42"). They are compared exactly as `fractions.Fraction`, never as
  floats. Nearly every GSM8K answer takes this path;
* the slow path: anything else ("\\sqrt{2}", "\\binom{5}{2}", "2\\pi") goes to `math_verify`, run in a pool
  of worker processes with a hard time limit per answer (default 1 s). An answer that runs out of time
  scores 0, its worker is killed, and the timeout is counted; nothing the model writes can hang, crash
  or raise out of a run.

Between the two, a screen (in-process, for every answer the fast path does not decide) scores 0 what is
not one answer, so that math-verify, which searches prose for a final answer ("41 or 42" is 42 to it),
never sees it. The rules, for all three reward functions (they share `grade_answer`'s path):

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

`score_batch` extracts every answer in-process and sends only the slow-path answers to the pool, all at
once, so a batch is graded in parallel on the available cores.

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

This module does not import torch (the grading workers import it and must start fast); only
`compute_rollout_rewards` does, when called. The workers fork from a fork server of this module's own
that preloads only rlvr.rewards and math_verify, and they never import the main script: a script that
grades needs no `if __name__ == "__main__":` guard (except on Windows, which has no forkserver).
"""

from __future__ import annotations

import atexit
import concurrent.futures
import io
import logging
import math
import multiprocessing
import os
import re
import signal
import threading
import time
import unicodedata
from fractions import Fraction
from typing import Callable, Sequence

__all__ = [
    "REWARD_FNS",
    "RewardFn",
    "answer_tag_reward_fn",
    "combine_rewards",
    "compute_rollout_rewards",
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

Scores = dict[str, float]

# ----------------------------------------------------------------------------------------------------
# Ground truth and answer extraction.


def parse_gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last "####", without thousands commas.

    >>> parse_gsm8k_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 1,234")
    '1234'
    """
    text = str(solution)
    if "####" not in text:
        raise ValueError(f"GSM8K solution has no '####' final-answer line: ...{text[-120:]!r}")
    answer = text.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise ValueError(f"GSM8K solution has nothing after its '####': ...{text[-120:]!r}")
    return answer


_BRACE = re.compile(r"[{}]")


def extract_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} (or \\fbox{...}, or "\\boxed 5"), or None if absent or unbalanced.

    >>> extract_boxed("so \\\\boxed{1} then \\\\boxed{\\\\frac{3}{4}}.")
    '\\\\frac{3}{4}'
    >>> extract_boxed("\\\\boxed 5$."), extract_boxed("\\\\boxed{12"), extract_boxed("no box")
    ('5', None, None)
    """
    box = _last_box(_as_text(text))
    return None if box is None else box[2]


def _last_box(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last box in the text (the innermost, when boxes nest), or None if
    absent or unbalanced."""
    return _box_at(text, max(text.rfind("\\boxed"), text.rfind("\\fbox")))


def _last_outer_box(text: str) -> tuple[int, int, str] | None:
    """(start, end, content) of the last box not inside another, or None if absent or unbalanced: in
    "\\boxed{41 or \\boxed{42}}" the answer is "41 or \\boxed{42}", not "42"."""
    last, i = None, 0
    while True:
        m = _BOX_START.search(text, i)
        if m is None:
            return last
        start = m.start()
        box = _box_at(text, start)
        if box is None:
            if _opens_box(text, start):
                return None  # unbalanced: whatever follows is inside it
            i = start + 5
        else:
            last, i = box, box[1]


def _opens_box(text: str, start: int) -> bool:
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    return i < len(text) and (text[i] == "{" or text[i].isspace())


def _box_at(text: str, start: int) -> tuple[int, int, str] | None:
    if start < 0:
        return None
    i = start + (6 if text.startswith("\\boxed", start) else 5)
    j = i
    while j < len(text) and text[j].isspace():
        j += 1
    if j < len(text) and text[j] == "{":
        depth = 0
        for m in _BRACE.finditer(text, j):
            depth += 1 if m.group() == "{" else -1
            if depth == 0:
                return start, m.end(), text[j + 1 : m.start()]
        return None
    if j == i:  # "\boxedx" is another command; only "\boxed 5" takes an unbraced argument
        return None
    raw = _NON_SPACE.match(text, j).group()  # not text[j:].split(): a box per call must cost its token only
    token = raw.split("$", 1)[0].rstrip(".")
    return (start, j + len(raw), token) if token else None


_BOX_START = re.compile(r"\\(?:boxed|fbox)")
_NON_SPACE = re.compile(r"\S*")


def _as_text(value) -> str:
    """Any input as a string; grading must accept whatever a caller hands it."""
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:
        return ""


# ----------------------------------------------------------------------------------------------------
# Unicode: every way of writing a digit becomes an ASCII digit, on both sides.

# Invisible format characters (zero-width space and joiners, word joiner, BOM, soft hyphen, bidi marks):
# "4\u200b2" must read as 42, not as two numbers or as junk.
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")
# NFKC would turn "m²" into "m2" and "10½" into "101⁄2"; rewritten first, they keep their meaning.
_SUPERSCRIPT_RUN = re.compile("[\u2070\u00b9\u00b2\u00b3\u2074-\u207b]+")
_SUBSCRIPT_RUN = re.compile("[\u2080-\u208b]+")
_VULGAR_FRACTION = re.compile("[\u00bc-\u00be\u2150-\u215e\u2189]")
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")  # any Unicode decimal digit NFKC leaves alone (Arabic-Indic, ...)
_CANONICAL = str.maketrans({"\u066b": ".", "\u066c": ",", "\u2044": "/", "\u2212": "-", "\u2013": "-", "\u2014": "-"})


def _canonical(text: str) -> str:
    """The text with ASCII digits for every Unicode way of writing one and no invisible characters.

    >>> _canonical("\\uff14\\uff12\\u5143\\u3002"), _canonical("\\u0664\\u0662"), _canonical("10\\u00bd m\\u00b2")
    ('42元。', '42', '10 1/2  m^{2}')
    """
    if text.isascii():
        return text
    try:
        text = _INVISIBLE.sub("", text)
        text = _SUPERSCRIPT_RUN.sub(lambda m: "^{" + unicodedata.normalize("NFKC", m.group()) + "}", text)
        text = _SUBSCRIPT_RUN.sub(lambda m: "_{" + unicodedata.normalize("NFKC", m.group()) + "}", text)
        text = _VULGAR_FRACTION.sub(lambda m: " " + unicodedata.normalize("NFKC", m.group()) + " ", text)
        text = unicodedata.normalize("NFKC", text)
        text = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group(), "")), text)
        return text.translate(_CANONICAL)
    except Exception:  # lone surrogates and the like: the text as it was, to be graded as junk
        return text


# ----------------------------------------------------------------------------------------------------
# The fast path: plain numbers, compared exactly.

_MAX_FAST_CHARS = 200  # longer strings are never plain numbers worth parsing here
_MAX_DIGITS = 100  # keeps Fraction/int far from Python's 4,300-digit limit and from slow arithmetic
_MAX_SLOW_CHARS = 2000  # an "answer" longer than this is prose, not an answer; scored 0 unseen

_UNICODE = str.maketrans(
    {"\u2212": "-", "\u2013": "-", "\u2014": "-", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u3000": " ",
     "\uff04": "$"}
)
_LATEX_SPACING = re.compile(r"\\[,;: ]|~")
_INLINE_TEXT = re.compile(
    r"\\(?:text|textbf|textrm|textit|textnormal|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}"
)
_OUTER_WRAPPERS = [
    re.compile(r"\$(.*)\$", re.S),
    re.compile(r"\\\((.*)\\\)", re.S),
    re.compile(r"\\\[(.*)\\\]", re.S),
    re.compile(r"\*\*(.*)\*\*", re.S),
]
_TRAILING_PUNCTUATION = ".,;:!\u3002\u3001"  # the CJK full stop and enumeration comma too: "42。"
_NUMBER = re.compile(
    r"""(?P<sign>[-+]?)\s*(?:US\$|USD|RMB|\$|€|£|¥)?\s*(?P<sign2>[-+]?)\s*
    (?:(?P<whole>[0-9]+)\s+(?=[0-9]+\s*/\s*[0-9]))?  # the 10 of the mixed number "10 1/2"
    (?P<num>[1-9][0-9]{0,2}(?:,[0-9]{3})+(?:\.[0-9]+)?   # 1,234,567.89 (not 0,042)
       |[1-9][0-9]{0,2}(?:\ [0-9]{3})+(?:\.[0-9]+)?      # 1 234 567
       |[0-9]+(?:\.[0-9]+)?|\.[0-9]+)
    (?:\s*/\s*(?P<den>[0-9]+)                        # 3/4
      |[eE](?P<exp>[-+]?[0-9]{1,3})                  # 4.2e1
      |\s*(?:[x×*·⋅∙]|\\times|\\cdot)\s*10\s*\^\s*   # 4.2 x 10^1, 4.2 \times 10^{1}
         (?:\{\s*(?P<exp2>[-+]?[0-9]{1,3})\s*\}|(?P<exp3>[-+]?[0-9]{1,3})))?
    (?=[^0-9,.]|\.(?![0-9])|$)""",
    re.X,
)
# After the number: unit words, CJK unit characters ("元", "只", "个") and punctuation, and the exponent of
# a unit ("m^2", from "m²"), which is no second number.
_SUFFIX = re.compile(
    r"(?:[A-Za-z'’./$\-\s\u3001\u3002\u3400-\u4dbf\u4e00-\u9fff°]"
    r"|(?<=[A-Za-z])\^\{?[0-9]\}?"  # m^2
    r"|\^\s*\{?\s*\\circ\s*\}?)*"  # 42^\circ
)
_WORD = re.compile(r"[a-z]+")
_SCALES = {
    "k": 1000, "thousand": 1000, "million": 10**6, "billion": 10**9, "trillion": 10**12, "dozen": 12, "hundred": 100
}
# Words after a number that change its value: sending these to math-verify beats misreading them as units.
_VALUE_WORDS = frozenset(
    "and plus minus times over point or half halves quarter quarters third thirds fourth fourths fifth fifths "
    "sixths eighths tenths squared cubed pi zero one two three four five six seven eight nine ten eleven twelve "
    "thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty "
    "ninety hundred hundreds thousand thousands million millions billion billions trillion dozen dozens "
    "percent percentage cent".split()
)
# CJK magnitudes right after the digits scale the number, and only that reading counts: "42万" is 420000,
# never 42. Any other CJK numeral next to the digits ("42两", "4点2") makes the answer unreadable.
_CJK_MAGNITUDES = {"十": 10, "百": 100, "千": 1000, "万": 10**4, "萬": 10**4, "亿": 10**8, "億": 10**8}
_CJK_SCALE = re.compile("[十百千万萬亿億]+")
_CJK_NUMERALS = "零〇一二三四五六七八九十百千万萬亿億兆两兩半点點廿卅"
_CJK_NUMERAL = re.compile(f"[{_CJK_NUMERALS}]")


def _normalize(text: str) -> str:
    """Strip the LaTeX and markdown dress around a would-be number: "$\\boxed{\\$1,000}$." -> "$1,000"."""
    s = text.translate(_UNICODE).replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\!", "")
    s = _INLINE_TEXT.sub(r" \1 ", _LATEX_SPACING.sub(" ", s))
    for _ in range(8):
        before = s
        s = s.strip().rstrip(_TRAILING_PUNCTUATION).strip()
        box = _box_at(s, 0) if s.startswith(("\\boxed", "\\fbox")) else None
        if box is not None and box[1] == len(s):  # one box around it all, not "\\boxed{42} * \\frac{82}{2}"
            s = box[2]
        else:
            for wrapper in _OUTER_WRAPPERS:
                m = wrapper.fullmatch(s)
                if m:
                    s = m.group(1)
                    break
        if s == before:
            break
    return s


def _plain_number(text: str) -> tuple[Fraction, Fraction | None] | None:
    """(value as written, value scaled by a trailing % or magnitude word or None), or None if not a plain number.

    >>> _plain_number("$1,000.00 dollars"), _plain_number("50%"), _plain_number("1,00")
    ((Fraction(1000, 1), None), (Fraction(50, 1), Fraction(1, 2)), None)
    >>> _plain_number("10 1/2"), _plain_number("4.2 \\\\times 10^{1}"), _plain_number("42万")
    ((Fraction(21, 2), None), (Fraction(42, 1), None), (Fraction(420000, 1), None))
    """
    if len(text) > _MAX_FAST_CHARS:
        return None
    s = _normalize(_canonical(text))
    m = _NUMBER.match(s)
    if m is None:
        return None
    sign, sign2, whole, num, den = m.group("sign", "sign2", "whole", "num", "den")
    exp, exp2, exp3 = m.group("exp", "exp2", "exp3")
    if sign and sign2:
        return None
    exp = exp or exp2 or exp3
    if len(num) + len(den or "") + len(whole or "") > _MAX_DIGITS and (
        len(re.sub(r"[^0-9]", "", num) + (den or "") + (whole or "")) > _MAX_DIGITS
    ):
        return None
    rest = s[m.end() :].strip()
    cjk = None if rest.isascii() else _CJK_SCALE.match(rest)
    if cjk:
        rest = rest[cjk.end() :].strip()
    percent = rest.startswith("%")
    rest = rest[1:] if percent else rest
    if rest and (not _SUFFIX.fullmatch(rest) or (not rest.isascii() and _CJK_NUMERAL.search(rest))):
        return None  # more digits, braces, operators, numerals: not a plain number
    words = _WORD.findall(rest.lower()) if rest else []
    if not percent and words[:1] in (["percent"], ["percentage"]):
        percent, words = True, words[1:]
    elif not percent and words[:2] == ["per", "cent"]:
        percent, words = True, words[2:]
    scale = _SCALES.get(words[0]) if words and not percent else None
    if scale is not None:
        words = words[1:]
    if any(w in _VALUE_WORDS for w in words):
        return None
    value = Fraction(num.replace(",", "").replace(" ", ""))
    if den:
        if int(den) == 0:
            return None
        value /= int(den)
    if whole:  # a proper fraction only: "10 3/2" is no way of writing a number
        if not (den and num.isdigit() and num[0] != "0" and value < 1):
            return None
        value += int(whole)
    if exp:
        value *= Fraction(10) ** int(exp)
    if cjk:
        for ch in cjk.group():
            value *= _CJK_MAGNITUDES[ch]
    if "-" in (sign, sign2):
        value = -value
    if percent:
        return value, value / 100
    return value, (value * scale if scale is not None else None)


def _fast_grade(answer: str, ground_truth: str, golds: dict | None = None) -> bool | None:
    """True/False when both sides are plain numbers; None when math-verify must decide.

    A percentage or magnitude word in the answer may be read either way ("50%" is right for 50 and for
    0.5, "5 million" for 5 and for 5000000); one in the ground truth sends the pair to math-verify.
    `golds` caches the parsed ground truths of a batch, where each comes once per sample of its group.
    """
    if golds is None:
        gold = _plain_number(ground_truth)
    else:
        if ground_truth not in golds:
            golds[ground_truth] = _plain_number(ground_truth)
        gold = golds[ground_truth]
    if gold is None or gold[1] is not None:
        return None
    pred = _plain_number(answer)
    if pred is None:
        return None
    return pred[0] == gold[0] or pred[1] == gold[0]


# ----------------------------------------------------------------------------------------------------
# Screening: an answer must be one value. What is not is scored 0 here, and never reaches math-verify,
# which, given prose, searches it for a final answer ("41 or 42" would be 42).

_TAG = re.compile(r"<\s*/?\s*[A-Za-z][\w:-]*\s*/?\s*>")
# What math-verify misreads as a finite number: a command as an unbraced exponent ("\sqrt{1681}^\frac{84}{2}"
# is 42 to it; "42^\circ" is fine), and infinity ("\infty^2\pi" is 42 to it).
_ILL_FORMED = re.compile(r"[\^_]\s*\\(?!circ(?![A-Za-z])|prime(?![A-Za-z]))[A-Za-z]|\\infty(?![A-Za-z])|∞")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # "72\x00" is junk, not 72
_CJK_NEAR_DIGIT = re.compile(f"[0-9]\\s*[{_CJK_NUMERALS}]|[{_CJK_NUMERALS}]\\s*[0-9]")
_NAME = re.compile(r"[^\W\d]+(?:\s+[^\W\d]+)*")  # "x", "total", "the total cost": the left of "x = 42"
_PROSE_PREFIX = re.compile(r"(?:[^\W\d]+[\s:,]+)+(?=[0-9(\[{.+\-\\$])")  # "So, " in "So, 6 x 7 = 42"
_MAX_BITS = 20_000  # exact arithmetic on an answer stays far from the 4,300-digit int-to-str limit
_LATEX_MIXED = re.compile(r"([0-9]+)\s*\\[dt]?frac\s*\{\s*([0-9]+)\s*\}\s*\{\s*([0-9]+)\s*\}")
_MIXED = r"[0-9]+\s+[0-9]+\s*/\s*[0-9]+(?![0-9.])|[0-9]+\s*\\[dt]?frac\s*\{\s*[0-9]+\s*\}\s*\{\s*[0-9]+\s*\}"

_ARITH_TOKEN = re.compile(
    rf"""\s*(?:
    (?P<mixed>{_MIXED})
   |(?P<num>[1-9][0-9]{{0,2}}(?:,[0-9]{{3}})+(?:\.[0-9]+)?(?![0-9])
      |[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{{1,3}})?|\.[0-9]+)
   |(?P<frac>\\[dt]?frac(?![A-Za-z]))
   |(?P<op>\*\*|[-+*/^()\[\]{{}}%×÷·⋅∙]|\\(?:times|cdot|div)(?![A-Za-z])|[xX](?![A-Za-z]))
   |(?P<skip>\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\?\$|€|£|¥)
    )""",
    re.X,
)
_MUL = frozenset("* × · ⋅ ∙ x X \\times \\cdot".split())
_DIV = frozenset("/ ÷ \\div".split())
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def _mixed_value(text: str) -> Fraction | None:
    """ "10 1/2" or "10\\frac{1}{2}" as 21/2; None unless the fraction is proper (as in "10 3/2")."""
    m = _LATEX_MIXED.fullmatch(text.strip())
    whole, numerator, denominator = m.groups() if m else re.split(r"\s*/\s*|\s+", text.strip())
    if int(denominator) == 0 or int(numerator) >= int(denominator):
        return None
    return int(whole) + Fraction(int(numerator), int(denominator))


class _Arithmetic:
    """Exact evaluation of + - * / x × ÷ · ^ % and brackets (and \\frac, \\times, \\cdot, \\div) over
    numbers, by recursive descent with Fraction: no eval(), and bounded in depth and in size."""

    def __init__(self, tokens: list[tuple[str, str]]):
        self.tokens, self.i, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.i][1] if self.i < len(self.tokens) else None

    def take(self, expected: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.tokens) or (expected is not None and self.tokens[self.i][1] != expected):
            raise ValueError("unexpected end or token")
        self.i += 1
        return self.tokens[self.i - 1]

    @staticmethod
    def check(value: Fraction) -> Fraction:
        if max(abs(value.numerator).bit_length(), value.denominator.bit_length()) > _MAX_BITS:
            raise ValueError("too large")
        return value

    def expression(self) -> Fraction:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()[1]
            value = self.check(value + self.term() if op == "+" else value - self.term())
        return value

    def term(self) -> Fraction:
        value = self.unary()
        while self.peek() in _MUL or self.peek() in _DIV:
            op = self.take()[1]
            value = self.check(value * self.unary() if op in _MUL else value / self.unary())
        return value

    def unary(self) -> Fraction:
        if self.peek() in ("+", "-"):
            op = self.take()[1]
            self.enter()
            value = self.unary()
            self.depth -= 1
            return -value if op == "-" else value
        return self.power()

    def power(self) -> Fraction:
        base = self.postfix()
        if self.peek() in ("^", "**"):
            self.take()
            self.enter()
            exponent = self.unary()
            self.depth -= 1
            if exponent.denominator != 1 or (base == 0 and exponent < 0):
                raise ValueError("not an exact power")
            size = max(abs(base.numerator).bit_length(), base.denominator.bit_length())
            if size * abs(exponent.numerator) > _MAX_BITS:
                raise ValueError("too large")
            return self.check(base ** int(exponent))
        return base

    def postfix(self) -> Fraction:
        value = self.primary()
        while self.peek() == "%":
            self.take()
            value /= 100
        return value

    def primary(self) -> Fraction:
        kind, text = self.take()
        if kind == "num":
            return Fraction(text.replace(",", ""))
        if kind == "mixed":
            value = _mixed_value(text)
            if value is None:
                raise ValueError("not a mixed number")
            return value
        if kind == "frac":
            numerator, denominator = self.group("{"), self.group("{")
            return self.check(numerator / denominator)
        if text in _CLOSING:
            self.i -= 1
            return self.group(text)
        raise ValueError(f"unexpected {text!r}")

    def group(self, opening: str) -> Fraction:
        self.take(opening)
        self.enter()
        value = self.expression()
        self.depth -= 1
        self.take(_CLOSING[opening])
        return value

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 100:
            raise ValueError("too deep")


def _evaluate(text: str) -> Fraction | None:
    """The exact value of an arithmetic expression, or None if it is not one this module can evaluate.

    >>> _evaluate("6 x 7"), _evaluate("\\\\frac{84}{2}"), _evaluate("(40 + 3) \\\\times 1"), _evaluate("2^{10}")
    (Fraction(42, 1), Fraction(42, 1), Fraction(43, 1), Fraction(1024, 1))
    >>> _evaluate("\\\\sqrt{4}"), _evaluate("9^9^9"), _evaluate("1/0")
    (None, None, None)
    """
    tokens, i = [], 0
    text = text.strip()
    while i < len(text):
        m = _ARITH_TOKEN.match(text, i)
        if m is None or m.end() == i:
            if text[i:].strip():
                return None
            break
        i = m.end()
        if m.lastgroup != "skip":
            tokens.append((m.lastgroup, m.group(m.lastgroup)))
    if not tokens:
        return None
    parser = _Arithmetic(tokens)
    try:
        value = parser.expression()
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return value if parser.i == len(tokens) else None


def _side_value(text: str) -> Fraction | None:
    """One side of a restated computation: an expression, or a number with its units ("$42", "42 apples")."""
    value = _evaluate(text)
    if value is None:
        plain = _plain_number(text)
        if plain is not None and plain[1] is None:  # "50%" or "5 million" could be either; no guessing
            value = plain[0]
    return value


def _render(value: Fraction) -> str:
    """An exact value as the fast path and math-verify both read it: "42", "-3/4"."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# Tokens of an answer, to count its values. Numbers joined by arithmetic are one value (an expression);
# numbers apart, or with words, commas, newlines, "±" and the like between them, are separate values.
_CARDINALS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand "
    "million billion trillion dozen"
).split()
_CARDINAL = "(?:" + "|".join(sorted(_CARDINALS, key=len, reverse=True)) + ")"
_ATTACHED_WORDS = frozenset("hundred thousand million billion trillion dozen percent percentage".split())
_FUNCTIONS = frozenset("\\frac \\dfrac \\tfrac \\sqrt \\binom".split())
_CONSTANTS = frozenset("\\pi \\infty π ∞".split())  # values without digits: "42 or \\pi" hedges
_RISKY_OPS = frozenset("x X × ÷ · ⋅ ∙".split())  # math-verify may read "0 x +42" as 0x + 42
_VALUE_TOKEN = re.compile(
    rf"""(?P<exponent>(?<=[A-Za-z])[^\S\n]*[\^_][^\S\n]*(?:\{{\s*[-+]?[0-9]\s*\}}|[-+]?[0-9](?![0-9.])))  # m^2
   |(?P<space>[^\S\n]+)
   |(?P<mixed>{_MIXED})
   |(?P<num>[1-9][0-9]{{0,2}}(?:,[0-9]{{3}})+(?:\.[0-9]+)?(?![0-9])
      |[1-9][0-9]{{0,2}}(?:\ [0-9]{{3}})+(?:\.[0-9]+)?(?![0-9/])
      |[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{{1,3}})?|\.[0-9]+)
   |(?P<words>(?i:(?<![a-z]){_CARDINAL}(?:(?:\s+|\s*-\s*)(?:and\s+)?{_CARDINAL})*(?![a-z])))
   |(?P<cjk>[{_CJK_NUMERALS}]+)
   |(?P<op>\*\*|[-+*/^%×÷·⋅∙]|\\(?:[dt]?frac|sqrt|times|cdot|div|binom)(?![A-Za-z]))
   |(?P<ignore>\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\displaystyle(?![A-Za-z])|\^\s*\{{?\s*\\circ\s*\}}?)
   |(?P<open>[({{\[])
   |(?P<close>[)}}\]])
   |(?P<word>[A-Za-z]+|\\[A-Za-z]+|(?![{_CJK_NUMERALS}])[^\W\d_])  # one CJK character a word: 或one
   |(?P<other>.)""",
    re.X | re.S,
)
_Token = tuple  # (kind, text, start, end)


def _values(s: str) -> list[list[_Token]]:
    """The answer's values, each as its tokens: a number with its magnitude word, an expression, a number
    word ("forty-one") or a CJK numeral ("四十二"; a lone 一, as in 一共 "in all", is not counted)."""
    values: list[list[_Token]] = []
    current: list[_Token] | None = None
    expecting = True  # the next number continues the current expression (after an operator or "(")
    arguments: list[list[int]] = []  # per open \frac or \sqrt: [arguments still to come, bracket depth]
    depth = 0
    last = None

    def start(token):
        nonlocal current, arguments, depth
        current, arguments, depth = [token], [], 0
        values.append(current)

    for m in _VALUE_TOKEN.finditer(s):
        kind, text = m.lastgroup, m.group()
        token = (kind, text, m.start(), m.end())
        if kind in ("space", "ignore", "exponent"):
            continue
        if kind == "word" and text in ("x", "X") and current is not None and not expecting:
            kind, token = "op", ("op", text, m.start(), m.end())  # "6 x 7"
        if kind in ("num", "mixed"):
            if current is None or not expecting:
                start(token)
            else:
                current.append(token)
            expecting = False
        elif kind == "op":
            if text == "%" and current is not None and not expecting:
                current.append(token)
            else:
                if current is None or (text in _FUNCTIONS and not expecting):  # "41 \frac{84}{2}": two
                    start(token)
                else:
                    current.append(token)
                if text in _FUNCTIONS:
                    arguments.append([1 if text == "\\sqrt" else 2, depth])
                expecting = True
        elif kind == "open":
            # "}{" continues an expression only between the arguments of its \frac: "\frac{84}{2}}{41" is two
            argument = bool(arguments) and arguments[-1][1] == depth and last in ("op", "close") and text in "{["
            if current is None or not (expecting or argument):
                start(token)
            else:
                current.append(token)
            depth += 1
            expecting = True
        elif kind == "close":
            if current is not None:
                current.append(token)
                depth -= 1
                if arguments and arguments[-1][1] == depth and text == "}":
                    arguments[-1][0] -= 1
                    if arguments[-1][0] <= 0:
                        arguments.pop()
                expecting = False
        elif kind == "words" and current is not None and not expecting and text.lower() in _ATTACHED_WORDS:
            current.append(token)  # "5 million", "2 dozen", "42 percent"
        elif kind == "cjk" and current is not None and not expecting and _CJK_SCALE.fullmatch(text):
            current.append(token)  # "42万"
        elif kind in ("words", "cjk") and text != "一":
            values.append([token])
            current, expecting = None, True
        elif kind == "word" and current is not None and not expecting and text.lower() in ("percent", "percentage"):
            current.append(token)
        elif kind == "word" and text in _CONSTANTS:
            if current is not None and not expecting:
                current.append(token)  # "2\\pi"
            else:
                current, expecting = [("const", text, m.start(), m.end())], False
                values.append(current)
        else:
            current, expecting = None, True
        last = kind
    return [v for v in values if any(t[0] in ("num", "mixed", "words", "cjk", "const") for t in v)]


def _counts_as_number(words: str) -> bool:
    """Whether words hold a number word or CJK numeral: "forty = 42" names nothing, it hedges."""
    return any(t[0] in ("words", "cjk") for tokens in _values(words) for t in tokens)


def _plain_value(text: str) -> Fraction:
    return Fraction(text.replace(",", "").replace(" ", ""))


def _value_keys(tokens: list[_Token]) -> list:
    """What a value is, to tell two values apart: an exact number when it has one, else its text.
    A bare "a - b" is a range ("40-42"): two values."""
    kinds = [t[0] for t in tokens]
    if kinds == ["num", "op", "num"] and tokens[1][1] == "-":
        return [_plain_value(tokens[0][1]), _plain_value(tokens[2][1])]
    if kinds == ["const"]:
        return [("const", tokens[0][1])]
    if kinds[0] in ("words", "cjk"):
        return [(kinds[0], " ".join(tokens[0][1].lower().replace("-", " ").split()))]
    if kinds == ["mixed"]:
        value = _mixed_value(tokens[0][1])
        if value is None:  # "10 3/2": an integer and a fraction, not a mixed number
            return [("whole", tokens[0][1]), ("fraction", tokens[0][1])]
        return [value]
    if kinds == ["num"]:
        return [_plain_value(tokens[0][1])]
    text = " ".join(t[1] for t in tokens)
    value = _evaluate(text)
    return [value if value is not None else ("expression", "".join(text.split()))]


# Words that change the value beside them: with one of these around it, a value cannot be graded alone.
_CHANGING_WORDS = frozenset(
    "not negative minus plus times over point half halves quarter quarters third thirds fourth fourths fifth "
    "fifths sixth sixths eighth eighths tenth tenths hundredths twice double triple thrice squared cubed "
    "except without percent percentage".split()
)
_CJK_CHANGING = re.compile("[不负負倍减減加乘除]|分之")
_PROSE = re.compile(r"(?<!\\)[^\W\d_]{2,}|[\u3400-\u4dbf\u4e00-\u9fff]")


_GLUE = re.compile(r"[A-Za-z\u0370-\u03ff\\^_]")
_DROPPABLE_COMMANDS = re.compile(r"\\(?:boxed|fbox|quad|qquad|displaystyle|left|right)(?![A-Za-z])")
_MATH_AROUND = re.compile(r"\\[A-Za-z]|[\^_]")
_LATEX_COMMENT = re.compile(r"(?<!\\)%")


def _screen(answer: str) -> str | None:
    """The answer to grade (perhaps rewritten as its one value), or None when it scores 0 unseen: a tag
    inside it, CJK numerals beside its digits, a restated computation that does not hold, two or more
    different values, or one value with a value-changing word beside it (see the module docstring)."""
    text = _canonical(answer)
    plain = _plain_number(text)
    if plain is not None and plain[1] is None:
        return _render(plain[0])  # one number, one reading: its exact value is what math-verify should see
    if _TAG.search(text) or _CONTROL.search(text):
        return None
    s = _normalize(text)
    if _CJK_NEAR_DIGIT.search(s) or _ILL_FORMED.search(s) or s.count("{") != s.count("}"):
        return None
    if "=" in s:
        sides = [side.replace("$", " ").strip() for side in re.split(r"=+", s)]  # "so $x = 42$"
        while len(sides) > 1 and not sides[0]:
            sides.pop(0)  # "= 42"
        while len(sides) > 1 and _NAME.fullmatch(sides[0]) and not _counts_as_number(sides[0]):
            sides.pop(0)
        if len(sides) > 1:
            prefix = _PROSE_PREFIX.match(sides[0])
            if prefix and not _counts_as_number(prefix.group()):
                sides[0] = sides[0][prefix.end() :]
            values = {_side_value(side) for side in sides}
            if None in values or len(values) != 1:
                return None
            return _render(values.pop())
    groups = _values(s)
    keys: set = set()
    for tokens in groups:
        keys.update(_value_keys(tokens))
        if len(keys) > 1:
            return None
    if not groups:
        return text
    value = groups[0]
    while value[-1][0] == "op" and value[-1][1] in "+-":
        value = value[:-1]  # "Janet has 42 - that is the answer": a dash, not a minus
    if (value[-1][0] == "op" and value[-1][1] != "%") or (value[0][0] == "op" and value[0][1] in "*/^"):
        return None  # "\frac{84}{2}^ apples": an expression cut short is no value
    first, last = value[0][2], value[-1][3]
    span, around = s[first:last], s[:first] + " " + s[last:]
    prose = _PROSE.findall(around)
    if any(word.lower() in _CHANGING_WORDS for word in prose) or _CJK_CHANGING.search(around):
        return None
    risky = any(t[0] == "op" and t[1] in _RISKY_OPS for t in value)
    # The value alone can be graded when what is around it is words, names, wrappers and punctuation, and
    # no LaTeX or letter is glued to it (as in "2\pi", which is no 2).
    before, after = _DROPPABLE_COMMANDS.sub(" ", s[:first]), _DROPPABLE_COMMANDS.sub(" ", s[last:])
    glued = _GLUE.match(after) or (before and _GLUE.match(before[-1]))
    if glued or _MATH_AROUND.search(before + " " + after):
        unsafe = risky or _LATEX_COMMENT.search(text) or s.count("(") != s.count(")")
        return None if unsafe else text
    if _plain_number(span) is not None:
        return span
    exact = _evaluate(span)
    if exact is not None:
        # Exact, where math-verify misreads odd LaTeX: it reads "41^\frac{84}{2}" and "\frac{84}{2}%-41" as 42.
        return _render(exact)
    # "%" starts a LaTeX comment: math-verify would read "\frac{84}{2}%\pi" as 42.
    return None if risky or "%" in span or span.count("(") != span.count(")") else span


# ----------------------------------------------------------------------------------------------------
# The slow path: math-verify in a pool of worker processes, killed at the time limit.

_DEFAULT_TIMEOUT = 1.0
_STARTUP_GRACE_S = 60.0  # a worker that never starts must not hang the caller either
_RESTART_S = 5.0  # allowance per queued task for killing and replacing a timed-out worker

_config = {"timeout": _DEFAULT_TIMEOUT, "max_workers": None}
_pool = None
_pool_pid: int | None = None
_pool_lock = threading.RLock()
_STAT_KEYS = ("fast_path", "slow_path", "timeouts", "errors", "too_long", "rejected")
_stats = dict.fromkeys(_STAT_KEYS, 0)
_stats_lock = threading.Lock()


def configure_grading(timeout: float = _DEFAULT_TIMEOUT, max_workers: int | None = None) -> None:
    """Set the hard time limit per slow-path grading (seconds) and the pool size (None: os.cpu_count()).

    Calling it with no arguments restores the defaults. A new pool size takes effect at the next grading.

    >>> configure_grading(timeout=0.5); configure_grading()
    """
    timeout = float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"configure_grading: timeout must be a positive number of seconds; got {timeout!r}")
    if max_workers is not None and (not isinstance(max_workers, int) or max_workers < 1):
        raise ValueError(f"configure_grading: max_workers must be a positive integer or None; got {max_workers!r}")
    with _pool_lock:
        if max_workers != _config["max_workers"]:
            shutdown_grading()
        _config.update(timeout=timeout, max_workers=max_workers)


def grading_stats() -> dict[str, int]:
    """Counts since start (or the last reset): gradings by fast and slow path, timeouts, errors, answers
    too long to grade (scored 0 without a look), and answers rejected by the screen (scored 0 as hedged,
    holding a tag, or restating a computation that does not hold; see the module docstring)."""
    with _stats_lock:
        return dict(_stats)


def reset_grading_stats() -> None:
    with _stats_lock:
        _stats.update(dict.fromkeys(_STAT_KEYS, 0))


def shutdown_grading() -> None:
    """Stop the worker pool (registered atexit); the next slow-path grading starts a new one."""
    global _pool, _pool_pid
    with _pool_lock:
        pool, owned = _pool, _pool_pid == os.getpid()
        _pool, _pool_pid = None, None
    if pool is not None and owned:  # a forked child must not stop its parent's pool threads
        try:
            # Closing lets a worker that is still booting (the replacement of a killed one) start and
            # exit cleanly; stopping it mid-boot makes it print a traceback. Stop only what hangs.
            pool.close()
            pool.join(timeout=_config["timeout"] + 2)
        except Exception:
            try:
                pool.stop()
                pool.join(timeout=5)
            except Exception:
                pass


def _worker_count() -> int:
    return _config["max_workers"] or os.cpu_count() or 1


def _get_pool():
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is not None and _pool_pid == os.getpid() and _pool.active:
            return _pool
        if _pool_pid == os.getpid():
            shutdown_grading()  # a broken pool (a worker start failed) is replaced, not reused
        from pebble import ProcessPool

        # Registered after pebble's own atexit hook, so it runs first (LIFO), while pebble still works.
        atexit.unregister(shutdown_grading)
        atexit.register(shutdown_grading)
        # Forking a process that holds torch threads is unsafe; forkserver forks from a clean server.
        if _GraderContext is not None and "forkserver" in multiprocessing.get_all_start_methods():
            context = _GraderContext()
        else:  # no forkserver (Windows): spawn, which re-imports the main script in each worker
            context = multiprocessing.get_context("spawn")
        _pool = ProcessPool(max_workers=_worker_count(), initializer=_worker_init, context=context)
        _pool_pid = os.getpid()
        return _pool


# The grading workers' own start method. A stdlib forkserver or spawn child runs the parent's main script
# again, as __mp_main__, before it unpickles its task: a script without a main guard would train again
# inside the grader. These workers get the preparation data without the main module, from a fork server
# of rlvr's own that preloads only rlvr.rewards and math_verify (so replacing a killed worker costs a fork,
# not a 0.5 s import). The user's own multiprocessing, its default forkserver and its preload are untouched.
_server = None
_server_pid: int | None = None
_server_lock = threading.Lock()  # not _pool_lock: pebble's thread starts workers while shutdown holds that


def _grader_server():
    global _server, _server_pid
    with _server_lock:
        if _server is None or _server_pid != os.getpid():  # a forked child needs a server of its own
            from multiprocessing import forkserver

            server = forkserver.ForkServer()
            server.set_forkserver_preload(["rlvr.rewards", "math_verify"])
            _server, _server_pid = server, os.getpid()
        return _server


try:
    from multiprocessing import context as _mp_context
    from multiprocessing import popen_forkserver as _mp_popen_forkserver
except ImportError:  # no forkserver on this platform
    _GraderContext = None
else:

    class _GraderPopen(_mp_popen_forkserver.Popen):
        def _launch(self, process_obj):
            # The stdlib's Popen._launch (3.11 to 3.14), with two changes: no main module in the preparation
            # data, and rlvr's fork server instead of the default one.
            from multiprocessing import forkserver, spawn, util

            prep_data = spawn.get_preparation_data(process_obj._name)
            prep_data.pop("init_main_from_name", None)
            prep_data.pop("init_main_from_path", None)
            buf = io.BytesIO()
            _mp_context.set_spawning_popen(self)
            try:
                _mp_context.reduction.dump(prep_data, buf)
                _mp_context.reduction.dump(process_obj, buf)
            finally:
                _mp_context.set_spawning_popen(None)
            self.sentinel, w = _grader_server().connect_to_new_process(self._fds)
            parent_w = os.dup(w)  # the child reads the parent's death from this pipe's other end
            self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self.pid = forkserver.read_signed(self.sentinel)

    class _GraderProcess(_mp_context.ForkServerProcess):
        @staticmethod
        def _Popen(process_obj):
            return _GraderPopen(process_obj)

    class _GraderContext(_mp_context.ForkServerContext):
        Process = _GraderProcess


def _worker_init() -> None:
    # pebble's SIGTERM handler is Python code, which cannot run until a long C call (a huge power) ends,
    # so pebble would wait 3 s before SIGKILL; the default action ends the worker at once.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _limit_memory()
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    logging.getLogger("latex2sympy2_extended").setLevel(logging.ERROR)
    from math_verify import parse

    parse("\\boxed{1}")  # imports sympy and compiles the regexes before any task's clock starts


def _limit_memory(headroom: int = 2 << 30) -> None:
    """Cap the worker's address space, so an answer that builds a huge integer fails fast instead of
    taking the machine's memory before the time limit strikes."""
    try:
        import resource

        with open("/proc/self/statm") as f:
            in_use = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = in_use + headroom
        if hard == resource.RLIM_INFINITY or cap < hard:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except Exception:
        pass  # not Linux: no cap, the time limit still holds


_PROSE_DROP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mbox)\s*\{[^{}]*\}|\\[A-Za-z]+")
_PROSE_WORD = re.compile(r"[A-Za-z]{2,}")


def _mv_parse(text: str, seconds: int) -> list:
    """math-verify's parse of one answer. LaTeX is read as one expression ("\\boxed{2^{10}}" is 1024, where
    a bare "2^{10}" would be read as 2); prose ("The answer is 72") is searched for its final answer, as
    math-verify does with a whole model output, because read as LaTeX its words become symbols."""
    from math_verify import parse

    boxed = "\\boxed{" + text + "}"
    prose = _PROSE_WORD.search(_PROSE_DROP.sub(" ", text)) is not None
    for candidate in (text, boxed) if prose else (boxed, text):
        parsed = parse(candidate, parsing_timeout=seconds)
        if parsed:
            return parsed
    return []


def _slow_grade(answer: str, ground_truth: str, seconds: int) -> bool:
    """Runs in a worker: math-verify's verdict, with its own (whole-second, signal-based) timeouts."""
    from math_verify import verify

    gold = _mv_parse(ground_truth, seconds)
    pred = _mv_parse(answer, seconds)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=seconds))


def _run_slow(pairs: list[tuple[str, str]], timeout: float, counts: dict) -> list[bool]:
    """Grade all pairs in the pool at once; each gets `timeout` seconds of a worker, then is killed."""
    # math-verify's own timeout is a backstop set above the hard limit, so the kill (which is counted)
    # is what normally strikes.
    inner = math.ceil(timeout) + 1
    try:
        pool = _get_pool()
        futures = [pool.schedule(_slow_grade, args=(a, g, inner), timeout=timeout) for a, g in pairs]
    except Exception:
        counts["errors"] += len(pairs)
        shutdown_grading()
        return [False] * len(pairs)
    rounds = math.ceil(len(pairs) / _worker_count())
    _, late = concurrent.futures.wait(futures, timeout=_STARTUP_GRACE_S + rounds * (timeout + _RESTART_S))
    verdicts = []
    for future in futures:
        if future in late:
            future.cancel()
            counts["timeouts"] += 1
            verdicts.append(False)
            continue
        try:
            verdicts.append(future.result(timeout=0) is True)
        except TimeoutError:
            counts["timeouts"] += 1
            verdicts.append(False)
        except Exception:
            counts["errors"] += 1
            verdicts.append(False)
    return verdicts


def _grade_pairs(pairs: Sequence[tuple[str, str]], timeout: float | None = None) -> tuple[list[bool], dict]:
    """Grade many (answer, ground truth) pairs: fast path here, the rest concurrently in the pool, each
    distinct pair once. Returns the verdicts and this call's counts (see `grading_stats`) and seconds."""
    start = time.perf_counter()
    timeout = _config["timeout"] if timeout is None else float(timeout)
    if not (math.isfinite(timeout) and timeout > 0):
        timeout = _config["timeout"]
    counts = dict.fromkeys(_STAT_KEYS, 0)
    verdicts = [False] * len(pairs)
    pending: dict[tuple[str, str], list[int]] = {}
    golds: dict = {}
    for i, (answer, gold) in enumerate(pairs):
        answer, gold = _as_text(answer).strip(), _as_text(gold).strip()
        try:
            decided = _fast_grade(answer, gold, golds) if answer and gold else False
        except Exception:  # the fast path is only a shortcut; the screen and math-verify get the pair instead
            decided = None
        if decided is None and len(answer) <= _MAX_SLOW_CHARS and len(gold) <= _MAX_SLOW_CHARS:
            # The fast path accepts one number and nothing else, so only what it declines needs screening.
            try:
                screened = _screen(answer)
            except Exception:  # a bug in the screen must not let an unscreened answer through
                counts["errors"] += 1
                continue
            if screened is None:
                counts["rejected"] += 1
                continue
            if screened != answer:
                answer = screened
                try:
                    decided = _fast_grade(answer, gold, golds)
                except Exception:
                    decided = None
            gold = _canonical(gold)
        if decided is not None:
            verdicts[i] = decided
            counts["fast_path"] += 1
        elif len(answer) > _MAX_SLOW_CHARS or len(gold) > _MAX_SLOW_CHARS:
            counts["too_long"] += 1
        else:
            pending.setdefault((answer, gold), []).append(i)
    if pending:
        counts["slow_path"] = len(pending)
        for indices, verdict in zip(pending.values(), _run_slow(list(pending), timeout, counts)):
            for i in indices:
                verdicts[i] = verdict
    with _stats_lock:
        for key in _STAT_KEYS:
            _stats[key] += counts[key]
    counts["seconds"] = time.perf_counter() - start
    return verdicts, counts


def grade_answer(model_answer: str, ground_truth: str, timeout: float | None = None) -> bool:
    """Whether an extracted answer equals the ground truth. Never raises; never takes much longer than
    `timeout` seconds of grading (default: `configure_grading`'s), after which the answer is wrong.

    >>> grade_answer("$1,000.00", "1000"), grade_answer("\\\\frac{3}{4}", "0.75"), grade_answer("72.5", "72")
    (True, True, False)
    """
    return _grade_pairs([(model_answer, ground_truth)], timeout)[0][0]


# ----------------------------------------------------------------------------------------------------
# Reward functions. Each is a RewardFn: call it on one response, or `score_batch` it on many.


def _scores(format_ok: float, right: bool) -> Scores:
    return {"reward": float(right), "format_reward": float(format_ok), "answer_reward": float(right)}


class RewardFn:
    """A reward function `fn(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}`
    that can also grade a batch in parallel (`fn.batch`). Subclasses say where the answer is (`extract`)."""

    name = "reward"

    def extract(self, response: str) -> tuple[float, str | None]:
        """(format_reward, the answer to grade or None when there is none)."""
        raise NotImplementedError

    def plan(self, responses: list[str], ground_truths: list[str]):
        """The (answer, ground truth) pairs to grade, and a function from their verdicts to the scores."""
        extracted = []
        for response in responses:
            try:
                extracted.append(self.extract(response))
            except Exception:  # a bug here must cost one sample its reward, not the run
                extracted.append((0.0, None))
        pairs = [(a, g) for (_, a), g in zip(extracted, ground_truths) if a is not None]

        def finish(verdicts: list[bool]) -> list[Scores]:
            it = iter(verdicts)
            return [_scores(f, a is not None and next(it)) for f, a in extracted]

        return pairs, finish

    def __call__(self, response: str, ground_truth: str) -> Scores:
        return self.batch([response], [ground_truth])[0][0]

    def batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> tuple[list[Scores], dict]:
        return score_batch(self, responses, ground_truths)

    def __repr__(self) -> str:
        return f"<reward fn {self.name}>"


def _unbox(answer: str) -> str | None:
    """The answer block with its \\boxed{} unwrapped when present; None when the box is unbalanced.

    The box is unwrapped only when the rest of the block holds no value and no tag ("The answer is
    \\boxed{72}."): a block such as "\\boxed{5} so \\boxed{72}" is graded whole, so the screen sees both.
    """
    if "\\boxed" not in answer and "\\fbox" not in answer:
        return answer
    box = _last_box(answer)
    if box is None:
        return None
    start, end, content = box
    rest = _canonical(answer[:start] + " " + answer[end:])
    return answer if _TAG.search(rest) or _values(_normalize(rest)) else content


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
        response = _as_text(response)
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
        return 1.0, _unbox(response[opened + len("<answer>") : end])


class QuestionOnlyReward(RewardFn):
    """The question_only contract: the answer is the last \\boxed{} (not inside another); format_reward 1 iff
    there is one.

    >>> question_only_reward_fn("Half of 48 is 24, so 48 + 24 = \\\\boxed{72}.", "72")["reward"]
    1.0
    """

    name = "question_only"

    def extract(self, response: str) -> tuple[float, str | None]:
        box = _last_outer_box(_as_text(response))
        if box is None:
            return 0.0, None
        answer = _unbox(box[2])  # "\\boxed{\\boxed{72}}" is 72; "\\boxed{41 or \\boxed{42}}" is hedged
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
        response = _as_text(response)
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
        return 1.0, _unbox(response[opened.end() : close.start()])


class FormatReward(RewardFn):
    """Another reward function's format_reward as the reward: a format bonus, with no grading."""

    def __init__(self, base: RewardFn):
        self.base, self.name = base, f"format/{base.name}"

    def extract(self, response: str) -> tuple[float, str | None]:
        return self.base.extract(response)[0], None

    def plan(self, responses, ground_truths):
        formats = []
        for response in responses:
            try:
                formats.append(float(self.base.extract(response)[0]))
            except Exception:
                formats.append(0.0)
        return [], lambda _: [{"reward": f, "format_reward": f, "answer_reward": 0.0} for f in formats]


class CombinedReward(RewardFn):
    """A weighted sum of reward functions; see `combine_rewards`."""

    def __init__(self, components: list[tuple[str, Callable, float]]):
        self.components = components
        self.name = "+".join(name for name, _, _ in components)

    def plan(self, responses, ground_truths):
        parts = []  # (name, weight, first pair index, pair count, finish) per component
        pairs: list[tuple[str, str]] = []
        for name, fn, weight in self.components:
            if isinstance(fn, RewardFn):
                sub_pairs, finish = fn.plan(responses, ground_truths)
            else:  # a user's plain callable: no batch support, called one by one
                done = [fn(r, g) for r, g in zip(responses, ground_truths)]
                sub_pairs, finish = [], lambda _, done=done: done
            parts.append((name, weight, len(pairs), len(sub_pairs), finish))
            pairs.extend(sub_pairs)

        # correctness comes from the first component that grades answers: a format bonus listed first
        # ({format: 0.2, r1_zero: 1.0}) has no answer, and would make every answer look wrong to RFT/MaxRL
        graders = [i for i, (_, fn, _) in enumerate(self.components) if not isinstance(fn, FormatReward)]
        grader = graders[0] if graders else 0

        def finish_all(verdicts: list[bool]) -> list[Scores]:
            results = [(name, w, finish(verdicts[i : i + n])) for name, w, i, n, finish in parts]
            out = []
            for k in range(len(responses)):
                first = results[0][2][k]
                row = {
                    "reward": sum(w * float(scores[k]["reward"]) for _, w, scores in results),
                    "format_reward": float(first["format_reward"]),
                    "answer_reward": float(results[grader][2][k]["answer_reward"]),
                }
                row.update({f"reward/{name}": float(scores[k]["reward"]) for name, _, scores in results})
                out.append(row)
            return out

        return pairs, finish_all


def combine_rewards(components: list[tuple[str, Callable, float]]) -> RewardFn:
    """A reward function that is the weighted sum of others (seed 002: correctness plus a format bonus).

    `reward` is sum(weight * component reward); `format_reward` comes from the first component and
    `answer_reward` (correctness) from the first one that is not a format bonus; `reward/<name>` is each
    component's unweighted reward.

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
    return CombinedReward(checked)


def format_reward_fn(base: RewardFn | str = "r1_zero") -> RewardFn:
    """A reward function whose reward is `base`'s format_reward (a format bonus for `combine_rewards`).

    >>> format_reward_fn("answer_tag")("<answer> 7 </answer>", "72")
    {'reward': 1.0, 'format_reward': 1.0, 'answer_reward': 0.0}
    """
    base = get_reward_fn(base) if isinstance(base, str) else base
    if not isinstance(base, RewardFn) or isinstance(base, (CombinedReward, FormatReward)):
        raise ValueError(f"format_reward_fn: base must be one of {sorted(REWARD_FNS)} or a RewardFn; got {base!r}")
    return FormatReward(base)


r1_zero_reward_fn = R1ZeroReward()
question_only_reward_fn = QuestionOnlyReward()
answer_tag_reward_fn = AnswerTagReward()

REWARD_FNS: dict[str, RewardFn] = {
    "r1_zero": r1_zero_reward_fn,
    "question_only": question_only_reward_fn,
    "answer_tag": answer_tag_reward_fn,
}


def get_reward_fn(name: str) -> RewardFn:
    """The built-in reward function of that name (a key of REWARD_FNS)."""
    try:
        return REWARD_FNS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown reward function {name!r}; valid: {', '.join(sorted(REWARD_FNS))}") from None


# ----------------------------------------------------------------------------------------------------
# Scoring a batch of rollouts.


def score_batch(
    reward_fn: Callable[[str, str], Scores], responses: Sequence[str], ground_truths: Sequence[str]
) -> tuple[list[Scores], dict]:
    """Score many responses at once: the same dicts as calling `reward_fn` one by one, but the slow-path
    gradings of a RewardFn run concurrently in the pool. A plain callable is called one by one.

    Metadata: "grading/<count>" for the counts of `grading_stats` in this batch, and "grading/seconds".

    >>> scores, meta = score_batch(r1_zero_reward_fn, [" </think> <answer> $72 </answer>", "72"], ["72", "72"])
    >>> [s["reward"] for s in scores], meta["grading/fast_path"], meta["grading/slow_path"]
    ([1.0, 0.0], 1, 0)
    """
    responses, ground_truths = list(responses), list(ground_truths)
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch: responses ({len(responses)}) and ground_truths ({len(ground_truths)}) differ in length"
        )
    responses = [_as_text(r) for r in responses]
    ground_truths = [_as_text(g) for g in ground_truths]
    if isinstance(reward_fn, RewardFn):
        pairs, finish = reward_fn.plan(responses, ground_truths)
        verdicts, counts = _grade_pairs(pairs)
        scores = finish(verdicts)
    else:
        start, before = time.perf_counter(), grading_stats()
        scores = [reward_fn(r, g) for r, g in zip(responses, ground_truths)]
        after = grading_stats()
        counts = {key: after[key] - before[key] for key in _STAT_KEYS}
        counts["seconds"] = time.perf_counter() - start
    return scores, {f"grading/{key}": value for key, value in counts.items()}


def compute_rollout_rewards(
    reward_fn: Callable[[str, str], Scores],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
):
    """Raw rewards of a rollout batch (seed 004 §4.2.3), and metadata to log.

    Returns `raw_rewards`, float32 of shape (rollout_batch_size,), and a dict with the mean of every score
    the reward function returns (`reward_mean`, `format_reward_mean`, `answer_reward_mean`, and
    `reward/<name>_mean` for combined rewards; 0.0 for an empty batch) plus the "grading/*" counts.

    >>> raw, meta = compute_rollout_rewards(r1_zero_reward_fn, [" </think> <answer> 3 </answer>", " 3"], ["3", "3"])
    >>> raw.tolist(), meta["reward_mean"], meta["format_reward_mean"]
    ([1.0, 0.0], 0.5, 0.5)
    """
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(
            f"compute_rollout_rewards: rollout_responses ({len(rollout_responses)}) and repeated_ground_truths "
            f"({len(repeated_ground_truths)}) must have the same length"
        )
    scores, grading = score_batch(reward_fn, rollout_responses, repeated_ground_truths)
    return rewards_and_metadata(scores, grading)


def rewards_and_metadata(scores: list[Scores], grading: dict) -> tuple:
    """The raw-reward tensor and the metadata of `compute_rollout_rewards`, from `score_batch`'s output."""
    import torch

    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    keys = list(dict.fromkeys(["reward", "format_reward", "answer_reward"] + [k for s in scores for k in s]))
    metadata: dict[str, float] = {}
    for key in keys:
        values = [float(s[key]) for s in scores if isinstance(s.get(key), (int, float))]
        metadata[f"{key}_mean"] = sum(values) / len(values) if values else 0.0
    metadata.update({key: float(value) for key, value in grading.items()})
    return raw_rewards, metadata

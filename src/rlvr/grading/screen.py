"""The screen: an answer the fast path declines must be one value (rules 3 to 7 of `rlvr.grading`). What
is not (a tag inside it, a restated computation that does not hold, two or more different values, one
value with a value-changing word beside it) scores 0 here and never reaches math-verify; one value is
graded alone, evaluated exactly by this module's arithmetic evaluator where it can be."""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr.grading.arithmetic import MIXED, evaluate, mixed_value, render, side_value
from rlvr.grading.extract import last_box
from rlvr.grading.normalize import (
    CJK_NUMERALS,
    CJK_SCALE,
    canonical,
    normalize_answer,
    plain_number,
)

# ----------------------------------------------------------------------------------------------------
# Screening: an answer must be one value. What is not is scored 0 here, and never reaches math-verify,
# which, given prose, searches it for a final answer ("41 or 42" would be 42).

_TAG = re.compile(r"<\s*/?\s*[A-Za-z][\w:-]*\s*/?\s*>")
# What math-verify misreads as a finite number: a command as an unbraced exponent ("\sqrt{1681}^\frac{84}{2}"
# is 42 to it; "42^\circ" is fine), and infinity ("\infty^2\pi" is 42 to it).
_ILL_FORMED = re.compile(r"[\^_]\s*\\(?!circ(?![A-Za-z])|prime(?![A-Za-z]))[A-Za-z]|\\infty(?![A-Za-z])|∞")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")  # "72\x00" is junk, not 72
_CJK_NEAR_DIGIT = re.compile(f"[0-9]\\s*[{CJK_NUMERALS}]|[{CJK_NUMERALS}]\\s*[0-9]")
_NAME = re.compile(r"[^\W\d]+(?:\s+[^\W\d]+)*")  # "x", "total", "the total cost": the left of "x = 42"
_PROSE_PREFIX = re.compile(r"(?:[^\W\d]+[\s:,]+)+(?=[0-9(\[{.+\-\\$])")  # "So, " in "So, 6 x 7 = 42"


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
   |(?P<mixed>{MIXED})
   |(?P<num>[1-9][0-9]{{0,2}}(?:,[0-9]{{3}})+(?:\.[0-9]+)?(?![0-9])
      |[1-9][0-9]{{0,2}}(?:\ [0-9]{{3}})+(?:\.[0-9]+)?(?![0-9/])
      |[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]{{1,3}})?|\.[0-9]+)
   |(?P<words>(?i:(?<![a-z]){_CARDINAL}(?:(?:\s+|\s*-\s*)(?:and\s+)?{_CARDINAL})*(?![a-z])))
   |(?P<cjk>[{CJK_NUMERALS}]+)
   |(?P<op>\*\*|[-+*/^%×÷·⋅∙]|\\(?:[dt]?frac|sqrt|times|cdot|div|binom)(?![A-Za-z]))
   |(?P<ignore>\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\displaystyle(?![A-Za-z])|\^\s*\{{?\s*\\circ\s*\}}?)
   |(?P<open>[({{\[])
   |(?P<close>[)}}\]])
   |(?P<word>[A-Za-z]+|\\[A-Za-z]+|(?![{CJK_NUMERALS}])[^\W\d_])  # one CJK character a word: 或one
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
        elif kind == "cjk" and current is not None and not expecting and CJK_SCALE.fullmatch(text):
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
        value = mixed_value(tokens[0][1])
        if value is None:  # "10 3/2": an integer and a fraction, not a mixed number
            return [("whole", tokens[0][1]), ("fraction", tokens[0][1])]
        return [value]
    if kinds == ["num"]:
        return [_plain_value(tokens[0][1])]
    text = " ".join(t[1] for t in tokens)
    value = evaluate(text)
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


def screen_answer(answer: str) -> str | None:
    """The answer to grade (perhaps rewritten as its one value), or None when it scores 0 unseen: a tag
    inside it, CJK numerals beside its digits, a restated computation that does not hold, two or more
    different values, or one value with a value-changing word beside it (see `rlvr.grading`)."""
    text = canonical(answer)
    plain = plain_number(text)
    if plain is not None and plain[1] is None:
        return render(plain[0])  # one number, one reading: its exact value is what math-verify should see
    if _TAG.search(text) or _CONTROL.search(text):
        return None
    s = normalize_answer(text)
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
            values = {side_value(side) for side in sides}
            if None in values or len(values) != 1:
                return None
            return render(values.pop())
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
    if plain_number(span) is not None:
        return span
    exact = evaluate(span)
    if exact is not None:
        # Exact, where math-verify misreads odd LaTeX: it reads "41^\frac{84}{2}" and "\frac{84}{2}%-41" as 42.
        return render(exact)
    # "%" starts a LaTeX comment: math-verify would read "\frac{84}{2}%\pi" as 42.
    return None if risky or "%" in span or span.count("(") != span.count(")") else span


# ----------------------------------------------------------------------------------------------------
# The answer block of a reward function (rule 7): its \boxed{} unwrapped when nothing else in it is a value.


def unbox(answer: str) -> str | None:
    """The answer block with its \\boxed{} unwrapped when present; None when the box is unbalanced.

    The box is unwrapped only when the rest of the block holds no value and no tag ("The answer is
    \\boxed{72}."): a block such as "\\boxed{5} so \\boxed{72}" is graded whole, so the screen sees both.
    """
    if "\\boxed" not in answer and "\\fbox" not in answer:
        return answer
    box = last_box(answer)
    if box is None:
        return None
    start, end, content = box
    rest = canonical(answer[:start] + " " + answer[end:])
    return answer if _TAG.search(rest) or _values(normalize_answer(rest)) else content


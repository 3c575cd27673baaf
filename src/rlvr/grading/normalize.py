"""Normalisation and the fast path: every way of writing a digit made ASCII, the LaTeX and markdown dress
around a would-be number stripped, and plain numbers ("$1,000", "72 apples", "50%", "3/4", "42万")
compared exactly as `fractions.Fraction` (rules 1 and 2 of `rlvr.grading`)."""

from __future__ import annotations

import re
import unicodedata
from fractions import Fraction

from rlvr.grading.extract import box_at

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


def canonical(text: str) -> str:
    """The text with ASCII digits for every Unicode way of writing one and no invisible characters.

    >>> canonical("\\uff14\\uff12\\u5143\\u3002"), canonical("\\u0664\\u0662"), canonical("10\\u00bd m\\u00b2")
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
CJK_SCALE = re.compile("[十百千万萬亿億]+")
CJK_NUMERALS = "零〇一二三四五六七八九十百千万萬亿億兆两兩半点點廿卅"
_CJK_NUMERAL = re.compile(f"[{CJK_NUMERALS}]")


def normalize_answer(text: str) -> str:
    """Strip the LaTeX and markdown dress around a would-be number: "$\\boxed{\\$1,000}$." -> "$1,000"."""
    s = text.translate(_UNICODE).replace("\\$", "$").replace("\\%", "%").replace("{,}", ",").replace("\\!", "")
    s = _INLINE_TEXT.sub(r" \1 ", _LATEX_SPACING.sub(" ", s))
    for _ in range(8):
        before = s
        s = s.strip().rstrip(_TRAILING_PUNCTUATION).strip()
        box = box_at(s, 0) if s.startswith(("\\boxed", "\\fbox")) else None
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


def plain_number(text: str) -> tuple[Fraction, Fraction | None] | None:
    """(value as written, value scaled by a trailing % or magnitude word or None), or None if not a plain number.

    >>> plain_number("$1,000.00 dollars"), plain_number("50%"), plain_number("1,00")
    ((Fraction(1000, 1), None), (Fraction(50, 1), Fraction(1, 2)), None)
    >>> plain_number("10 1/2"), plain_number("4.2 \\\\times 10^{1}"), plain_number("42万")
    ((Fraction(21, 2), None), (Fraction(42, 1), None), (Fraction(420000, 1), None))
    """
    if len(text) > _MAX_FAST_CHARS:
        return None
    s = normalize_answer(canonical(text))
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
    cjk = None if rest.isascii() else CJK_SCALE.match(rest)
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


def fast_grade(answer: str, ground_truth: str, golds: dict | None = None) -> bool | None:
    """True/False when both sides are plain numbers; None when math-verify must decide.

    A percentage or magnitude word in the answer may be read either way ("50%" is right for 50 and for
    0.5, "5 million" for 5 and for 5000000); one in the ground truth sends the pair to math-verify.
    `golds` caches the parsed ground truths of a batch, where each comes once per sample of its group.
    """
    if golds is None:
        gold = plain_number(ground_truth)
    else:
        if ground_truth not in golds:
            golds[ground_truth] = plain_number(ground_truth)
        gold = golds[ground_truth]
    if gold is None or gold[1] is not None:
        return None
    pred = plain_number(answer)
    if pred is None:
        return None
    return pred[0] == gold[0] or pred[1] == gold[0]


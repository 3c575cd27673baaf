"""The screen's exact arithmetic (rlvr.grading.screen): an answer that restates a computation ("6 x 7 = 42",
"\\frac{84}{2}", "3 1/2") is evaluated with Fractions, never with eval, so a restated computation that does
not hold scores 0 and one that does is graded as its value.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rlvr.grading.normalize import plain_number

_MAX_BITS = 20_000  # exact arithmetic on an answer stays far from the 4,300-digit int-to-str limit


_LATEX_MIXED = re.compile(r"([0-9]+)\s*\\[dt]?frac\s*\{\s*([0-9]+)\s*\}\s*\{\s*([0-9]+)\s*\}")


MIXED = r"[0-9]+\s+[0-9]+\s*/\s*[0-9]+(?![0-9.])|[0-9]+\s*\\[dt]?frac\s*\{\s*[0-9]+\s*\}\s*\{\s*[0-9]+\s*\}"


_ARITH_TOKEN = re.compile(
    rf"""\s*(?:
    (?P<mixed>{MIXED})
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


def mixed_value(text: str) -> Fraction | None:
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
            value = mixed_value(text)
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


def evaluate(text: str) -> Fraction | None:
    """The exact value of an arithmetic expression, or None if it is not one this module can evaluate.

    >>> evaluate("6 x 7"), evaluate("\\\\frac{84}{2}"), evaluate("(40 + 3) \\\\times 1"), evaluate("2^{10}")
    (Fraction(42, 1), Fraction(42, 1), Fraction(43, 1), Fraction(1024, 1))
    >>> evaluate("\\\\sqrt{4}"), evaluate("9^9^9"), evaluate("1/0")
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


def side_value(text: str) -> Fraction | None:
    """One side of a restated computation: an expression, or a number with its units ("$42", "42 apples")."""
    value = evaluate(text)
    if value is None:
        plain = plain_number(text)
        if plain is not None and plain[1] is None:  # "50%" or "5 million" could be either; no guessing
            value = plain[0]
    return value


def render(value: Fraction) -> str:
    """An exact value as the fast path and math-verify both read it: "42", "-3/4"."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"

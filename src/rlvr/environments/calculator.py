"""`env=gsm8k_calculator`: the calculator GSM8K was written with (Cobbe et al. 2021, the `<<48/2=24>>`
annotations in its solutions). The model writes `<<expr=`; the environment computes `expr` and writes
`result>>`, so the model's arithmetic is done by the tool and the model goes on from the right number.

The expression is evaluated by walking its syntax tree (numbers, + - * / // %, unary minus, parentheses, powers with a
small exponent): model text is never given to `eval`. A turn ends at every "="; one that is not an open
annotation (`12 = ` in prose, or `<<` already closed) gets no observation and the model simply goes on.
"""

from __future__ import annotations

import ast
import math
import operator
import re

from rlvr.environments.base import Environment, Observation, register_environment

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
MAX_LENGTH = 120  # characters of an expression: GSM8K's longest annotation has 52
MAX_MAGNITUDE = 1e15  # no result (or intermediate) beyond this: a 135M model's typo must not allocate gigabytes


class CalculatorError(ValueError):
    """An expression the calculator does not compute (it says why)."""


def evaluate(expression: str) -> float:
    """The value of an arithmetic expression such as `48/2`, `2*20*.01`, `(3+4)**2`; CalculatorError otherwise.

    >>> evaluate("48/2"), evaluate("2*20*.01"), evaluate("-(3 + 4) ** 2")
    (24.0, 0.4, -49.0)
    """
    text = expression.replace(",", "").replace("$", "").replace("^", "**").strip()
    if not text or len(text) > MAX_LENGTH:
        raise CalculatorError(f"expression of {len(text)} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise CalculatorError(f"not an arithmetic expression: {text!r}") from None
    return _value(tree.body)


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = float(node.value)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _value(node.operand) * (-1.0 if isinstance(node.op, ast.USub) else 1.0)
    elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise CalculatorError("division by zero")
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or (left == 0 and right < 0)):
            raise CalculatorError(f"power {right:g} out of range")
        try:
            value = _BINARY[type(node.op)](left, right)
        except (OverflowError, ZeroDivisionError) as err:
            raise CalculatorError(str(err)) from None
        if isinstance(value, complex):
            raise CalculatorError("a complex result")
    else:
        raise CalculatorError(f"{type(node).__name__} is not arithmetic")
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise CalculatorError("result out of range")
    return value


def format_result(value: float) -> str:
    """As GSM8K's annotations write results: whole numbers without a point, others to at most 4 decimals.

    >>> format_result(24.0), format_result(0.2), format_result(10 / 3)
    ('24', '0.2', '3.3333')
    """
    if value == int(value):
        return str(int(value))
    return f"{value:.4f}".rstrip("0").rstrip(".")


class CalculatorEnv(Environment):
    """The GSM8K calculator: `<<expr=` is answered with `result>>`."""

    stop = ("=",)
    max_turns = 32  # a turn ends at every "=", and a GSM8K solution has a few in prose besides its annotations
    tool_timeout_s = 5.0
    sft_annotations = True

    def step(self, text: str, ids: list[int]) -> Observation:
        start = text.rfind("<<")
        if start < 0 or ">>" in text[start:] or not text.endswith("="):
            return Observation()  # an "=" in prose: the model goes on
        try:
            return Observation(text=format_result(evaluate(text[start + 2 : -1])) + ">>", tool_calls=1)
        except CalculatorError:
            return Observation(tool_calls=1, tool_errors=1)  # the model writes the result itself

    def sft_segments(self, response: str) -> list[tuple[str, bool]]:
        """`<<48/2=24>>`: the model writes `<<48/2=`, the calculator `24>>` (not trained)."""
        pieces, start = [], 0
        for match in _ANNOTATION.finditer(response):
            pieces += [(response[start : match.start(1)], True), (response[match.start(1) : match.end()], False)]
            start = match.end()
        return [p for p in pieces + [(response[start:], True)] if p[0]]


_ANNOTATION = re.compile(r"<<[^<>=]*=([^<>]*)>>")  # the expression ends at its first "=", as a model turn does


register_environment("gsm8k_calculator", CalculatorEnv)

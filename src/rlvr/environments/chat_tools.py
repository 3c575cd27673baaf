"""rlvr's tools as chat tools (TRL's environment shape, rlvr.environments.tool_loop), so a task with a calculator or
a Python interpreter is a chat tool-use task: `env_class=calculator` offers `calculate(expression)`, the safe
evaluator of `env=gsm8k_calculator`; `env_class=python` offers `run_python(code)`, a program run in the sandbox
as `env=python_tool` runs its blocks. Their schemas are built from the signatures and docstrings below.
"""

from __future__ import annotations

from rlvr.environments.calculator import evaluate, format_result
from rlvr.environments.python_tool import run_python


class CalculatorTools:
    """A calculator the model calls as a tool."""

    def reset(self, **row) -> None:
        return None

    def calculate(self, expression: str) -> str:
        """Compute an arithmetic expression exactly, e.g. "48 / 2 + 48" or "(3 + 4) ** 2".

        Args:
            expression: numbers with + - * / // % ** and parentheses
        """
        return format_result(evaluate(expression))


class PythonTools:
    """A Python interpreter (the sandbox) the model calls as a tool."""

    runs_programs = True  # the run checks that the sandbox can isolate programs before it starts

    def reset(self, **row) -> None:
        return None

    def run_python(self, code: str) -> str:
        """Run a Python program and return what it printed (an exception's last line if it raised).

        Args:
            code: the program; print the values you need
        """
        return run_python(code)


CHAT_TOOLS = {"calculator": CalculatorTools, "python": PythonTools}

"""`env=python_tool`: tool-integrated reasoning. The model writes a fenced Python block; the block runs in the
sandbox (rlvr.sandbox: bubblewrap + seccomp, fails closed) and what it printed comes back as an observation:

    ```python                          <- the model
    print(48 / 2 + 48)
    ```
    ```output                          <- the environment
    72.0
    ```

as many times as the model asks (up to `max_turns` turns), then the model writes its answer. An exception is
returned as its last line (`ZeroDivisionError: division by zero`); a program that runs out of time or memory
gets one line saying so. The program runs with the sandbox's limits (`sandbox.*`), at most `sandbox.workers` at
once across every episode of a step (the sandbox's own process-wide bound).
"""

from __future__ import annotations

from rlvr import sandbox
from rlvr.environments.base import Environment, Observation, register_environment
from rlvr.grading.values import read_str
from rlvr.sandbox.records import Check, Job

OUTPUT_CHARS = 1000  # the tail of what a block printed that comes back (a loop that prints forever is cut)
OPEN, CLOSE = "```python\n", "\n```\n"
# runs the block as __main__, its prints captured; an exception ends the output with its last line
_WRAPPER = """import contextlib as _c, io as _io, traceback as _t
_out = _io.StringIO()
try:
    with _c.redirect_stdout(_out):
        exec(compile({code!r}, "<tool>", "exec"), {{"__name__": "__main__"}})
except BaseException as _e:
    _out.write("".join(_t.format_exception_only(type(_e), _e)))
OUTPUT = _out.getvalue()[-{chars}:]
"""


def run_python(code: str) -> str:
    """What `code` printed in the sandbox (its tail), or one line on why it stopped."""
    job = Job(_WRAPPER.format(code=code, chars=OUTPUT_CHARS), (Check("OUTPUT"),))
    result = sandbox.run_programs([job], workers=1)[0]  # the sandbox bounds the programs at once, process-wide
    if result.status == "ok" and result.values and result.values[0] is not None:
        # read as one string literal only: a program that swaps OUTPUT for a set of colliding ints must not get
        # the trainer to build it (rlvr.grading.values)
        text = read_str(result.values[0])
        return text if text is not None else result.values[0]
    return f"({result.status}: {result.error or 'no output'})"


class PythonToolEnv(Environment):
    """A fenced ```python block is run in the sandbox; its output comes back in a fenced ```output block."""

    stop = (CLOSE,)
    max_turns = 4
    runs_programs = True
    tool_timeout_s = 60.0  # the sandbox's own limits end a program first; this covers waiting for a slot

    def step(self, text: str, ids: list[int]) -> Observation:
        start = text.rfind(OPEN)
        if start < 0:
            return Observation()  # a fence that closes no Python block: the model goes on
        code = text[start + len(OPEN) : -len(CLOSE)]
        output = run_python(code)
        failed = output.startswith("(") and output.endswith(")") and ": " in output
        return Observation(text=f"```output\n{output.rstrip()}\n```\n", tool_calls=1, tool_errors=int(failed))


register_environment("python_tool", PythonToolEnv)

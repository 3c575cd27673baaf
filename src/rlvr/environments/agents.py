"""A user's agent: an async function that runs one episode against an OpenAI-compatible endpoint, named in
`agent=` like environments and reward functions (`path/to/agent.py:run_episode`, `package.module:fn`) or handed to
`rlvr.train(agent=fn)` (registered here by its name):

    async def run_episode(client, row, sampling):
        reply = await client.chat.completions.create(
            messages=row["prompt"], **sampling)               # model, temperature, max_tokens, seed (and stop)
        return 1.0 if row["answer"] in reply.choices[0].message.content else 0.0

`client` is an `openai.AsyncOpenAI` whose base URL attributes every call to this episode; `row` every column of
the dataset row, with `prompt` the task's prompt as chat messages; `sampling` the keyword arguments of a call at
the run's settings. It returns the episode's reward (a number, or a dict like a reward function's), or None: the
run's `rewards=` then score the episode (rlvr.stages.agents runs it, bounded, and records every call).
"""

from __future__ import annotations

import inspect
from typing import Callable

from rlvr.core.imports import import_target

# agents handed over in Python (rlvr.train(agent=fn)), by key "python:<name>"
AGENTS: dict[str, Callable] = {}
PYTHON = "python:"
PARAMETERS = ("client", "row", "sampling")


def register_agent(fn: Callable) -> str:
    """Make `fn` available as `agent=<key>` in this process; returns the key, python:<name>."""
    name = getattr(fn, "__name__", None) or type(fn).__name__
    key = f"{PYTHON}{name}"
    check_agent(fn, key)
    AGENTS[key] = fn
    return key


def load_agent(name: str) -> Callable:
    """The function `agent=name` names (registered, `file.py:fn` or `package.module:fn`), checked."""
    if name in AGENTS:
        return AGENTS[name]
    if name.startswith(PYTHON):
        raise ValueError(f"agent={name!r} was handed over in Python (rlvr.train(agent=...)) and lives in that "
                         "process only: hand it over again, or put it in a file (agent=path/to/agent.py:fn)")
    if ":" not in name:
        raise ValueError(f"agent={name!r}: expected path/to/agent.py:function or package.module:function")
    fn = import_target(name, field="agent")
    check_agent(fn, name)
    return fn


def check_agent(fn, name: str) -> None:
    """An agent is an `async def` taking (client, row, sampling); a clear ValueError otherwise."""
    if not callable(fn):
        raise ValueError(f"agent={name!r} is a {type(fn).__name__}, not a function")
    if not (inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))):
        raise ValueError(f"agent={name!r} is not an async function: write it as `async def {getattr(fn, '__name__', 'fn')}"
                         "(client, row, sampling)` (its calls to the policy are awaited, so that the episodes of a "
                         "batch run side by side)")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise ValueError(f"agent={name!r}: its signature cannot be read") from None
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    takes_rest = any(p.kind == p.VAR_POSITIONAL for p in params.values())
    if len(required) > 3 or (len(positional) < 3 and not takes_rest):
        shown = ", ".join(params)
        raise ValueError(f"agent={name!r} takes ({shown}); an agent takes (client, row, sampling)")

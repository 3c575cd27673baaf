"""Multi-turn environments: the policy writes a turn, the environment answers, until the episode ends.

    base        the interface a user implements (Environment, Observation) and the table of names
    __init__    environment_factory: `env=` a name, `module:Class` or `file.py:Class`
    calculator  the GSM8K paper's calculator: `<<expr=` is answered with `result>>` (a safe evaluator)
    python_tool a fenced Python block is run in the sandbox and what it printed comes back
    code_feedback  the code task with retries: a failing program's first failing test comes back
    agents      a user's agent (`agent=`): an async function given an OpenAI client, the row and the sampling
    tool_loop   TRL's environment shape (`env_class=`): reset(**row), tools with schemas from hints, the tool loop
    chat_tools  rlvr's calculator and Python tool as chat tools (`env_class=calculator`, `env_class=python`)
    verifiers_env  verifiers' v1 tasksets (`env_class=verifiers:<id>`, the verifiers extra)

The episodes themselves (batched decoding, the token ids the learner trains on) are rlvr.stages.episodes, and
rlvr.stages.agents for agents and env_class= (through rlvr's server).

May import: rlvr.core, rlvr.sandbox, rlvr.grading, rlvr.tasks.
"""

import difflib
import math
import typing

from rlvr.core.imports import import_target
from rlvr.environments import calculator, code_feedback, python_tool  # noqa: F401  (register the built-ins)
from rlvr.environments.base import ENVIRONMENTS, Environment, Observation, register_environment

__all__ = ["ENVIRONMENTS", "Environment", "Observation", "environment_factory", "register_environment"]


def environment_factory(name: str) -> type[Environment]:
    """The environment class `env=name` selects: a built-in or registered name, or `module:Class` /
    `file.py:Class`, optionally followed by `:key=value,...` that sets its numbers (`max_turns`,
    `max_total_tokens`, `max_turn_tokens`, `tool_timeout_s`, a subclass's own such as `attempt_discount`):
    `code_feedback:max_turns=3,max_turn_tokens=160`. An unknown name or option fails naming the valid ones."""
    head, sep, tail = name.rpartition(":")
    if sep and "=" in tail:
        return _with_options(environment_factory(head), tail, name)
    if name in ENVIRONMENTS:
        return ENVIRONMENTS[name]
    if ":" in name:
        target = import_target(name, field="env")
        if not (isinstance(target, type) and issubclass(target, Environment)):
            raise ValueError(f"env={name!r} names {target!r}, not a subclass of rlvr.environments.Environment")
        return target
    close = difflib.get_close_matches(name, list(ENVIRONMENTS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown env {name!r}; {hint}valid: {', '.join(ENVIRONMENTS)}, or module:Class / file.py:Class")


def _with_options(cls: type[Environment], options: str, name: str) -> type[Environment]:
    """A subclass of `cls` whose numeric class attributes are set from "key=value,...". Only numbers can be set
    (flags such as `runs_programs`, which decides whether the run checks its sandbox, cannot)."""
    settable = sorted(k for k in dir(cls) if not k.startswith("_") and _number_or_none(getattr(cls, k)))
    values = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, eq, raw = (x.strip() for x in item.partition("="))
        if not eq or key not in settable:
            raise ValueError(f"env={name!r}: {item!r} is not key=value with a key of {cls.__name__}'s: "
                             f"{', '.join(settable)}")
        default, whole = getattr(cls, key), _whole_number_option(cls, key)
        if raw.lower() in ("none", "null"):
            if default is not None and key not in ("max_total_tokens", "max_turn_tokens"):
                raise ValueError(f"env={name!r}: {key} needs a number")
            value = None
        else:
            try:
                number = float(raw)
            except ValueError:
                raise ValueError(f"env={name!r}: {key}={raw!r} is not a number") from None
            # a whole-number option given 150.5 would pass the config and crash the engine: refused here
            if not math.isfinite(number) or number <= 0 or (whole and not raw.lstrip("+").isdigit()):
                raise ValueError(f"env={name!r}: {key}={raw!r}: expected a positive "
                                 f"{'whole number' if whole else 'number'}")
            value = int(raw) if whole else number
        values[key] = value
    return type(cls.__name__, (cls,), {**values, "__module__": cls.__module__, "__doc__": cls.__doc__,
                                       "__qualname__": cls.__qualname__})


def _whole_number_option(cls: type[Environment], key: str) -> bool:
    """Whether an option takes whole numbers only: its annotation says int (`max_total_tokens: int | None`),
    or, without one that resolves, its default is an int."""
    try:
        hint = typing.get_type_hints(cls).get(key)
    except Exception:  # a user's annotation that does not resolve: the default decides
        hint = None
    if hint is not None:
        kinds = set(typing.get_args(hint)) or {hint}
        return int in kinds and float not in kinds
    return isinstance(getattr(cls, key), int)


def _number_or_none(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))

"""Multi-turn environments: the policy writes a turn, the environment answers, until the episode ends.

    base        the interface a user implements (Environment, Observation) and the table of names
    __init__    environment_factory: `env=` a name, `module:Class` or `file.py:Class`
    calculator  the GSM8K paper's calculator: `<<expr=` is answered with `result>>` (a safe evaluator)
    python_tool a fenced Python block is run in the sandbox and what it printed comes back
    code_feedback  the code task with retries: a failing program's first failing test comes back

The episodes themselves (batched decoding, the token ids the learner trains on) are rlvr.stages.episodes.

May import: rlvr.core, rlvr.sandbox, rlvr.grading, rlvr.tasks.
"""

import difflib

from rlvr.core.imports import import_target
from rlvr.environments import calculator, code_feedback, python_tool  # noqa: F401  (register the built-ins)
from rlvr.environments.base import ENVIRONMENTS, Environment, Observation, register_environment

__all__ = ["ENVIRONMENTS", "Environment", "Observation", "environment_factory", "register_environment"]


def environment_factory(name: str) -> type[Environment]:
    """The environment class `env=name` selects: a built-in or registered name, or `module:Class` /
    `file.py:Class`. An unknown name fails naming the valid ones."""
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

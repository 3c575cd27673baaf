"""A program's values as the trainer reads them: only what a tool shows the model, never built otherwise.

The judge (`rlvr.sandbox.inside`) decides every test itself, on values it rebuilt as their standard types; the
trainer reads outcomes, not values. What does come back is a "value" check's wire text (`ProgramResult.values`),
read here only as one string (env=python_tool's output): one JSON string literal, read in linear time, so a
program that swaps its output for a set of colliding hashes cannot make the trainer build it.
"""

from __future__ import annotations

import json

MAX_CHARS = 1_000_000


def read_str(text: str) -> str | None:
    """The str a "value" check sent back as `text`, or None when it is not one string."""
    if not isinstance(text, str) or len(text) > MAX_CHARS or text[:1] != '"':
        return None
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return value if type(value) is str else None

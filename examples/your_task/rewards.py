"""The rewards of the largest-number task, one in each signature rlvr takes (docs/your_task.md)."""

import re


def _first_number(text: str) -> int | None:
    found = re.search(r"-?\d+", text)
    return int(found.group()) if found else None


def largest(completions, numbers, **kwargs):
    """TRL's signature: 1 when the first number the model writes is the row's largest, else 0."""
    return [1.0 if _first_number(c) == max(n) else 0.0 for c, n in zip(completions, numbers)]


def brief(response, ground_truth, **row):
    """rlvr's signature: 1 for an answer of at most five words (the prompt asks for the number only)."""
    return 1.0 if 0 < len(response.split()) <= 5 else 0.0

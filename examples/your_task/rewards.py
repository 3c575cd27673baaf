"""The rewards of the sorting task, one in each signature rlvr takes (docs/your_task.md)."""

import re


def _numbers(text: str) -> list[int]:
    # the answer is the first line the model writes; any number-like tokens on it, in order
    first = text.strip().splitlines()[0] if text.strip() else ""
    return [int(x) for x in re.findall(r"-?\d+", first)]


def sorted_list(completions, numbers, **kwargs):
    """TRL's signature: 1 when the first line is the row's numbers in ascending order, else 0."""
    return [1.0 if _numbers(c) == sorted(n) else 0.0 for c, n in zip(completions, numbers)]


def same_numbers(response, ground_truth, numbers, **row):
    """rlvr's signature: 1 when the first line holds exactly the row's numbers, in any order (a format term)."""
    return 1.0 if sorted(_numbers(response)) == sorted(numbers) else 0.0

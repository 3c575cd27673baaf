"""A rollout batch's rewards as tensors and logged means: `compute_rollout_rewards` (seed 004's interface) and
`rewards_and_metadata` (what the training loops log). This module imports torch; rlvr.tasks.rewards does not.
"""

from __future__ import annotations

import math
from typing import Callable

from rlvr.tasks.rewards import Scores, score_batch


def compute_rollout_rewards(
    reward_fn: Callable[[str, str], Scores],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
):
    """Raw rewards of a rollout batch (seed 004 §4.2.3), and metadata to log.

    Returns `raw_rewards`, float32 of shape (rollout_batch_size,), and a dict with the mean of every score
    the reward function returns (`reward_mean`, `format_reward_mean`, `answer_reward_mean`, and
    `reward/<name>_mean` for combined rewards; 0.0 for an empty batch) plus the "grading/*" counts.

    >>> raw, meta = compute_rollout_rewards(r1_zero_reward_fn, [" </think> <answer> 3 </answer>", " 3"], ["3", "3"])
    >>> raw.tolist(), meta["reward_mean"], meta["format_reward_mean"]
    ([1.0, 0.0], 0.5, 0.5)
    """
    if len(rollout_responses) != len(repeated_ground_truths):
        raise ValueError(
            f"compute_rollout_rewards: rollout_responses ({len(rollout_responses)}) and repeated_ground_truths "
            f"({len(repeated_ground_truths)}) must have the same length"
        )
    scores, grading = score_batch(reward_fn, rollout_responses, repeated_ground_truths)
    return rewards_and_metadata(scores, grading)


def rewards_and_metadata(scores: list[Scores], grading: dict) -> tuple:
    """The raw-reward tensor and the metadata of `compute_rollout_rewards`, from `score_batch`'s output. A row
    no reward function applied to has reward NaN; means skip NaN, and a signal no row has (the format of a
    user's functions that say nothing of it) is left out of the metadata."""
    import torch

    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    keys = list(dict.fromkeys(["reward", "format_reward", "answer_reward"]
                              + [k for s in scores for k in s if not k.startswith("log/")]))
    metadata: dict[str, float] = {}
    for key in keys:
        values = [float(s[key]) for s in scores
                  if isinstance(s.get(key), (int, float)) and math.isfinite(float(s[key]))]
        if not values and key != "reward":
            continue
        mean = sum(values) / len(values) if values else 0.0
        metadata[f"{key}_mean"] = mean
        if key.startswith("reward/"):  # each term's spread too, as TRL logs rewards/<fn>/std (over rows it applies
            # to, with n - 1 as torch.std does)
            metadata[f"{key}_std"] = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5 \
                if len(values) > 1 else 0.0
    metadata.update({key: float(value) for key, value in grading.items()})
    return raw_rewards, metadata


def binary_rate(values) -> float | None:
    """The mean of a 0/1 signal (its NaN rows left out), or None when it is not one: a rate (format rate,
    answer rate, pass@k) of real-valued rewards would mean nothing."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not finite or any(v not in (0.0, 1.0) for v in finite):
        return None
    return sum(finite) / len(finite)


def soft_overlong_penalty(length: int, max_new_tokens: int, buffer: int) -> float:
    """DAPO's soft overlong punishment of a response of `length` tokens (DAPO, eq. 13; TRL's
    get_soft_overlong_punishment, verl's overlong_buffer): 0 up to max_new_tokens - buffer tokens, then falling
    linearly to -1 at max_new_tokens, -1 beyond it. The reward term `overlong` adds weight x this.

    >>> [soft_overlong_penalty(n, 100, 20) for n in (80, 90, 100)]
    [0.0, -0.5, -1.0]
    """
    if not 0 < buffer <= max_new_tokens:
        raise ValueError(f"overlong buffer must be in [1, max_new_tokens={max_new_tokens}]; got {buffer}")
    expected = max_new_tokens - buffer
    if length <= expected:
        return 0.0
    return (expected - length) / buffer if length <= max_new_tokens else -1.0


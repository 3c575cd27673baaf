"""A rollout batch's rewards as tensors and logged means: `compute_rollout_rewards` (seed 004's interface) and
`rewards_and_metadata` (what the training loops log). This module imports torch; rlvr.tasks.rewards does not.
"""

from __future__ import annotations

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
    """The raw-reward tensor and the metadata of `compute_rollout_rewards`, from `score_batch`'s output."""
    import torch

    raw_rewards = torch.tensor([float(s["reward"]) for s in scores], dtype=torch.float32)
    keys = list(dict.fromkeys(["reward", "format_reward", "answer_reward"] + [k for s in scores for k in s]))
    metadata: dict[str, float] = {}
    for key in keys:
        values = [float(s[key]) for s in scores if isinstance(s.get(key), (int, float))]
        metadata[f"{key}_mean"] = sum(values) / len(values) if values else 0.0
    metadata.update({key: float(value) for key, value in grading.items()})
    return raw_rewards, metadata

"""Seed 004's `grpo_train_step`: the assignment's interface (prompts and response texts in; rewards,
advantages, tokens and one update out), built on `policy_gradient_update`. The training loop computes
rewards and advantages once per rollout batch and trains on the sampled ids instead (rlvr.stages).
"""

from __future__ import annotations

import math

import torch

from rlvr.algorithms.policy import tokenize_prompt_and_output
from rlvr.algorithms.spec import EstimatorSpec, compute_advantages
from rlvr.algorithms.update import TrainBatch, policy_gradient_update, score_log_probs
from rlvr.tasks.rewards import score_batch
from rlvr.tasks.scoring import rewards_and_metadata


def grpo_train_step(
    model,
    tokenizer,
    optimizer,
    gradient_accumulation_steps: int,
    max_grad_norm: float | None,
    reward_fn,
    repeated_prompts: list[str],
    rollout_responses: list[str],
    repeated_ground_truths: list[str],
    group_size: int,
    baseline: str = "mean",
    advantage_eps: float = 1e-6,
    advantage_normalizer: str = "std",
    importance_reweighting_method: str = "none",
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    loss_normalization: str = "sequence",
    normalization_constant: float | None = None,
    temperature: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Seed 004's GRPO train step: rewards -> group-normalised advantages -> one optimizer step.

    old_log_probs, when given, is aligned with `tokenize_prompt_and_output(repeated_prompts,
    rollout_responses)` of the whole batch: one row per rollout, the batch's padded width, scored at
    `temperature` (the rollouts' sampling temperature). Returns the batch loss (sum of the backpropagated
    microbatch losses) and metadata: grad norm (before clipping), the token entropy of the whole batch
    (the rollouts pruning skipped are scored for it without gradient), train rewards (total, format,
    answer), clip fraction for the clipping methods.
    """
    n = len(rollout_responses)
    if not (len(repeated_prompts) == n == len(repeated_ground_truths)):
        raise ValueError(f"repeated_prompts ({len(repeated_prompts)}), rollout_responses ({n}) and "
                         f"repeated_ground_truths ({len(repeated_ground_truths)}) must have the same length")
    if loss_normalization == "constant" and not normalization_constant:
        raise ValueError("loss_normalization='constant' needs normalization_constant")
    spec = EstimatorSpec(baseline, advantage_normalizer, importance_reweighting_method, loss_normalization,
                         cliprange=cliprange, advantage_eps=advantage_eps,
                         normalization_constant=normalization_constant).validate(seed_call=True)
    scores, grading = score_batch(reward_fn, rollout_responses, repeated_ground_truths)
    raw_rewards, reward_meta = rewards_and_metadata(scores, grading)
    advantages, adv_meta = compute_advantages(raw_rewards, group_size, spec)
    tokens = tokenize_prompt_and_output(repeated_prompts, rollout_responses, tokenizer)
    if old_log_probs is not None and old_log_probs.shape != tokens["labels"].shape:
        raise ValueError(f"old_log_probs has shape {tuple(old_log_probs.shape)}; the tokenized batch has "
                         f"{tuple(tokens['labels'].shape)} (one row per rollout, the batch's padded width)")
    batch = TrainBatch(tokens["input_ids"], tokens["labels"], tokens["response_mask"], advantages, old_log_probs)
    skipped = [i for i in range(n) if advantages[i] == 0 and bool(batch.response_mask[i].any())]
    skipped_entropy = 0.0
    if skipped:  # the entropy of the whole batch, not of the rollouts that happened to have signal
        _, entropy = score_log_probs(model, batch.input_ids, batch.labels, batch.response_mask,
                                     math.ceil(n / gradient_accumulation_steps), rows=skipped,
                                     temperature=temperature, return_token_entropy=True)
        skipped_entropy = float((entropy * batch.response_mask).sum())
    loss, meta = policy_gradient_update(model, optimizer, batch, spec, gradient_accumulation_steps, max_grad_norm,
                                        temperature=temperature)
    meta.update({
        "token_entropy": (meta["trained_token_entropy_sum"] + skipped_entropy) / max(int(batch.response_mask.sum()), 1),
        "loss": float(loss),
        "train_reward": reward_meta["reward_mean"],
        "train_format_reward": reward_meta["format_reward_mean"],
        "train_answer_reward": reward_meta["answer_reward_mean"],
        **{f"advantages/{k}": float(v) for k, v in adv_meta.items()},
    })
    return loss, meta

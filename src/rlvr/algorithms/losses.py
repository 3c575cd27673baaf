"""The GRPO family's losses as pure tensor functions (seed 004, sections 4.2-6): the per-token policy-gradient
loss with its importance weighting (eqs. 32, 50-57, GSPO, CISPO), the rollout-vs-trainer correction, the
aggregation over tokens and sequences (eqs. 33-35), and DPO's loss. The same rules as rlvr.algorithms.estimators:
tensors and plain scalars in, tensors out, no `.item()` in the math.
"""

from __future__ import annotations

import torch

from rlvr.algorithms.estimators import (
    IMPORTANCE_METHODS,
    LOSS_NORMALIZATIONS,
    ROLLOUT_CORRECTIONS,
    ImportanceMethod,
    LossNormalization,
    RolloutCorrection,
    check_choice,
    check_finite,
    check_shape,
    masked_mean,
    per_rollout_column,
)


def compute_policy_gradient_loss(
    raw_rewards_or_advantages: torch.Tensor,
    policy_log_probs: torch.Tensor,
    importance_reweighting_method: ImportanceMethod = "none",
    old_log_probs: torch.Tensor | None = None,
    cliprange: float | None = None,
    response_mask: torch.Tensor | None = None,
    cliprange_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token loss (B, T) whose gradient, once aggregated, is minus the policy-gradient estimator.

    raw_rewards_or_advantages: (B,) or (B, 1), one scalar A per rollout, or (B, T), one per token
    (on-policy distillation's `distill_advantages`; not with gspo, whose ratio is per sequence).
    policy_log_probs, old_log_probs, response_mask: (B, T). Returns the NEGATIVE objective, so gradient
    descent ascends it. With w_t = pi_theta / pi_old at each token (eps = cliprange, eps_high =
    cliprange_high or cliprange):

        "none"    -A log pi                                   eq. 14, 20, 25, 28/32, 33, 34, 37, 43 (on-policy)
        "noclip"  -A w_t                                      eq. 56 (token-level reweighting, 48)
        "grpo"    -min(A w_t, A clip(w_t, 1-eps, 1+eps_high)) eq. 57-60 (the PPO clip GRPO uses; DAPO's clip-higher
        or "clip"                                             when eps_high > eps). "grpo" is seed 004's name,
                                                              "clip" rlvr's: the same method.
        "gspo"    -min(A s, A clip(s, 1-eps, 1+eps_high))     eq. 62-65, s = exp(mean_t log w_t) over the
                  response tokens (a geometric mean, in log space). The sequence's value is repeated at
                  every position of its row; masking happens in aggregation, so per-sequence averaging
                  gives eq. 62 exactly.
        "cispo"   -sg[min(w_t, 1+eps_high)] A log pi          eq. 61: the capped weight is not differentiated,
                  so upweighted tokens still get gradient (unlike the PPO clip).

    Metadata (tensors) for the weighted methods: the ratio's mean/min/max over response tokens and the
    clip fraction -- the share of response tokens whose clipped branch is active. For gspo all four are over
    the sequences that have a response token (their count is `sequences`), since its ratio is per sequence.
    """
    check_choice("importance_reweighting_method", importance_reweighting_method, IMPORTANCE_METHODS)
    if policy_log_probs.dim() != 2:
        raise ValueError(f"policy_log_probs must have shape (B, T); got {tuple(policy_log_probs.shape)}")
    batch = policy_log_probs.shape[0]
    advantages = per_rollout_column(raw_rewards_or_advantages, batch, policy_log_probs.shape[1]).to(
        policy_log_probs.dtype)
    if response_mask is not None:
        check_shape("response_mask", response_mask, policy_log_probs.shape, "policy_log_probs")
        response_mask = response_mask.bool()
    check_finite("raw_rewards_or_advantages", advantages)
    check_finite("policy_log_probs", policy_log_probs, response_mask)

    if importance_reweighting_method == "none":
        return -advantages * policy_log_probs, {}

    if old_log_probs is None:
        raise ValueError(f"importance_reweighting_method={importance_reweighting_method!r} needs old_log_probs")
    check_shape("old_log_probs", old_log_probs, policy_log_probs.shape, "policy_log_probs")
    check_finite("old_log_probs", old_log_probs, response_mask)
    needs_clip = importance_reweighting_method in ("clip", "grpo", "gspo", "cispo")
    if needs_clip and cliprange is None and not (importance_reweighting_method == "cispo" and cliprange_high):
        raise ValueError(f"importance_reweighting_method={importance_reweighting_method!r} needs cliprange")
    for name, value in (("cliprange", cliprange), ("cliprange_high", cliprange_high)):
        if value is not None and value < 0:
            raise ValueError(f"{name} must be >= 0; got {value}")
    low = 1.0 - cliprange if cliprange is not None else None
    high = 1.0 + (cliprange_high if cliprange_high is not None else cliprange) if needs_clip else None

    mask = response_mask if response_mask is not None else torch.ones_like(policy_log_probs, dtype=torch.bool)
    log_ratio = policy_log_probs - old_log_probs.to(policy_log_probs.dtype)

    if importance_reweighting_method == "gspo" and advantages.shape[1] != 1:
        raise ValueError("gspo weights whole sequences: it needs one advantage per rollout, not per token")
    if importance_reweighting_method == "gspo":
        # an empty response has no tokens to average: its log-ratio is taken as 0 (ratio 1) instead of 0/0,
        # and it is left out of the statistics, which are over sequences
        tokens = mask.sum(dim=-1)
        summed = torch.where(mask, log_ratio, torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)).sum(-1)
        seq_ratio = torch.exp(summed / tokens.clamp(min=1)).unsqueeze(-1)  # (B, 1)
        unclipped = advantages * seq_ratio
        clipped = advantages * seq_ratio.clamp(low, high)
        seq_loss = -torch.minimum(unclipped, clipped)
        rows = tokens > 0
        ratios = seq_ratio.detach().squeeze(-1)[rows]
        metadata = {
            "clip_fraction": (clipped < unclipped).squeeze(-1)[rows].float().mean() if rows.any() else torch.zeros(()),
            "ratio_mean": ratios.mean() if rows.any() else torch.ones(()),
            "ratio_min": ratios.min() if rows.any() else torch.ones(()),
            "ratio_max": ratios.max() if rows.any() else torch.ones(()),
            "sequences": rows.sum(),
        }
        return seq_loss.expand_as(policy_log_probs), metadata

    ratio = torch.exp(log_ratio)
    metadata = {
        "ratio_mean": masked_mean(ratio.detach(), mask),
        "ratio_min": ratio.detach()[mask].min() if mask.any() else torch.ones(()),
        "ratio_max": ratio.detach()[mask].max() if mask.any() else torch.ones(()),
    }
    if importance_reweighting_method == "noclip":
        return -advantages * ratio, metadata
    if importance_reweighting_method == "cispo":
        weight = ratio.clamp(max=high).detach()
        metadata["clip_fraction"] = masked_mean((ratio > high).float(), mask)
        return -weight * advantages * policy_log_probs, metadata
    # what is left is "grpo" / "clip", the PPO clip (eq. 57-60)
    unclipped = advantages * ratio
    clipped = advantages * ratio.clamp(low, high)
    metadata["clip_fraction"] = masked_mean((clipped < unclipped).float(), mask)
    return -torch.minimum(unclipped, clipped), metadata


def dpo_loss(policy_chosen_log_probs: torch.Tensor, policy_rejected_log_probs: torch.Tensor,
             reference_chosen_log_probs: torch.Tensor, reference_rejected_log_probs: torch.Tensor,
             beta: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """DPO (seed 004's optional part; Rafailov et al. 2023), per pair (P,): from each response's summed
    log-prob under the policy and the frozen reference,

        r_c = beta (log pi(y_c) - log pi_ref(y_c)),  r_r = beta (log pi(y_r) - log pi_ref(y_r))
        loss = -log sigmoid(r_c - r_r)

    r_c and r_r are the implicit rewards; d loss / d log pi(y_c) = -beta sigmoid(r_r - r_c) = -d loss / d log pi(y_r).
    Returns the per-pair loss (P,) and metadata: the rewards' means, the margin r_c - r_r and the
    accuracy (share of pairs with r_c > r_r).

    >>> z = torch.zeros(1); loss, meta = dpo_loss(z, z, z, z, beta=0.1)
    >>> round(float(loss[0]), 4), float(meta["accuracy"])  # log 2 when the policy is the reference
    (0.6931, 0.0)
    """
    if beta <= 0:
        raise ValueError(f"DPO needs beta > 0; got {beta}")
    chosen = beta * (policy_chosen_log_probs - reference_chosen_log_probs.detach())
    rejected = beta * (policy_rejected_log_probs - reference_rejected_log_probs.detach())
    margin = chosen - rejected
    loss = -torch.nn.functional.logsigmoid(margin)
    meta = {"rewards_chosen": chosen.detach().mean(), "rewards_rejected": rejected.detach().mean(),
            "margin": margin.detach().mean(), "accuracy": (margin.detach() > 0).float().mean()}
    return loss, meta


def rollout_correction_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    mode: RolloutCorrection,
    cap: float = 2.0,
    band: tuple[float, float] = (0.5, 2.0),
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Weights (B, T), detached, for the gap between the sampler and the trainer's old policy.

    The engine samples with its own numerics (a bf16 copy, other kernels) and, in asynchronous RL, from older
    weights, so a rollout comes from mu, not from pi_old, the policy the importance weight w_t of eq. 48 and
    the clip of eq. 57-60 are centred on (seed 004 assumes they are one policy). Per token,
    rho_t = pi_old(o_t) / mu(o_t) = exp(old - rollout); per sequence, rho = prod_t rho_t over its response. The weight multiplies each token's policy-gradient loss:

        token_tis       min(rho_t, cap)                  truncated importance sampling, per token
        sequence_tis    min(rho, cap)                    the same on the sequence's ratio
        token_mask      rho_t if low <= rho_t <= high else 0         masked IS (IcePop), per token
        sequence_mask   rho   if low <= rho   <= high else 0         the same per sequence
        none            1

    A NaN in `rollout_log_probs` marks a token whose sampling log-prob is unknown: rho_t = 1 there.
    Metadata, sums over the response tokens (tensors, so the caller decides when to synchronise): `tokens`,
    `known_tokens`, `mismatch_k3` (the k3 estimate of KL(mu || pi_old) on samples of mu, rho_t - 1 - log rho_t),
    `max_abs_log_ratio`, `outside_band` (tokens whose rho_t leaves the band), `weight_sum`, `weight_max`,
    `capped` and `masked` (tokens whose weight the cap lowered or the band zeroed).
    """
    check_choice("mode", mode, ROLLOUT_CORRECTIONS)
    low, high = band
    if not (0 < low <= 1 <= high) or cap < 1:
        raise ValueError(f"rollout correction needs 0 < low <= 1 <= high and cap >= 1; got band {band}, cap {cap}")
    mask = response_mask.bool()
    check_shape("rollout_log_probs", rollout_log_probs, old_log_probs.shape, "old_log_probs")
    check_shape("response_mask", mask, old_log_probs.shape, "old_log_probs")
    known = mask & ~torch.isnan(rollout_log_probs)
    log_ratio = torch.where(known, old_log_probs.detach() - rollout_log_probs, torch.zeros_like(old_log_probs))
    rho = torch.exp(log_ratio)
    if mode.startswith("sequence"):
        per_row = torch.exp(log_ratio.sum(dim=-1, keepdim=True))
        rho_w = per_row.expand_as(rho)
    else:
        rho_w = rho
    if mode.endswith("tis"):
        weight = rho_w.clamp(max=cap)
        capped, masked = rho_w > cap, torch.zeros_like(mask)
    elif mode.endswith("mask"):
        masked = (rho_w < low) | (rho_w > high)
        weight = torch.where(masked, torch.zeros_like(rho_w), rho_w)
        capped = torch.zeros_like(mask)
    else:
        weight, capped, masked = torch.ones_like(rho), torch.zeros_like(mask), torch.zeros_like(mask)
    weight = weight.masked_fill(~mask, 0.0).detach()
    k3 = (rho - 1 - log_ratio).masked_fill(~known, 0.0)
    # log_ratio is 0 where unknown and the weight 0 off the mask (and >= 0): whole-tensor sums and maxima are the
    # masked ones, with no boolean indexing or `.any()` that would synchronise with the device
    meta = {
        "tokens": mask.sum(), "known_tokens": known.sum(), "mismatch_k3": k3.sum(),
        "max_abs_log_ratio": log_ratio.abs().amax(), "outside_band": (known & ((rho < low) | (rho > high))).sum(),
        "weight_sum": weight.sum(), "weight_max": weight.amax(),
        "capped": (capped & mask).sum(), "masked": (masked & mask).sum(),
    }
    return weight, meta


def aggregate_loss_across_microbatch(
    per_token_loss: torch.Tensor,
    mask: torch.Tensor,
    loss_normalization: LossNormalization = "sequence",
    normalization_constant: float | None = None,
) -> torch.Tensor:
    """Scalar loss from the per-token loss (B, T) and the response mask (B, T).

        "sequence"  mean over each sequence's response tokens, then over sequences   eq. 27-28 (GRPO)
        "sum"       sum over each sequence's response tokens, mean over sequences    eq. 14, 20, 26 (REINFORCE:
                    the gradient of log pi(y|x) = sum_t log pi(y_t | ...), no length normalisation)
        "constant"  masked sum / normalization_constant (e.g. B*G*L)                   eq. 33, 34, 37 (Dr. GRPO)
        "token"     masked sum / number of response tokens                             DAPO's token-mean;
                    with normalization_constant given, that count is taken as the whole batch's token count,
                    so the microbatches of one batch add up to the batch's token-mean.

    A sequence with no response token contributes 0 (not NaN) to the "sequence" mean and is still counted.

    >>> aggregate_loss_across_microbatch(torch.tensor([[1., 3.], [2., 0.]]), torch.tensor([[1, 1], [1, 0]]))
    tensor(2.)
    """
    check_choice("loss_normalization", loss_normalization, LOSS_NORMALIZATIONS)
    check_shape("mask", mask, per_token_loss.shape, "per_token_loss")
    mask = mask.bool()
    masked = torch.where(mask, per_token_loss, torch.zeros((), dtype=per_token_loss.dtype, device=per_token_loss.device))
    if loss_normalization == "sequence":
        tokens = mask.sum(dim=-1).clamp(min=1)
        return (masked.sum(dim=-1) / tokens).mean()
    if loss_normalization == "sum":
        return masked.sum(dim=-1).mean()
    if loss_normalization == "constant":
        if normalization_constant is None or normalization_constant <= 0:
            raise ValueError(
                f"loss_normalization='constant' needs a positive normalization_constant; got {normalization_constant!r}"
            )
        return masked.sum() / normalization_constant
    if normalization_constant is not None:
        if normalization_constant <= 0:
            raise ValueError(f"normalization_constant must be positive; got {normalization_constant!r}")
        return masked.sum() / normalization_constant
    return masked.sum() / mask.sum().clamp(min=1)


def whole_batch_normalizer(loss_normalization: LossNormalization, response_mask: torch.Tensor,
                           normalization_constant: float | None = None) -> float | None:
    """The divisor an aggregation needs from the whole batch, for `aggregate_loss_across_microbatch`'s
    normalization_constant when the batch is cut into microbatches (or pruned): "constant" takes Z as given,
    "token" the batch's response-token count (pruned rollouts included), the per-sequence means None (they
    are rescaled by `microbatch_loss_scale` instead)."""
    check_choice("loss_normalization", loss_normalization, LOSS_NORMALIZATIONS)
    if loss_normalization == "constant":
        if not normalization_constant or normalization_constant <= 0:
            raise ValueError("loss_normalization='constant' needs a positive normalization_constant")
        return float(normalization_constant)
    if loss_normalization == "token":
        return float(response_mask.bool().sum().clamp(min=1))
    return None


def microbatch_loss_scale(loss_normalization: LossNormalization, microbatch_size: int, batch_size: int) -> float:
    """Factor that turns one microbatch's aggregated loss into its share of the whole batch's loss.

    Only the means over sequences need it (a mean over B_micro sequences is a fraction B_micro/B of the batch
    mean); "constant" and "token" already divide by a whole-batch quantity passed as normalization_constant.
    """
    return microbatch_size / batch_size if loss_normalization in ("sequence", "sum") else 1.0

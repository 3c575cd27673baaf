"""The GRPO family as pure tensor functions (seed 004, sections 4-6).

Every function takes tensors and plain scalars and returns tensors: no config objects, no model, and no
`.item()` in the math, so the caller decides when to synchronise. Shapes used below:

    N  rollouts in the batch (prompts x group size G)
    B  rollouts in a (micro)batch
    T  sequence length of the labels (prompt + response, padded); the response mask picks the response

A named algorithm (GRPO, Dr. GRPO, RFT, MaxRL, GSPO, ...) is a combination of independent choices --
baseline, advantage normaliser, importance weighting, clip range(s), loss aggregation, KL weight -- kept in
one table, `rlvr.algorithms.PRESETS`, with the registry that users extend.

Input checks (shapes, options, NaN/inf) run by default; set `CHECK_INPUTS = False` to skip the NaN/inf
scans, which synchronise with the device, in a tuned GPU run.
"""

from __future__ import annotations

import warnings
from typing import Literal, get_args

import torch

# Each set of choices is written once, as a Literal; the tuples of names are read off it.
Baseline = Literal["mean", "none"]
AdvantageNormalizer = Literal["std", "mean", "none"]
ImportanceMethod = Literal["none", "noclip", "clip", "gspo", "cispo"]
LossNormalization = Literal["sequence", "sum", "constant", "token"]
KLEstimator = Literal["k1", "k2", "k3"]
RolloutCorrection = Literal["none", "token_tis", "sequence_tis", "token_mask", "sequence_mask"]
RewardSignal = Literal["reward", "correctness"]
DistillKL = Literal["sampled", "reverse", "forward"]

BASELINES = get_args(Baseline)
ADVANTAGE_NORMALIZERS = get_args(AdvantageNormalizer)
IMPORTANCE_METHODS = get_args(ImportanceMethod)
LOSS_NORMALIZATIONS = get_args(LossNormalization)
KL_ESTIMATORS = get_args(KLEstimator)
REWARD_SIGNALS = get_args(RewardSignal)
DISTILL_KLS = get_args(DistillKL)
ROLLOUT_CORRECTIONS = get_args(RolloutCorrection)
# Old names kept for one release: "grpo" is the PPO clip, which is what the name now says.
DEPRECATED_IMPORTANCE_METHODS = {"grpo": "clip"}

CHECK_INPUTS = True


# ----------------------------------------------------------------------------------------------------
# Input checks: every message names the argument at fault.


def check_choice(argument: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{argument}={value!r} is not one of {', '.join(map(repr, choices))}")


def canonical_importance_method(method: str) -> str:
    """The current name of an importance weighting method; an old name works, with a warning."""
    if method in DEPRECATED_IMPORTANCE_METHODS:
        new = DEPRECATED_IMPORTANCE_METHODS[method]
        warnings.warn(f"importance_reweighting_method={method!r} is now called {new!r}; the old name goes in the "
                      "next release", DeprecationWarning, stacklevel=3)
        return new
    return method


def _check_finite(argument: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if not CHECK_INPUTS:
        return
    values = tensor if mask is None else tensor[mask.bool()]
    if not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(f"{argument} contains {bad} NaN or infinite value(s)")


def _check_shape(argument: str, tensor: torch.Tensor, shape: torch.Size, reference: str) -> None:
    if tensor.shape != shape:
        raise ValueError(
            f"{argument} has shape {tuple(tensor.shape)} but {reference} has shape {tuple(shape)}"
        )


def _per_rollout_column(values: torch.Tensor, batch_size: int, tokens: int | None = None) -> torch.Tensor:
    """(B,) or (B, 1) -> (B, 1), so one scalar per rollout broadcasts over its tokens; (B, T) per-token
    advantages (on-policy distillation) pass through."""
    if values.dim() == 1:
        values = values.unsqueeze(-1)
    if values.dim() != 2 or values.shape[0] != batch_size or values.shape[1] not in (1, tokens):
        raise ValueError(
            f"raw_rewards_or_advantages has shape {tuple(values.shape)}; expected ({batch_size},), "
            f"({batch_size}, 1) or per token ({batch_size}, {tokens}) to match policy_log_probs"
        )
    return values


# ----------------------------------------------------------------------------------------------------
# Masked reductions and the per-token quantities.


def masked_mean(tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `tensor` over the positions where `mask` is true, over `dim` (or over everything).

    Masked-out positions may hold anything, NaN included: they are selected away, not multiplied by 0.
    A slice with no true position gives NaN (0/0), as torch.mean of an empty tensor does.

    >>> masked_mean(torch.tensor([[1., 2., 9.]]), torch.tensor([[1, 1, 0]]))
    tensor(1.5000)
    """
    mask = mask.bool()
    total = torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))
    if dim is None:
        return total.sum() / mask.sum()
    return total.sum(dim) / mask.sum(dim)


def masked_normalize(
    tensor: torch.Tensor, mask: torch.Tensor, dim: int | None = None, normalize_constant: float = 1.0
) -> torch.Tensor:
    """Sum of `tensor` over the masked positions (over `dim` or everything) divided by a constant.

    >>> masked_normalize(torch.tensor([[1., 2., 9.]]), torch.tensor([[1, 1, 0]]), normalize_constant=2.0)
    tensor(1.5000)
    """
    if normalize_constant == 0:
        raise ValueError("normalize_constant must not be 0")
    mask = mask.bool()
    total = torch.where(mask, tensor, torch.zeros((), dtype=tensor.dtype, device=tensor.device))
    summed = total.sum() if dim is None else total.sum(dim)
    return summed / normalize_constant


def compute_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of the next-token distribution at every position: (..., V) -> (...).

    Computed from log_softmax in float32, so it stays finite for extreme logits (1e4, -1e4, -inf):
    p * log p is taken as 0 where p underflows to 0 instead of 0 * -inf = NaN.

    >>> compute_entropy(torch.tensor([0.0, 0.0]))   # two equally likely tokens: log 2
    tensor(0.6931)
    """
    log_p = torch.log_softmax(logits.float(), dim=-1)
    p = log_p.exp()
    return -(p * log_p.masked_fill(p == 0, 0.0)).sum(dim=-1)


def kl_penalty(
    policy_log_probs: torch.Tensor, reference_log_probs: torch.Tensor, estimator: KLEstimator = "k2"
) -> torch.Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) on tokens sampled from pi_theta (Schulman's k1/k2/k3).

    With log r = log pi_ref - log pi_theta at each token:
        k1 = -log r                 unbiased value, can be negative, high variance
        k2 = (log r)^2 / 2          biased value, low variance
        k3 = r - 1 - log r          unbiased value and >= 0 (the GRPO paper's choice)
    k3's exponent is capped at 20 so that one wildly unlikely token cannot overflow the loss.

    As a loss term (beta * k added to the per-token loss and differentiated with the samples held fixed)
    the three differ in their *gradient*, which is what the penalty acts through:
        k1: E[grad] = E[grad log pi_theta] = 0 on-policy -- it penalises nothing in expectation;
        k2: E[grad] = E[log(pi_theta/pi_ref) grad log pi_theta] = grad KL(pi_theta || pi_ref), the reverse KL;
        k3: E[grad] = E[(1 - pi_ref/pi_theta) grad log pi_theta] = grad KL(pi_ref || pi_theta), the forward KL.
    So k2 is the default: it is the only one whose gradient is that of the KL it claims to penalise
    (tests/test_estimators.py checks all three on an exact categorical distribution). k1 and k3 remain for
    logging the KL's value and for reproducing papers that used them.

    >>> kl_penalty(torch.tensor([0.0]), torch.tensor([0.0]))   # identical policies: no penalty
    tensor([0.])
    """
    check_choice("estimator", estimator, KL_ESTIMATORS)
    _check_shape("reference_log_probs", reference_log_probs, policy_log_probs.shape, "policy_log_probs")
    log_r = reference_log_probs - policy_log_probs
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r.square()
    return torch.exp(log_r.clamp(max=20.0)) - 1.0 - log_r


# ----------------------------------------------------------------------------------------------------
# Advantages.


def groups_without_spread(grouped_rewards: torch.Tensor) -> torch.Tensor:
    """(P, G) rewards -> (P, 1) bool: the groups whose rewards are all equal (they carry no signal).

    Compared exactly, as max == min: a float mean of equal rewards can miss them by an ulp.

    >>> groups_without_spread(torch.tensor([[1., 1.], [0., 1.]])).squeeze(-1)
    tensor([ True, False])
    """
    return grouped_rewards.max(dim=1, keepdim=True).values == grouped_rewards.min(dim=1, keepdim=True).values


def compute_group_normalized_rewards(
    raw_rewards: torch.Tensor,
    group_size: int,
    baseline: Baseline = "mean",
    advantage_eps: float = 1e-6,
    advantage_normalizer: AdvantageNormalizer = "std",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-rollout advantages from raw rewards, normalised within each group of `group_size` rollouts.

    raw_rewards: (N,) with N = n_prompts * group_size, each prompt's G rollouts contiguous.
    Returns advantages (N,) and metadata of tensors.

        baseline="mean"      r - mu_i, the group-mean baseline           eq. 20
        baseline="none"      r                                           eq. 14, 34 (REINFORCE, RFT)
        normalizer="std"     / (std_i + eps), torch.std's unbiased std   eq. 25, 28-30 (GRPO)
        normalizer="none"    no division                                 eq. 33 (Dr. GRPO)
        normalizer="mean"    / (mu_i + eps)                              eq. 37, 43 (MaxRL)

    MaxRL's mean normaliser assumes non-negative rewards (a group of zeros gives 0 / eps = 0).

    >>> compute_group_normalized_rewards(torch.tensor([1., 0., 0., 0.]), 4, advantage_normalizer="none")[0]
    tensor([ 0.7500, -0.2500, -0.2500, -0.2500])
    """
    check_choice("baseline", baseline, BASELINES)
    check_choice("advantage_normalizer", advantage_normalizer, ADVANTAGE_NORMALIZERS)
    if raw_rewards.dim() == 2 and raw_rewards.shape[-1] == 1:
        raw_rewards = raw_rewards.squeeze(-1)
    if raw_rewards.dim() != 1:
        raise ValueError(f"raw_rewards must have shape (N,); got {tuple(raw_rewards.shape)}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer; got {group_size!r}")
    n = raw_rewards.shape[0]
    if n == 0 or n % group_size:
        raise ValueError(
            f"raw_rewards holds {n} rollouts, which is not a whole number of groups of group_size={group_size}"
        )
    if group_size == 1 and advantage_normalizer == "std":
        raise ValueError("advantage_normalizer='std' needs group_size >= 2 (the std of one sample is undefined)")
    if group_size == 1 and baseline == "mean":
        raise ValueError("baseline='mean' with group_size=1 makes every advantage 0; use baseline='none'")
    if advantage_eps < 0:
        raise ValueError(f"advantage_eps must be >= 0; got {advantage_eps}")
    _check_finite("raw_rewards", raw_rewards)

    rewards = raw_rewards.float().view(-1, group_size)
    group_mean = rewards.mean(dim=1, keepdim=True)
    no_spread = groups_without_spread(rewards)
    if baseline == "mean":
        # the float mean of equal rewards can miss them by an ulp (eight 0.2s: -1.5e-8 each), and dividing by
        # the equally tiny std + eps turns that into a uniform advantage of -0.015 that Adam scales up to a
        # full-size update; a group with no spread has exactly zero advantage
        advantages = (rewards - group_mean).masked_fill(no_spread, 0.0)
    else:
        advantages = rewards
    group_std = rewards.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(group_mean)
    if advantage_normalizer == "std":
        advantages = advantages / (group_std + advantage_eps)
    elif advantage_normalizer == "mean":
        advantages = advantages / (group_mean + advantage_eps)

    metadata = {
        "reward_mean": rewards.mean(),
        "reward_std": rewards.std() if rewards.numel() > 1 else torch.zeros(()),
        "reward_max": rewards.max(),
        "reward_min": rewards.min(),
        "group_reward_std_mean": group_std.mean(),
        "frac_groups_zero_std": no_spread.float().mean(),
        "advantage_mean": advantages.mean(),
        "advantage_abs_max": advantages.abs().max(),
    }
    return advantages.reshape(-1), metadata


# ----------------------------------------------------------------------------------------------------
# Per-token policy-gradient loss.


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
        "clip"    -min(A w_t, A clip(w_t, 1-eps, 1+eps_high)) eq. 57-60 (the PPO clip GRPO uses; DAPO's clip-higher
                                                              when eps_high > eps)
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
    importance_reweighting_method = canonical_importance_method(importance_reweighting_method)
    check_choice("importance_reweighting_method", importance_reweighting_method, IMPORTANCE_METHODS)
    if policy_log_probs.dim() != 2:
        raise ValueError(f"policy_log_probs must have shape (B, T); got {tuple(policy_log_probs.shape)}")
    batch = policy_log_probs.shape[0]
    advantages = _per_rollout_column(raw_rewards_or_advantages, batch, policy_log_probs.shape[1]).to(
        policy_log_probs.dtype)
    if response_mask is not None:
        _check_shape("response_mask", response_mask, policy_log_probs.shape, "policy_log_probs")
        response_mask = response_mask.bool()
    _check_finite("raw_rewards_or_advantages", advantages)
    _check_finite("policy_log_probs", policy_log_probs, response_mask)

    if importance_reweighting_method == "none":
        return -advantages * policy_log_probs, {}

    if old_log_probs is None:
        raise ValueError(f"importance_reweighting_method={importance_reweighting_method!r} needs old_log_probs")
    _check_shape("old_log_probs", old_log_probs, policy_log_probs.shape, "policy_log_probs")
    _check_finite("old_log_probs", old_log_probs, response_mask)
    needs_clip = importance_reweighting_method in ("clip", "gspo", "cispo")
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
    unclipped = advantages * ratio
    clipped = advantages * ratio.clamp(low, high)
    metadata["clip_fraction"] = masked_mean((clipped < unclipped).float(), mask)
    return -torch.minimum(unclipped, clipped), metadata


# ----------------------------------------------------------------------------------------------------
# Aggregation over tokens and sequences.


def distill_advantages(student_log_probs: torch.Tensor, teacher_log_probs: torch.Tensor,
                       response_mask: torch.Tensor, discount: float = 0.0) -> torch.Tensor:
    """Per-token advantages (B, T) of on-policy distillation (seeds 002, 003): the student sampled the
    tokens, the teacher scored them, and each token's signal is the (detached) log-ratio
    r_t = log p_teacher(y_t | y_<t) - log p_student(y_t | y_<t), summed over the tokens after it with
    `discount` gamma: A_t = sum_{t' >= t} gamma^(t'-t) r_t' (0 outside the response).

    With the "none" policy loss (-A_t log pi(y_t)), the expected gradient is exactly
      gamma = 0: minus the gradient of the per-token reverse KL, sum_t E_{y<t ~ pi}[KL(pi(.|y<t) || p_teacher(.|y<t))],
                 at the states the student visits (the usual on-policy distillation signal; dense, low variance);
      gamma = 1: minus the gradient of the sequence-level reverse KL, KL(pi(y) || p_teacher(y)), which also
                 credits a token with the divergence it leads to later.
    (tests/test_distill.py checks both by exact enumeration.)

    >>> s = torch.log(torch.tensor([[0.5, 0.5]])); t = torch.log(torch.tensor([[0.25, 1.0]]))
    >>> distill_advantages(s, t, torch.tensor([[True, True]]), discount=1.0)
    tensor([[0.0000, 0.6931]])
    """
    _check_shape("teacher_log_probs", teacher_log_probs, student_log_probs.shape, "student_log_probs")
    _check_shape("response_mask", response_mask, student_log_probs.shape, "student_log_probs")
    if not 0.0 <= discount <= 1.0:
        raise ValueError(f"discount must be in [0, 1]; got {discount}")
    mask = response_mask.bool()
    ratio = (teacher_log_probs.float() - student_log_probs.float()).detach().masked_fill(~mask, 0.0)
    if discount == 0.0:
        return ratio
    out = torch.zeros_like(ratio)
    running = torch.zeros(ratio.shape[0])
    for t in range(ratio.shape[1] - 1, -1, -1):
        running = ratio[:, t] + discount * running
        out[:, t] = running
    return out.masked_fill(~mask, 0.0)


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
    _check_shape("rollout_log_probs", rollout_log_probs, old_log_probs.shape, "old_log_probs")
    _check_shape("response_mask", mask, old_log_probs.shape, "old_log_probs")
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
    _check_shape("mask", mask, per_token_loss.shape, "per_token_loss")
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


def __getattr__(name: str):
    # the preset table moved to rlvr.algorithms (it is configuration, not maths); old imports keep working
    if name in ("Preset", "PRESETS", "get_preset", "EstimatorSpec"):
        from rlvr import algorithms

        return getattr(algorithms, name)
    raise AttributeError(f"module 'rlvr.estimators' has no attribute {name!r}")

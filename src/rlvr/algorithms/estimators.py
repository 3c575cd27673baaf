"""The GRPO family as pure tensor functions (seed 004, sections 4-6).

Every function takes tensors and plain scalars and returns tensors: no config objects, no model, and no
`.item()` in the math, so the caller decides when to synchronise. Shapes used below:

    N  rollouts in the batch (prompts x group size G)
    B  rollouts in a (micro)batch
    T  sequence length of the labels (prompt + response, padded); the response mask picks the response

A named algorithm (GRPO, Dr. GRPO, RFT, MaxRL, GSPO, ...) is a combination of independent choices --
baseline, advantage normaliser, importance weighting, clip range(s), loss aggregation, KL weight -- kept in
one table, `rlvr.algorithms.spec.PRESETS`, with the registry that users extend.

Input checks (shapes, options, NaN/inf) run by default; set `CHECK_INPUTS = False` to skip the NaN/inf
scans, which synchronise with the device, in a tuned GPU run.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch

# Each set of choices is written once, as a Literal; the tuples of names are read off it.
Baseline = Literal["mean", "none"]
AdvantageNormalizer = Literal["std", "mean", "none"]
# "grpo" is seed 004's name for the PPO clip (its Literal["none", "noclip", "grpo", "gspo"]) and "clip" rlvr's;
# both name one method, and both stay accepted: the seed's names are a public contract.
ImportanceMethod = Literal["none", "noclip", "clip", "grpo", "gspo", "cispo"]
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

CHECK_INPUTS = True


# ----------------------------------------------------------------------------------------------------
# Input checks: every message names the argument at fault.


def check_choice(argument: str, value: object, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{argument}={value!r} is not one of {', '.join(map(repr, choices))}")


def check_finite(argument: str, tensor: torch.Tensor, mask: torch.Tensor | None = None) -> None:
    if not CHECK_INPUTS:
        return
    values = tensor if mask is None else tensor[mask.bool()]
    if not bool(torch.isfinite(values).all()):
        bad = int((~torch.isfinite(values)).sum())
        raise ValueError(f"{argument} contains {bad} NaN or infinite value(s)")


def check_shape(argument: str, tensor: torch.Tensor, shape: torch.Size, reference: str) -> None:
    if tensor.shape != shape:
        raise ValueError(
            f"{argument} has shape {tuple(tensor.shape)} but {reference} has shape {tuple(shape)}"
        )


def per_rollout_column(values: torch.Tensor, batch_size: int, tokens: int | None = None) -> torch.Tensor:
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
    check_shape("reference_log_probs", reference_log_probs, policy_log_probs.shape, "policy_log_probs")
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
    check_finite("raw_rewards", raw_rewards)

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
    check_shape("teacher_log_probs", teacher_log_probs, student_log_probs.shape, "student_log_probs")
    check_shape("response_mask", response_mask, student_log_probs.shape, "student_log_probs")
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



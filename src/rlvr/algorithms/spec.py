"""The estimator spec: every choice a policy-gradient estimator makes, in one frozen record; the named
algorithms of seed 004 as rows of one table; and the registry that users extend without editing rlvr.

    spec = EstimatorSpec(baseline="mean", advantage_normalizer="none", loss_normalization="constant")
    advantages, meta = compute_advantages(raw_rewards, group_size, spec)     # ADVANTAGES[spec.advantage]
    per_token, meta = policy_loss(spec, advantages, log_probs, old_log_probs, mask)
                                                  # POLICY_LOSSES[spec.importance_reweighting_method]

A user's estimator is one function in their own file (see examples/custom_estimator.py, RLOO):

    @register_advantage("rloo")
    def rloo(raw_rewards, group_size, spec): ...          # -> (advantages (N,), metadata)
    RLOO = EstimatorSpec(advantage="rloo", loss_normalization="sequence", summary="leave-one-out baseline")

and is chosen as `rlvr train algorithm=path/to/file.py:RLOO` (or `my_package.module:RLOO`), in sweeps too.
It gets the same pruning, microbatching, metrics, checkpoints and resume as a built-in one.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from rlvr.algorithms.estimators import (
    ADVANTAGE_NORMALIZERS,
    BASELINES,
    DISTILL_KLS,
    KL_ESTIMATORS,
    LOSS_NORMALIZATIONS,
    REWARD_SIGNALS,
    AdvantageNormalizer,
    Baseline,
    DistillKL,
    KLEstimator,
    LossNormalization,
    RewardSignal,
    check_choice,
    compute_group_normalized_rewards,
    groups_without_spread,
)
from rlvr.algorithms.losses import compute_policy_gradient_loss
from rlvr.core.imports import import_target

# advantage(raw_rewards (N,), group_size, spec) -> (advantages (N,), metadata of scalars)
AdvantageFn = Callable[[torch.Tensor, int, "EstimatorSpec"], tuple[torch.Tensor, dict]]
# loss(advantages (B,), log_probs (B, T), old_log_probs (B, T) or None, response_mask (B, T), spec)
#   -> (per-token loss (B, T) whose aggregated gradient is minus the estimator, metadata of scalars)
PolicyLossFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, "EstimatorSpec"],
                        tuple[torch.Tensor, dict]]

ADVANTAGES: dict[str, AdvantageFn] = {}
POLICY_LOSSES: dict[str, PolicyLossFn] = {}
# losses that weight by pi_theta / pi_old and so need the sampling policy's log-probs
NEEDS_OLD_LOG_PROBS: set[str] = set()


def register_advantage(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: make `fn(raw_rewards, group_size, spec) -> (advantages, metadata)` available as
    `EstimatorSpec(advantage=name)`. Advantages of exactly 0 are never trained (pruning keeps the update)."""
    def register(fn: AdvantageFn) -> AdvantageFn:
        ADVANTAGES[name] = fn
        return fn
    return register


def register_policy_loss(name: str, needs_old_log_probs: bool = True) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: make `fn(advantages, log_probs, old_log_probs, response_mask, spec) -> (per_token_loss,
    metadata)` available as `EstimatorSpec(importance_reweighting_method=name)`. With
    `needs_old_log_probs`, the loop scores the sampling policy's log-probs for train batches after the first."""
    def register(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES[name] = fn
        (NEEDS_OLD_LOG_PROBS.add if needs_old_log_probs else NEEDS_OLD_LOG_PROBS.discard)(name)
        return fn
    return register


@dataclasses.dataclass(frozen=True)
class EstimatorSpec:
    """One policy-gradient estimator: the row of the preset table, and what the update step receives."""

    baseline: Baseline = "mean"
    advantage_normalizer: AdvantageNormalizer = "std"
    importance_reweighting_method: str = "none"  # a key of POLICY_LOSSES
    loss_normalization: LossNormalization = "sequence"
    cliprange: float | None = None
    cliprange_high: float | None = None
    beta: float = 0.0  # weight of the KL penalty to the reference model
    # weight of the entropy bonus (verl's entropy_coeff): the loss loses entropy_coef x the token entropy,
    # aggregated as the policy-gradient loss is, so a collapsing policy is pushed back toward spread
    entropy_coef: float = 0.0
    kl_estimator: KLEstimator = "k2"  # the one whose gradient is the reverse KL's (see kl_penalty)
    steps_per_rollout: int = 1  # optimizer steps per rollout batch; > 1 is off-policy
    mask_truncated_completions: bool = False
    # what the advantage is computed from: the (possibly shaped) reward, or the 0/1 correctness of the answer,
    # which RFT's indicator (eq. 34) and MaxRL's success probability (eq. 37) are defined on
    reward_signal: RewardSignal = "reward"
    advantage: str = "group"  # a key of ADVANTAGES; "group" is seed 004's group normalisation
    advantage_eps: float = 1e-6
    normalization_constant: float | None = None  # Z of the "constant" aggregation (eq. 33)
    # on-policy distillation (seeds 002, 003): weight of the per-token teacher signal added to the advantage
    # (`estimators.distill_advantages`; needs `teacher=`), and its discount over later tokens
    distill: float = 0.0
    distill_discount: float = 0.0
    # how the teacher signal enters: "sampled", the log-ratio of the sampled token as a per-token advantage
    # (the policy-gradient estimator above); "reverse", the exact per-token KL(student || teacher) over the whole
    # vocabulary at each visited state, differentiated directly -- its gradient is the sampled one's expectation
    # over the token drawn there (distill_discount 0), without that sampling noise; "forward", KL(teacher ||
    # student) at the same states, whose gradient on the logits, p_student - p_teacher, raises a token the
    # teacher wants even where the student gives it almost no mass (GKD's on-policy divergences, beta 1 and 0)
    distill_kl: DistillKL = "sampled"
    summary: str = ""

    def validate(self, seed_call: bool = False) -> "EstimatorSpec":
        """Every check of the estimator's choices, in one place; returns the spec. `seed_call`: a call of seed
        004's own function (grpo_train_step), which takes every combination of the seed's literals, so a
        combination rlvr's configs refuse as unwise only warns there."""
        spec, method = self, self.importance_reweighting_method
        check_choice("baseline", spec.baseline, BASELINES)
        check_choice("advantage_normalizer", spec.advantage_normalizer, ADVANTAGE_NORMALIZERS)
        check_choice("importance_reweighting_method", method, tuple(POLICY_LOSSES))
        check_choice("loss_normalization", spec.loss_normalization, LOSS_NORMALIZATIONS)
        check_choice("kl_estimator", spec.kl_estimator, KL_ESTIMATORS)
        check_choice("reward_signal", spec.reward_signal, REWARD_SIGNALS)
        check_choice("advantage", spec.advantage, tuple(ADVANTAGES))
        if spec.advantage == "group" and spec.baseline == "none" and spec.advantage_normalizer == "std":
            if not seed_call:
                raise ValueError("baseline='none' with advantage_normalizer='std' divides raw rewards by the group "
                                 "std: a group that is all right gets advantages of 1/eps = 1e6; use baseline='mean'")
            import warnings

            warnings.warn("baseline='none' with advantage_normalizer='std' divides raw rewards by the group std: an "
                          "all-right group gets advantages of 1/eps", stacklevel=3)
        if method in ("clip", "grpo", "gspo") and spec.cliprange is None:
            raise ValueError(f"importance_reweighting_method={method!r} needs cliprange")
        if method == "cispo" and spec.cliprange is None and spec.cliprange_high is None:
            raise ValueError("importance_reweighting_method='cispo' needs cliprange or cliprange_high")
        for name in ("cliprange", "cliprange_high"):
            if getattr(spec, name) is not None and getattr(spec, name) < 0:
                raise ValueError(f"{name} must be >= 0; got {getattr(spec, name)}")
        if spec.steps_per_rollout < 1:
            raise ValueError(f"steps_per_rollout must be >= 1; got {spec.steps_per_rollout}")
        if spec.beta < 0:
            raise ValueError(f"beta must be >= 0; got {spec.beta}")
        if spec.entropy_coef < 0:
            raise ValueError(f"entropy_coef must be >= 0 (a bonus); got {spec.entropy_coef}")
        if spec.advantage_eps < 0:
            raise ValueError(f"advantage_eps must be >= 0; got {spec.advantage_eps}")
        if spec.normalization_constant is not None and spec.normalization_constant <= 0:
            raise ValueError(f"normalization_constant must be positive; got {spec.normalization_constant}")
        if spec.distill < 0 or not 0 <= spec.distill_discount <= 1:
            raise ValueError(f"distill must be >= 0 and distill_discount in [0, 1]; got {spec.distill}, "
                             f"{spec.distill_discount}")
        check_choice("distill_kl", spec.distill_kl, DISTILL_KLS)
        if spec.distill_kl != "sampled" and spec.distill_discount != 0:
            raise ValueError(f"distill_kl={spec.distill_kl!r} is a KL at each visited state (distill_discount 0); got "
                             f"distill_discount={spec.distill_discount}: use distill_kl='sampled' for a discount")
        if spec.distill > 0 and method == "gspo":
            raise ValueError("distill > 0 gives per-token advantages; gspo weights whole sequences and cannot take them")
        return spec

    @property
    def needs_old_log_probs(self) -> bool:
        return self.importance_reweighting_method in NEEDS_OLD_LOG_PROBS

    @property
    def exact_distill(self) -> bool:
        """Whether the update adds the exact KL to the teacher to every token's loss (distill_kl reverse /
        forward), rather than distillation entering as per-token advantages."""
        return self.distill > 0 and self.distill_kl != "sampled"


Preset = EstimatorSpec  # the name the preset table had before the spec was the update's only argument
CHOICES = tuple(f.name for f in dataclasses.fields(EstimatorSpec) if f.name != "summary")


# ----------------------------------------------------------------------------------------------------
# The built-in advantages and losses: seed 004's functions, behind the registry's signatures.


@register_advantage("group")
def group_normalized_advantages(raw_rewards: torch.Tensor, group_size: int, spec: EstimatorSpec):
    """Seed 004's group normalisation (eq. 14, 20, 25, 33, 34, 37) with the spec's baseline and normaliser."""
    return compute_group_normalized_rewards(raw_rewards, group_size, spec.baseline, spec.advantage_eps,
                                            spec.advantage_normalizer)


@register_advantage("none")
def no_reward_advantages(raw_rewards: torch.Tensor, group_size: int, spec: EstimatorSpec):
    """No reward signal at all: pure on-policy distillation (`distill` > 0) learns from the teacher alone."""
    return torch.zeros_like(raw_rewards, dtype=torch.float32).reshape(-1), {}


def _seed_loss(method: str) -> PolicyLossFn:
    def loss(advantages, log_probs, old_log_probs, response_mask, spec):
        return compute_policy_gradient_loss(advantages, log_probs, method, old_log_probs=old_log_probs,
                                            cliprange=spec.cliprange, response_mask=response_mask,
                                            cliprange_high=spec.cliprange_high)
    loss.__name__ = loss.__qualname__ = f"{method}_policy_loss"
    loss.__doc__ = f"`compute_policy_gradient_loss(..., {method!r})`; see its docstring for the equations."
    return loss


for _method in ("none", "noclip", "clip", "grpo", "gspo", "cispo"):  # "grpo": seed 004's name of "clip"
    register_policy_loss(_method, needs_old_log_probs=_method != "none")(_seed_loss(_method))


def compute_advantages(raw_rewards: torch.Tensor, group_size: int, spec: EstimatorSpec):
    """Per-rollout advantages (N,) and metadata from the spec's advantage function. The metadata always
    holds the signal statistics every estimator is logged with (`frac_groups_zero_std`, `reward_std`);
    a registered function need not compute them."""
    advantages, metadata = ADVANTAGES[spec.advantage](raw_rewards, group_size, spec)
    if advantages.shape != raw_rewards.reshape(-1).shape:
        raise ValueError(f"advantage function {spec.advantage!r} returned shape {tuple(advantages.shape)} for "
                         f"{raw_rewards.numel()} rollouts; it must return one advantage per rollout")
    metadata = dict(metadata)
    rewards = raw_rewards.float().reshape(-1)
    if "frac_groups_zero_std" not in metadata:
        metadata["frac_groups_zero_std"] = groups_without_spread(rewards.view(-1, group_size)).float().mean()
    if "reward_std" not in metadata:
        metadata["reward_std"] = rewards.std() if rewards.numel() > 1 else torch.zeros(())
    return advantages.float(), metadata


def policy_loss(spec: EstimatorSpec, advantages, log_probs, old_log_probs, response_mask):
    """Per-token loss (B, T) and metadata from the spec's policy loss."""
    return POLICY_LOSSES[spec.importance_reweighting_method](advantages, log_probs, old_log_probs, response_mask, spec)


# ----------------------------------------------------------------------------------------------------
# Named algorithms: each one a row of independent choices.

_OFF = 4  # optimizer steps per rollout batch for the off-policy presets (seed 004 uses 32 at 256 rollouts)

PRESETS: dict[str, EstimatorSpec] = {
    "reinforce": EstimatorSpec("none", "none", "none", "sum", summary="raw reward, no baseline (eq. 14); G=1 allowed"),
    "reinforce_with_baseline": EstimatorSpec("mean", "none", "none", "sum", summary="group-mean baseline (eq. 20)"),
    "grpo": EstimatorSpec("mean", "std", "none", "sequence", summary="GRPO on-policy (Algorithm 1, eq. 28)"),
    "grpo_constant": EstimatorSpec("mean", "std", "none", "constant", summary="GRPO with constant normalisation"),
    "grpo_token": EstimatorSpec("mean", "std", "none", "token",
                                summary="GRPO with the batch's token-mean loss (DAPO's aggregation)"),
    "dr_grpo": EstimatorSpec("mean", "none", "none", "constant", summary="Dr. GRPO (eq. 33)"),
    "rft": EstimatorSpec("none", "none", "none", "constant", reward_signal="correctness",
                         summary="rejection fine-tuning on correct rollouts (eq. 34)"),
    "maxrl": EstimatorSpec("mean", "mean", "none", "constant", reward_signal="correctness",
                           summary="MaxRL, mean-normalised advantage (eq. 37)"),
    "grpo_clip": EstimatorSpec("mean", "std", "clip", "sequence", cliprange=0.2,
                               summary="GRPO with the PPO clip (eq. 57); the ratio is 1 unless steps_per_rollout > 1"),
    "offpolicy_naive": EstimatorSpec("mean", "std", "none", "sequence", steps_per_rollout=_OFF,
                                     summary="stale samples, no reweighting (eq. 44)"),
    "offpolicy_noclip": EstimatorSpec("mean", "std", "noclip", "sequence", steps_per_rollout=_OFF,
                                      summary="token-level reweighting (eq. 56)"),
    "offpolicy_clip": EstimatorSpec("mean", "std", "clip", "sequence", cliprange=0.2, steps_per_rollout=_OFF,
                                    summary="PPO/GRPO clip (eq. 57-60)"),
    "offpolicy_gspo": EstimatorSpec("mean", "std", "gspo", "sequence", cliprange=3e-4, steps_per_rollout=_OFF,
                                    summary="GSPO sequence-level geometric-mean ratio (eq. 62-65)"),
    "cispo": EstimatorSpec("mean", "std", "cispo", "sequence", cliprange=0.2, steps_per_rollout=_OFF,
                           summary="CISPO: capped, undifferentiated token weight (eq. 61)"),
    "opd": EstimatorSpec("none", "none", "none", "token", advantage="none", distill=1.0,
                         summary="on-policy distillation: per-token reverse KL to teacher= (seeds 002/003)"),
    "opd_grpo": EstimatorSpec("mean", "std", "none", "token", distill=1.0,
                              summary="on-policy distillation plus GRPO's group-normalised reward advantage"),
    "dapo": EstimatorSpec("mean", "std", "clip", "token", cliprange=0.2, cliprange_high=0.28, steps_per_rollout=_OFF,
                          mask_truncated_completions=True,
                          summary="DAPO: clip-higher, token-mean loss, truncated rollouts masked"),
}
for _name, _preset in PRESETS.items():
    _preset.validate()
BUILTIN_PRESETS = tuple(PRESETS)  # the table above; register_estimator adds users' rows after these


def register_estimator(name: str, spec: EstimatorSpec) -> EstimatorSpec:
    """Add a named algorithm, so that `algorithm=name` selects it (in this process)."""
    PRESETS[name] = spec.validate()
    return PRESETS[name]


def get_preset(name: str) -> EstimatorSpec:
    """The algorithm called `name`: a preset (or one added with `register_estimator`), or an import path
    `module:attr` / `file.py:attr` naming an EstimatorSpec. An unknown name fails with the valid ones."""
    if name in PRESETS:
        return PRESETS[name]
    if ":" in name:
        target = import_target(name, field="algorithm")
        if not isinstance(target, EstimatorSpec):
            raise ValueError(f"algorithm={name!r} names a {type(target).__name__}, not an EstimatorSpec")
        return target.validate()
    import difflib

    close = difflib.get_close_matches(name, list(PRESETS), n=1, cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise ValueError(f"unknown algorithm {name!r}; {hint}valid: {', '.join(PRESETS)}, or module:spec / file.py:spec")

"""A user-defined estimator in its own file: RLOO, the leave-one-out baseline (Kool et al. 2019;
Ahmadian et al. 2024), which rlvr does not ship.

Each rollout's baseline is the mean reward of the *other* G - 1 rollouts of its prompt:

    A_ij = r_ij - (sum_k r_ik - r_ij) / (G - 1)  =  G / (G - 1) * (r_ij - mean_i)

The baseline does not depend on the rollout it is subtracted from, so the estimator is unbiased, where the
group mean of seed 004's eq. 20 shrinks the gradient by (G - 1) / G. With a token sum per response (the
`sum` aggregation) this is the REINFORCE estimator of eq. 14 with that baseline.

Use it without editing rlvr:

    rlvr train --config configs/grpo_arithmetic.yaml algorithm=examples/custom_estimator.py:RLOO

or from Python (`import custom_estimator` registers it; then `algorithm=rloo` works in that process), or in a
sweep's grid (`algorithm: [grpo, examples/custom_estimator.py:RLOO]`). It gets the same pruning (zero
advantages are never trained), microbatching, metrics, checkpoints and resume as a built-in estimator.
"""

import torch

from rlvr.algorithms.estimators import groups_without_spread
from rlvr.algorithms.spec import EstimatorSpec, register_advantage, register_estimator


@register_advantage("rloo")
def rloo_advantages(raw_rewards: torch.Tensor, group_size: int, spec: EstimatorSpec):
    """(N,) rewards, prompt-major in groups of G -> (N,) leave-one-out advantages and metadata."""
    if group_size < 2:
        raise ValueError("RLOO needs group_size >= 2: one sample has no others to form its baseline")
    rewards = raw_rewards.float().view(-1, group_size)
    others = (rewards.sum(dim=1, keepdim=True) - rewards) / (group_size - 1)
    # a group without reward spread has exactly zero advantage (float rounding would otherwise leave 1e-8s)
    advantages = (rewards - others).masked_fill(groups_without_spread(rewards), 0.0)
    return advantages.reshape(-1), {"advantage_abs_max": advantages.abs().max()}


RLOO = register_estimator("rloo", EstimatorSpec(
    advantage="rloo", loss_normalization="sum", summary="RLOO: leave-one-out baseline, token sum (eq. 14 form)"))

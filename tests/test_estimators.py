"""The estimator core against hand-computed values and the closed-form gradients of seed 004."""

import math
import typing

import pytest
import torch

from rlvr.algorithms import losses as L
from rlvr.algorithms import spec as S
from rlvr.algorithms.estimators import (
    compute_entropy,
    compute_group_normalized_rewards,
    kl_penalty,
    masked_mean,
    masked_normalize,
)
from rlvr.algorithms.losses import aggregate_loss_across_microbatch, compute_policy_gradient_loss

EPS = 1e-6


# ---------------------------------------------------------------------------------------------------
# Group-normalised advantages, worked on paper.
# Group 1 = [1, 0, 0, 0]: mean 0.25, unbiased std sqrt(0.75 / 3) = 0.5.
# Group 2 = [1, 1, 0, 0]: mean 0.5, unbiased std sqrt(1 / 3) = 0.57735.

REWARDS = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0])
S2 = math.sqrt(1 / 3)


@pytest.mark.parametrize(
    "baseline, normalizer, expected",
    [
        ("mean", "std", [0.75 / (0.5 + EPS)] + [-0.25 / (0.5 + EPS)] * 3 + [0.5 / (S2 + EPS)] * 2 + [-0.5 / (S2 + EPS)] * 2),
        ("mean", "none", [0.75, -0.25, -0.25, -0.25, 0.5, 0.5, -0.5, -0.5]),
        ("mean", "mean", [0.75 / (0.25 + EPS)] + [-0.25 / (0.25 + EPS)] * 3 + [0.5 / (0.5 + EPS)] * 2 + [-0.5 / (0.5 + EPS)] * 2),
        ("none", "none", [1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]),
        ("none", "std", [1 / (0.5 + EPS), 0, 0, 0, 1 / (S2 + EPS), 1 / (S2 + EPS), 0, 0]),
    ],
)
def test_group_normalized_rewards_hand_values(baseline, normalizer, expected):
    adv, meta = compute_group_normalized_rewards(REWARDS, 4, baseline=baseline, advantage_normalizer=normalizer)
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-6, atol=1e-6)
    assert meta["reward_mean"].item() == pytest.approx(0.375)
    assert meta["frac_groups_zero_std"].item() == 0.0


def test_group_normalized_rewards_zero_spread_groups_and_maxrl_zero_mean():
    rewards = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0, 0.0])  # groups of 2: no spread, no spread, spread
    adv, meta = compute_group_normalized_rewards(rewards, 2, advantage_normalizer="mean")
    torch.testing.assert_close(adv, torch.tensor([0.0, 0.0, 0.0, 0.0, 0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS)]))
    assert meta["frac_groups_zero_std"].item() == pytest.approx(2 / 3)
    adv_std, _ = compute_group_normalized_rewards(rewards, 2)
    # a group with equal rewards gets 0 / eps = 0, never NaN
    assert torch.equal(adv_std[:4], torch.zeros(4))


@pytest.mark.parametrize("normalizer", ["std", "none", "mean"])
def test_group_of_equal_non_binary_rewards_has_exactly_zero_advantage(normalizer):
    # correctness 0 + 0.2 format bonus for all eight: the float32 mean misses 0.2 by 1.5e-8, and std + eps
    # would turn that into advantages of -0.015 (a real update under Adam) instead of no signal
    rewards = torch.tensor([1.0 * 0 + 0.2 * 1.0] * 8 + [1.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2, 0.2])
    adv, meta = compute_group_normalized_rewards(rewards, 8, advantage_normalizer=normalizer)
    assert torch.equal(adv[:8], torch.zeros(8))
    assert adv[8] > 0 and (adv[9:] < 0).all()
    assert meta["frac_groups_zero_std"].item() == 0.5


def test_group_normalized_rewards_reinforce_group_of_one():
    adv, _ = compute_group_normalized_rewards(torch.tensor([1.0, 0.0, 1.0]), 1, baseline="none", advantage_normalizer="none")
    assert adv.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(raw_rewards=torch.ones(7), group_size=4), "whole number of groups"),
        (dict(raw_rewards=torch.ones(4), group_size=1), "group_size >= 2"),
        (dict(raw_rewards=torch.ones(4), group_size=1, advantage_normalizer="none"), "baseline='none'"),
        (dict(raw_rewards=torch.ones(4), group_size=2, baseline="median"), "baseline='median'"),
        (dict(raw_rewards=torch.ones(4), group_size=2, advantage_normalizer="max"), "advantage_normalizer='max'"),
        (dict(raw_rewards=torch.tensor([1.0, float("nan")]), group_size=2), "raw_rewards contains 1 NaN"),
        (dict(raw_rewards=torch.ones(2, 2), group_size=2), "raw_rewards must have shape"),
        (dict(raw_rewards=torch.ones(4), group_size=0), "group_size must be a positive integer"),
    ],
)
def test_group_normalized_rewards_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        compute_group_normalized_rewards(**kwargs)


# ---------------------------------------------------------------------------------------------------
# Per-token losses, worked on paper: A = [2, -1], two tokens each, eps = 0.2.

A = torch.tensor([2.0, -1.0])
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
OLD = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])  # log ratios [[0, -1], [0.5, -2]]
e = math.exp


def test_loss_none_is_minus_advantage_times_logprob():
    loss, meta = compute_policy_gradient_loss(A, LOGP)
    torch.testing.assert_close(loss, torch.tensor([[2.0, 4.0], [-0.5, -3.0]]))
    assert meta == {}
    loss_col, _ = compute_policy_gradient_loss(A.unsqueeze(-1), LOGP)
    assert torch.equal(loss, loss_col)


def test_loss_noclip_is_minus_advantage_times_ratio():
    loss, meta = compute_policy_gradient_loss(A, LOGP, "noclip", old_log_probs=OLD)
    expected = torch.tensor([[-2.0, -2 * e(-1)], [e(0.5), e(-2)]])
    torch.testing.assert_close(loss, expected)
    assert meta["ratio_max"].item() == pytest.approx(e(0.5))
    assert meta["ratio_min"].item() == pytest.approx(e(-2))


def test_loss_grpo_clip_hand_values():
    loss, meta = compute_policy_gradient_loss(A, LOGP, "grpo", old_log_probs=OLD, cliprange=0.2)
    # row 0 (A=2): ratios [1, e^-1]; min(A w, A clip(w)) = [2, 2 e^-1] (the clip of a small ratio never binds for A>0)
    # row 1 (A=-1): ratios [e^.5, e^-2]; min = [-e^.5, -0.8] -> the second token takes the clipped branch
    expected = torch.tensor([[-2.0, -2 * e(-1)], [e(0.5), 0.8]])
    torch.testing.assert_close(loss, expected)
    assert meta["clip_fraction"].item() == pytest.approx(0.25)


def test_loss_grpo_clip_higher_is_asymmetric():
    # ratio 1.25 with A > 0: clipped at 1.2 by eps=0.2, free under DAPO's eps_high=0.28
    logp, old = torch.tensor([[math.log(1.25)]]), torch.zeros(1, 1)
    sym, m1 = compute_policy_gradient_loss(torch.tensor([1.0]), logp, "grpo", old_log_probs=old, cliprange=0.2)
    high, m2 = compute_policy_gradient_loss(
        torch.tensor([1.0]), logp, "grpo", old_log_probs=old, cliprange=0.2, cliprange_high=0.28
    )
    assert sym.item() == pytest.approx(-1.2) and m1["clip_fraction"].item() == 1.0
    assert high.item() == pytest.approx(-1.25) and m2["clip_fraction"].item() == 0.0


def test_clip_fraction_counts_both_branches_of_the_clip():
    # A > 0 clipped above (ratio 1.5 > 1.2), A < 0 clipped below (ratio 0.5 < 0.8), and one free token of each
    logp = torch.log(torch.tensor([[1.5, 1.1], [0.5, 0.9]]))
    loss, meta = compute_policy_gradient_loss(torch.tensor([1.0, -1.0]), logp, "grpo", old_log_probs=torch.zeros(2, 2),
                                              cliprange=0.2)
    torch.testing.assert_close(loss, torch.tensor([[-1.2, -1.1], [0.8, 0.9]]))
    assert meta["clip_fraction"].item() == 0.5


def test_loss_gspo_hand_values_and_mask():
    loss, meta = compute_policy_gradient_loss(A, LOGP, "gspo", old_log_probs=OLD, cliprange=0.2)
    # row 0: s = exp(mean(0, -1)) = e^-.5, A=2 -> -2 e^-.5 (unclipped); row 1: s = e^-.75 < 0.8 with A<0 -> clipped, 0.8
    expected = torch.tensor([[-2 * e(-0.5)] * 2, [0.8, 0.8]])
    torch.testing.assert_close(loss, expected)
    assert meta["clip_fraction"].item() == pytest.approx(0.5)
    mask = torch.tensor([[True, True], [True, False]])
    masked, meta = compute_policy_gradient_loss(A, LOGP, "gspo", old_log_probs=OLD, cliprange=0.2, response_mask=mask)
    # row 1 now averages only its first token: s = e^.5, and A < 0 means the upper clip does not bind
    assert masked[1, 0].item() == pytest.approx(e(0.5))
    assert meta["clip_fraction"].item() == 0.0


def test_loss_cispo_hand_values():
    loss, meta = compute_policy_gradient_loss(A, LOGP, "cispo", old_log_probs=OLD, cliprange=0.2)
    weights = torch.tensor([[1.0, e(-1)], [1.2, e(-2)]])  # min(w, 1.2)
    torch.testing.assert_close(loss, -weights * A.unsqueeze(-1) * LOGP)
    assert meta["clip_fraction"].item() == pytest.approx(0.25)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(importance_reweighting_method="grpo", cliprange=0.2), "needs old_log_probs"),
        (dict(importance_reweighting_method="grpo", old_log_probs=OLD), "needs cliprange"),
        (dict(importance_reweighting_method="clip", old_log_probs=OLD), "needs cliprange"),
        (dict(importance_reweighting_method="gspo", old_log_probs=OLD), "needs cliprange"),
        (dict(importance_reweighting_method="ppo"), "importance_reweighting_method='ppo'"),
        (dict(importance_reweighting_method="noclip", old_log_probs=OLD[:1]), "old_log_probs has shape"),
        (dict(response_mask=torch.ones(2, 3)), "response_mask has shape"),
        (dict(importance_reweighting_method="noclip", old_log_probs=OLD + float("inf")), "old_log_probs contains"),
    ],
)
def test_policy_loss_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        compute_policy_gradient_loss(A, LOGP, **kwargs)


def test_policy_loss_bad_advantages_and_nan_logprobs():
    with pytest.raises(ValueError, match="raw_rewards_or_advantages has shape"):
        compute_policy_gradient_loss(torch.ones(3), LOGP)
    with pytest.raises(ValueError, match="policy_log_probs contains"):
        compute_policy_gradient_loss(A, torch.tensor([[float("nan"), 0.0], [0.0, 0.0]]))
    # NaN on a masked-out (padding) position is allowed
    mask = torch.tensor([[False, True], [True, True]])
    loss, _ = compute_policy_gradient_loss(A, torch.tensor([[float("nan"), -1.0], [-1.0, -1.0]]), response_mask=mask)
    assert torch.isfinite(aggregate_loss_across_microbatch(loss, mask))


# ---------------------------------------------------------------------------------------------------
# Aggregation, masked reductions, entropy, KL.

LOSS = torch.tensor([[1.0, 3.0, 5.0], [2.0, 4.0, 100.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def test_aggregate_hand_values():
    assert aggregate_loss_across_microbatch(LOSS, MASK).item() == pytest.approx((3.0 + 3.0) / 2)
    assert aggregate_loss_across_microbatch(LOSS, MASK, "constant", 10).item() == pytest.approx(15 / 10)
    assert aggregate_loss_across_microbatch(LOSS, MASK, "token").item() == pytest.approx(15 / 5)
    assert aggregate_loss_across_microbatch(LOSS, MASK, "token", normalization_constant=6).item() == pytest.approx(2.5)
    # an empty response counts as a sequence with loss 0
    empty = torch.tensor([[1, 1, 1], [0, 0, 0]])
    assert aggregate_loss_across_microbatch(LOSS, empty).item() == pytest.approx(1.5)
    with pytest.raises(ValueError, match="positive normalization_constant"):
        aggregate_loss_across_microbatch(LOSS, MASK, "constant")
    with pytest.raises(ValueError, match="loss_normalization='mean'"):
        aggregate_loss_across_microbatch(LOSS, MASK, "mean")
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate_loss_across_microbatch(LOSS, MASK[:, :2])


def test_masked_mean_and_normalize():
    t = torch.tensor([[1.0, 2.0, float("nan")], [3.0, 4.0, 5.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(t, m).item() == pytest.approx(11 / 4)
    torch.testing.assert_close(masked_mean(t, m, dim=1), torch.tensor([1.5, 4.0]))
    torch.testing.assert_close(masked_mean(t, m, dim=0), torch.tensor([2.0, 2.0, 5.0]))
    assert masked_normalize(t, m, normalize_constant=2.0).item() == pytest.approx(5.5)
    torch.testing.assert_close(masked_normalize(t, m, dim=1, normalize_constant=0.5), torch.tensor([6.0, 16.0]))
    torch.testing.assert_close(masked_normalize(t, m, dim=-1), torch.tensor([3.0, 8.0]))


def test_entropy_values_and_extreme_logits():
    torch.testing.assert_close(compute_entropy(torch.zeros(2, 4)), torch.full((2,), math.log(4)))
    p = torch.tensor([0.5, 0.25, 0.25])
    assert compute_entropy(p.log()).item() == pytest.approx(-(p * p.log()).sum().item(), abs=1e-6)
    extreme = torch.tensor([[1e4, -1e4, 0.0], [float("-inf"), 0.0, 0.0], [1e30, 1e30, 1e30]])
    ent = compute_entropy(extreme)
    assert torch.isfinite(ent).all()
    torch.testing.assert_close(ent, torch.tensor([0.0, math.log(2), math.log(3)]), atol=1e-6, rtol=1e-6)
    assert compute_entropy(torch.zeros(2, 3, 5, dtype=torch.bfloat16)).dtype == torch.float32


def test_kl_penalty_estimators():
    pol = torch.tensor([-1.0, -2.0])
    ref = torch.tensor([-2.0, -1.0])  # log r = ref - pol = [-1, 1]
    torch.testing.assert_close(kl_penalty(pol, ref, "k1"), torch.tensor([1.0, -1.0]))
    torch.testing.assert_close(kl_penalty(pol, ref, "k2"), torch.tensor([0.5, 0.5]))
    torch.testing.assert_close(kl_penalty(pol, ref, "k3"), torch.tensor([e(-1) - 1 + 1, e(1) - 1 - 1]))
    assert (kl_penalty(torch.randn(100), torch.randn(100)) >= 0).all()
    with pytest.raises(ValueError, match="estimator='k4'"):
        kl_penalty(pol, ref, "k4")


def test_kl_estimators_agree_in_expectation_with_exact_kl():
    # Sample from pi_theta over 3 actions; k1 and k3 are unbiased for KL(pi_theta || pi_ref).
    torch.manual_seed(0)
    logits_t, logits_r = torch.tensor([1.0, 0.0, -1.0]), torch.tensor([0.0, 0.5, 0.0])
    lp_t, lp_r = logits_t.log_softmax(-1), logits_r.log_softmax(-1)
    exact = (lp_t.exp() * (lp_t - lp_r)).sum().item()
    actions = torch.multinomial(lp_t.exp(), 200_000, replacement=True)
    for est in ("k1", "k3"):
        assert kl_penalty(lp_t[actions], lp_r[actions], est).mean().item() == pytest.approx(exact, abs=3e-3)


# ---------------------------------------------------------------------------------------------------
# Autograd gradient == closed-form estimator of seed 004, for every weighting and every aggregation.

B, T = 6, 7


def _random_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(B, T, generator=g) * 3 - 0.05
    old = logp + torch.randn(B, T, generator=g) * 0.3
    lengths = torch.tensor([7, 1, 4, 6, 2, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    adv = torch.randn(B, generator=g)
    adv[2] = 0.0  # a zero-advantage rollout
    return logp, old, mask, adv


def _sequence_weights(aggregation: str, mask: torch.Tensor, constant: float) -> torch.Tensor:
    """c_i of d loss / d logp_it = c_i * (per-token loss derivative): how each aggregation weights a token."""
    lengths = mask.sum(-1).float()
    if aggregation == "sequence":
        return 1.0 / (mask.shape[0] * lengths)  # 1/(BG) * 1/len(y), eq. 28
    if aggregation == "sum":
        return torch.full_like(lengths, 1.0 / mask.shape[0])  # 1/(BG), eq. 14 and 20
    if aggregation == "constant":
        return torch.full_like(lengths, 1.0 / constant)  # 1/Z, eq. 33
    return torch.full_like(lengths, 1.0 / mask.sum().item())  # DAPO token mean


def _closed_form_gradient(method, logp, old, mask, adv, eps, eps_high, c):
    """Minus the estimator's per-token weight on grad log pi (eq. 14/20/25/28/33/34/43, 56, 59-60, 61, 64-65)."""
    A = adv.unsqueeze(-1)
    w = torch.exp(logp - old)
    m = mask.float()
    ci = c.unsqueeze(-1)
    if method == "none":
        return -ci * A * m
    if method == "noclip":
        return -ci * A * w * m
    if method in ("grpo", "clip"):
        keep = torch.where(A >= 0, w < 1 + eps_high, w > 1 - eps).float()  # eq. 60
        return -ci * keep * w * A * m
    if method == "cispo":
        return -ci * torch.clamp(w, max=1 + eps_high) * A * m
    if method == "gspo":
        L = mask.sum(-1, keepdim=True).float()
        s = torch.exp(((logp - old) * m).sum(-1, keepdim=True) / L)
        keep = torch.where(A >= 0, s < 1 + eps_high, s > 1 - eps).float()
        # the sequence value is repeated on its L tokens, so aggregation weighs it by L * c_i; eq. 65
        return -ci * L * keep * A * s * m / L
    raise AssertionError(method)


METHODS = ["none", "noclip", "grpo", "clip", "gspo", "cispo"]  # seed 004's four, rlvr's name of grpo, CISPO
AGGREGATIONS = ["sequence", "sum", "constant", "token"]


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_autograd_gradient_equals_closed_form(method, aggregation, seed):
    logp, old, mask, adv = _random_batch(seed)
    eps, eps_high = (0.05, 0.08) if method == "gspo" else (0.2, 0.28)
    logp = logp.clone().requires_grad_(True)
    loss, meta = compute_policy_gradient_loss(
        adv, logp, method, old_log_probs=old, cliprange=eps, response_mask=mask, cliprange_high=eps_high
    )
    constant = 40.0
    agg = aggregate_loss_across_microbatch(loss, mask, aggregation, constant if aggregation == "constant" else None)
    agg.backward()
    expected = _closed_form_gradient(method, logp.detach(), old, mask, adv, eps, eps_high,
                                     _sequence_weights(aggregation, mask, constant))
    torch.testing.assert_close(logp.grad, expected, rtol=1e-5, atol=1e-7)
    if method in ("grpo", "clip", "gspo"):
        # the test data must exercise both branches of the clip, or it proves little
        assert 0.0 < meta["clip_fraction"].item() < 1.0


def test_gspo_sequence_gradient_is_eq_65_written_out():
    # eq. 65 for one sequence: A * s * (1/L) * sum_t grad log pi; check d/d logp_t = -(1/B) A s / L
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = torch.tensor([[-1.3, -1.9, -0.6]])  # log ratios 0.3, -0.1, 0.1: s = e^0.1, inside the clip
    loss, _ = compute_policy_gradient_loss(torch.tensor([0.7]), logp, "gspo", old_log_probs=old, cliprange=0.5)
    aggregate_loss_across_microbatch(loss, torch.ones(1, 3)).backward()
    s = math.exp((0.3 - 0.1 + 0.1) / 3)
    assert s == pytest.approx(1.10517, rel=1e-4)
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -0.7 * s / 3))


def test_kl_gradient_closed_form():
    pol = torch.tensor([-1.0, -0.2, -3.0], requires_grad=True)
    ref = torch.tensor([-1.5, -0.1, -2.0])
    kl_penalty(pol, ref, "k3").sum().backward()
    torch.testing.assert_close(pol.grad, 1 - torch.exp(ref - pol.detach()))


# ---------------------------------------------------------------------------------------------------
# Two code paths that must agree: microbatched vs whole batch, pruned vs unpruned.


def _grad_whole(method, aggregation, logp, old, mask, adv, constant):
    x = logp.clone().requires_grad_(True)
    loss, _ = compute_policy_gradient_loss(adv, x, method, old_log_probs=old, cliprange=0.2, response_mask=mask)
    norm = constant if aggregation == "constant" else None
    aggregate_loss_across_microbatch(loss, mask, aggregation, norm).backward()
    return x.grad


def _grad_rows(method, aggregation, logp, old, mask, adv, constant, row_groups, n_total, total_tokens):
    """Accumulate gradients over row subsets with each aggregation's whole-batch normaliser."""
    x = logp.clone().requires_grad_(True)
    for rows in row_groups:
        rows = torch.tensor(rows)
        loss, _ = compute_policy_gradient_loss(
            adv[rows], x[rows], method, old_log_probs=old[rows], cliprange=0.2, response_mask=mask[rows]
        )
        norm = {"constant": constant, "token": total_tokens, "sequence": None, "sum": None}[aggregation]
        mb = aggregate_loss_across_microbatch(loss, mask[rows], aggregation, norm)
        (mb * L.microbatch_loss_scale(aggregation, len(rows), n_total)).backward()
    return x.grad


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_microbatched_gradient_equals_whole_batch(method, aggregation):
    logp, old, mask, adv = _random_batch(7)
    whole = _grad_whole(method, aggregation, logp, old, mask, adv, 40.0)
    micro = _grad_rows(method, aggregation, logp, old, mask, adv, 40.0, [[0, 1], [2, 3], [4, 5]], B, mask.sum().item())
    uneven = _grad_rows(method, aggregation, logp, old, mask, adv, 40.0, [[0, 1, 2, 3], [4], [5]], B, mask.sum().item())
    torch.testing.assert_close(micro, whole, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(uneven, whole, rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("aggregation", AGGREGATIONS)
def test_pruning_zero_advantage_rollouts_keeps_the_gradient(method, aggregation):
    logp, old, mask, adv = _random_batch(3)
    adv[0] = 0.0
    adv[4] = 0.0
    kept = [i for i in range(B) if adv[i] != 0]
    whole = _grad_whole(method, aggregation, logp, old, mask, adv, 40.0)
    # the normalisers still count the pruned rollouts: N sequences, and every response token
    pruned = _grad_rows(method, aggregation, logp, old, mask, adv, 40.0, [kept], B, mask.sum().item())
    torch.testing.assert_close(pruned, whole, rtol=1e-5, atol=1e-8)
    assert torch.equal(whole[adv == 0], torch.zeros_like(whole[adv == 0]))
    if aggregation != "constant":
        # counting only the kept rollouts would rescale the gradient: the normaliser matters
        wrong = _grad_rows(method, aggregation, logp, old, mask, adv, 40.0, [kept], len(kept), mask[kept].sum().item())
        assert not torch.allclose(wrong, whole)


# ---------------------------------------------------------------------------------------------------
# The preset table.


def test_presets_match_the_assignment_settings():
    P = S.PRESETS
    assert (P["grpo"].baseline, P["grpo"].advantage_normalizer, P["grpo"].loss_normalization) == ("mean", "std", "sequence")
    assert (P["grpo_constant"].advantage_normalizer, P["grpo_constant"].loss_normalization) == ("std", "constant")
    assert (P["dr_grpo"].baseline, P["dr_grpo"].advantage_normalizer, P["dr_grpo"].loss_normalization) == ("mean", "none", "constant")
    assert (P["rft"].baseline, P["rft"].advantage_normalizer, P["rft"].loss_normalization) == ("none", "none", "constant")
    assert (P["maxrl"].baseline, P["maxrl"].advantage_normalizer, P["maxrl"].loss_normalization) == ("mean", "mean", "constant")
    assert P["reinforce"].baseline == "none" and P["reinforce_with_baseline"].baseline == "mean"
    assert P["offpolicy_naive"].importance_reweighting_method == "none" and P["offpolicy_naive"].steps_per_rollout > 1
    assert P["offpolicy_noclip"].importance_reweighting_method == "noclip"
    assert (P["offpolicy_clip"].importance_reweighting_method, P["offpolicy_clip"].cliprange) == ("clip", 0.2)
    assert (P["offpolicy_gspo"].importance_reweighting_method, P["offpolicy_gspo"].cliprange) == ("gspo", 3e-4)
    assert P["cispo"].importance_reweighting_method == "cispo"
    assert (P["dapo"].cliprange, P["dapo"].cliprange_high, P["dapo"].loss_normalization) == (0.2, 0.28, "token")
    for name in ["reinforce", "reinforce_with_baseline", "grpo", "grpo_constant", "dr_grpo", "rft", "maxrl",
                 "grpo_clip", "offpolicy_naive", "offpolicy_noclip", "offpolicy_clip", "offpolicy_gspo", "cispo", "dapo"]:
        assert name in P


def test_unknown_preset_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown algorithm 'ppo'; valid: reinforce, .*dr_grpo.*dapo"):
        S.get_preset("ppo")
    with pytest.raises(ValueError, match="needs cliprange"):
        S.Preset("mean", "std", "clip", "sequence").validate()


def test_seed_name_of_the_clip_and_rlvr_name_are_one_method():
    # "grpo" is seed 004's name of the PPO clip (issue 37 had removed it; issue 56 restored it), "clip" rlvr's
    seed, seed_meta = compute_policy_gradient_loss(A, LOGP, "grpo", old_log_probs=OLD, cliprange=0.2)
    own, own_meta = compute_policy_gradient_loss(A, LOGP, "clip", old_log_probs=OLD, cliprange=0.2)
    assert torch.equal(seed, own) and seed_meta.keys() == own_meta.keys()
    assert all(torch.equal(seed_meta[k], own_meta[k]) for k in seed_meta)
    from rlvr.config import TrainConfig, load_config

    cfg = load_config(TrainConfig, overrides={"algorithm": "offpolicy_naive", "importance_reweighting_method": "grpo",
                                              "cliprange": 0.2})
    assert cfg.estimator.importance_reweighting_method == "grpo" and cfg.estimator.needs_old_log_probs


def test_rollout_correction_weights_by_hand():
    """Issue 36 item 2: rho_t = pi_old / mu per token; truncated (TIS) or masked (IcePop) per token or sequence."""
    import math

    from rlvr.algorithms.estimators import ROLLOUT_CORRECTIONS
    from rlvr.algorithms.losses import rollout_correction_weights
    from rlvr.config import RolloutCorrectionMode

    assert ROLLOUT_CORRECTIONS == typing.get_args(RolloutCorrectionMode)  # the config's copy of the names
    old = torch.log(torch.tensor([[0.6, 0.5, 0.2, 0.9], [0.3, 0.3, 0.3, 0.3]]))
    mu = torch.log(torch.tensor([[0.1, 0.5, 0.5, 0.9], [0.3, 0.75, 0.3, 0.3]]))
    mu[1, 2] = float("nan")  # an unknown sampling log-prob: rho = 1
    mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
    # rho: [[6, 1, 0.4, -], [1, 0.4, (unknown) 1, 1]]
    w, meta = rollout_correction_weights(old, mu, mask, "token_tis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 1.0, 0.4, 0.0], [1.0, 0.4, 1.0, 1.0]]))
    assert int(meta["capped"]) == 1 and int(meta["tokens"]) == 7 and int(meta["known_tokens"]) == 6
    k3 = sum(r - 1 - math.log(r) for r in (6.0, 1.0, 0.4, 1.0, 0.4, 1.0))
    assert float(meta["mismatch_k3"]) == pytest.approx(k3, rel=1e-5)
    assert float(meta["max_abs_log_ratio"]) == pytest.approx(math.log(6.0), rel=1e-5)
    assert int(meta["outside_band"]) == 3  # 6, 0.4, 0.4 leave [0.5, 2]
    w, meta = rollout_correction_weights(old, mu, mask, "token_mask", band=(0.6, 2.0))
    torch.testing.assert_close(w, torch.tensor([[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]]))
    assert int(meta["masked"]) == 3
    # per sequence: row 0's rho = 6 * 1 * 0.4 = 2.4, row 1's = 0.4
    w, _ = rollout_correction_weights(old, mu, mask, "sequence_tis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 2.0, 2.0, 0.0], [0.4, 0.4, 0.4, 0.4]]))
    w, _ = rollout_correction_weights(old, mu, mask, "sequence_mask", band=(0.3, 2.0))
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.0, 0.0, 0.0], [0.4, 0.4, 0.4, 0.4]]))
    w, _ = rollout_correction_weights(old, mu, mask, "none")
    torch.testing.assert_close(w, mask.float())
    with pytest.raises(ValueError, match="mode='tis'"):
        rollout_correction_weights(old, mu, mask, "tis")

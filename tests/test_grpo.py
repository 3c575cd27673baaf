"""grpo_train_step on a tiny model: the update equals the naive whole-batch gradient, for every aggregation
and weighting, with microbatching and pruning on; zero-advantage rollouts never reach the model."""

import copy

import pytest
import torch

from conftest import run_update
from rlvr.algorithms.estimators import compute_group_normalized_rewards
from rlvr.algorithms.losses import aggregate_loss_across_microbatch, compute_policy_gradient_loss
from rlvr.algorithms.policy import tokenize_prompt_and_output
from rlvr.algorithms.train_step import grpo_train_step
from rlvr.algorithms.update import NonFiniteLoss
from rlvr.tasks.rewards import r1_zero_reward_fn

G = 3
PROMPTS = ["Q: 2+2?\nA: <think>", "Q: 3+4?\nA: <think>", "Q: 9-1?\nA: <think>"]
TRUTHS = ["4", "7", "8"]
RESPONSES = [
    # group 0: one right, two wrong -> advantages nonzero
    " 2+2=4 </think> <answer> 4 </answer>", " five </think> <answer> 5 </answer>", " no idea",
    # group 1: all wrong -> zero spread, pruned
    " </think> <answer> 1 </answer>", " hmm", " 3+4=8 </think> <answer> 8 </answer>",
    # group 2: two right (different lengths), one wrong
    " 8 </think> <answer> 8 </answer>", " nine minus one is eight </think> <answer> 8 </answer>", " 7",
]
REPEATED_PROMPTS = [p for p in PROMPTS for _ in range(G)]
REPEATED_TRUTHS = [t for t in TRUTHS for _ in range(G)]


def _sgd(model):
    return torch.optim.SGD(model.parameters(), lr=1.0)


def _reference_gradient(model, tokenizer, method, old, cliprange, normalization, constant, normalizer):
    """Seed 004's math written plainly: one whole-batch forward, full log-softmax, no pruning."""
    model = copy.deepcopy(model)
    raw = torch.tensor([r1_zero_reward_fn(r, t)["reward"] for r, t in zip(RESPONSES, REPEATED_TRUTHS)])
    adv, _ = compute_group_normalized_rewards(raw, G, advantage_normalizer=normalizer)
    batch = tokenize_prompt_and_output(REPEATED_PROMPTS, RESPONSES, tokenizer)
    logp = torch.log_softmax(model(input_ids=batch["input_ids"]).logits, -1)
    logp = logp.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    loss, _ = compute_policy_gradient_loss(adv, logp, method, old_log_probs=old, cliprange=cliprange,
                                           response_mask=batch["response_mask"])
    total = aggregate_loss_across_microbatch(loss, batch["response_mask"], normalization, constant)
    total.backward()
    return total.detach(), {n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                            for n, p in model.named_parameters()}, adv


def _old_log_probs(model, tokenizer, seed=0):
    batch = tokenize_prompt_and_output(REPEATED_PROMPTS, RESPONSES, tokenizer)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=batch["input_ids"]).logits, -1)
        logp = logp.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    g = torch.Generator().manual_seed(seed)
    return logp + 0.3 * torch.randn(logp.shape, generator=g)


@pytest.mark.parametrize("normalization", ["sequence", "constant", "token"])
@pytest.mark.parametrize("method", ["none", "noclip", "grpo", "gspo", "cispo"])  # seed 004's names
def test_update_equals_whole_batch_gradient(tiny_model, tokenizer, normalization, method):
    constant = 500.0 if normalization == "constant" else None
    old = None if method == "none" else _old_log_probs(tiny_model, tokenizer)
    cliprange = {"grpo": 0.2, "gspo": 0.05, "cispo": 0.2}.get(method)
    ref_loss, ref_grads, adv = _reference_gradient(tiny_model, tokenizer, method, old, cliprange, normalization,
                                                   constant, "std")
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    loss, meta = grpo_train_step(
        tiny_model, tokenizer, _sgd(tiny_model), gradient_accumulation_steps=4, max_grad_norm=None,
        reward_fn=r1_zero_reward_fn, repeated_prompts=REPEATED_PROMPTS, rollout_responses=RESPONSES,
        repeated_ground_truths=REPEATED_TRUTHS, group_size=G, importance_reweighting_method=method,
        old_log_probs=old, cliprange=cliprange, loss_normalization=normalization, normalization_constant=constant)
    assert (adv[3:6] == 0).all() and meta["trained_rollouts"] == 6
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-6)
    for name, p in tiny_model.named_parameters():
        torch.testing.assert_close(before[name] - p.detach(), ref_grads[name], rtol=1e-4, atol=1e-6)
        assert p.grad is None  # cleared after the step
    assert meta["train_reward"] == pytest.approx(3 / 9) and meta["train_format_reward"] == pytest.approx(6 / 9)
    if method in ("grpo", "gspo", "cispo"):
        assert 0.0 <= meta["clip_fraction"] <= 1.0


@pytest.mark.parametrize("normalizer", ["none", "mean"])
def test_dr_grpo_and_maxrl_updates(tiny_model, tokenizer, normalizer):
    ref_loss, ref_grads, _ = _reference_gradient(tiny_model, tokenizer, "none", None, None, "constant", 300.0, normalizer)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    loss, _ = grpo_train_step(tiny_model, tokenizer, _sgd(tiny_model), 2, None, r1_zero_reward_fn, REPEATED_PROMPTS,
                              RESPONSES, REPEATED_TRUTHS, G, advantage_normalizer=normalizer,
                              loss_normalization="constant", normalization_constant=300.0)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-7)
    for name, p in tiny_model.named_parameters():
        torch.testing.assert_close(before[name] - p.detach(), ref_grads[name], rtol=1e-4, atol=1e-7)


def test_zero_advantage_rollouts_never_reach_the_model(tiny_model, tokenizer):
    rows_seen = []  # rows of the forward passes that build a graph (grpo_train_step scores the rest for entropy)
    tiny_model.get_input_embeddings().register_forward_hook(
        lambda m, i, o: rows_seen.append(i[0].shape[0]) if torch.is_grad_enabled() else None)
    # RFT: baseline none -> every wrong rollout has zero advantage; 3 right ones remain
    _, meta = grpo_train_step(tiny_model, tokenizer, _sgd(tiny_model), 9, None, r1_zero_reward_fn, REPEATED_PROMPTS,
                              RESPONSES, REPEATED_TRUTHS, G, baseline="none", advantage_normalizer="none",
                              loss_normalization="constant", normalization_constant=100.0)
    assert sum(rows_seen) == 3 and meta["trained_rollouts"] == 3 and meta["pruned_fraction"] == pytest.approx(6 / 9)
    # microbatch size stays ceil(9 / 9) = 1, so 3 microbatches remain
    assert meta["microbatches"] == 3


def test_grad_norm_is_reported_before_clipping(tiny_model, tokenizer):
    twin = copy.deepcopy(tiny_model)
    _, free = grpo_train_step(twin, tokenizer, _sgd(twin), 1, None, r1_zero_reward_fn, REPEATED_PROMPTS, RESPONSES,
                              REPEATED_TRUTHS, G)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    _, clipped = grpo_train_step(tiny_model, tokenizer, _sgd(tiny_model), 1, 1e-3, r1_zero_reward_fn,
                                 REPEATED_PROMPTS, RESPONSES, REPEATED_TRUTHS, G)
    assert clipped["grad_norm"] == pytest.approx(free["grad_norm"], rel=1e-5) and free["grad_norm"] > 1e-3
    step = torch.sqrt(sum(((before[n] - p.detach()) ** 2).sum() for n, p in tiny_model.named_parameters()))
    assert step.item() == pytest.approx(1e-3, rel=1e-3)


def test_old_log_probs_shape_and_nonfinite_loss(tiny_model, tokenizer):
    with pytest.raises(ValueError, match="old_log_probs has shape"):
        grpo_train_step(tiny_model, tokenizer, _sgd(tiny_model), 1, None, r1_zero_reward_fn, REPEATED_PROMPTS,
                        RESPONSES, REPEATED_TRUTHS, G, importance_reweighting_method="noclip",
                        old_log_probs=torch.zeros(9, 3))
    batch = tokenize_prompt_and_output(REPEATED_PROMPTS, RESPONSES, tokenizer)
    with torch.no_grad():
        tiny_model.get_input_embeddings().weight[5] = float("nan")
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    with pytest.raises(NonFiniteLoss, match="step skipped"):
        run_update(tiny_model, _sgd(tiny_model), batch, torch.ones(9), 1, 1.0)
    for n, p in tiny_model.named_parameters():
        assert p.grad is None and torch.equal(p.detach().nan_to_num(), before[n].nan_to_num())


def test_kl_term_and_on_policy_ratio(tiny_model, tokenizer):
    batch = tokenize_prompt_and_output(REPEATED_PROMPTS, RESPONSES, tokenizer)
    adv = torch.zeros(9)
    reference = _old_log_probs(tiny_model, tokenizer, seed=1)
    # with zero advantages only the KL term pushes; pruning must not drop those rows
    _, meta = run_update(tiny_model, _sgd(tiny_model), batch, adv, 2, None, beta=0.1, reference_log_probs=reference)
    assert meta["trained_rollouts"] == 9 and meta["kl"] > 0 and meta["grad_norm"] > 0
    # on_policy_ratio: the first update on fresh rollouts has ratio exactly 1, so clipping never binds
    _, meta = run_update(tiny_model, _sgd(tiny_model), batch, torch.linspace(-1, 1, 9), 3, None,
                                     importance_reweighting_method="grpo", cliprange=0.2, on_policy_ratio=True)
    assert meta["clip_fraction"] == 0.0 and meta["ratio_min"] == meta["ratio_max"] == 1.0

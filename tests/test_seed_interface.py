"""Seed 004's public interface, called as the assignment writes it (issue 56): every function of the seed with a
`Literal` argument, imported from `rlvr`, with every literal value the seed's text gives, and the same values
through a config and a sweep file. The seed's signatures:

    compute_group_normalized_rewards(..., baseline: Literal["mean", "none"],
                                     advantage_normalizer: Literal["std", "none", "mean"])
    compute_policy_gradient_loss(..., importance_reweighting_method: Literal["none", "noclip", "grpo", "gspo"])
    aggregate_loss_across_microbatch(..., loss_normalization: Literal["sequence", "constant"])
    grpo_train_step(..., all four)

"grpo" is the seed's name for the PPO clip (eq. 57-60); rlvr's "clip" is the same method.
"""

import copy
import math

import pytest
import torch
import yaml

import rlvr

SEED_LITERALS = {
    "baseline": ("mean", "none"),
    "advantage_normalizer": ("std", "none", "mean"),
    "importance_reweighting_method": ("none", "noclip", "grpo", "gspo"),
    "loss_normalization": ("sequence", "constant"),
}
EPS = 1e-6


@pytest.mark.parametrize("baseline", SEED_LITERALS["baseline"])
@pytest.mark.parametrize("normalizer", SEED_LITERALS["advantage_normalizer"])
def test_group_normalized_rewards_takes_each_seed_literal(baseline, normalizer):
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 0.5, 0.0])
    adv, _ = rlvr.compute_group_normalized_rewards(rewards, 4, baseline=baseline, advantage_eps=EPS,
                                                   advantage_normalizer=normalizer)
    # the seed's formula, group by group in plain Python (torch.std's unbiased estimate, as the seed asks)
    expected = []
    for group in (rewards[:4].tolist(), rewards[4:].tolist()):
        mean = sum(group) / 4
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / 3)
        shifted = [r - (mean if baseline == "mean" else 0.0) for r in group]
        scale = {"std": std + EPS, "mean": mean + EPS, "none": 1.0}[normalizer]
        expected += [s / scale for s in shifted]
    torch.testing.assert_close(adv, torch.tensor(expected), rtol=1e-5, atol=1e-6)


# A = [2, -1]; log ratios [[0, -1], [0.5, -2]]; eps = 0.2
A = torch.tensor([2.0, -1.0])
LOGP = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]])
OLD = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
e = math.exp
EXPECTED_LOSS = {
    "none": [[2.0, 4.0], [-0.5, -3.0]],  # -A log pi
    "noclip": [[-2.0, -2 * e(-1)], [e(0.5), e(-2)]],  # -A w
    # -min(A w, A clip(w, 0.8, 1.2)): row 1's second token (w = e^-2 < 0.8, A < 0) takes the clipped 0.8
    "grpo": [[-2.0, -2 * e(-1)], [e(0.5), 0.8]],
    # s = exp(mean log w): row 0 e^-0.5 (A > 0, unclipped), row 1 e^-0.75 < 0.8 (A < 0, clipped to 0.8)
    "gspo": [[-2 * e(-0.5)] * 2, [0.8, 0.8]],
}


@pytest.mark.parametrize("method", SEED_LITERALS["importance_reweighting_method"])
def test_policy_gradient_loss_takes_each_seed_literal(method):
    old = None if method == "none" else OLD
    loss, meta = rlvr.compute_policy_gradient_loss(A, LOGP, importance_reweighting_method=method,
                                                   old_log_probs=old, cliprange=0.2)
    torch.testing.assert_close(loss, torch.tensor(EXPECTED_LOSS[method]))
    if method == "grpo":
        assert meta["clip_fraction"].item() == pytest.approx(0.25)
        same, same_meta = rlvr.compute_policy_gradient_loss(A, LOGP, "clip", old_log_probs=OLD, cliprange=0.2)
        assert torch.equal(loss, same) and same_meta.keys() == meta.keys()


@pytest.mark.parametrize("normalization", SEED_LITERALS["loss_normalization"])
def test_aggregate_loss_takes_each_seed_literal(normalization):
    per_token = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, False]])
    total = rlvr.aggregate_loss_across_microbatch(per_token, mask, loss_normalization=normalization,
                                                  normalization_constant=4 if normalization == "constant" else None)
    # sequence: mean(1.5, 4) = 2.75; constant: (1 + 2 + 4) / 4 = 1.75
    assert total.item() == pytest.approx({"sequence": 2.75, "constant": 1.75}[normalization])


PROMPTS = ["Q: 2+2?\nA: <think>"] * 2 + ["Q: 9-1?\nA: <think>"] * 2
TRUTHS = ["4", "4", "8", "8"]
RESPONSES = [" 4 </think> <answer> 4 </answer>", " no", " 8 </think> <answer> 8 </answer>", " 7"]
CALLS = [(name, value) for name, values in SEED_LITERALS.items() for value in values]


def _train_step(model, tokenizer, **choices):
    batch = rlvr.tokenize_prompt_and_output(PROMPTS, RESPONSES, tokenizer)
    old = None
    if choices.get("importance_reweighting_method", "none") != "none":
        # a stale policy: the model's own log-probs, shifted per token so the ratios differ from 1
        with torch.no_grad():
            logp = rlvr.get_response_log_probs(model, batch["input_ids"], batch["labels"])["log_probs"]
        old = logp + 0.3 * torch.randn(logp.shape, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    return rlvr.grpo_train_step(model, tokenizer, optimizer, 2, None, rlvr.r1_zero_reward_fn, PROMPTS, RESPONSES,
                                TRUTHS, 2, old_log_probs=old, cliprange=0.2,
                                normalization_constant=64 if choices.get("loss_normalization") == "constant" else None,
                                **choices)


@pytest.mark.parametrize("argument, value", CALLS, ids=[f"{n}={v}" for n, v in CALLS])
def test_grpo_train_step_takes_each_seed_literal(tiny_model, tokenizer, argument, value):
    choices = {argument: value}  # baseline none alone keeps the default std normaliser: the seed's function
    # takes every combination of its literals (rlvr's configs refuse this one; here it warns, 1/eps advantages)
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    twin = copy.deepcopy(tiny_model)
    loss, meta = _train_step(tiny_model, tokenizer, **choices)
    assert math.isfinite(float(loss)) and meta["train_reward"] == pytest.approx(0.5)
    assert any(not torch.equal(before[n], p.detach()) for n, p in tiny_model.named_parameters())
    if value == "grpo":  # the seed's name of the clip makes exactly the update rlvr's "clip" makes
        _, twin_meta = _train_step(twin, tokenizer, importance_reweighting_method="clip")
        assert twin_meta["clip_fraction"] == meta["clip_fraction"]
        for (name, p), q in zip(tiny_model.named_parameters(), twin.parameters()):
            assert torch.equal(p.detach(), q.detach()), name


@pytest.mark.parametrize("argument, value", CALLS, ids=[f"{n}={v}" for n, v in CALLS])
def test_config_and_sweep_file_take_each_seed_literal(tmp_path, argument, value):
    from rlvr.config import TrainConfig, load_config
    from rlvr.experiments.sweep_plan import build_configs, load_sweep

    extra = {"advantage_normalizer": "none"} if (argument, value) == ("baseline", "none") else {}
    base = {"dataset": "arithmetic:steps=1,max=9", "algorithm": "offpolicy_naive", "cliprange": 0.2,
            "rollout_batch_size": 8, "group_size": 4, **extra}
    cfg = load_config(TrainConfig, overrides={**base, argument: value})
    assert getattr(cfg.estimator, argument) == value
    sweep = tmp_path / "seed_literals.yaml"
    sweep.write_text(yaml.safe_dump({"base": base, "grid": {argument: [value]}, "out": str(tmp_path / "runs")}))
    (run,) = build_configs(load_sweep(sweep))
    assert getattr(run.config, argument) == value

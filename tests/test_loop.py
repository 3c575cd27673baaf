"""The RL loop's wiring (issue 21): every preset's choices reach the maths, the KL term pulls toward the
reference, and the learning rate of every optimizer step is the schedule's value. Spies wrap the real
functions (the maths still runs); nothing here is a mock of an estimator."""

import copy
import math

import pytest
import torch

from conftest import run_update
from rlvr import stages
from rlvr.algorithms.policy import tokenize_prompt_and_output
from rlvr.algorithms.spec import PRESETS
from rlvr.training import rl as train_module
from test_train import _cfg, _parity, parity_reward  # noqa: F401 (_parity: the autouse reward with signal in every group)


def _spy(monkeypatch, name, calls):
    # the stage that calls it: score_rollouts computes the advantages, train_on_rollouts runs the update
    module = stages.rollouts if name == "compute_advantages" else stages.learn
    real = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("algorithm", list(PRESETS))
def test_every_preset_reaches_the_advantages_and_the_update(tmp_path, model_dir, monkeypatch, algorithm):
    preset = PRESETS[algorithm]
    extra = {"group_size": 1} if algorithm == "reinforce" else {}
    if preset.mask_truncated_completions:
        extra["mask_truncated_completions"] = False  # the random model's rollouts are all truncated
    advantage_calls, update_calls = [], []
    _spy(monkeypatch, "compute_advantages", advantage_calls)
    _spy(monkeypatch, "policy_gradient_update", update_calls)
    if preset.distill:  # a teacher that differs from the student, or there is nothing to distil
        from conftest import make_model, make_tokenizer

        extra["teacher"] = str(tmp_path / "teacher")
        make_model(len(make_tokenizer()), seed=11).save_pretrained(extra["teacher"])
        make_tokenizer().save_pretrained(extra["teacher"])
    cfg = _cfg(model_dir, tmp_path / algorithm, algorithm=algorithm, steps=2, eval_every=0, eval_at_start=False,
               eval_at_end=False, **extra)
    from rlvr.core.models import load_model

    start = {n: p.detach().clone() for n, p in load_model(cfg.model)[0].named_parameters()}
    train_module.train_grpo(cfg)

    assert len(advantage_calls) == 2
    for args, kwargs in advantage_calls:
        _, group_size, spec = args
        assert (group_size, spec.advantage, spec.baseline, spec.advantage_normalizer, spec.advantage_eps) == (
            cfg.group_size, preset.advantage, preset.baseline, preset.advantage_normalizer, 1e-6)
    assert len(update_calls) == 2 * preset.steps_per_rollout
    for i, (args, kwargs) in enumerate(update_calls):
        _, _, batch, spec, accumulation, max_grad_norm = args
        for name in ("importance_reweighting_method", "cliprange", "cliprange_high", "loss_normalization", "beta",
                     "kl_estimator", "steps_per_rollout", "reward_signal"):
            assert getattr(spec, name) == getattr(preset, name), name
        assert spec.mask_truncated_completions == extra.get("mask_truncated_completions",
                                                            preset.mask_truncated_completions)
        assert kwargs["on_policy_ratio"] == (preset.importance_reweighting_method != "none"
                                             and i % preset.steps_per_rollout == 0)
        assert len(batch) == cfg.rollout_batch_size // preset.steps_per_rollout  # the train batch's rows
        assert accumulation == -(-len(batch) // cfg.microbatch_size) and max_grad_norm == cfg.max_grad_norm
        if preset.loss_normalization == "constant":
            assert spec.normalization_constant == cfg.train_batch_size * cfg.max_new_tokens
    trained = load_model(str(tmp_path / algorithm / "final"))[0]
    moved = max(float((p.detach() - start[n]).abs().max()) for n, p in trained.named_parameters())
    assert moved > 1e-5


def _exact_kl(model, reference, batch) -> float:
    """KL(pi || pi_ref) of the full next-token distributions at the response positions (no sampling)."""
    with torch.no_grad():
        logp = model(input_ids=batch["input_ids"]).logits.log_softmax(-1)
        logq = reference(input_ids=batch["input_ids"]).logits.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1)
    return float(kl[batch["response_mask"]].mean())


@pytest.mark.parametrize("estimator", ["k2", "k3"])
def test_the_kl_term_alone_pulls_the_policy_toward_the_reference(tiny_model, tokenizer, estimator):
    reference = copy.deepcopy(tiny_model)
    with torch.no_grad():  # a policy that has drifted from the reference
        g = torch.Generator().manual_seed(0)
        for p in tiny_model.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g))
    responses = [" 2+2=4 </think> <answer> 4 </answer>", " five", " 3 and 4 make 7", " seven </think>"]
    batch = tokenize_prompt_and_output(["Q: 2+2?\nA: <think>"] * 2 + ["Q: 3+4?\nA: <think>"] * 2, responses, tokenizer)
    with torch.no_grad():
        ref_lp = reference(input_ids=batch["input_ids"]).logits.log_softmax(-1)
        ref_lp = ref_lp.gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    before = _exact_kl(tiny_model, reference, batch)
    for _ in range(5):
        run_update(tiny_model, torch.optim.SGD(tiny_model.parameters(), lr=0.2), batch, torch.zeros(4), 2, None,
                   beta=1.0, reference_log_probs=ref_lp, kl_estimator=estimator)
    after = _exact_kl(tiny_model, reference, batch)
    assert before > 0.05 and after < 0.9 * before  # flipping the sign of the KL term raises it instead


def test_learning_rate_of_every_optimizer_step_is_the_schedule(tmp_path, model_dir, monkeypatch):
    # off-policy: 4 optimizer steps per rollout batch, 3 rollout batches -> 12 steps, warmup 2, cosine to 10 %
    seen = []
    real = stages.learn.policy_gradient_update

    def recording(model, optimizer, *args, **kwargs):
        seen.append(optimizer.param_groups[0]["lr"])
        return real(model, optimizer, *args, **kwargs)

    monkeypatch.setattr(stages.learn, "policy_gradient_update", recording)
    lr, total, warmup, floor = 1e-3, 12, 2, 0.1
    train_module.train_grpo(_cfg(model_dir, tmp_path / "lr", algorithm="offpolicy_clip", steps=3, lr_schedule="cosine",
                                 warmup_steps=warmup, min_lr_ratio=floor, learning_rate=lr, eval_every=0,
                                 eval_at_start=False, eval_at_end=False))

    def schedule(step):  # warmup from 0, then cosine from lr down to floor * lr at the last step
        if step < warmup:
            return lr * step / warmup
        progress = (step - warmup) / (total - warmup)
        return lr * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))

    assert seen == pytest.approx([schedule(s) for s in range(total)], rel=1e-9, abs=1e-15)
    from rlvr.core.tracking import read_jsonl

    logged = [r["train/lr"] for r in read_jsonl(tmp_path / "lr" / "metrics.jsonl")]
    assert logged == pytest.approx([schedule(4), schedule(8), schedule(12)], rel=1e-9)


def test_the_trained_response_is_the_sampled_ids_eos_included(tmp_path, model_dir, tiny_model, tokenizer):
    """Issue 36 item 3: what the update trains (labels under the response mask) is each rollout's sampled ids,
    EOS included when it was sampled, where decoding and re-encoding the text would give other ids."""
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.tasks.records import Example

    cfg = _cfg(model_dir, tmp_path / "run", rollout_batch_size=64, group_size=32, max_new_tokens=40)
    engine = HFEngine(tiny_model, tokenizer, batch_size=64)
    prompts = ["1+2=", "3*4="]
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=40, n=32, seed=3))
    rollouts = stages.Rollouts([Example("1+2", "3"), Example("3*4", "12")], prompts, completions)
    scored = stages.score_rollouts(rollouts, parity_reward, PRESETS["grpo"], cfg, tokenizer)
    batch = scored.batch
    trained = [batch.labels[j][batch.response_mask[j]].tolist() for j in range(len(completions))]
    assert trained == [c.token_ids for c in completions]
    stopped = [c for c in completions if c.finish_reason == "stop"]
    assert stopped and all(c.token_ids[-1] == tokenizer.eos_token_id for c in stopped)  # the decision to stop
    # the text path this replaces trains other ids: EOS dropped, and bytes that are not UTF-8 come back as U+FFFD
    retokenised = tokenize_prompt_and_output([prompts[c.prompt_index] for c in completions],
                                             [c.text for c in completions], tokenizer)
    differs = sum(retokenised["labels"][j][retokenised["response_mask"][j]].tolist() != trained[j]
                  for j in range(len(completions)))
    assert differs >= len(stopped)


def test_every_step_measures_the_rollout_trainer_mismatch_and_corrects_it(tmp_path, model_dir, monkeypatch):
    """Issue 36 item 2: a synchronous run with a bf16 engine and an fp32 learner logs the mismatch of the
    engine's sampling log-probs against the trainer's, and weights the loss by the correction (default
    token_tis); with mode none it is measured and not applied."""
    from rlvr.core import devices
    from rlvr.core.tracking import read_jsonl

    # a CPU without native bf16 kernels runs a bf16 engine in fp32 (no mismatch to measure): keep it bf16 here
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: True)

    runs = {}
    for mode in ("token_tis", "none"):
        out = tmp_path / mode
        train_module.train_grpo(_cfg(model_dir, out, steps=1, eval_every=0, generation_dtype="bfloat16",
                                     **{"rollout_correction.mode": mode}))
        runs[mode] = [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r][-1]
    for row in runs.values():
        assert row["train/mismatch_kl"] > 0 and 0 < row["train/mismatch_max_abs_log_ratio"] < 1
        assert 0 <= row["train/mismatch_outside_band_fraction"] < 1
    tis, none = runs["token_tis"], runs["none"]
    assert tis["train/mismatch_kl"] == none["train/mismatch_kl"]  # the same rollouts, the same policy
    assert 0.9 < tis["train/is_weight_mean"] < 1.1 and tis["train/is_weight_max"] <= 2.0
    assert "train/is_weight_mean" not in none
    assert tis["train/loss"] != none["train/loss"]


def test_an_entropy_bonus_is_logged_as_its_share_of_the_loss(tmp_path, model_dir):
    from rlvr.core.tracking import read_jsonl

    out = tmp_path / "run"
    train_module.train_grpo(_cfg(model_dir, out, steps=2, eval_every=0, entropy_coef=0.01))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/loss" in r]
    assert rows and all(r["train/entropy_loss"] < 0 for r in rows)  # -coef x a positive entropy
    assert all(abs(r["train/entropy_loss"]) <= 0.01 * 12 for r in rows)  # entropy <= log(vocab) ~ 5.6 nats
    assert all(r["train/pruned_fraction"] == 0 for r in rows)  # a loss on every token: nothing is pruned


def test_the_overlong_term_adds_dapos_penalty_on_the_sampled_token_counts(tmp_path, model_dir):
    from rlvr.config import ConfigError
    from rlvr.core.tracking import read_jsonl
    from rlvr.tasks.scoring import soft_overlong_penalty

    out = tmp_path / "run"
    cfg = _cfg(model_dir, out, steps=2, eval_every=0, log_rollouts_every=1, max_new_tokens=12,
               rewards={"r1_zero": 1.0, "overlong": 0.5}, overlong_buffer=4)
    train_module.train_grpo(cfg)
    rows = list(read_jsonl(out / "rollouts.jsonl"))
    assert rows and {r["tokens"] for r in rows} & set(range(9, 13))  # some rollouts reach the buffer
    for r in rows:  # this module's parity reward (its answer_reward), plus the length term
        assert r["reward"] == pytest.approx(r["answer_reward"] + 0.5 * soft_overlong_penalty(r["tokens"], 12, 4))
    logged = [m for m in read_jsonl(out / "metrics.jsonl") if "train/reward" in m]
    assert all("train/reward/overlong" in m and m["train/reward/overlong"] <= 0 for m in logged)
    for bad, message in (({"rewards": {"r1_zero": 1.0, "overlong": 1.0}}, "set overlong_buffer"),
                         ({"overlong_buffer": 4}, "add `overlong: 1.0` to rewards"),
                         ({"rewards": {"overlong": 1.0}, "overlong_buffer": 4}, "no reward to shape"),
                         ({"rewards": {"r1_zero": 1.0, "overlong": 1.0}, "overlong_buffer": 40}, "longer than")):
        with pytest.raises((ConfigError, ValueError), match=message):
            _cfg(model_dir, out, max_new_tokens=12, **bad)

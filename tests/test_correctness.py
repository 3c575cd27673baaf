"""Issue 12's training-correctness review: each test here failed on the code before its fix.

KL reference after resume, empty responses, fully pruned batches, unbiased metrics, presets that match
their equations, correctness-weighted RFT/MaxRL, GSPO metrics, KL-estimator gradients, sampling
temperature, leftover gradients, and clear errors for a new user's mistakes.
"""

import copy
import logging

import pytest
import torch

from conftest import run_update
from rlvr import stages
from rlvr.algorithms import losses as L
from rlvr.algorithms import spec as S
from rlvr.algorithms.estimators import kl_penalty
from rlvr.algorithms.losses import aggregate_loss_across_microbatch, compute_policy_gradient_loss
from rlvr.algorithms.policy import get_response_log_probs, tokenize_prompt_and_output
from rlvr.algorithms.train_step import grpo_train_step
from rlvr.config import ConfigError, SamplingMismatchWarning, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.training import rl as train_module
from test_train import _cfg, _parity, _strip, parity_reward  # noqa: F401 (_parity: the autouse reward)

PROMPTS = ["Q: 2+2?\nA: <think>", "Q: 3+4?\nA: <think>"]


def _batch(tokenizer, responses, prompts=None):
    prompts = prompts or [PROMPTS[i * len(PROMPTS) // len(responses)] for i in range(len(responses))]
    return tokenize_prompt_and_output(prompts, responses, tokenizer)


def _whole_batch_loss(model, batch, advantages, normalization, constant=None, temperature=1.0):
    """Seed 004's step written plainly: one forward of every row, full log-softmax, no pruning."""
    logits = model(input_ids=batch["input_ids"]).logits / temperature
    logp = torch.log_softmax(logits, -1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
    per_token, _ = compute_policy_gradient_loss(advantages, logp, "none", response_mask=batch["response_mask"])
    if normalization == "token":
        constant = float(batch["response_mask"].sum())
    return aggregate_loss_across_microbatch(per_token, batch["response_mask"], normalization, constant)


# ---------------------------------------------------------------------------------------------------
# 1. The KL reference is the starting model, also after a resume.


def test_kill_and_resume_with_a_kl_penalty_keeps_the_starting_model_as_reference(tmp_path, model_dir, crash_at):
    kw = dict(steps=4, save_every=2, beta=0.5, learning_rate=1e-2)
    straight = tmp_path / "straight"
    train_module.train_grpo(_cfg(model_dir, straight, **kw))
    crashed = tmp_path / "crashed"
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_cfg(model_dir, crashed, **kw))
    undo()
    train_module.train_grpo(_cfg(model_dir, crashed, resume=True, **kw))
    rows, expected = _strip(read_jsonl(crashed / "metrics.jsonl")), _strip(read_jsonl(straight / "metrics.jsonl"))
    assert rows == expected
    assert expected[3]["train/kl"] > 0 and expected[4]["train/kl"] > 0


# ---------------------------------------------------------------------------------------------------
# 2. A rollout with no response token (EOS sampled first).


def test_a_microbatch_of_only_empty_responses_contributes_zero(tiny_model, tokenizer):
    responses = ["", " 4 </think> <answer> 4 </answer>", "", " five"]
    batch = _batch(tokenizer, responses)
    assert not batch["response_mask"][0].any() and not batch["response_mask"][2].any()
    advantages = torch.tensor([1.5, -0.5, 0.7, -0.7])
    for normalization in ("sequence", "sum", "constant", "token"):
        reference = copy.deepcopy(tiny_model)
        _whole_batch_loss(reference, batch, advantages, normalization, 50.0).backward()
        model = copy.deepcopy(tiny_model)
        sgd = torch.optim.SGD(model.parameters(), lr=1.0)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        # microbatches of one row: two of them hold nothing but an empty response
        _, meta = run_update(model, sgd, batch, advantages, 4, None, loss_normalization=normalization,
                                         normalization_constant=50.0)
        assert meta["trained_rollouts"] == 2
        for (name, p), (_, r) in zip(model.named_parameters(), reference.named_parameters()):
            torch.testing.assert_close(before[name] - p.detach(), r.grad, rtol=1e-4, atol=1e-7)


def test_grpo_train_step_survives_a_rewarded_empty_response(tiny_model, tokenizer):
    def reward(response, truth):
        return {"reward": float(response == ""), "format_reward": 0.0, "answer_reward": float(response == "")}

    _, meta = grpo_train_step(tiny_model, tokenizer, torch.optim.SGD(tiny_model.parameters(), lr=0.1), 2, None,
                              reward, [PROMPTS[0]] * 2, ["", " x"], ["4", "4"], 2)
    assert meta["trained_rollouts"] == 1 and meta["grad_norm"] > 0


# ---------------------------------------------------------------------------------------------------
# 3. A fully pruned batch takes the same (zero-gradient) optimizer step as the unpruned reference.


@pytest.mark.parametrize("normalization", ["sequence", "sum", "constant", "token"])
def test_fully_pruned_batch_gives_the_unpruned_adamw_update(tiny_model, tokenizer, normalization):
    responses = [" 4 </think> <answer> 4 </answer>", " five", " 7 </think>", " seven </think> <answer> 7 </answer>"]
    batch = _batch(tokenizer, responses)
    models = [copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)]
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.1) for m in models]
    signal, nothing = torch.tensor([1.0, -1.0, 0.5, -0.5]), torch.zeros(4)
    for advantages in (signal, nothing, nothing):
        before = [p.detach().clone() for p in models[0].parameters()]
        # rlvr's step on models[0]; seed 004's whole-batch step on models[1]
        run_update(models[0], optimizers[0], batch, advantages, 2, 1.0, loss_normalization=normalization, normalization_constant=40.0)
        optimizers[1].zero_grad()
        _whole_batch_loss(models[1], batch, advantages, normalization, 40.0).backward()
        torch.nn.utils.clip_grad_norm_(models[1].parameters(), 1.0)
        optimizers[1].step()
        optimizers[1].zero_grad()
        # Adam turns rounding-level differences of near-zero gradients into steps of up to ~lr/1000; a skipped
        # step differs by up to lr
        for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
            torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=2e-4, msg=name)
        moved = max(float((p.detach() - b).abs().max()) for p, b in zip(models[0].parameters(), before))
        assert moved > 5e-3  # momentum and weight decay move the weights even on a zero gradient
    steps = [[float(s["step"]) for s in o.state_dict()["state"].values()] for o in optimizers]
    assert steps[0] == steps[1] and set(steps[0]) == {3.0}


@pytest.mark.parametrize("normalization", ["sequence", "token"])
def test_the_entropy_bonus_is_the_whole_batch_loss_minus_coef_times_its_aggregated_entropy(tiny_model, tokenizer,
                                                                                          normalization):
    # issue 39.3: microbatched, with zero-advantage rows (pruned without a bonus: here every row has a loss), the
    # step equals seed 004's whole-batch loss plus -coef x the entropy aggregated the same way, to SGD precision
    responses = [" 4 </think> <answer> 4 </answer>", " five", " 7 </think>", " seven </think> <answer> 7 </answer>"]
    batch, coef = _batch(tokenizer, responses), 0.3
    advantages = torch.tensor([1.0, 0.0, 0.0, -1.0])
    models = [copy.deepcopy(tiny_model), copy.deepcopy(tiny_model)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=1.0) for m in models]
    _, meta = run_update(models[0], optimizers[0], batch, advantages, 2, None, loss_normalization=normalization,
                         entropy_coef=coef)
    assert meta["trained_rollouts"] == 4 and meta["pruned_fraction"] == 0  # the bonus reaches every row
    logits = models[1](input_ids=batch["input_ids"]).logits.float()
    entropy = torch.logsumexp(logits, -1) - (torch.softmax(logits, -1) * logits).sum(-1)
    constant = float(batch["response_mask"].sum()) if normalization == "token" else None
    bonus = aggregate_loss_across_microbatch(-coef * entropy, batch["response_mask"], normalization, constant)
    (_whole_batch_loss(models[1], batch, advantages, normalization) + bonus).backward()
    optimizers[1].step()
    assert meta["entropy_loss"] == pytest.approx(float(bonus), rel=1e-5)  # its share of the loss, logged
    for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=0, atol=1e-5, msg=name)


# ---------------------------------------------------------------------------------------------------
# 4. Unbiased metrics, no false alarms.


def test_grpo_train_step_entropy_is_the_whole_batch(tiny_model, tokenizer):
    responses = [" 4 </think> <answer> 4 </answer>", " five", " 7 </think> <answer> 7 </answer>", " hmm"]
    truths = ["4", "4", "7", "7"]
    prompts = [PROMPTS[0]] * 2 + [PROMPTS[1]] * 2
    with torch.no_grad():  # sharpen the random model, so that entropy differs from row to row
        tiny_model.get_input_embeddings().weight.mul_(25.0)
    batch = tokenize_prompt_and_output(prompts, responses, tokenizer)
    with torch.no_grad():
        entropy = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], True)["token_entropy"]
    expected = float((entropy * batch["response_mask"]).sum() / batch["response_mask"].sum())
    from rlvr.tasks.rewards import r1_zero_reward_fn

    # RFT (baseline none): only the two right answers are trained; the entropy is still the batch's
    _, meta = grpo_train_step(tiny_model, tokenizer, torch.optim.SGD(tiny_model.parameters(), lr=0.0), 4, None,
                              r1_zero_reward_fn, prompts, responses, truths, 2, baseline="none",
                              advantage_normalizer="none", loss_normalization="constant", normalization_constant=9.0)
    assert meta["trained_rollouts"] == 2
    assert meta["token_entropy"] == pytest.approx(expected, rel=1e-5)
    trained = batch["response_mask"][[0, 2]]
    assert meta["trained_token_entropy"] == pytest.approx(float((entropy[[0, 2]] * trained).sum() / trained.sum()),
                                                          rel=1e-5)
    assert abs(meta["trained_token_entropy"] - expected) > 5e-4  # 10x the tolerance above


def test_rollout_entropy_matches_a_scoring_pass_at_the_sampling_temperature(tiny_model, tokenizer):
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    c = HFEngine(tiny_model, tokenizer).generate(PROMPTS[:1], SamplingParams(
        temperature=0.7, max_new_tokens=8, logprobs=True, entropy=True, seed=3))[0]
    ids = tokenizer(PROMPTS[0], add_special_tokens=False).input_ids + c.token_ids
    with torch.no_grad():
        log_p = (tiny_model(torch.tensor([ids])).logits[0, :-1] / 0.7).log_softmax(-1)[-len(c.token_ids):]
    entropy = -(log_p.exp() * log_p).sum(-1)
    torch.testing.assert_close(torch.tensor(c.entropies), entropy, atol=1e-4, rtol=1e-4)
    chosen = log_p.gather(-1, torch.tensor(c.token_ids).unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(torch.tensor(c.logprobs), chosen, atol=1e-4, rtol=1e-4)


def test_steps_that_train_nothing_log_no_update_metrics_and_raise_no_alarm(tmp_path, model_dir, monkeypatch, caplog):
    calls = {"n": 0}

    def signal_then_none(response, truth):  # step 1 has reward spread, later steps none
        calls["n"] += 1
        return parity_reward(response, truth) if calls["n"] <= 8 else {"reward": 1.0, "format_reward": 1.0,
                                                                          "answer_reward": 1.0}

    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: signal_then_none)
    with caplog.at_level(logging.WARNING):
        train_module.train_grpo(_cfg(model_dir, tmp_path / "run", steps=4, eval_every=0, eval_at_start=False,
                                     eval_at_end=False))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert rows[0]["train/updates_trained"] == 1 and "train/loss" in rows[0]
    for row in rows[1:]:
        assert row["train/updates_trained"] == 0 and row["train/frac_groups_zero_std"] == 1.0
        assert "train/loss" not in row and "train/grad_norm" not in row
        assert row["train/token_entropy"] > 0.5 * rows[0]["train/token_entropy"]  # the sampler's, not 0
        # the only alarm a signal-free step may raise is the one about having no signal
        assert all("no reward spread" in w for w in row.get("warnings", []))
    assert not [r for r in caplog.records if "entropy collapsing" in r.getMessage()]


def test_monitor_alarms_on_entropy_only_for_steps_that_trained():
    monitor = stages.RunMonitor(max_new_tokens=10)
    monitor.check({"train/token_entropy": 2.0})
    assert monitor.check({"train/token_entropy": 0.1, "train/kl": 9.0}, trained=False) == []
    assert any("entropy collapsing" in w for w in monitor.check({"train/token_entropy": 0.1}, trained=True))


# ---------------------------------------------------------------------------------------------------
# 5. Presets aggregate as the equations they cite.


def test_reinforce_presets_are_eq_14_and_20_sum_over_tokens():
    # eq. 14: g = 1/(BG) sum_i r_i grad sum_t log pi(y_it): d loss / d log pi(y_it) = -r_i / N, whatever the length
    logp = torch.zeros(3, 4, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 2.0, -1.0])
    for name in ("reinforce", "reinforce_with_baseline"):
        preset = S.PRESETS[name]
        logp.grad = None
        per_token, _ = compute_policy_gradient_loss(rewards, logp, preset.importance_reweighting_method,
                                                    response_mask=mask)
        aggregate_loss_across_microbatch(per_token, mask, preset.loss_normalization).backward()
        torch.testing.assert_close(logp.grad, (-rewards / 3).unsqueeze(-1).expand(3, 4) * mask)


def test_sum_aggregation_microbatches_add_up_to_the_batch():
    per_token, mask = torch.arange(12.0).view(3, 4), torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0]]).bool()
    whole = aggregate_loss_across_microbatch(per_token, mask, "sum")
    assert float(whole) == pytest.approx((0 + 1 + 4 + 5 + 6 + 8) / 3)
    parts = sum(aggregate_loss_across_microbatch(per_token[i : i + 1], mask[i : i + 1], "sum")
                * L.microbatch_loss_scale("sum", 1, 3) for i in range(3))
    torch.testing.assert_close(parts, whole)


# ---------------------------------------------------------------------------------------------------
# 6. RFT and MaxRL weight by correctness, whatever shaping the reward has.


@pytest.mark.parametrize("algorithm,expect_correctness", [("rft", True), ("maxrl", True), ("grpo", False)])
def test_rft_and_maxrl_use_correctness_not_the_shaped_reward(tmp_path, model_dir, monkeypatch, algorithm,
                                                             expect_correctness):
    def shaped(response, truth):  # correct half the time, a 0.2 format bonus on a third of the responses
        right = parity_reward(response, truth)["reward"]
        bonus = 0.2 * float(len(response) % 3 == 0)
        return {"reward": right + bonus, "format_reward": float(bonus > 0), "answer_reward": right}

    seen = []
    real = stages.rollouts.compute_advantages

    def spy(raw_rewards, *args, **kwargs):
        seen.append(raw_rewards.clone())
        return real(raw_rewards, *args, **kwargs)

    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: shaped)
    monkeypatch.setattr(stages.rollouts, "compute_advantages", spy)
    train_module.train_grpo(_cfg(model_dir, tmp_path / algorithm, algorithm=algorithm, steps=2, eval_every=0,
                                 eval_at_start=False, eval_at_end=False, log_rollouts_every=1))
    logged = read_jsonl(tmp_path / algorithm / "rollouts.jsonl")
    answers = torch.tensor([r["answer_reward"] for r in logged])
    shaped_rewards = torch.tensor([r["reward"] for r in logged])
    assert not torch.equal(answers, shaped_rewards)  # the bonus did shape some rewards
    torch.testing.assert_close(torch.cat(seen), answers if expect_correctness else shaped_rewards)
    if algorithm == "rft":  # formatted-but-wrong answers are never reinforced
        assert all(r["advantage"] == 0 for r in logged if r["answer_reward"] == 0)


# ---------------------------------------------------------------------------------------------------
# 7. GSPO metrics.


def test_gspo_metrics_with_an_empty_row_are_finite_and_per_sequence():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [0.0, 0.0, 0.0], [-1.0, 0.0, 0.0]])
    old = logp - torch.tensor([[0.5, 0.5, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0], [1, 0, 0]], dtype=torch.bool)
    loss, meta = compute_policy_gradient_loss(torch.ones(3), logp, "gspo", old_log_probs=old, cliprange=0.1,
                                              response_mask=mask)
    assert torch.isfinite(loss).all()
    # sequence ratios exp(0.5) (clipped) and 1 (not); the empty row is in neither statistic
    assert float(meta["clip_fraction"]) == pytest.approx(0.5)
    assert float(meta["ratio_max"]) == pytest.approx(torch.e ** 0.5) and float(meta["ratio_min"]) == 1.0
    assert float(meta["ratio_mean"]) == pytest.approx((torch.e ** 0.5 + 1) / 2)


def test_gspo_clip_fraction_across_microbatches_counts_sequences(tiny_model, tokenizer):
    responses = [" a long answer that runs on </think> <answer> 4 </answer>", " 4"]
    batch = _batch(tokenizer, responses)
    with torch.no_grad():
        current = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"])["log_probs"]
    old = current.clone()
    old[0] -= 0.5  # the long row's sequence ratio is e^0.5: clipped; the short row's is 1
    _, meta = run_update(tiny_model, torch.optim.SGD(tiny_model.parameters(), lr=0.0), batch, torch.ones(2), 2, None,
                         "gspo", old, cliprange=0.1)
    assert meta["clip_fraction"] == pytest.approx(0.5)  # one sequence of two, not 0.9 of the tokens


# ---------------------------------------------------------------------------------------------------
# 8. KL estimators as loss terms: their expected gradients on an exact categorical distribution.


def test_kl_estimator_expected_gradients_and_the_default():
    theta = torch.tensor([0.3, -0.2, 1.0, 0.0, -1.5], requires_grad=True)
    ref_logp = torch.tensor([0.0, 0.5, -0.5, 0.2, 0.0]).log_softmax(-1)

    def exact(kl):
        theta.grad = None
        logp = theta.log_softmax(-1)
        p, q = logp.exp(), ref_logp.exp()
        (p * (logp - ref_logp)).sum().backward() if kl == "reverse" else (q * (ref_logp - logp)).sum().backward()
        return theta.grad.clone()

    def expected_gradient(estimator):  # E_{y ~ pi_theta}[grad k(y)], every y weighted by its (fixed) probability
        theta.grad = None
        logp = theta.log_softmax(-1)
        weights = logp.exp().detach()
        (weights * kl_penalty(logp, ref_logp, estimator)).sum().backward()
        return theta.grad.clone()

    torch.testing.assert_close(expected_gradient("k1"), torch.zeros(5), atol=1e-6, rtol=0)
    torch.testing.assert_close(expected_gradient("k2"), exact("reverse"))
    torch.testing.assert_close(expected_gradient("k3"), exact("forward"))
    assert not torch.allclose(exact("reverse"), exact("forward"), atol=1e-3)
    assert S.Preset("mean", "std", "none", "sequence").kl_estimator == "k2"
    assert load_config(TrainConfig, overrides={"beta": 0.1}).kl_estimator == "k2"


# ---------------------------------------------------------------------------------------------------
# 9. Rollouts sampled at temperature T are scored at T.


def test_log_probs_and_update_at_the_sampling_temperature(tiny_model, tokenizer):
    batch = _batch(tokenizer, [" 4 </think> <answer> 4 </answer>", " five", " 7", " 8 </think>"])
    with torch.no_grad():
        logits = tiny_model(input_ids=batch["input_ids"]).logits
        expected = (logits / 0.6).log_softmax(-1).gather(-1, batch["labels"].unsqueeze(-1)).squeeze(-1)
        scored = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], temperature=0.6,
                                        positions=batch["response_mask"], share_prefix=True)["log_probs"]
    mask = batch["response_mask"]
    torch.testing.assert_close(scored[mask], expected[mask], atol=1e-5, rtol=1e-5)

    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    reference = copy.deepcopy(tiny_model)
    _whole_batch_loss(reference, batch, advantages, "sequence", temperature=0.6).backward()
    before = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    run_update(tiny_model, torch.optim.SGD(tiny_model.parameters(), lr=1.0), batch, advantages, 2, None,
               temperature=0.6)
    for (name, p), (_, r) in zip(tiny_model.named_parameters(), reference.named_parameters()):
        torch.testing.assert_close(before[name] - p.detach(), r.grad, rtol=1e-4, atol=1e-7)


def test_the_loop_scores_at_the_rollout_temperature(tmp_path, model_dir, monkeypatch):
    seen = []
    real_update, real_score = stages.learn.policy_gradient_update, stages.learn.score_log_probs
    monkeypatch.setattr(stages.learn, "policy_gradient_update",
                        lambda *a, **kw: seen.append(("update", kw["temperature"])) or real_update(*a, **kw))
    monkeypatch.setattr(stages.learn, "score_log_probs",
                        lambda *a, **kw: seen.append(("score", kw["temperature"])) or real_score(*a, **kw))
    train_module.train_grpo(_cfg(model_dir, tmp_path / "t", algorithm="offpolicy_clip", beta=0.1, temperature=0.7,
                                 steps=1, eval_every=0, eval_at_start=False, eval_at_end=False))
    assert {kind for kind, _ in seen} == {"update", "score"} and {t for _, t in seen} == {0.7}


@pytest.mark.parametrize("override", [{"top_p": 0.9}, {"repetition_penalty": 1.1}, {"min_new_tokens": 2}])
def test_sampling_that_the_learner_cannot_score_warns_at_config_time(override):
    with pytest.warns(SamplingMismatchWarning, match=next(iter(override))):
        load_config(TrainConfig, overrides=override)


# ---------------------------------------------------------------------------------------------------
# 10. Leftover gradients; refused estimator combinations.


def test_gradients_left_behind_by_the_caller_do_not_leak_into_the_step(tiny_model, tokenizer):
    batch = _batch(tokenizer, [" 4 </think> <answer> 4 </answer>", " five"])
    clean = copy.deepcopy(tiny_model)
    args = (batch, torch.tensor([1.0, -1.0]), 1, None)
    run_update(clean, torch.optim.SGD(clean.parameters(), lr=1.0), *args)
    for p in tiny_model.parameters():
        p.grad = torch.full_like(p, 3.0)
    run_update(tiny_model, torch.optim.SGD(tiny_model.parameters(), lr=1.0), *args)
    for p, q in zip(tiny_model.parameters(), clean.parameters()):
        torch.testing.assert_close(p.detach(), q.detach())


def test_baseline_none_with_std_normaliser_is_refused():
    with pytest.raises(ConfigError, match="baseline='none' with advantage_normalizer='std'"):
        load_config(TrainConfig, overrides={"algorithm": "rft", "advantage_normalizer": "std"})
    with pytest.raises(ValueError, match="1e6"):
        S.Preset("none", "std", "none", "sequence").validate()


# ---------------------------------------------------------------------------------------------------
# Clear errors.


def test_a_missing_model_directory_says_so(tmp_path):
    from typer.testing import CliRunner

    from rlvr.cli import app

    result = CliRunner().invoke(app, ["eval", "model=/no/such/dir", "limit=1"])
    assert result.exit_code == 2
    assert "no such directory" in result.output and "nothing is downloaded" in result.output
    assert "Repo id" not in result.output


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("steps: 3\nseed: 1\nrewards: {r1_zero: 1.0, format: [\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{path}:\d+:\d+: not valid YAML"):
        load_config(TrainConfig, path)
    path.write_text("steps: 3\nseed: 1\n  lr: 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"{path}:3:"):
        load_config(TrainConfig, path)


def test_no_validation_is_said_plainly_and_a_fresh_resumable_run_is_no_warning(tmp_path, model_dir, caplog):
    with caplog.at_level(logging.INFO):
        train_module.train_grpo(_cfg(model_dir, tmp_path / "quiet", steps=1, eval_every=0, eval_at_start=False,
                                     eval_at_end=False, resume=True))
    messages = [r.getMessage() for r in caplog.records]
    finished = [m for m in messages if m.startswith("training finished")]
    assert finished and "no validation" in finished[0] and "nan" not in finished[0]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING and "resume" in r.getMessage()]


def test_the_algorithms_guide_table_matches_the_preset_table():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "algorithms.md").read_text(encoding="utf-8")
    rows = [line.strip("|").split("|") for line in readme.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip() in S.PRESETS]
    table = {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}
    from rlvr.algorithms.spec import BUILTIN_PRESETS  # not the rows other tests' estimators registered

    assert set(table) == set(BUILTIN_PRESETS)
    methods = {"none": "none", "noclip": "token ratio", "clip": "PPO clip", "gspo": "sequence geometric mean",
               "cispo": "capped"}
    for name, p in ((n, S.PRESETS[n]) for n in BUILTIN_PRESETS):
        baseline, normalizer, weighting, aggregation, steps, signal = table[name][:6]
        # on-policy distillation's advantage comes from the teacher, alone or added to the reward's
        expected = "teacher" if p.advantage == "none" and p.distill else p.reward_signal + (" + teacher" if p.distill else "")
        assert (baseline, normalizer, aggregation, int(steps), signal) == (
            p.baseline, p.advantage_normalizer, p.loss_normalization, p.steps_per_rollout, expected), name
        assert weighting.startswith(methods[p.importance_reweighting_method]), name
        if p.cliprange is not None and p.importance_reweighting_method != "cispo":
            written = weighting.split("clip ")[-1].split(" ")[0]
            assert float(written) == p.cliprange, name


def test_correctness_of_a_combined_reward_does_not_depend_on_the_order_of_its_parts():
    from rlvr.tasks.rewards import combine_rewards, format_reward_fn, r1_zero_reward_fn

    right = " 2+2=4 </think> <answer> 4 </answer>"
    for parts in ([("r1_zero", r1_zero_reward_fn, 1.0), ("format", format_reward_fn(), 0.2)],
                  [("format", format_reward_fn(), 0.2), ("r1_zero", r1_zero_reward_fn, 1.0)]):
        scores = combine_rewards(parts)(right, "4")
        assert scores["reward"] == pytest.approx(1.2) and scores["answer_reward"] == 1.0

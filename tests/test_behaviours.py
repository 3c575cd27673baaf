"""Behaviours of the training loop and the models layer that no other test pins down (issue 21): the run
monitor's warnings, weighted rewards, masking truncated rollouts, a non-finite loss mid-run, train/pass@k,
checkpoint rotation, the split seed, and resolving model paths (GGUF included). Every expected number is
computed here from what the run wrote (rollouts.jsonl) or by hand."""

import math
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from rlvr import stages
from rlvr.algorithms.policy import tokenize_prompt_and_ids
from rlvr.algorithms.update import NonFiniteLoss
from rlvr.config import EvalConfig, SFTConfig, TrainConfig
from rlvr.core import models as models_module
from rlvr.core.tracking import read_jsonl
from rlvr.stages import RunMonitor
from rlvr.stages import build_reward_fn as real_build_reward_fn  # before the autouse fixture replaces it
from rlvr.tasks.datasets import load_split
from rlvr.tasks.prompts import get_prompt
from rlvr.tasks.rewards import score_batch
from rlvr.tasks.scoring import rewards_and_metadata
from rlvr.training import rl as train_module
from test_train import _cfg, _parity  # noqa: F401 (_parity: the autouse reward with signal in every group)

QUIET = dict(eval_every=0, eval_at_start=False, eval_at_end=False)


# ----------------------------------------------------------------------------------------------------
# RunMonitor: seed 002's four warning signs.


def _healthy(step: int) -> dict:
    """A run that learns quietly: length creeping up, entropy easing down, a small steady KL, signal."""
    return {"rollout/mean_tokens": 40.0 + step, "rollout/truncated_rate": 0.05,
            "train/token_entropy": 1.5 - 0.02 * step, "train/kl": 0.010 + 0.001 * step,
            "train/frac_groups_zero_std": 0.5}


def test_a_healthy_run_raises_no_warning():
    monitor = RunMonitor(max_new_tokens=256)
    assert [monitor.check(_healthy(step)) for step in range(1, 21)] == [[]] * 20


def test_response_length_exploding_fires_only_with_truncation():
    monitor = RunMonitor(max_new_tokens=128)
    assert monitor.check({"rollout/mean_tokens": 50.0, "rollout/truncated_rate": 0.1}) == []
    assert monitor.check({"rollout/mean_tokens": 100.0, "rollout/truncated_rate": 0.9}) == []  # 2x, not more
    assert monitor.check({"rollout/mean_tokens": 101.0, "rollout/truncated_rate": 0.5}) == []  # half, not more
    (warning,) = monitor.check({"rollout/mean_tokens": 101.0, "rollout/truncated_rate": 0.6})
    assert warning.startswith("response length exploding: 101 tokens (started at 50), 60% truncated")


def test_entropy_collapsing_fires_below_a_fifth_of_the_start_and_only_on_trained_steps():
    monitor = RunMonitor(max_new_tokens=128)
    assert monitor.check({"train/token_entropy": 2.0}) == []
    assert monitor.check({"train/token_entropy": 0.41}) == []  # above 0.2 * 2.0
    assert monitor.check({"train/token_entropy": 0.39}, trained=False) == []  # nothing trained: not its fault
    (warning,) = monitor.check({"train/token_entropy": 0.39})
    assert warning.startswith("entropy collapsing: 0.390 (started at 2.000)")


def test_kl_spiking_needs_three_steps_of_history_a_floor_and_five_times_the_median():
    monitor = RunMonitor(max_new_tokens=128)
    assert [monitor.check({"train/kl": kl}) for kl in (0.01, 0.01)] == [[], []]
    assert monitor.check({"train/kl": 0.3}, trained=False) == []  # not recorded either
    assert monitor.check({"train/kl": 0.06}) == []  # 6x the median, but only two steps of history
    assert monitor.check({"train/kl": 0.01}) == []
    assert monitor.kl_history == [0.01, 0.01, 0.06, 0.01]
    assert monitor.check({"train/kl": 0.04}) == []  # 4x the median, and under the 0.05 floor
    (warning,) = monitor.check({"train/kl": 0.06})  # history [0.01, 0.01, 0.06, 0.01, 0.04]: median 0.01
    assert warning.startswith("KL spiking: 0.0600 vs median 0.0100")
    assert monitor.check({"train/kl": 0.06}, trained=False) == []


def test_no_reward_spread_fires_on_the_third_step_in_a_row_and_survives_a_resume():
    monitor = RunMonitor(max_new_tokens=128)
    assert monitor.check({"train/frac_groups_zero_std": 0.9}) == []
    assert monitor.check({"train/frac_groups_zero_std": 0.8}) == []  # 0.8 is not more than 0.8: streak reset
    assert [monitor.check({"train/frac_groups_zero_std": 1.0}) for _ in range(2)] == [[], []]
    resumed = RunMonitor(max_new_tokens=128)
    resumed.load(monitor.state())  # what a checkpoint carries
    (warning,) = resumed.check({"train/frac_groups_zero_std": 0.9})
    assert warning.startswith("90% of groups had no reward spread for 3 steps")
    (warning,) = resumed.check({"train/frac_groups_zero_std": 1.0})
    assert "for 4 steps" in warning
    assert resumed.check({"train/frac_groups_zero_std": 0.5}) == []


# ----------------------------------------------------------------------------------------------------
# Weighted rewards: cfg.rewards = {r1_zero: 1.0, format: 0.2} (configs/grpo_gsm8k.yaml).

RIGHT = " 2+2=4 </think> <answer> 4 </answer>"
FORMATTED_WRONG = " 2+2=5 </think> <answer> 5 </answer>"
UNFORMATTED = " 2+2 is 4"


def test_weighted_rewards_give_the_hand_computed_values_and_components():
    fn = real_build_reward_fn(TrainConfig(rewards={"r1_zero": 1.0, "format": 0.2}), "r1_zero")
    assert fn(RIGHT, "4") == pytest.approx(
        {"reward": 1.2, "format_reward": 1.0, "answer_reward": 1.0, "reward/r1_zero": 1.0, "reward/format": 1.0})
    assert fn(FORMATTED_WRONG, "4") == pytest.approx(
        {"reward": 0.2, "format_reward": 1.0, "answer_reward": 0.0, "reward/r1_zero": 0.0, "reward/format": 1.0})
    assert fn(UNFORMATTED, "4") == pytest.approx(
        {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0, "reward/r1_zero": 0.0, "reward/format": 0.0})
    # the batch path of the loop: raw rewards and the per-component means it logs as train/reward/<name>
    scores, grading = score_batch(fn, [RIGHT, FORMATTED_WRONG, UNFORMATTED], ["4"] * 3)
    raw, meta = rewards_and_metadata(scores, grading)
    assert raw.tolist() == pytest.approx([1.2, 0.2, 0.0])
    assert (meta["reward_mean"], meta["reward/r1_zero_mean"], meta["reward/format_mean"]) == pytest.approx(
        (1.4 / 3, 1 / 3, 2 / 3))
    # without `rewards` the prompt's own reward; the format bonus follows the prompt's reward function
    assert real_build_reward_fn(TrainConfig(), "r1_zero")(FORMATTED_WRONG, "4")["reward"] == 0.0
    tagged = real_build_reward_fn(TrainConfig(rewards={"answer_tag": 1.0, "format": 0.5}), "answer_tag")
    assert tagged("<answer> 7 </answer>", "72") == pytest.approx(
        {"reward": 0.5, "format_reward": 1.0, "answer_reward": 0.0, "reward/answer_tag": 0.0, "reward/format": 1.0})
    assert tagged("so it is <answer> 72 </answer>", "72")["reward"] == pytest.approx(1.5)


def test_weighted_reward_components_are_logged_by_the_loop(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(stages, "build_reward_fn", real_build_reward_fn)
    out = tmp_path / "weighted"
    train_module.train_grpo(_cfg(model_dir, out, steps=1, rewards={"r1_zero": 1.0, "format": 0.2},
                                 log_rollouts_every=1, **QUIET))
    (row,) = read_jsonl(out / "metrics.jsonl")
    rollouts = read_jsonl(out / "rollouts.jsonl")
    fn = real_build_reward_fn(TrainConfig(rewards={"r1_zero": 1.0, "format": 0.2}), "r1_zero")
    regraded = [fn(r["response"], r["ground_truth"]) for r in rollouts]
    assert [r["reward"] for r in rollouts] == pytest.approx([s["reward"] for s in regraded])
    for name in ("r1_zero", "format"):
        assert row[f"train/reward/{name}"] == pytest.approx(sum(s[f"reward/{name}"] for s in regraded) / 8)


# ----------------------------------------------------------------------------------------------------
# The loop: masked truncations, a non-finite loss, train/pass@k.


@pytest.fixture
def stopping_model_dir(tmp_path, tiny_model, tokenizer):
    """The tiny model with 16 end-of-sequence tokens: about 6% stop chance per token, so with 12 new tokens
    roughly half the rollouts stop and half are truncated."""
    tiny_model.generation_config.eos_token_id = list(range(1, 17))
    path = tmp_path / "stopping"
    tiny_model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _spy_updates(monkeypatch, calls, before=None):
    real = stages.learn.policy_gradient_update

    def spy(model, optimizer, batch, *args, **kwargs):
        calls.append({"input_ids": batch.input_ids.clone(), "mask": batch.response_mask.clone(),
                      "advantages": batch.advantages.clone()})
        if before is not None:
            before(len(calls), model)
        return real(model, optimizer, batch, *args, **kwargs)

    monkeypatch.setattr(stages.learn, "policy_gradient_update", spy)


def _group_advantages(rewards: list[float], group_size: int, eps: float = 1e-6) -> list[float]:
    out = []
    for i in range(0, len(rewards), group_size):
        g = torch.tensor(rewards[i : i + group_size])
        out += ((g - g.mean()) / (g.std() + eps)).tolist()  # GRPO: unbiased std
    return out


def test_masked_truncations_get_no_advantage_and_no_trained_tokens(tmp_path, stopping_model_dir, tokenizer,
                                                                   monkeypatch):
    calls = []
    _spy_updates(monkeypatch, calls)
    out = tmp_path / "masked"
    cfg = _cfg(stopping_model_dir, out, algorithm="grpo", mask_truncated_completions=True, steps=2,
               log_rollouts_every=1, **QUIET)
    assert cfg.steps_per_rollout == 1
    train_module.train_grpo(cfg)
    rollouts, metrics = read_jsonl(out / "rollouts.jsonl"), read_jsonl(out / "metrics.jsonl")
    assert len(calls) == 2 and len(rollouts) == 16
    prompt = get_prompt(cfg.prompt)
    would_have_trained = 0
    for step, call, row in zip((1, 2), calls, metrics[-2:]):
        logged = [r for r in rollouts if r["step"] == step]
        truncated = torch.tensor([r["finish_reason"] == "length" for r in logged])
        assert 0 < int(truncated.sum()) < 8, "the fixture should give a mix of stopped and truncated rollouts"
        batch = tokenize_prompt_and_ids([prompt.format(r["question"]) for r in logged],
                                        [r["token_ids"] for r in logged], tokenizer)  # the sampled ids are trained
        assert torch.equal(call["input_ids"], batch["input_ids"])
        # the mask: the response tokens of the rollouts that stopped, nothing of the truncated ones
        assert torch.equal(call["mask"], batch["response_mask"] & ~truncated.unsqueeze(-1))
        assert not call["mask"][truncated].any() and call["mask"][~truncated].any()
        # advantages: group-normalised over all 8 rewards (truncated ones included), then 0 where truncated
        unmasked = _group_advantages([r["reward"] for r in logged], cfg.group_size)
        expected = [0.0 if t else a for a, t in zip(unmasked, truncated.tolist())]
        assert call["advantages"].tolist() == pytest.approx(expected, abs=1e-5)
        assert [r["advantage"] for r in logged] == pytest.approx(expected, abs=1e-5)
        would_have_trained += sum(1 for a, t in zip(unmasked, truncated.tolist()) if t and abs(a) > 1e-3)
        kept = [j for j in range(8) if expected[j] != 0]
        assert row["train/trained_tokens"] == int(batch["response_mask"][kept].sum())
    assert would_have_trained > 0  # some truncated rollouts carried signal that the mask took away


def test_a_non_finite_loss_skips_one_update_and_the_run_goes_on(tmp_path, model_dir, monkeypatch):
    """The second update sees a policy with a NaN weight (a diverged step): it raises NonFiniteLoss, the
    optimizer does not step, the loop logs it, still steps the schedule, and trains again at step 3."""
    snapshots = {}

    def poison_second(call: int, model):
        if call == 2:
            snapshots["before"] = {n: p.detach().clone() for n, p in model.named_parameters()}
            with torch.no_grad():
                model.model.norm.weight[0] = float("nan")

    calls, raised = [], []
    _spy_updates(monkeypatch, calls, before=poison_second)
    spy = stages.learn.policy_gradient_update

    def heal_after(model, *args, **kwargs):
        try:
            return spy(model, *args, **kwargs)
        except NonFiniteLoss as err:
            raised.append(err)
            with torch.no_grad():  # undo the poison so that the rest of the run is healthy
                model.model.norm.weight[0] = snapshots["before"]["model.norm.weight"][0]
            snapshots["after"] = {n: p.detach().clone() for n, p in model.named_parameters()}
            snapshots["grads"] = [p.grad for p in model.parameters()]
            raise

    monkeypatch.setattr(stages.learn, "policy_gradient_update", heal_after)
    out = tmp_path / "nan"
    lr = 1e-3
    summary = train_module.train_grpo(_cfg(model_dir, out, steps=3, warmup_steps=4, lr_schedule="constant",
                                           learning_rate=lr, **QUIET))
    assert len(calls) == 3 and len(raised) == 1
    # the failed update changed no weight and left no gradient behind
    assert all(torch.equal(snapshots["after"][n], snapshots["before"][n]) for n in snapshots["before"])
    assert all(g is None for g in snapshots["grads"])
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["train/nonfinite_steps"] for r in rows] == [0, 1, 0]
    assert rows[1]["train/updates_trained"] == 0 and rows[1]["train/trained_tokens"] == 0
    assert "train/loss" not in rows[1] and "train/grad_norm" not in rows[1]
    assert math.isfinite(rows[2]["train/loss"]) and rows[2]["train/updates_trained"] == 1
    # linear warmup over 4 scheduler steps, one per update, the skipped one included
    assert [r["train/lr"] for r in rows] == pytest.approx([lr / 4, 2 * lr / 4, 3 * lr / 4], rel=1e-9)
    assert summary["steps"] == 3 and (out / "final" / "DONE").is_file()
    from rlvr.core.models import load_model

    final, _ = load_model(str(out / "final"))
    assert all(bool(torch.isfinite(p).all()) for p in final.parameters())


def shaped_parity(response: str, ground_truth: str) -> dict:
    """Correct about half the time; the reward adds a format bonus, so reward and correctness differ."""
    code = sum(map(ord, response))
    answer, fmt = float(code % 2), float(code % 3 == 0)
    return {"reward": answer + 0.5 * fmt, "format_reward": fmt, "answer_reward": answer}


def _pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased estimator, written out: 1 - C(n - c, k) / C(n, k)."""
    return 1.0 if n - c < k else 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_train_pass_at_k_is_recomputed_from_the_logged_rollouts(tmp_path, model_dir, monkeypatch):
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: shaped_parity)
    out = tmp_path / "passk"
    train_module.train_grpo(_cfg(model_dir, out, steps=5, rollout_batch_size=16, microbatch_size=4,
                                 log_rollouts_every=1, **QUIET))
    rows, rollouts = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "rollouts.jsonl")
    counts, regrouped = [], False
    for row in rows:
        logged = [r for r in rollouts if r["step"] == row["step"]]
        assert len(logged) == 16
        right = [r["answer_reward"] for r in logged]
        correct = [sum(right[i : i + 4]) for i in range(0, 16, 4)]  # a group's samples are contiguous
        counts += correct
        regrouped |= sorted(correct) != sorted(sum(right[i::4]) for i in range(4))
        for k in (1, 2, 3, 4):
            expected = sum(_pass_at_k(4, int(c), k) for c in correct) / 4
            assert row[f"train/pass@{k}"] == pytest.approx(expected, abs=1e-12), (row["step"], k)
    assert any(0 < c < 4 for c in counts) and len(set(counts)) > 2  # the estimator is exercised off its ends
    assert regrouped  # grouping the samples any other way would give other numbers
    assert any(r["reward"] != r["answer_reward"] for r in rollouts)  # pass@k counts correctness, not reward


# ----------------------------------------------------------------------------------------------------
# Checkpoints and data.


def test_keep_checkpoints_rotation_keeps_the_newest_and_latest_names_the_last(tmp_path, model_dir):
    out = tmp_path / "rotate"
    train_module.train_grpo(_cfg(model_dir, out, steps=4, save_every=1, keep_checkpoints=2, **QUIET))
    root = out / "checkpoints"
    # checkpoints at steps 1, 2, 3 (step 4 is the final model); the two newest remain, nothing half-written
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_000002", "step_000003"]
    assert (root / "latest").read_text().strip() == "step_000003"
    from rlvr.core import checkpoint as ckpt

    assert ckpt.latest_checkpoint(out) == root / "step_000003"
    assert [ckpt.load_state(root / name)["step"] for name in ("step_000002", "step_000003")] == [2, 3]
    assert (out / "final" / "DONE").is_file()


def _ids(examples):
    return [e.id for e in examples]


def test_split_seed_moves_the_validation_questions_and_the_run_seed_does_not(tmp_path):
    base = _ids(load_split(TrainConfig(dataset="gsm8k"), "validation"))
    assert len(base) == 500
    assert _ids(load_split(TrainConfig(dataset="gsm8k", seed=7), "validation")) == base
    assert _ids(load_split(SFTConfig(dataset="gsm8k", seed=3), "validation")) == base
    assert _ids(load_split(EvalConfig(dataset="gsm8k", seed=9), "validation")) == base
    other = _ids(load_split(TrainConfig(dataset="gsm8k", split_seed=1), "validation"))
    assert len(other) == 500 and len(set(other) & set(base)) < 100  # about 500 * 500 / 7470 = 33 by chance
    train = _ids(load_split(TrainConfig(dataset="gsm8k", seed=7), "train"))
    assert not set(train) & set(base) and len(train) + len(base) == 7473 - 3  # minus the few-shot examples
    assert set(train) & set(other)  # split seed 1 validates on questions split seed 0 trains on
    # a JSONL dataset: a seeded tenth of the file validates
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(f'{{"question": "q{i}?", "answer": "{i}"}}\n' for i in range(60)))
    jsonl = lambda split="validation", **kw: _ids(load_split(  # noqa: E731
        TrainConfig(dataset=str(data), prompt="r1_zero", **kw), split))
    assert len(jsonl()) == 6 and jsonl(seed=5) == jsonl() and jsonl(split_seed=2) != jsonl()
    assert len(jsonl("test")) == 6 and not set(jsonl("test")) & set(jsonl())  # a test tenth, held out too
    assert set(jsonl("train", seed=5)) == {f"qa:{i}" for i in range(1, 61)} - set(jsonl()) - set(jsonl("test"))


# ----------------------------------------------------------------------------------------------------
# Model paths: saved directories, errors that say what to do, GGUF conversion into $RLVR_CACHE.


def test_resolve_model_path_accepts_a_saved_dir_and_explains_what_it_cannot_use(tmp_path, model_dir):
    assert models_module.resolve_model_path(str(model_dir)) == str(model_dir)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="the directory has no config.json"):
        models_module.resolve_model_path(str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match="no such directory.*nothing is downloaded"):
        models_module.resolve_model_path(str(tmp_path / "missing" / "model"))
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache.*nothing is downloaded"):
        models_module.resolve_model_path("rlvr-tests-no-such-org/no-such-model")
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(FileNotFoundError, match="is a file but neither a model directory nor a .gguf file"):
        models_module.resolve_model_path(str(tmp_path / "weights.bin"))
    with pytest.raises(FileNotFoundError, match="GGUF file .*missing.gguf not found"):
        models_module.resolve_model_path(str(tmp_path / "missing.gguf"))


def _write_llama_gguf(path, model, tokenizer) -> None:
    """A float32 GGUF of a tiny Llama, laid out as llama.cpp's converter writes one (q/k rows permuted)."""
    import gguf

    cfg = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(cfg.num_attention_heads)
    writer.add_head_count_kv(cfg.num_key_value_heads)
    writer.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = [t for t, _ in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.CONTROL] * 2 + [gguf.TokenType.NORMAL] * (len(tokens) - 2))
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)

    def permute(w, heads):
        return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    writer.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        writer.add_tensor(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.attn_q.weight", permute(sd[p + "self_attn.q_proj.weight"], cfg.num_attention_heads))
        writer.add_tensor(f"blk.{i}.attn_k.weight", permute(sd[p + "self_attn.k_proj.weight"], cfg.num_key_value_heads))
        writer.add_tensor(f"blk.{i}.attn_v.weight", sd[p + "self_attn.v_proj.weight"])
        writer.add_tensor(f"blk.{i}.attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        writer.add_tensor(f"blk.{i}.ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", sd["model.norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_a_gguf_file_is_converted_once_into_the_cache_and_then_reused(tmp_path, tiny_model, tokenizer, monkeypatch):
    pytest.importorskip("gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("RLVR_CACHE", str(cache))
    conversions = []
    real = models_module._convert_gguf
    monkeypatch.setattr(models_module, "_convert_gguf", lambda g, t: conversions.append(g) or real(g, t))
    source = tmp_path / "files" / "tiny-llama.gguf"
    source.parent.mkdir()
    _write_llama_gguf(source, tiny_model, tokenizer)

    target = Path(models_module.resolve_model_path(str(source)))
    assert target.parent == cache / "models" and target.name.startswith("tiny-llama-")
    assert conversions == [source]
    assert {p.name for p in (cache / "models").iterdir()} == {target.name}  # no temporary directory left
    assert (target / "config.json").is_file() and (target / "model.safetensors").is_file()
    assert models_module.resolve_model_path(str(source)) == str(target)
    model, tok = models_module.load_model(str(source))
    assert conversions == [source]  # the second resolve and the load read the cached directory
    # the conversion is exact: same token ids, same logits as the model the file was written from
    ids = tokenizer("Sam has 3 apples. 12+7=19", add_special_tokens=False).input_ids
    assert tok("Sam has 3 apples. 12+7=19", add_special_tokens=False).input_ids == ids
    assert (tok.eos_token, tok.pad_token) == ("<eos>", "<pad>")
    with torch.no_grad():
        expected = tiny_model(input_ids=torch.tensor([ids])).logits
        got = model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    # a different file under the same name is not mistaken for the cached one
    with torch.no_grad():
        tiny_model.get_input_embeddings().weight.mul_(2.0)
    _write_llama_gguf(source, tiny_model, tokenizer)
    os.utime(source, ns=(1, 1))
    changed = Path(models_module.resolve_model_path(str(source)))
    assert changed != target and conversions == [source, source]


def test_a_copy_of_a_gguf_file_elsewhere_reuses_its_conversion_and_is_hashed_once(tmp_path, tiny_model, tokenizer,
                                                                                monkeypatch):
    """A fresh clone installs the same GGUF under another path: the conversion is keyed by content, and the
    content hashed once per (path, size, mtime)."""
    import hashlib
    import shutil

    pytest.importorskip("gguf")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    conversions, hashed = [], []
    real, real_digest = models_module._convert_gguf, hashlib.file_digest
    monkeypatch.setattr(models_module, "_convert_gguf", lambda g, t: conversions.append(g) or real(g, t))
    monkeypatch.setattr(hashlib, "file_digest", lambda f, d: hashed.append(f.name) or real_digest(f, d))
    first = tmp_path / "clone1" / ".venv" / "model.gguf"
    first.parent.mkdir(parents=True)
    _write_llama_gguf(first, tiny_model, tokenizer)
    second = tmp_path / "clone2" / ".venv" / "model.gguf"
    second.parent.mkdir(parents=True)
    shutil.copy(first, second)  # a new mtime and inode, the same bytes
    target = models_module.resolve_model_path(str(first))
    assert models_module.resolve_model_path(str(second)) == target
    assert conversions == [first]  # converted once for both paths
    assert models_module.resolve_model_path(str(first)) == models_module.resolve_model_path(str(second)) == target
    assert hashed == [str(first.resolve()), str(second.resolve())]  # each path hashed once, then looked up


def test_a_conversion_keyed_by_path_is_renamed_to_its_content_key(tmp_path, tiny_model, tokenizer, monkeypatch):
    import hashlib

    pytest.importorskip("gguf")
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "model.gguf"
    _write_llama_gguf(source, tiny_model, tokenizer)
    stat = source.resolve().stat()
    old_key = hashlib.blake2b(f"{source.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(),
                              digest_size=4).hexdigest()
    legacy = tmp_path / "cache" / "models" / f"model-{old_key}"
    tiny_model.save_pretrained(legacy)
    monkeypatch.setattr(models_module, "_convert_gguf", lambda g, t: pytest.fail("converted again"))
    target = Path(models_module.resolve_model_path(str(source)))
    assert (target / "config.json").is_file() and not legacy.exists()
    assert target.name == f"model-{models_module.content_digest(source)[:16]}"


@pytest.mark.parametrize("where", ["while writing", "before writing"])
def test_a_full_disk_during_the_conversion_says_so_and_leaves_nothing(tmp_path, tiny_model, tokenizer, monkeypatch,
                                                                      where):
    import errno
    import shutil

    from typer.testing import CliRunner
    from transformers import PreTrainedModel

    from rlvr.cli import app

    pytest.importorskip("gguf")
    cache = tmp_path / "cache"
    monkeypatch.setenv("RLVR_CACHE", str(cache))
    source = tmp_path / "model.gguf"
    _write_llama_gguf(source, tiny_model, tokenizer)
    if where == "while writing":  # what safetensors raises when a write fails with ENOSPC (not an OSError)
        def full(self, path, **kwargs):
            (Path(path) / "model.safetensors").write_bytes(b"partial")
            raise RuntimeError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No '
                               'space left on device" })')

        monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    else:
        usage = shutil.disk_usage(tmp_path)
        monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=1000))
    with pytest.raises(OSError, match="No space left on device for the converted model") as caught:
        models_module.resolve_model_path(str(source))
    assert caught.value.errno == errno.ENOSPC and "RLVR_CACHE" in str(caught.value)
    assert list((cache / "models").iterdir()) == []  # no partial conversion left behind
    result = CliRunner().invoke(app, ["eval", f"model={source}", "dataset=arithmetic", "limit=1",
                                      f"out={tmp_path / 'eval'}"])
    assert result.exit_code == 2
    assert "no space left on device" in result.output.lower() and "bug in rlvr" not in result.output


def test_load_tokenizer_gives_a_tokenizer_without_pad_token_its_eos(tmp_path, tiny_model, tokenizer):
    from transformers import PreTrainedTokenizerFast

    no_pad = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend_tokenizer, eos_token="<eos>")
    assert no_pad.pad_token is None
    path = tmp_path / "no_pad"
    tiny_model.save_pretrained(path)
    no_pad.save_pretrained(path)
    loaded = models_module.load_tokenizer(str(path))
    assert (loaded.pad_token, loaded.pad_token_id, loaded.eos_token_id) == ("<eos>", 1, 1)
    batch = loaded(["ab", "abcd"], padding=True)  # what batching needs the pad token for
    assert batch["input_ids"][0][2:] == [1, 1]
    # a tokenizer with its own pad token keeps it
    tokenizer.save_pretrained(tmp_path / "with_pad")
    tiny_model.save_pretrained(tmp_path / "with_pad")
    assert models_module.load_tokenizer(str(tmp_path / "with_pad")).pad_token_id == 0


def test_get_model_and_tokenizer_is_seed_004s_loader(model_dir, tiny_model, tokenizer):
    import rlvr

    model, tok = rlvr.get_model_and_tokenizer(str(model_dir), "cpu")
    assert next(model.parameters()).dtype == torch.bfloat16 and next(model.parameters()).device.type == "cpu"
    ids = tokenizer("12+7=19", add_special_tokens=False).input_ids
    assert tok("12+7=19", add_special_tokens=False).input_ids == ids
    expected = dict(tiny_model.named_parameters())  # the same weights, rounded to bfloat16
    for name, value in model.named_parameters():
        assert torch.equal(value, expected[name].detach().to(torch.bfloat16)), name

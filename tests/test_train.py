"""`rlvr train` end to end on a tiny model: every preset runs and logs every metric; kill-and-resume logs the
same numbers; a finished run is evaluated instead of trained again."""

import math

import pytest
import torch
from typer.testing import CliRunner

from conftest import train_cfg
from rlvr import stages
from rlvr.algorithms.spec import PRESETS
from rlvr.cli import app
from rlvr.config import load_config
from rlvr.core.tracking import read_jsonl
from rlvr.training import rl as train_module


def parity_reward(response: str, ground_truth: str) -> dict:
    """A reward a random tiny model earns about half the time, so every group has signal."""
    code = sum(map(ord, response))
    r = float(code % 2)
    return {"reward": r, "format_reward": float(code % 3 == 0), "answer_reward": r}


@pytest.fixture(autouse=True)
def _parity(monkeypatch):
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: parity_reward)


_cfg = train_cfg


ALWAYS = ["train/loss", "train/grad_norm", "train/token_entropy", "train/reward", "train/format_reward",
          "train/answer_reward", "train/frac_groups_zero_std", "train/pass@1", "train/pass@4",
          "rollout/mean_tokens", "rollout/max_tokens", "rollout/truncated_rate", "time/generate", "time/score",
          "time/train", "time/step", "time/generate_tokens_per_second", "time/train_tokens_per_second", "train/lr"]
UPDATE_ONLY = ("train/loss", "train/grad_norm", "time/train_tokens_per_second", "train/clip_fraction",
               "train/ratio_max")


@pytest.mark.parametrize("algorithm", list(PRESETS))
def test_every_preset_runs_three_steps_with_finite_metrics(tmp_path, model_dir, algorithm):
    extra = {"group_size": 1, "rollout_batch_size": 8} if algorithm == "reinforce" else {}
    if PRESETS[algorithm].distill:  # on-policy distillation needs a teacher (a different tiny model)
        from conftest import make_model, make_tokenizer

        extra["teacher"] = str(tmp_path / "teacher")
        make_model(len(make_tokenizer()), seed=5).save_pretrained(extra["teacher"])
        make_tokenizer().save_pretrained(extra["teacher"])
    summary = train_module.train_grpo(_cfg(model_dir, tmp_path / algorithm, algorithm=algorithm, **extra))
    rows = read_jsonl(tmp_path / algorithm / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "val/accuracy" in rows[0] and "val/accuracy" in rows[2] and "val/accuracy" in rows[3]
    preset = PRESETS[algorithm]
    for row in rows[1:]:
        keys = [k for k in ALWAYS if not (algorithm == "reinforce" and k == "train/pass@4")]
        if preset.importance_reweighting_method != "none":
            keys += ["train/clip_fraction", "train/ratio_max"]
        if preset.mask_truncated_completions and row["train/updates_trained"] == 0:
            # 12 new tokens: most rollouts of the random model are truncated and DAPO masks them; a step
            # whose updates trained nothing logs no update metrics rather than a misleading 0
            assert row["rollout/truncated_rate"] > 0.5 and row["train/trained_tokens"] == 0
            assert not [k for k in UPDATE_ONLY if k in row]
            keys = [k for k in keys if k not in UPDATE_ONLY]
        elif row["train/updates_trained"] == 0:  # parity rewards can leave every group without spread
            assert row["train/frac_groups_zero_std"] == 1.0 and row["train/trained_tokens"] == 0
            keys = [k for k in keys if k not in UPDATE_ONLY]
        else:  # a train batch of 2 may hold no signal
            assert row["train/updates_trained"] <= preset.steps_per_rollout
        assert not [k for k in keys if k not in row], f"missing {[k for k in keys if k not in row]}"
        assert all(math.isfinite(row[k]) for k in keys)
    assert summary["steps"] == 3 and (tmp_path / algorithm / "final" / "DONE").is_file()
    logged = read_jsonl(tmp_path / algorithm / "rollouts.jsonl")
    assert {r["step"] for r in logged} == {1, 2} and len(logged) == 16


def test_off_policy_takes_several_optimizer_steps_per_rollout_batch(tmp_path, model_dir):
    cfg = _cfg(model_dir, tmp_path / "off", algorithm="offpolicy_clip", steps=2, lr_schedule="cosine",
               warmup_steps=0)
    assert cfg.steps_per_rollout == 4 and cfg.train_batch_size == 2
    train_module.train_grpo(cfg)
    rows = read_jsonl(tmp_path / "off" / "metrics.jsonl")
    # 8 optimizer steps in all, the cosine schedule stepped once per optimizer step
    assert rows[2]["train/lr"] < rows[1]["train/lr"] < 1e-3
    # after the first of the four updates the policy has moved: the importance ratios leave 1
    assert rows[1]["train/ratio_max"] > 1.0 > rows[1]["train/ratio_min"]
    assert rows[1]["train/pruned_fraction"] < 1.0


def test_kl_penalty_with_a_reference_model_and_with_lora(tmp_path, model_dir):
    train_module.train_grpo(_cfg(model_dir, tmp_path / "kl", beta=0.05, steps=2))
    rows = read_jsonl(tmp_path / "kl" / "metrics.jsonl")
    assert rows[1]["train/kl"] == pytest.approx(0.0, abs=1e-6) and rows[2]["train/kl"] > 0
    train_module.train_grpo(_cfg(model_dir, tmp_path / "lora", beta=0.05, steps=2, lora_rank=4,
                                 learning_rate=1e-2))
    rows = read_jsonl(tmp_path / "lora" / "metrics.jsonl")
    assert rows[2]["train/kl"] > 0
    assert (tmp_path / "lora" / "final" / "model.safetensors").is_file()  # merged for evaluation


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and not k.endswith("seconds")}
            for r in rows]


@pytest.mark.parametrize("algorithm", ["grpo", "offpolicy_gspo"])
def test_kill_and_resume_gives_identical_metrics(tmp_path, model_dir, crash_at, algorithm):
    straight = tmp_path / "straight"
    train_module.train_grpo(_cfg(model_dir, straight, steps=4, save_every=2, algorithm=algorithm))
    crashed = tmp_path / "crashed"
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_cfg(model_dir, crashed, steps=4, save_every=2, algorithm=algorithm))
    undo()
    train_module.train_grpo(_cfg(model_dir, crashed, steps=4, save_every=2, algorithm=algorithm, resume=True))
    assert _strip(read_jsonl(crashed / "metrics.jsonl")) == _strip(read_jsonl(straight / "metrics.jsonl"))
    assert read_jsonl(crashed / "rollouts.jsonl") == read_jsonl(straight / "rollouts.jsonl")


def test_finished_run_is_evaluated_not_trained(tmp_path, model_dir):
    out = tmp_path / "done"
    train_module.train_grpo(_cfg(model_dir, out, steps=1))
    again = train_module.train_grpo(_cfg(model_dir, out, steps=1))
    assert again["already_finished"] and "val/accuracy" in again
    assert len(read_jsonl(out / "metrics.jsonl")) == 2


def test_train_config_validation_and_cli(tmp_path, model_dir):
    with pytest.raises(ValueError, match="not a whole number of groups"):
        _cfg(model_dir, tmp_path / "x", rollout_batch_size=10, group_size=4)
    with pytest.raises(ValueError, match="unknown algorithm 'ppo'"):
        _cfg(model_dir, tmp_path / "x", algorithm="ppo")
    with pytest.raises(ValueError, match="does not split into steps_per_rollout=3"):
        _cfg(model_dir, tmp_path / "x", steps_per_rollout=3)
    result = CliRunner().invoke(app, ["train", "--model", str(model_dir), "--out", str(tmp_path / "cli"),
                                      "--dataset", "arithmetic", "steps=1", "rollout_batch_size=4", "group_size=2",
                                      "max_new_tokens=4", "eval_limit=1", "eval_max_new_tokens=2",
                                      "tensorboard=false", "--algorithm", "dr_grpo"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "config.yaml").read_text().count("loss_normalization: constant") == 1


def test_every_run_seed_holds_out_the_same_validation_questions(tmp_path, model_dir, monkeypatch):
    # the run seed varies sampling and data order; the split must not move, or seed 1 validates on questions
    # the SFT checkpoint (split seed 0) trained on, and seeds are compared on different sets
    from rlvr.config import SFTConfig
    from rlvr.tasks import datasets as data_module
    from rlvr.training import sft as sft_module

    seen = []

    def recording(name, split, limit=None, **kw):
        seen.append((split, kw["seed"]))
        return real(name, split, limit, **kw)

    real = data_module.load_dataset
    monkeypatch.setattr(data_module, "load_dataset", recording)
    train_module.train_grpo(_cfg(model_dir, tmp_path / "grpo", seed=7, steps=1, eval_at_start=False))
    sft_module.train_sft(load_config(SFTConfig, overrides=dict(
        model=str(model_dir), dataset="arithmetic:steps=1,max=9", out=str(tmp_path / "sft"), seed=7, steps=1,
        batch_size=2, microbatch_size=2, eval_every=0, eval_at_start=False, eval_at_end=False,
        precision="fp32", tensorboard=False)))
    # (the SFT run never validates: it does not read the validation split)
    assert seen == [("train", 0), ("validation", 0), ("train", 0)]


def test_sampled_validation_beside_the_greedy_one_and_in_the_summary(tmp_path, model_dir, monkeypatch):
    """eval_sampled_samples: a second validation at eval_sampled_temperature, logged as val_sampled/* at every
    validation step; its accuracy is the mean over samples (sampled pass@1) and reaches `rlvr summary`."""
    from rlvr.experiments.runs import load_groups, summarize
    from rlvr.stages import validation as loop_common

    calls = []
    real = loop_common.evaluate

    def spy(engine, examples, prompt, sampling, **kw):
        calls.append((sampling.temperature, sampling.n, sampling.seed))
        return real(engine, examples, prompt, sampling, **kw)

    monkeypatch.setattr(loop_common, "evaluate", spy)
    out = tmp_path / "run"
    train_module.train_grpo(_cfg(model_dir, out, steps=2, eval_sampled_samples=3, eval_sampled_temperature=0.7))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "val/accuracy" in r]
    assert [r["step"] for r in rows] == [0, 2]
    for r in rows:
        assert {"val_sampled/accuracy", "val_sampled/format_rate", "val_sampled/pass@1", "val_sampled/pass@3"} <= set(r)
        assert r["val_sampled/pass@1"] == pytest.approx(r["val_sampled/accuracy"])
        assert "val/pass@1" not in r  # the greedy one stays one sample
    assert calls == [(0.0, 1, 0), (0.7, 3, 0)] * 2  # greedy, then sampled, at each validation step
    run = summarize(load_groups([out])).runs[0]
    assert run.final_val_sampled_accuracy == pytest.approx(rows[-1]["val_sampled/accuracy"])


def test_start_validation_key_ignores_only_what_cannot_change_step_0(tmp_path, model_dir, monkeypatch):
    from rlvr.config import TrainConfig
    from rlvr.stages.validation import NOT_IN_START_VALIDATION, start_validation_key

    assert NOT_IN_START_VALIDATION <= set(TrainConfig.model_fields)  # no typo hides a field from the key
    key = start_validation_key(_cfg(model_dir, tmp_path / "a"))
    for same in ({"algorithm": "dr_grpo"}, {"learning_rate": 5e-4}, {"steps": 9}, {"temperature": 0.7},
                 {"group_size": 2}, {"eval_every": 1}, {"save_every": 1, "resume": True}):
        assert start_validation_key(_cfg(model_dir, tmp_path / "a", **same)) == key, same
    assert start_validation_key(_cfg(model_dir, tmp_path / "elsewhere")) == key
    for other in ({"seed": 1}, {"eval_limit": 3}, {"eval_max_new_tokens": 5}, {"prompt": "question_only"},
                  {"eval_sampled_samples": 1}, {"generation_dtype": "bfloat16"}, {"split_seed": 2},
                  {"generation_batch_size": 7}):
        assert start_validation_key(_cfg(model_dir, tmp_path / "a", **other)) != key, other
    torch.set_num_threads(2)  # bf16 and float sums may round differently with another thread count
    try:
        assert start_validation_key(_cfg(model_dir, tmp_path / "a")) != key
    finally:
        torch.set_num_threads(1)
    (model_dir / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes() + b" ")
    assert start_validation_key(_cfg(model_dir, tmp_path / "a")) != key  # other weights
    assert start_validation_key(_cfg("SmolLM2-135M-Instruct", tmp_path / "a")) is None  # nothing to hash: no cache


def test_step_0_validation_is_computed_once_and_skipping_it_changes_nothing_after(tmp_path, model_dir):
    from rlvr.stages.validation import validation_cache

    # the sampled validation too, which draws random numbers: they come from its own streams
    common = dict(steps=2, seed=3, eval_sampled_samples=2, eval_limit=3)
    train_module.train_grpo(_cfg(model_dir, tmp_path / "first", algorithm="grpo", **common))
    assert len(list(validation_cache().glob("*.json"))) == 1
    train_module.train_grpo(_cfg(model_dir, tmp_path / "cached", algorithm="dr_grpo", learning_rate=3e-3, **common))
    train_module.train_grpo(_cfg(model_dir, tmp_path / "fresh", algorithm="dr_grpo", learning_rate=3e-3,
                                 eval_start_cache=False, **common))
    first, cached, fresh = (read_jsonl(tmp_path / name / "metrics.jsonl") for name in ("first", "cached", "fresh"))
    assert cached[0]["time/validate_cached"] == 1.0 and "time/validate_cached" not in fresh[0]
    assert "val_sampled/accuracy" in cached[0]
    step0 = lambda row: {k: v for k, v in row.items() if k.startswith(("val/", "val_sampled/"))}  # noqa: E731
    assert step0(cached[0]) == step0(first[0])  # read, seconds included
    assert _strip([step0(fresh[0])]) == _strip([step0(first[0])])  # computed again: the same numbers
    assert _strip(cached) == _strip(fresh)  # the skipped validation left the training that follows as it was
    assert read_jsonl(tmp_path / "cached" / "rollouts.jsonl") == read_jsonl(tmp_path / "fresh" / "rollouts.jsonl")
    assert len(list(validation_cache().glob("*.json"))) == 1

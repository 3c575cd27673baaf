"""A user's estimator in its own file (examples/custom_estimator.py, RLOO) trains through every layer:
config, CLI, sweeps, pruning, metrics, checkpoints and resume, with the advantages it defines."""

from pathlib import Path

import pytest
import torch

from rlvr import stages
from rlvr.algorithms.spec import ADVANTAGES, EstimatorSpec, get_preset
from rlvr.config import ConfigError, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.training import rl as train_module
from test_train import _cfg, _parity, _strip  # noqa: F401 (_parity: the autouse reward)

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "custom_estimator.py"
RLOO = f"{EXAMPLE}:RLOO"


def test_rloo_advantages_hand_values():
    spec = get_preset(RLOO)
    assert isinstance(spec, EstimatorSpec) and spec.advantage == "rloo" and "rloo" in ADVANTAGES
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 3.0])
    advantages, _ = ADVANTAGES["rloo"](rewards, 4, spec)
    # group 0: a right answer's others average 1/3 -> +2/3, a wrong one's 2/3 -> -2/3; group 1 has no spread;
    # group 2: 3 - 0 = 3 for the 3, and 0 - 1 = -1 for each 0
    expected = [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 0, -1, -1, -1, 3]
    assert advantages.tolist() == pytest.approx(expected)
    with pytest.raises(ValueError, match="group_size >= 2"):
        ADVANTAGES["rloo"](rewards, 1, spec)


def test_rloo_trains_three_steps_with_its_own_advantages(tmp_path, model_dir, monkeypatch):
    seen = []
    real = stages.rollouts.compute_advantages
    monkeypatch.setattr(stages.rollouts, "compute_advantages",
                        lambda raw, g, spec: seen.append((raw.clone(), spec)) or real(raw, g, spec))
    out = tmp_path / "rloo"
    train_module.train_grpo(_cfg(model_dir, out, algorithm=RLOO, steps=3, log_rollouts_every=1, eval_every=0,
                                 eval_at_start=False))
    rows, rollouts = read_jsonl(out / "metrics.jsonl"), read_jsonl(out / "rollouts.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and len(seen) == 3
    for step, (raw, spec) in enumerate(seen, start=1):
        assert spec.advantage == "rloo" and spec.loss_normalization == "sum"
        logged = [r for r in rollouts if r["step"] == step]
        rewards = torch.tensor([r["reward"] for r in logged])
        assert torch.equal(raw, rewards)
        groups = rewards.view(-1, 4)
        others = (groups.sum(1, keepdim=True) - groups) / 3
        assert [r["advantage"] for r in logged] == pytest.approx((groups - others).reshape(-1).tolist(), abs=1e-6)
        kept = sum(1 for r in logged if r["advantage"] != 0)
        assert rows[step - 1]["train/pruned_fraction"] == pytest.approx(1 - kept / 8)
        for key in ("train/token_entropy", "train/frac_groups_zero_std") + (("train/loss", "train/grad_norm")
                                                                            if kept else ()):
            assert key in rows[step - 1]  # a step whose groups all lack spread trains nothing and logs no loss
    assert any(r["train/updates_trained"] for r in rows)
    assert (out / "final" / "DONE").is_file()
    assert load_config(TrainConfig, out / "config.yaml").algorithm == RLOO


def test_rloo_resumes_exactly(tmp_path, model_dir, crash_at):
    kw = dict(algorithm=RLOO, steps=4, save_every=2)
    train_module.train_grpo(_cfg(model_dir, tmp_path / "straight", **kw))
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_cfg(model_dir, tmp_path / "crashed", **kw))
    undo()
    train_module.train_grpo(_cfg(model_dir, tmp_path / "crashed", resume=True, **kw))
    assert _strip(read_jsonl(tmp_path / "crashed" / "metrics.jsonl")) == _strip(
        read_jsonl(tmp_path / "straight" / "metrics.jsonl"))


def test_rloo_from_the_command_line_and_in_a_sweep_plan(tmp_path, model_dir):
    from typer.testing import CliRunner

    from rlvr.cli import app

    out = tmp_path / "cli"
    result = CliRunner().invoke(app, ["train", f"model={model_dir}", f"out={out}", "dataset=arithmetic",
                                      f"algorithm={RLOO}", "steps=1", "rollout_batch_size=4", "group_size=2",
                                      "max_new_tokens=4", "eval_limit=1", "eval_max_new_tokens=2", "tensorboard=false",
                                      "generation_dtype=float32", "precision=fp32"])
    assert result.exit_code == 0, result.output
    assert "advantage: rloo" in (out / "config.yaml").read_text()
    from rlvr.experiments.sweep_plan import load_sweep, plan_sweep

    sweep_file = tmp_path / "sweep.yaml"
    sweep_file.write_text(f"name: s\nout: {tmp_path / 'sweep'}\nbase:\n  model: {model_dir}\n  steps: 1\n"
                          f"grid:\n  algorithm: [grpo, '{RLOO}']\n", encoding="utf-8")
    plan = plan_sweep(load_sweep(sweep_file, []))
    assert len(plan) == 2


def test_a_bad_import_path_is_a_clear_config_error(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_config(TrainConfig, overrides={"algorithm": str(tmp_path / "nope.py") + ":X"})
    with pytest.raises(ConfigError, match="has no attribute 'NOPE'"):
        load_config(TrainConfig, overrides={"algorithm": f"{EXAMPLE}:NOPE"})
    with pytest.raises(ConfigError, match="not an EstimatorSpec"):
        load_config(TrainConfig, overrides={"algorithm": f"{EXAMPLE}:rloo_advantages"})


def test_an_estimator_that_returns_no_metadata_still_gets_the_signal_statistics():
    from rlvr.algorithms.spec import compute_advantages, register_advantage

    @register_advantage("test_raw")
    def raw(rewards, group_size, spec):
        return rewards.float(), {}

    spec = EstimatorSpec(advantage="test_raw").validate()
    _, meta = compute_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0]), 2, spec)
    assert float(meta["frac_groups_zero_std"]) == pytest.approx(2 / 3)  # groups (1,1) and (2,2)
    assert float(meta["reward_std"]) == pytest.approx(float(torch.tensor([1.0, 1.0, 0.0, 1.0, 2.0, 2.0]).std()))

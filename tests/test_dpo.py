"""DPO (issue 17): the loss against hand-computed values and its closed-form gradient; `rlvr dpo` on pairs
from graded rollouts and from a JSONL; resume and LoRA."""

from __future__ import annotations

import json
import math

import pytest
import torch
from typer.testing import CliRunner

from rlvr.algorithms.losses import dpo_loss
from rlvr.cli import app
from rlvr.config import ConfigError, DPOConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.engines.base import Completion
from rlvr.stages import run as loop_common
from rlvr.tasks.records import DataError
from rlvr.training import dpo as dpo_module


def test_dpo_loss_by_hand():
    # policy - reference: chosen +1.0, rejected -1.0 (pair 0); chosen -0.5, rejected +0.5 (pair 1); beta 0.5
    pc, pr = torch.tensor([-1.0, -3.0]), torch.tensor([-4.0, -1.5])
    rc, rr = torch.tensor([-2.0, -2.5]), torch.tensor([-3.0, -2.0])
    loss, meta = dpo_loss(pc, pr, rc, rr, beta=0.5)
    # margins: 0.5 * (1 - (-1)) = 1.0 and 0.5 * (-0.5 - 0.5) = -0.5
    expected = [math.log1p(math.exp(-1.0)), math.log1p(math.exp(0.5))]
    torch.testing.assert_close(loss, torch.tensor(expected))
    assert float(meta["margin"]) == pytest.approx(0.25) and float(meta["accuracy"]) == 0.5
    assert float(meta["rewards_chosen"]) == pytest.approx((0.5 - 0.25) / 2)
    assert float(meta["rewards_rejected"]) == pytest.approx((-0.5 + 0.25) / 2)


def test_dpo_gradient_is_the_closed_form():
    beta = 0.3
    pc = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    pr = torch.tensor([-1.5, -1.0, -3.0], requires_grad=True)
    rc, rr = torch.tensor([-1.2, -1.9, -0.7]), torch.tensor([-1.1, -1.4, -2.0])
    loss, _ = dpo_loss(pc, pr, rc, rr, beta)
    loss.sum().backward()
    margin = beta * ((pc - rc) - (pr - rr)).detach()
    closed = -beta * torch.sigmoid(-margin)  # d/d log pi(y_c); the rejected side gets the opposite
    torch.testing.assert_close(pc.grad, closed)
    torch.testing.assert_close(pr.grad, -closed)
    with pytest.raises(ValueError, match="beta"):
        dpo_loss(pc, pr, rc, rr, 0.0)


# ----------------------------------------------------------------------------------------------------
# The loop.


def _cfg(model_dir, out, **kw):
    base = dict(model=str(model_dir), dataset="arithmetic:steps=1,max=9", out=str(out), steps=3, questions_per_step=2,
                group_size=4, max_new_tokens=8, microbatch_size=4, learning_rate=1e-2, beta=0.5, eval_every=0,
                eval_at_start=False, eval_at_end=False, generation_dtype="float32", precision="fp32",
                tensorboard=False, log_rollouts_every=1)
    base.update(kw)
    return load_config(DPOConfig, overrides=base)


class GradedStub:
    """Per question: two right answers (one repeated), one wrong, one unformatted."""

    def __init__(self, answers: dict[str, str]):
        self.answers, self.calls = answers, []

    def generate(self, prompts, sampling, progress=None):
        self.calls.append(sampling)
        out = []
        for i, prompt in enumerate(prompts):
            question = prompt.split("User: ")[-1].split("\nAssistant")[0]
            answer = self.answers[question]
            texts = [f" ok </think> <answer> {answer} </answer>", f" ok </think> <answer> {answer} </answer>",
                     f" no </think> <answer> {int(answer) + 1} </answer>", " hmm"]
            out += [Completion(i, j, t, [100 + j], "stop") for j, t in enumerate(texts[: sampling.n])]
        return out

    def sync_weights(self, policy):
        pass


def test_dpo_from_graded_rollouts_pairs_right_with_wrong(tmp_path, model_dir, monkeypatch):
    from rlvr.tasks.datasets import load_split

    cfg = _cfg(model_dir, tmp_path / "run", pairs_per_question=2)
    answers = {q.question: q.answer for q in load_split(cfg, "train")}
    monkeypatch.setattr(loop_common, "HFEngine", lambda *a, **k: GradedStub(answers))
    dpo_module.train_dpo(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        # one distinct right answer and two distinct wrong ones (a wrong number, no format) per question:
        # zip pairs the right one with the first wrong one only
        assert r["train/pairs"] == 2 and r["train/questions_with_pair"] == 1.0
        assert r["train/answer_reward"] == 0.5
    assert rows[-1]["train/margin"] > rows[0]["train/margin"]  # the policy moves toward the chosen answers
    pairs = [json.loads(line) for line in (tmp_path / "run" / "pairs.jsonl").read_text().splitlines()]
    assert all("<answer> " in p["chosen"] and p["chosen"] != p["rejected"] for p in pairs)
    # a sampled pair keeps, and trains, the ids the engine sampled (the stub's one-token ids), not its text
    assert {(tuple(p["chosen_ids"]), tuple(p["rejected_ids"])) for p in pairs} == {((100,), (102,))}


def test_dpo_on_a_jsonl_learns_the_preference_and_resumes_exactly(tmp_path, model_dir, crash_at):
    data = tmp_path / "pairs.jsonl"
    rows = [{"question": f"What is {i} + 1?", "chosen": f" {i} + 1 = {i + 1} </think> <answer> {i + 1} </answer>",
             "rejected": f" I guess </think> <answer> {i} </answer>"} for i in range(6)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    kw = dict(pairs=str(data), batch_size=4, steps=6, save_every=2)
    dpo_module.train_dpo(_cfg(model_dir, tmp_path / "whole", **kw))
    whole = read_jsonl(tmp_path / "whole" / "metrics.jsonl")
    assert whole[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)  # the policy starts as the reference
    assert whole[-1]["train/loss"] < 0.3 and whole[-1]["train/accuracy"] == 1.0

    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        dpo_module.train_dpo(_cfg(model_dir, tmp_path / "cut", **kw))
    undo()
    dpo_module.train_dpo(_cfg(model_dir, tmp_path / "cut", resume=True, **kw))
    cut = read_jsonl(tmp_path / "cut" / "metrics.jsonl")
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time")} for r in rows]  # noqa: E731
    assert strip(cut) == strip(whole)


def test_dpo_with_lora_uses_the_base_as_reference(tmp_path, model_dir):
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"question": "1 + 1?", "chosen": " 2 </think> <answer> 2 </answer>",
                                "rejected": " 3 </think> <answer> 3 </answer>"}) + "\n")
    dpo_module.train_dpo(_cfg(model_dir, tmp_path / "lora", pairs=str(data), batch_size=1, steps=3, lora_rank=4))
    rows = read_jsonl(tmp_path / "lora" / "metrics.jsonl")
    assert rows[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-5)  # adapter starts at zero: policy = base
    assert rows[-1]["train/margin"] > 0


def test_dpo_inputs_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="pairs"):
        load_config(DPOConfig, overrides={"pairs": "pairs.csv"})
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "chosen": "a", "rejected": "b"}\n{"question": "q", "chosen": ""}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: field 'chosen'"):
        dpo_module.load_pairs(bad)
    result = CliRunner().invoke(app, ["dpo", "--help"])
    assert result.exit_code == 0 and "beta" in result.output


def test_a_sweep_of_dpo_runs_and_its_summary(tmp_path, model_dir):
    import yaml

    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"question": "1 + 1?", "chosen": " 2 </think> <answer> 2 </answer>",
                                "rejected": " 3 </think> <answer> 3 </answer>"}) + "\n")
    base = dict(model=str(model_dir), dataset="arithmetic:steps=1,max=9", pairs=str(data), batch_size=1, steps=2,
                learning_rate=1e-2, eval_every=0, eval_at_start=False, eval_limit=2, eval_max_new_tokens=4,
                generation_dtype="float32", precision="fp32", tensorboard=False)
    sweep = tmp_path / "dpo_seeds.yaml"
    sweep.write_text(yaml.safe_dump({"command": "dpo", "base": base, "grid": {"seed": [0, 1]},
                                     "out": str(tmp_path / "runs"), "report": False}))
    result = CliRunner().invoke(app, ["sweep", "--config", str(sweep)])
    assert result.exit_code == 0, result.output
    assert "2 ran, 0 skipped, 0 failed" in result.output
    for seed in (0, 1):
        rows = read_jsonl(tmp_path / "runs" / f"seed={seed}" / "metrics.jsonl")
        assert [r["step"] for r in rows] == [1, 2] and "val/accuracy" in rows[-1]
    summary = CliRunner().invoke(app, ["summary", str(tmp_path / "runs"), "--out", str(tmp_path / "summary.csv")])
    assert summary.exit_code == 0, summary.output
    assert (tmp_path / "summary.csv").read_text().count("\n") >= 3  # header + two runs
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"command": "dpo", "base": {**base, "group_size": 1}, "grid": {"seed": [0]}}))
    refused = CliRunner().invoke(app, ["sweep", "--config", str(bad)])
    assert refused.exit_code != 0 and "group_size" in refused.output

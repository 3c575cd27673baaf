"""Code RL end to end (issue 16): `rlvr train` / `rlvr eval` on a code dataset, programs graded in the sandbox.

A stub engine writes, for each question, one right program (the task's reference solution), one wrong one,
one that never finishes its think block, and one with no code: so every number below is hand-computed.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.engines.base import Completion, SamplingParams
from rlvr.stages import run as loop_common
from rlvr.stages.evaluation import evaluate
from rlvr.tasks.code import code_response, code_task
from rlvr.tasks.prompts import get_prompt
from rlvr.training import rl as train_module

WRONG = " I return nothing. </think>\n```python\ndef f(*args):\n    return None\n```\n"
UNCLOSED = " I keep thinking\n```python\ndef f(*args):\n    return None\n```\n"
NO_CODE = " I do not know."


class CodeStub:
    """Canned completions per question: right, wrong, unclosed think block, no code (then repeats)."""

    def __init__(self, examples):
        self.by_question = {ex.question: ex for ex in examples}
        self.calls = 0

    def generate(self, prompts, sampling, progress=None):
        self.calls += 1
        out = []
        for i, prompt in enumerate(prompts):
            (ex,) = [e for q, e in self.by_question.items() if f"User: {q}\n" in prompt]
            texts = [code_response(ex, think=True), WRONG, UNCLOSED, NO_CODE]
            for j in range(sampling.n):
                text = texts[j % 4]
                out.append(Completion(i, j, text, [100 + (b % 150) for b in text.encode()][:40], "stop",
                                      entropies=[0.5] * 3))
        return out

    def sync_weights(self, policy):
        pass


def test_evaluate_on_code_gives_the_hand_computed_scores():
    examples = code_task("validation", n=6)
    result = evaluate(CodeStub(examples), examples, get_prompt("code"), SamplingParams(n=4, temperature=1.0))
    s = result.summary
    # per question: 1 right of 4; format: right and wrong have a closed think block and a parsable block
    assert s["accuracy"] == 0.25 and s["format_rate"] == 0.5 and s["pass_at_k"]["4"] == 1.0
    assert s["categories"] == {"format1_answer1": 6, "format1_answer0": 6, "format0_answer0": 12}


def test_grpo_on_the_code_task_logs_sandbox_metrics(tmp_path, model_dir, monkeypatch):
    cfg = load_config(TrainConfig, overrides=dict(
        model=str(model_dir), dataset="code:level=1", prompt="code", out=str(tmp_path / "run"), steps=2,
        rollout_batch_size=8, group_size=4, max_new_tokens=40, microbatch_size=4, learning_rate=1e-3,
        eval_every=0, eval_at_start=False, eval_at_end=False, generation_dtype="float32", precision="fp32",
        tensorboard=False, log_rollouts_every=1, train_limit=8, rewards={"code_tests": 1.0, "format": 0.05}))
    examples = _train_examples(cfg)
    monkeypatch.setattr(loop_common, "HFEngine", lambda *a, **k: CodeStub(examples))
    train_module.train_grpo(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        # code_tests: 1 of 4 right; format (think-aware, the prompt's): right and wrong are well formed
        assert row["train/reward"] == pytest.approx(0.25 + 0.05 * 0.5)
        assert row["train/answer_reward"] == 0.25 and row["train/reward/code_tests"] == 0.25
        assert row["train/reward/format"] == 0.5
        # 2 questions x (right, wrong, unclosed: the same wrong program) -> 4 distinct programs; the
        # no-code samples never reach the sandbox
        assert row["grading/code_programs"] == 4 and row["grading/code_ok"] == 4
        assert row["grading/code_timeouts"] == 0 and row["grading/code_crashes"] == 0
    rollouts = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    assert [r["answer_reward"] for r in rollouts[:4]] == [1.0, 0.0, 0.0, 0.0]


def _train_examples(cfg):
    from rlvr.tasks.datasets import load_split

    return load_split(cfg, "train", cfg.train_limit)


def test_a_code_jsonl_runs_through_rlvr_eval(tmp_path, model_dir):
    data = tmp_path / "mbpp_like.jsonl"
    rows = [{"prompt": "Write `double(x)` that returns 2 * x.", "tests": ["assert double(2) == 4"], "entry_point": "double"},
            {"prompt": "Write `inc(x)` that returns x + 1.", "tests": [{"input": [1], "output": 2}], "entry_point": "inc"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", f"model={model_dir}", f"dataset={data}", "prompt=code",
                                      "question_field=prompt", "max_new_tokens=8", "dtype=float32", f"out={out}",
                                      "split=all"])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["accuracy"] == 0.0  # a random tiny model writes no program


def test_code_dataset_with_a_math_prompt_is_refused_before_loading_anything(tmp_path):
    result = CliRunner().invoke(app, ["train", "dataset=code", "prompt=r1_zero", "model=/nonexistent"])
    assert result.exit_code != 0 and "prompt" in result.output and "dataset" in result.output

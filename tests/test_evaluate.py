"""Evaluation summaries (hand-computed), pass@k, and `rlvr eval` end to end on a tiny saved model."""

import json
import math

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.data import Example
from rlvr.evaluate import evaluate, pass_at_k, summarize
from rlvr.prompts import get_prompt
from rlvr.rollout import HFEngine, SamplingParams


def _record(q, reward, fmt, tokens=10, finish="stop"):
    return {"question_index": q, "reward": reward, "answer_reward": reward, "format_reward": fmt,
            "tokens": tokens, "finish_reason": finish}


def test_pass_at_k_formula():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))  # 0.5
    assert pass_at_k(4, 3, 2) == 1.0


def test_summarize_hand_values():
    records = [
        _record(0, 1.0, 1.0, 10), _record(0, 0.0, 1.0, 20),
        _record(1, 0.0, 0.0, 30, "length"), _record(1, 0.0, 0.0, 40, "length"),
    ]
    s = summarize(records, samples=2, seconds=2.0)
    assert s["n"] == 4 and s["questions"] == 2
    assert s["accuracy"] == 0.25 and s["format_rate"] == 0.5
    assert s["categories"] == {"format1_answer1": 1, "format1_answer0": 1, "format0_answer0": 2}
    assert s["mean_response_tokens"] == 25.0 and s["max_response_tokens"] == 40
    assert s["truncated_rate"] == 0.5
    assert s["pass_at_k"] == {"1": pytest.approx(0.25), "2": pytest.approx(0.5)}
    assert s["completions_per_second"] == 2.0


def test_evaluate_end_to_end_on_a_tiny_model(tiny_model, tokenizer):
    examples = [Example("What is 1+1?", "2"), Example("What is 2+2?", "4")]
    engine = HFEngine(tiny_model, tokenizer)
    done = []
    result = evaluate(engine, examples, get_prompt("r1_zero"), SamplingParams(max_new_tokens=6, n=3),
                      progress=done.append)
    assert len(result.records) == 6 and sum(done) == 6
    r = result.records[4]
    assert (r["question_index"], r["sample_index"], r["ground_truth"]) == (1, 1, "4")
    assert r["prompt"].endswith("User: What is 2+2?\nAssistant: <think>")
    assert r["tokens"] <= 6 and r["finish_reason"] in ("stop", "length")
    assert set(result.summary["pass_at_k"]) == {"1", "2", "3"}
    assert sum(result.summary["categories"].values()) == 6


def test_rlvr_eval_command_writes_results_and_summary(tmp_path, tiny_model, tokenizer):
    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", "--model", str(model_dir), "--limit", "3", "--max_new_tokens", "5",
                                      "--samples=2", f"out={out}", "--dataset", "arithmetic"])
    assert result.exit_code == 0, result.output
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 6
    row = json.loads(lines[0])
    assert {"question", "prompt", "response", "ground_truth", "reward", "format_reward", "answer_reward",
            "tokens", "finish_reason"} <= set(row)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 6 and summary["questions"] == 3 and "pass_at_k" in summary
    assert summary["categories"]["format0_answer0"] + summary["categories"]["format1_answer0"] + \
        summary["categories"]["format1_answer1"] == 6
    assert (out / "config.yaml").read_text().count("samples: 2") == 1


def test_rlvr_eval_rejects_bad_config(tmp_path):
    result = CliRunner().invoke(app, ["eval", "--limit", "0"])
    assert result.exit_code == 2 and "field 'limit'" in result.output
    result = CliRunner().invoke(app, ["eval", "--limt", "3"])
    assert result.exit_code == 2 and "unknown field(s) 'limt'" in result.output
    result = CliRunner().invoke(app, ["eval", "--samples", "4", "--temperature", "0"])
    assert result.exit_code == 2 and "temperature" in result.output

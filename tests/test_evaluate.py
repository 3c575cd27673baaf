"""Evaluation summaries (hand-computed), pass@k, and `rlvr eval` end to end on a tiny saved model."""

import json
import math

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.engines.base import Completion, SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.stages.evaluation import evaluate, pass_at_k, summarize, write_results
from rlvr.tasks.prompts import get_prompt
from rlvr.tasks.records import Example


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
    assert result.exit_code == 2 and "unknown field 'limt'; did you mean 'limit'?" in result.output
    result = CliRunner().invoke(app, ["eval", "--samples", "4", "--temperature", "0"])
    assert result.exit_code == 2 and "temperature" in result.output


# ----------------------------------------------------------------------------------------------------
# Evaluation end to end on a stub engine with known completions (issue 21): a non-zero score whose every
# number is computed by hand below.

RIGHT, WRONG, LOOSE = "right", "formatted-wrong", "unformatted"
# question, ground truth, and its 4 samples: (kind, response, finish reason, response tokens)
STUB = [
    ("What is 2+2?", "4", [(RIGHT, " 2+2=4 </think> <answer> 4 </answer>", "stop", 10),
                           (RIGHT, " two and two </think> <answer> 4 </answer>", "stop", 11),
                           (WRONG, " 2+2=5 </think> <answer> 5 </answer>", "stop", 12),
                           (LOOSE, " 2+2 is 4", "stop", 13)]),
    ("What is 3+5?", "8", [(RIGHT, " 3+5=8 </think> <answer> 8 </answer>", "stop", 13),
                           (WRONG, " 3+5=4 </think> <answer> 4 </answer>", "stop", 14),
                           (WRONG, " 3+5=2 </think> <answer> 2 </answer>", "stop", 15),
                           (LOOSE, " 3 plus 5 is 8 and then", "length", 16)]),
    ("What is 9-7?", "2", [(WRONG, " 9-7=8 </think> <answer> 8 </answer>", "stop", 16),
                           (LOOSE, " 9-7=2", "stop", 17),
                           (LOOSE, " nine minus seven is", "length", 18),
                           (WRONG, " 9-7=4 </think> <answer> 4 </answer>", "stop", 19)]),
]
# Every response that is right for its own question is wrong for the others (and the formatted-wrong ones
# name another question's answer), so a record graded against a neighbour's ground truth changes the numbers.
SCORES = {RIGHT: (1.0, 1.0, 1.0), WRONG: (0.0, 1.0, 0.0), LOOSE: (0.0, 0.0, 0.0)}  # reward, format, answer


class StubEngine:
    """The RolloutEngine contract with canned completions: prompt-major, `sampling.n` per prompt. Each
    prompt's completions are looked up by the question it contains, not by its position."""

    def __init__(self, table=STUB, reverse=False):
        self.table, self.reverse = table, reverse
        self.calls, self.synced = [], []

    def generate(self, prompts, sampling, progress=None):
        self.calls.append((list(prompts), sampling))
        out = []
        for i, p in enumerate(prompts):
            (samples,) = [s for q, _, s in self.table if f"User: {q}\n" in p]
            assert sampling.n == len(samples)
            for j, (_, text, finish, tokens) in enumerate(samples):
                out.append(Completion(i, j, text, list(range(100, 100 + tokens)), finish))
        if progress is not None:
            progress(len(out))
        return out[::-1] if self.reverse else out

    def sync_weights(self, policy):
        self.synced.append(policy)


def _stub_examples():
    return [Example(q, a, id=f"stub:{i}") for i, (q, a, _) in enumerate(STUB)]


def _expected_records():
    prompt = get_prompt("r1_zero")
    rows = []
    for qi, (q, a, samples) in enumerate(STUB):
        for si, (kind, text, finish, tokens) in enumerate(samples):
            reward, fmt, answer = SCORES[kind]
            rows.append({"question_index": qi, "sample_index": si, "id": f"stub:{qi}", "question": q,
                         "prompt": prompt.format(q), "response": text, "ground_truth": a, "reward": reward,
                         "format_reward": fmt, "answer_reward": answer, "tokens": tokens, "finish_reason": finish})
    return rows


# 3 right, 5 formatted-wrong, 4 unformatted of 12; 2 truncated; tokens 10..19 in the table above: sum 174.
# pass@k per question with n = 4 and c = 2, 1, 0 correct, pass@k = 1 - C(n-c, k) / C(n, k):
#   c=2: k=1 0.5, k=2 1 - 1/6 = 5/6, k=3 1, k=4 1;  c=1: 0.25, 1 - 3/6 = 0.5, 1 - 1/4 = 0.75, 1;  c=0: 0
EXPECTED_SUMMARY = {
    "n": 12, "questions": 3, "samples": 4, "accuracy": 3 / 12, "answer_rate": 3 / 12, "format_rate": 8 / 12,
    "categories": {"format1_answer1": 3, "format1_answer0": 5, "format0_answer0": 4},
    "mean_response_tokens": 174 / 12, "max_response_tokens": 19, "truncated_rate": 2 / 12,
    "pass_at_k": {"1": (0.5 + 0.25) / 3, "2": (5 / 6 + 0.5) / 3, "3": (1 + 0.75) / 3, "4": 2 / 3},
}


def _assert_summary(summary):
    timing = {k: summary[k] for k in ("seconds", "completions_per_second") if k in summary}
    assert set(summary) - set(timing) == set(EXPECTED_SUMMARY)
    for key, value in EXPECTED_SUMMARY.items():
        assert summary[key] == pytest.approx(value), key


def test_evaluate_on_a_stub_engine_gives_the_hand_computed_score(tmp_path):
    engine = StubEngine()
    done = []
    result = evaluate(engine, _stub_examples(), get_prompt("r1_zero"), SamplingParams(n=4, max_new_tokens=16),
                      progress=done.append)
    (prompts, sampling), = engine.calls
    assert prompts == [get_prompt("r1_zero").format(q) for q, _, _ in STUB]
    assert sampling.stop == ("</answer>",) and sampling.n == 4 and done == [12]  # the prompt's stop string
    assert result.records == _expected_records()
    _assert_summary(result.summary)
    assert EXPECTED_SUMMARY["pass_at_k"] == pytest.approx({"1": 0.25, "2": 4 / 9, "3": 7 / 12, "4": 2 / 3})

    write_results(tmp_path / "out", result)
    lines = (tmp_path / "out" / "results.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == _expected_records()
    written = json.loads((tmp_path / "out" / "summary.json").read_text(encoding="utf-8"))
    _assert_summary(written)


def test_evaluate_grades_each_completion_by_its_prompt_index_not_its_position():
    # the engine contract is prompt-major, but grading must follow each completion's prompt_index
    result = evaluate(StubEngine(reverse=True), _stub_examples(), get_prompt("r1_zero"), SamplingParams(n=4))
    assert result.records == _expected_records()[::-1]
    _assert_summary(result.summary)


def test_validate_reports_the_stub_score_as_val_metrics():
    from rlvr.config import TrainConfig
    from rlvr.stages.validation import validate

    cfg = TrainConfig(eval_samples=4, eval_temperature=0.7, eval_max_new_tokens=24, seed=5)
    engine, policy = StubEngine(), object()
    metrics, records = validate(engine, policy, _stub_examples(), get_prompt("r1_zero"), None, cfg)
    assert engine.synced == [policy]  # the engine samples from the policy being validated
    (_, sampling), = engine.calls
    assert (sampling.n, sampling.temperature, sampling.max_new_tokens, sampling.seed, sampling.stop) == (
        4, 0.7, 24, 5, ("</answer>",))
    assert records == _expected_records()
    seconds = metrics.pop("val/seconds")
    assert seconds >= 0
    assert metrics == pytest.approx({
        "val/accuracy": 0.25, "val/format_rate": 8 / 12, "val/mean_response_tokens": 14.5,
        "val/truncated_rate": 2 / 12, "val/pass@1": 0.25, "val/pass@2": 4 / 9, "val/pass@3": 7 / 12,
        "val/pass@4": 2 / 3})


def test_rlvr_eval_in_blocks_writes_what_one_call_over_every_question_gives(tmp_path, model_dir, monkeypatch):
    """run_eval decodes block by block (so an interrupted evaluation keeps its blocks); the blocks are the engine's
    own chunks (longest prompt first), so the records equal one evaluate() call's, sampled rows included."""
    from rlvr.config import EvalConfig, load_config, sampling_params
    from rlvr.core.models import load_model
    from rlvr.stages.evaluation import eval_blocks, run_eval
    from rlvr.tasks.datasets import load_split

    chunks = []  # the prompt ids of every chunk the engine decodes, in order
    decode = HFEngine._generate_chunk

    def recorded(self, encoded, *args, **kwargs):
        chunks.append([tuple(ids) for ids in encoded])
        return decode(self, encoded, *args, **kwargs)

    monkeypatch.setattr(HFEngine, "_generate_chunk", recorded)
    cfg = load_config(EvalConfig, overrides=dict(model=str(model_dir), dataset="arithmetic", limit=9, samples=2,
                                                 batch_size=4, max_new_tokens=12, dtype="float32",
                                                 examples_per_category=0, out=str(tmp_path / "eval")))
    run_eval(cfg)
    blocked_chunks, chunks[:] = list(chunks), []
    blocked = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    prompt = get_prompt(cfg.prompt)
    examples = load_split(cfg, cfg.split, cfg.limit)
    model, tokenizer = load_model(str(model_dir), dtype="float32")
    blocks = eval_blocks(examples, prompt, tokenizer, 2)
    assert len(blocks) == 5 and sorted(i for b in blocks for i in b) == list(range(9))
    lengths = {len(prompt.format(ex.question, tokenizer)) for ex in examples}
    assert len(lengths) > 1  # prompts of several lengths: the order matters
    one = evaluate(HFEngine(model, tokenizer, batch_size=4, dtype="float32"), examples, prompt,
                   sampling_params(cfg, stop=prompt.stop, seed=cfg.seed), tokenizer=tokenizer).records
    assert chunks == blocked_chunks and len(chunks) == 5
    assert [json.loads(json.dumps(r)) for r in one] == blocked


def test_read_partial_keeps_the_finished_blocks_of_the_same_evaluation_and_names_what_differs(tmp_path, monkeypatch):
    from rlvr.stages.evaluation import read_partial

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    header = {"settings": {"model": "m", "max_new_tokens": 64, "split": "test"}, "weights": "abc", "questions": 40}
    path = tmp_path / "results.partial.jsonl"
    blocks = [{"block": b, "seconds": 0.5, "records": [{"question_index": b}]} for b in (0, 1)]
    path.write_text("\n".join(json.dumps(x) for x in [{"header": header}, *blocks]) + '\n{"block": 2, "rec')
    assert read_partial(path, header) == {0: blocks[0], 1: blocks[1]}  # the cut-short last block runs again
    # the same model directory spelled another way is the same evaluation
    same = {**header, "settings": {**header["settings"], "model": str(tmp_path / "m")}}
    assert read_partial(path, same) == {0: blocks[0], 1: blocks[1]}
    other = {"settings": {**header["settings"], "max_new_tokens": 9}, "weights": "abd", "questions": 41}
    with pytest.raises(ValueError) as err:
        read_partial(path, other)
    said = str(err.value)
    assert "max_new_tokens: saved 64, now 9" in said and "the weights of m differ" in said
    assert "questions: saved 40, now 41" in said and str(path) in said
    path.write_text("\n".join(json.dumps(x) for x in [{"header": header}, blocks[0]]) + "\nnot json\n"
                    + json.dumps(blocks[1]) + "\n")
    with pytest.raises(ValueError, match=r"results\.partial\.jsonl:3: not a block"):  # a broken line in the middle
        read_partial(path, header)

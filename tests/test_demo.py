"""`rlvr demo` end to end on a tiny model: every stage runs, the table is written, a rerun skips done stages."""

import json
import re

from typer.testing import CliRunner

from rlvr.cli import app


def test_demo_runs_every_stage_and_resumes(tmp_path, model_dir):
    out = tmp_path / "demo"
    args = ["demo", f"model={model_dir}", "dataset=arithmetic:steps=1,max=9", f"out={out}", "eval_limit=3",
            "eval_max_new_tokens=4", "sft_steps=2", "sft_batch_size=2", "grpo_steps=1", "rollout_batch_size=4",
            "group_size=2", "max_new_tokens=4", "baseline_limit=2", "baseline_max_new_tokens=4",
            "untrained_eval_limit=2"]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert re.findall(r"stage (\d) of 6: ", result.output) == [str(k) for k in range(1, 7)]
    # the first stage says why the rest exists as soon as it has run, before stage 2 starts
    first = " ".join(result.output[result.output.index("stage 1 of 6"):result.output.index("stage 2 of 6")].split())
    assert "why the rest exists: prompted alone, the untrained model wrote the <answer> format" in first
    # the terminal's tables read whole in 80 columns; the figure is written and named in the last line
    assert max(len(line) for line in result.output.splitlines() if "│" in line or "┃" in line) <= 80
    assert "…" not in result.output
    last = [line for line in result.output.splitlines() if line.strip()][-1]
    assert (out / "results.png").stat().st_size > 10_000 and str(out / "results.png") in last, last
    assert "test accuracy" in result.output
    # the figure's curve: the GRPO stage validated from step 0 (the SFT model) to its end, labelled as validation
    from rlvr.core.tracking import read_jsonl

    assert [r["step"] for r in read_jsonl(out / "grpo" / "metrics.jsonl") if "val/accuracy" in r] == [0, 1]
    assert "validation accuracy during GRPO (100 validation questions, greedy): " in result.output
    assert "GRPO - SFT on the same 3 test questions: " in result.output  # paired, with its verdict
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings) == ["prompting baseline", "baseline eval", "sft", "sft eval", "grpo", "grpo eval"]
    table = (out / "results.md").read_text()
    for stage in ("baseline (first 2)", "after SFT", "after SFT + GRPO"):  # the untrained row names its size
        assert f"| {stage} |" in table
    for stage, n in (("eval_baseline", 2), ("eval_sft", 3), ("eval_grpo", 3)):
        assert json.loads((out / stage / "summary.json").read_text())["n"] == n
    prompting = json.loads((out / "eval_prompting" / "summary.json").read_text())
    assert prompting["n"] == 2 and prompting["dataset"] == "gsm8k"  # the prompting baseline, on GSM8K
    assert "| prompting only |" in table and "Prompting baseline on gsm8k" in table and "+- " in table
    assert (out / "sft" / "final" / "DONE").is_file() and (out / "grpo" / "final" / "DONE").is_file()
    stamp = (out / "sft" / "final" / "DONE").stat().st_mtime
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert (out / "sft" / "final" / "DONE").stat().st_mtime == stamp  # finished stages are not redone
    assert json.loads((out / "timings.json").read_text()) == timings  # and keep the times they took
    assert "reused from an earlier run: prompting baseline, baseline eval, sft, sft eval, grpo, grpo eval" in again.output
    assert "| sft (reused) |" in (out / "results.md").read_text()


def test_why_the_rest_exists_names_the_counts_and_the_stages():
    from rlvr.config import DemoConfig
    from rlvr.experiments.demo import _why

    summary = {"n": 10, "format_rate": 0.2, "categories": {"format1_answer1": 1}}
    names = ["prompting baseline", "baseline eval", "sft", "sft eval", "grpo", "grpo eval"]
    text = " ".join(_why(summary, DemoConfig(), names).split())
    assert "format the grader reads in 2 of 10 answers (1 right; greedy, at most" in text
    assert "SFT (stage 3) teaches the format" in text and "GRPO (stage 5) rewards right answers" in text
    assert "both on arithmetic, where stage 2 shows the same start." in text
    assert max(len(line) for line in _why(summary, DemoConfig(), names).splitlines()) <= 80


def test_a_demo_directory_of_other_settings_is_refused_not_reused(tmp_path, model_dir):
    out = tmp_path / "demo"
    out.mkdir()
    (out / "config.yaml").write_text("dataset: gsm8k\n")
    result = CliRunner().invoke(app, ["demo", f"model={model_dir}", f"out={out}"])
    assert result.exit_code != 0
    assert "holds a demo run with other settings" in result.output and "dataset" in result.output


def test_the_curves_interval_is_wilsons_inside_zero_and_one():
    from rlvr.experiments.demo import _wilson

    lo, hi = _wilson(0.0, 10)  # 0 of 10: the normal interval would be [0, 0]
    assert lo == 0.0 and abs(hi - 0.27754) < 1e-5
    lo, hi = _wilson(0.5, 100)
    assert abs(lo - 0.40383) < 1e-5 and abs(hi - 0.59617) < 1e-5
    assert _wilson(1.0, 10)[1] == 1.0


def test_the_gain_is_paired_over_the_same_questions(tmp_path):
    """after - before per question (matched by id): 3 gained, 1 lost of 6 shared, so d = [1, 1, 1, -1, 0, 0],
    mean 1/3, half width t(0.975, 5) = 2.571 times s / sqrt(6); a question only one side answered is left out."""
    import math

    from rlvr.experiments.demo import _paired_line, paired_gain

    def write(name, rewards):
        d = tmp_path / name
        d.mkdir()
        (d / "results.jsonl").write_text("".join(json.dumps({"id": k, "sample_index": 0, "answer_reward": v}) + "\n"
                                                 for k, v in rewards.items()))
        return d

    before = write("sft", {"a": 0, "b": 0, "c": 0, "d": 1, "e": 1, "f": 0, "only_before": 1})
    after = write("grpo", {"a": 1, "b": 1, "c": 1, "d": 0, "e": 1, "f": 0, "only_after": 0})
    gain = paired_gain(before, after)
    d = [1, 1, 1, -1, 0, 0]
    mean = sum(d) / 6
    s = math.sqrt(sum((x - mean) ** 2 for x in d) / 5)
    assert gain["n"] == 6 and (gain["gained"], gain["lost"]) == (3, 1)
    assert abs(gain["mean"] - 1 / 3) < 1e-12 and abs(gain["half_width"] - 2.571 * s / math.sqrt(6)) < 1e-3
    assert not gain["resolved"] and "includes 0: this run does not resolve a difference" in _paired_line(gain)
    assert paired_gain(before, tmp_path / "missing") is None


def test_the_time_left_is_the_time_so_far_scaled_by_the_stages_shares(tmp_path, capsys, monkeypatch):
    import itertools

    from rlvr.experiments import demo

    # shares 0.1, 0.3, 0.6; the first stage takes 60 s -> 60 / 0.1 * (0.3 + 0.6) = 540 s = 9 min left
    monkeypatch.setattr(demo, "_SHARES", {"a": 0.1, "b": 0.3, "c": 0.6})
    clock = itertools.count(0, 60)  # every perf_counter reading is 60 s after the last
    monkeypatch.setattr(demo.time, "perf_counter", lambda: float(next(clock)))
    stages = demo._Stages(tmp_path, ["a", "b", "c"])
    stages.run("a", False, lambda: None)
    stages.run("b", False, lambda: None)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("stage 1 of 3: a [") and "left" not in lines[0]
    assert lines[1].endswith("about 9 min left]"), lines[1]

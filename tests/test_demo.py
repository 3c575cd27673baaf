"""`rlvr demo` end to end on a tiny model: every stage runs, the table is written, a rerun skips done stages."""

import json

from typer.testing import CliRunner

from rlvr.cli import app


def test_demo_runs_every_stage_and_resumes(tmp_path, model_dir):
    out = tmp_path / "demo"
    args = ["demo", f"model={model_dir}", "dataset=arithmetic:steps=1,max=9", f"out={out}", "eval_limit=3",
            "eval_max_new_tokens=4", "sft_steps=2", "sft_batch_size=2", "grpo_steps=1", "rollout_batch_size=4",
            "group_size=2", "max_new_tokens=4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = (out / "results.md").read_text()
    for stage in ("baseline", "after SFT", "after SFT + GRPO"):
        assert f"| {stage} |" in table
    for stage in ("eval_baseline", "eval_sft", "eval_grpo"):
        assert json.loads((out / stage / "summary.json").read_text())["n"] == 3
    assert (out / "sft" / "final" / "DONE").is_file() and (out / "grpo" / "final" / "DONE").is_file()
    stamp = (out / "sft" / "final" / "DONE").stat().st_mtime
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert (out / "sft" / "final" / "DONE").stat().st_mtime == stamp  # finished stages are not redone

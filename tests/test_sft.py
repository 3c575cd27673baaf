"""`rlvr sft` on a tiny model: it learns, writes its records, and a crash-and-resume logs the same numbers."""

import json

import pytest
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import SFTConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.training import sft as sft_module


def _cfg(model_dir, out, **kw):
    base = dict(model=str(model_dir), dataset="arithmetic:steps=1,max=9", out=str(out), steps=6, batch_size=4,
                microbatch_size=2, learning_rate=1e-2, warmup_steps=1, eval_every=3, eval_limit=2,
                eval_max_new_tokens=4, generation_dtype="float32", precision="fp32", tensorboard=False,
                train_limit=40)
    base.update(kw)
    return load_config(SFTConfig, overrides=base)


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and "seconds" not in k}
            for r in rows]


def test_sft_lowers_the_loss_and_writes_a_finished_model(tmp_path, model_dir):
    out = tmp_path / "run"
    summary = sft_module.train_sft(_cfg(model_dir, out, steps=12))
    rows = read_jsonl(out / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(13))
    assert "val/accuracy" in rows[0] and "val/format_rate" in rows[3] and "val/accuracy" in rows[12]
    nll = [r["train/nll_per_token"] for r in rows[1:]]
    assert nll[-1] < 0.8 * nll[0]
    assert (out / "final" / "DONE").is_file() and (out / "final" / "model.safetensors").is_file()
    assert json.loads((out / "final" / "DONE").read_text())["steps"] == 12
    assert summary["final"].endswith("final")
    # a finished run is not trained again
    assert sft_module.train_sft(_cfg(model_dir, out, steps=12))["already_finished"]


def test_crash_and_resume_logs_the_same_numbers(tmp_path, model_dir, crash_at):
    straight = tmp_path / "straight"
    sft_module.train_sft(_cfg(model_dir, straight, save_every=2))
    crashed = tmp_path / "crashed"
    undo = crash_at(5)
    with pytest.raises(KeyboardInterrupt):
        sft_module.train_sft(_cfg(model_dir, crashed, save_every=2))
    undo()
    assert (crashed / "checkpoints" / "latest").read_text() == "step_000004"
    sft_module.train_sft(_cfg(model_dir, crashed, save_every=2, resume=True))
    assert _strip(read_jsonl(crashed / "metrics.jsonl")) == _strip(read_jsonl(straight / "metrics.jsonl"))


def test_sft_config_checks_and_cli(tmp_path, model_dir):
    with pytest.raises(ValueError, match="batch_size=5 is not a multiple of microbatch_size=2"):
        _cfg(model_dir, tmp_path / "x", batch_size=5)
    result = CliRunner().invoke(app, ["sft", "--model", str(model_dir), "--out", str(tmp_path / "cli"), "steps=2",
                                      "batch_size=2", "microbatch_size=1", "eval_every=0", "eval_limit=1",
                                      "eval_max_new_tokens=2", "tensorboard=false", "dataset=arithmetic"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "cli" / "final" / "DONE").is_file()
    again = CliRunner().invoke(app, ["sft", "--model", str(model_dir), "--out", str(tmp_path / "cli"), "steps=3"])
    assert again.exit_code == 0

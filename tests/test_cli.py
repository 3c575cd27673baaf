"""The command line (issue 21): `rlvr algorithms` lists the preset table, every command's --help lists its
config fields, `rlvr sweep` runs two tiny runs side by side, survives Ctrl-C without leaving a child behind
and finishes when started again, and every shipped sweep and config file loads."""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlvr.algorithms.spec import PRESETS
from rlvr.cli import app
from rlvr.config import BaseConfig, DemoConfig, DPOConfig, EvalConfig, SFTConfig, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.experiments.sweep_plan import LOCK, SweepConfig
from rlvr.serve.config import ServeConfig

ROOT = Path(__file__).resolve().parent.parent
WIDE = {"COLUMNS": "250"}  # rich wraps tables and help text to the terminal width; CliRunner has none


def _table(output: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the one rich table in `output`."""
    header = next(line for line in output.splitlines() if line.startswith("┃"))
    rows = [line for line in output.splitlines() if line.startswith("│")]
    cells = lambda line: [c.strip() for c in re.split("[│┃]", line)[1:-1]]  # noqa: E731
    return cells(header), [cells(r) for r in rows]


def _columns(output: str, names: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of a borderless table whose header holds `names` in order: cells cut at the header's
    column starts."""
    lines = output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(names[0] + " "))
    starts, pos = [], 0
    for name in names:
        pos = lines[at].index(name, pos)
        starts.append(pos)
        pos += len(name)
    rows = []
    for line in lines[at + 1 :]:
        if not line.strip() or line[: starts[1]].strip() not in PRESETS:
            break
        rows.append([line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])])
    return list(names), rows


def test_algorithms_lists_every_preset_with_its_choices():
    result = CliRunner().invoke(app, ["algorithms"], env=WIDE)
    assert result.exit_code == 0, result.output
    header, rows = _columns(result.output, ("name", "baseline", "normaliser", "weighting", "clip", "aggregation",
                                            "steps/rollout", "advantage from", "summary"))
    assert [r[0] for r in rows] == list(PRESETS)
    for row in rows:
        p = PRESETS[row[0]]
        got = dict(zip(header, row))
        assert (got["baseline"], got["normaliser"], got["weighting"], got["aggregation"], got["steps/rollout"],
                got["advantage from"]) == (p.baseline, p.advantage_normalizer, p.importance_reweighting_method,
                                           p.loss_normalization, str(p.steps_per_rollout), p.reward_signal), row[0]
    by_name = {r[0]: dict(zip(header, r)) for r in rows}
    # a few rows by hand, as the estimator table of the docs has them
    assert by_name["dr_grpo"]["aggregation"] == "constant" and by_name["dr_grpo"]["normaliser"] == "none"
    assert by_name["dapo"]["aggregation"] == "token" and by_name["dapo"]["clip"] == "0.2/0.28"
    assert by_name["grpo"]["aggregation"] == "sequence" and by_name["grpo"]["clip"] == ""
    assert by_name["rft"]["advantage from"] == "correctness"


def test_algorithms_reads_whole_at_80_columns():
    result = CliRunner().invoke(app, ["algorithms"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 80 and "…" not in result.output
    _, rows = _columns(result.output, ("name", "base", "norm", "weight", "clip", "agg", "k", "signal"))
    assert [r[0] for r in rows] == list(PRESETS)  # every name whole: grpo_constant, grpo_token, grpo_clip apart
    assert {r[0]: r[-1] for r in rows}["rft"] == "correctness"


CONFIGS = {"eval": EvalConfig, "sft": SFTConfig, "train": TrainConfig, "dpo": DPOConfig, "demo": DemoConfig,
           "sweep": SweepConfig, "serve": ServeConfig}
PLAIN = {"algorithms": [], "plot": ["--out", "--band", "--only"], "report": ["--out", "--band", "--rollouts", "--title"],
         "summary": ["--out"]}


def _field_names(cls) -> list[str]:
    names = []
    for name, field in cls.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseConfig):
            names += [f"{field.alias or name}.{sub}" for sub in section.model_fields]
        else:
            names.append(name)
    return names


@pytest.mark.parametrize("command", list(CONFIGS) + list(PLAIN))
def test_help_of_every_command_exits_0_and_lists_its_config_fields(command):
    result = CliRunner().invoke(app, [command, "--help"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert "Usage: " in result.output and f" {command} " in result.output
    if command in CONFIGS:
        listed = re.findall(r"^[\s│]*([a-z_0-9.]+)=", result.output, flags=re.MULTILINE)
        assert listed == _field_names(CONFIGS[command])  # every field, in order, once; sections as section.field
    else:
        for option in PLAIN[command]:
            assert option in result.output
    if command == "train":  # the defaults are shown with the names
        for text in ("steps=20", "group_size=8", "algorithm=grpo", "learning_rate=1e-05", "rewards=None"):
            assert re.search(rf"^\s*{re.escape(text)}\s", result.output, flags=re.MULTILINE), text


def test_top_level_help_lists_every_command():
    result = CliRunner().invoke(app, ["--help"], env=WIDE)
    assert result.exit_code == 0
    commands = re.findall(r"^│ (\w+)\s{2,}", result.output, flags=re.MULTILINE)
    assert commands == ["eval", "sft", "train", "dpo", "serve", "demo", "algorithms", "sweep", "plot", "report",
                        "summary"]


# ----------------------------------------------------------------------------------------------------
# Sweeps of real `rlvr train` subprocesses.

TINY = {"dataset": "arithmetic:steps=1,max=9", "rollout_batch_size": 4, "group_size": 2, "max_new_tokens": 6,
        "microbatch_size": 4, "eval_limit": 1, "eval_max_new_tokens": 2, "eval_every": 0, "tensorboard": False,
        "generation_dtype": "float32", "precision": "fp32", "log_rollouts_every": 0, "learning_rate": 1e-3}


def _write_sweep(tmp_path, model_dir, steps: int, save_every: int, **top) -> Path:
    base = tmp_path / "configs" / "tiny.yaml"
    base.parent.mkdir(parents=True, exist_ok=True)
    base.write_text(yaml.safe_dump({**TINY, "model": str(model_dir), "steps": steps, "save_every": save_every}))
    sweep = tmp_path / "sweeps" / "tiny.yaml"
    sweep.parent.mkdir(parents=True, exist_ok=True)
    sweep.write_text(yaml.safe_dump({"base": {"config": str(base)}, "grid": {"seed": [0, 1]}, "parallel": 2,
                                     "out": str(tmp_path / "runs"), "report": False, **top}))
    return sweep


def _alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie waiting to be reaped is not)."""
    stat = Path(f"/proc/{pid}/stat")
    if Path("/proc/self/stat").is_file():
        try:
            return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (FileNotFoundError, ProcessLookupError):
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(os.name != "posix", reason="Ctrl-C is SIGINT here")
def test_sweep_runs_two_at_a_time_stops_on_ctrl_c_and_finishes_when_started_again(tmp_path, model_dir):
    # enough steps that the first run cannot finish while the second is still starting up (two process
    # starts on a loaded 2-core machine take seconds; a tiny step takes ~20 ms)
    steps = 200
    sweep = _write_sweep(tmp_path, model_dir, steps=steps, save_every=5)
    runs = [tmp_path / "runs" / f"seed={seed}" for seed in (0, 1)]
    log = (tmp_path / "sweep.log").open("w")
    # As a sweep started from a terminal: a test suite launched in the background (`make test &`, nohup) runs
    # with SIGINT ignored, a disposition children inherit, and Python then never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", "sweep", "--config", str(sweep)], stdout=log,
                            stderr=subprocess.STDOUT, cwd=tmp_path,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    children = []
    try:
        deadline = time.monotonic() + 90
        # both runs at once (parallel: 2), each past its first checkpoint
        while not all((r / "checkpoints" / "latest").is_file() and (r / LOCK).is_file() for r in runs):
            assert proc.poll() is None, (tmp_path / "sweep.log").read_text()
            assert time.monotonic() < deadline, "the runs did not start"
            time.sleep(0.05)
        children = [int(yaml.safe_load((r / LOCK).read_text())["pid"]) for r in runs]
        assert all(_alive(pid) for pid in children)  # two training processes at the same time
        os.kill(proc.pid, signal.SIGINT)  # Ctrl-C, to the sweep only: it must stop its children itself
        assert proc.wait(timeout=40) == 130
        assert not [pid for pid in children if _alive(pid)], "a child run outlived the sweep"
        output = (tmp_path / "sweep.log").read_text()
        assert "sweep interrupted; run the same command again to continue it" in output
        assert output.count("stopped seed=") == 2
        assert not [r for r in runs if (r / LOCK).exists()]
        assert not [r for r in runs if (r / "final" / "DONE").exists()], "interrupt earlier: a run had finished"
    finally:
        log.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in children:  # never leave a stray training process behind, even when the test fails
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)

    again = CliRunner().invoke(app, ["sweep", "--config", str(sweep)])
    assert again.exit_code == 0, again.output
    lines = again.output.splitlines()
    assert "2 runs in" in lines[0] and "2 at a time" in lines[0] and lines[3].strip() == "2 resume"
    starts = [i for i, line in enumerate(lines) if re.match(r"\[\d/2\] start seed=\d \(resume\)", line)]
    dones = [i for i, line in enumerate(lines) if re.match(r"\[\d/2\] done  seed=", line)]
    assert len(starts) == 2 and len(dones) == 2 and max(starts) < min(dones)  # side by side again
    assert "2 ran, 0 skipped, 0 failed" in again.output
    for run in runs:
        assert (run / "final" / "DONE").is_file(), (run / "train.log").read_text()[-2000:]
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(steps + 1))  # one history
        assert not (run / LOCK).exists()


# ----------------------------------------------------------------------------------------------------
# Shipped files.

SWEEP_FILES = sorted((ROOT / "sweeps").glob("*.yaml"))
CONFIG_FILES = sorted((ROOT / "configs").glob("*.yaml"))


def test_the_shipped_files_are_all_found():
    assert {p.stem for p in SWEEP_FILES} >= {"quick_variants", "learning_check", "gsm8k_seeds", "lr_sweep",
                                             "prompt_ablation", "on_policy_variants", "off_policy_variants"}
    assert {p.stem for p in CONFIG_FILES} >= {"sft_arithmetic", "sft_gsm8k", "grpo_arithmetic", "grpo_gsm8k"}


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.stem)
def test_every_shipped_config_loads_into_its_config_class(path):
    kind = path.stem.split("_")[0]
    assert kind in ("sft", "grpo"), f"{path.name}: no config class for this prefix"
    cfg = load_config(SFTConfig if kind == "sft" else TrainConfig, path)
    raw = yaml.safe_load(path.read_text())
    taken = {k: getattr(cfg, k) for k in raw}
    for k, v in raw.items():  # a section (curriculum: {enabled: true}) is compared field by field
        if isinstance(v, dict) and hasattr(taken[k], "model_dump"):
            taken[k] = {field: getattr(taken[k], field) for field in v}
    assert taken == raw  # every value in the file is taken as written


def test_the_curriculum_preset_is_the_gsm8k_preset_with_only_the_curriculum_on():
    # its header quotes a comparison against configs/grpo_gsm8k.yaml: nothing but the curriculum (and where the
    # run is written) may differ, or the numbers it quotes would not describe it
    plain = load_config(TrainConfig, ROOT / "configs" / "grpo_gsm8k.yaml").model_dump()
    curriculum = load_config(TrainConfig, ROOT / "configs" / "grpo_gsm8k_curriculum.yaml").model_dump()
    changed = {k for k in plain if plain[k] != curriculum[k]}
    assert changed == {"curriculum", "out"}
    assert curriculum["curriculum"] == {**plain["curriculum"], "enabled": True}


@pytest.mark.parametrize("path", SWEEP_FILES, ids=lambda p: p.stem)
def test_every_shipped_sweep_plans_with_a_dry_run(path, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # base configs are named relative to the repository
    raw = yaml.safe_load(path.read_text())
    expected = 1
    for values in raw["grid"].values():
        expected *= len(values)
    result = CliRunner().invoke(app, ["sweep", "--config", str(path.relative_to(ROOT)), "dry_run=true",
                                      f"out={tmp_path / 'runs'}"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert f": {expected} runs in {tmp_path / 'runs'}" in result.output
    # Committed records (results/) and other sweeps' finished runs stand in for training; every planned run is
    # one of these three and nothing is left to resume in a fresh out directory.
    counts = dict(reversed(part.split()) for part in result.output.rstrip().splitlines()[-1].split(","))
    assert set(counts) <= {"new", "recorded", "reuse"}, result.output
    assert sum(int(n) for n in counts.values()) == expected
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing

"""A newcomer's first hour (issue 41), through the command line as a user types it: a resume never mixes two
runs, an interrupt says what it saved and how to continue, and mistakes get one line in rlvr's words."""

import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from rlvr.core.tracking import read_jsonl

TINY = {"dataset": "arithmetic:steps=1,max=9", "rollout_batch_size": 4, "group_size": 2, "max_new_tokens": 6,
        "microbatch_size": 4, "eval_limit": 1, "eval_max_new_tokens": 2, "eval_every": 0, "eval_at_start": False,
        "eval_at_end": False, "tensorboard": False, "generation_dtype": "float32", "precision": "fp32",
        "log_rollouts_every": 0, "learning_rate": 1e-3}


def rlvr(*args, cwd, timeout=300, **popen):
    """`rlvr ARGS` in a subprocess: (exit code, stdout + stderr)."""
    out = subprocess.run([sys.executable, "-m", "rlvr.cli", *map(str, args)], cwd=cwd, capture_output=True,
                         text=True, timeout=timeout, env={**os.environ, "COLUMNS": "80"}, **popen)
    return out.returncode, out.stdout + out.stderr


def _overrides(**kw) -> list[str]:
    return [f"{k}={v}" for k, v in {**TINY, **kw}.items()]


def _start(tmp_path, *args, **popen):
    """`rlvr ARGS` started in the background, SIGINT at its default (a backgrounded test run ignores it)."""
    log = open(tmp_path / "run.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", *map(str, args)], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **popen)
    return proc, log


def _wait_for(path, proc, timeout=120):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, "the run ended before it got there"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.05)


def test_a_resume_with_other_settings_is_refused_and_the_saved_ones_are_used(tmp_path, model_dir):
    run = tmp_path / "run"
    proc, log = _start(tmp_path, "train", *_overrides(model=model_dir, out=run, steps=30, save_every=2))
    try:
        _wait_for(run / "checkpoints" / "latest", proc)
    finally:
        proc.kill()  # killed, as a lost session would be
        proc.wait()
        log.close()
    saved = (run / "config.yaml").read_text()
    code, out = rlvr("train", f"out={run}", "resume=true", "rollout_batch_size=8", "max_new_tokens=32", cwd=tmp_path)
    assert code == 2, out
    assert "rollout_batch_size: saved 4, now 8" in out and "max_new_tokens: saved 6, now 32" in out
    assert "Traceback" not in out and (run / "config.yaml").read_text() == saved  # nothing rewritten
    # what a user types to continue: the defaults (32 rollouts, 256 tokens) must not creep in
    code, out = rlvr("train", f"out={run}", "resume=true", "steps=31", cwd=tmp_path)
    assert code == 0, out
    assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == list(range(1, 32))
    record = yaml.safe_load((run / "config.yaml").read_text())
    assert record["steps"] == 31 and record["rollout_batch_size"] == 4 and record["max_new_tokens"] == 6
    code, out = rlvr("train", f"out={run}", "resume=true", "steps=2", cwd=tmp_path)
    assert code == 2 and "steps: saved 31, now 2" in out and "steps may only be raised" in out, out
    code, out = rlvr("train", f"out={run}", "resume=true", "steps=40", cwd=tmp_path)
    assert code == 2 and "holds a finished run of 31 steps" in out and "model=" in out, out


def _interrupt(tmp_path, run, model_dir, sig, steps):
    """Start a run with no periodic checkpoints, send `sig` once two steps are logged; (last line, output)."""
    proc, log = _start(tmp_path, "train", *_overrides(model=model_dir, out=run, steps=steps, save_every=0))
    try:
        deadline = time.monotonic() + 120
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.02)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    output = (tmp_path / "run.log").read_text()
    assert "Traceback" not in output
    last = output.strip().splitlines()[-1]
    assert last.startswith("interrupted after step ") and f"out={run} resume=true" in last, last
    step = int(last.split("interrupted after step ")[1].split()[0])
    assert 2 <= step < steps and (run / "checkpoints" / f"step_{step:06d}").is_dir()
    return last


@pytest.mark.skipif(os.name != "posix", reason="Ctrl-C is SIGINT here")
def test_ctrl_c_saves_the_step_says_so_and_its_command_continues_exactly(tmp_path, model_dir):
    """Ctrl-C on a real `rlvr train` with no periodic checkpoints: the step in flight finishes and is saved, one
    line says so and gives the command; that command continues to the same metrics as one straight run."""
    straight, run = tmp_path / "straight", tmp_path / "run"
    code, out = rlvr("train", *_overrides(model=model_dir, out=straight, steps=20, save_every=0), cwd=tmp_path)
    assert code == 0, out
    last = _interrupt(tmp_path, run, model_dir, signal.SIGINT, 20)
    command = last.split("Continue with: ")[1].split()
    code, out = rlvr(*command[1:], cwd=tmp_path)
    assert code == 0, out
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")} for r in rows]  # noqa: E731
    assert strip(read_jsonl(run / "metrics.jsonl")) == strip(read_jsonl(straight / "metrics.jsonl"))


def test_sigterm_stops_a_run_the_same_way(tmp_path, model_dir):
    _interrupt(tmp_path, tmp_path / "run", model_dir, signal.SIGTERM, 20)


@pytest.mark.skipif(os.name != "posix", reason="Ctrl-C is SIGINT here")
@pytest.mark.timeout(600)
def test_ctrl_c_stops_a_distributed_run_the_same_way(tmp_path, model_dir):
    """Ctrl-C in a terminal reaches every process of its group, the Ray roles' too: the driver still finishes
    the step in flight, learner rank 0 saves it, one line says so, and its command continues the run."""
    pytest.importorskip("ray")
    run = tmp_path / "run"
    args = ["train", *_overrides(model=model_dir, out=run, steps=12, save_every=0, async_max_staleness=1),
            "distributed.rollout_workers=1"]
    args = [a.replace("async_max_staleness", "async.max_staleness") for a in args]
    proc, log = _start(tmp_path, *args, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not ((run / "metrics.jsonl").is_file() and (run / "metrics.jsonl").read_text().count("\n") >= 2):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal does: the whole foreground process group
        assert proc.wait(timeout=180) == 130, (tmp_path / "run.log").read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "run.log").read_text()
    last = output.strip().splitlines()[-1]
    assert "Traceback" not in output and last.startswith("interrupted after step "), output[-3000:]
    step = int(last.split("interrupted after step ")[1].split()[0])
    assert 2 <= step < 12 and (run / "checkpoints" / f"step_{step:06d}").is_dir()
    code, out = rlvr(*last.split("Continue with: ")[1].split()[1:], cwd=tmp_path, timeout=600)
    assert code == 0, out
    rows = [r for r in read_jsonl(run / "metrics.jsonl") if "async/staleness" in r]
    assert [r["step"] for r in rows] == list(range(1, 13))  # every step once: none lost, none repeated


def test_mistakes_get_one_line_in_rlvrs_words(tmp_path):
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    shutil.copytree(root / "configs", tmp_path / "configs")  # a fresh clone: the recipes, no runs yet
    (tmp_path / "afile").write_text("x")

    def error(*args):
        code, out = rlvr(*args, cwd=tmp_path)
        # (log lines of the work done before the check that failed may come first)
        lines = [line for line in out.splitlines() if line.strip() and " INFO " not in line[:14]]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), out
        assert "Traceback" not in out and "Value error" not in out and "(got {" not in out, out
        return lines[0]

    line = error("train", "learnin_rate=1e-5")
    assert "unknown field 'learnin_rate'; did you mean 'learning_rate'?" in line and "valid fields" not in line
    assert "did you mean 'distributed.learners'?" in error("train", "distributed.learnrs=2")
    assert "use --config configs/grpo_arithmetic.yaml" in error("train", "configs/grpo_arithmetic.yaml")
    assert "is not a whole number of groups" in error("train", "rollout_batch_size=7")
    assert "command line + overrides" not in error("train", "learning_rate=-1")
    assert "afile is a file, not a directory" in error("train", f"out={tmp_path / 'afile' / 'sub'}")
    line = error("train", "--config", "configs/grpo_arithmetic.yaml", "out=runs/x")
    assert "runs/sft_arithmetic/final: no such directory" in line
    assert "run `rlvr sft --config configs/sft_arithmetic.yaml` first" in line
    assert "did you mean 'grpo'?" in error("train", "algorithm=grop")
    assert "did you mean 'r1_zero'?" in error("train", "prompt=r1zero")
    assert "did you mean 'gsm8k'?" in error("train", "dataset=gsm8", "out=runs/y")
    assert not (tmp_path / "runs").exists()  # a command that failed its checks leaves nothing behind
    code, out = rlvr("--version", cwd=tmp_path)
    assert code == 0 and out.startswith("rlvr ")


def test_none_on_the_command_line_is_a_choice_where_it_is_one():
    """`baseline=none` chose the preset's mean baseline: "none" was read as "unset" for every field."""
    from rlvr.config import DemoConfig, TrainConfig, load_config

    cfg = load_config(TrainConfig, None, ["baseline=none", "advantage_normalizer=none", "rollout_correction.mode=none",
                                          "teacher=none", "cliprange=null"])
    assert (cfg.baseline, cfg.advantage_normalizer, cfg.rollout_correction.mode) == ("none", "none", "none")
    assert cfg.teacher is None and cfg.cliprange is None
    assert load_config(DemoConfig, None, ["baseline_dataset=none"]).baseline_dataset is None


@pytest.mark.skipif(os.name != "posix", reason="Ctrl-C is SIGINT here")
def test_ctrl_c_in_the_demo_stops_inside_a_stage_and_the_demo_continues_there(tmp_path, model_dir):
    out = tmp_path / "demo"
    args = ["demo", f"model={model_dir}", "dataset=arithmetic:steps=1,max=9", f"out={out}", "eval_limit=3",
            "eval_max_new_tokens=4", "sft_steps=2", "sft_batch_size=2", "grpo_steps=40", "rollout_batch_size=4",
            "group_size=2", "max_new_tokens=4", "baseline_dataset=none", "untrained_eval_limit=2"]
    proc, log = _start(tmp_path, *args)
    metrics = out / "grpo" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 120
        while not (metrics.is_file() and metrics.read_text().count("\n") >= 3):  # step 0's validation + 2 steps
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run.log").read_text()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    last = (tmp_path / "run.log").read_text().strip().splitlines()[-1]
    assert last.startswith("interrupted after step ") and "Run the same `rlvr demo`" in last, last
    stopped = int(last.split("interrupted after step ")[1].split()[0])
    code, output = rlvr(*args, cwd=tmp_path)
    assert code == 0, output
    assert "stage 4 of 5: grpo [" in output and "reused from an earlier run: baseline eval, sft, sft eval" in output
    steps = [r["step"] for r in read_jsonl(metrics)]
    assert steps == list(range(0, 41)) and 2 <= stopped < 40  # one history (step 0: the SFT model's validation)


def test_an_interrupted_evaluation_keeps_its_blocks_and_resume_true_finishes_it_exactly(tmp_path, model_dir):
    """`rlvr eval` appends each finished block of questions to results.partial.jsonl: SIGTERM (or a kill, which
    may cut the last line short) loses at most the block in flight, and the resumed evaluation writes what one
    uninterrupted evaluation writes."""
    import json

    common = [f"model={model_dir}", "dataset=arithmetic:steps=1,max=9", "limit=40", "batch_size=1",
              "max_new_tokens=64", "dtype=float32", "examples_per_category=0"]
    code, out = rlvr("eval", *common, f"out={tmp_path / 'whole'}", cwd=tmp_path)
    assert code == 0, out
    run = tmp_path / "stopped"
    partial = run / "results.partial.jsonl"
    proc, log = _start(tmp_path, "eval", *common, f"out={run}")
    try:
        deadline = time.monotonic() + 120
        while not (partial.is_file() and partial.read_text().count("\n") >= 3):  # the header and two blocks
            assert proc.poll() is None and time.monotonic() < deadline, "the evaluation ended before two blocks"
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 130
    finally:
        proc.kill()
        log.close()
    said = (tmp_path / "run.log").read_text()
    assert "resume=true" in said and "Traceback" not in said, said
    assert "SIGTERM: stopping after the block in flight" in said, said  # a block, not a training step
    kept = partial.read_text().count("\n") - 1
    assert 2 <= kept < 40 and not (run / "results.jsonl").exists()
    with partial.open("a") as f:
        f.write('{"block": 39, "seconds": 0.1, "records": [{"question_in')  # a kill while a block was written
    code, out = rlvr("eval", *common, f"out={run}", cwd=tmp_path)
    assert code == 2 and "resume=true" in out, out  # never overwritten without being asked
    code, out = rlvr("eval", f"out={run}", "resume=true", "max_new_tokens=9", cwd=tmp_path)
    assert code == 2 and "max_new_tokens: saved 64, now 9" in out, out
    code, out = rlvr("eval", f"out={run}", "resume=true", cwd=tmp_path)
    assert code == 0 and f"resume: {kept} of 40 blocks kept" in out, out
    assert (run / "results.jsonl").read_text() == (tmp_path / "whole" / "results.jsonl").read_text()
    summaries = [json.loads((d / "summary.json").read_text()) for d in (tmp_path / "whole", run)]
    for s in summaries:
        s.pop("seconds"), s.pop("completions_per_second")
    assert summaries[0] == summaries[1] and summaries[0]["n"] == 40 and not partial.exists()

"""Issue 63 item 2: a user's reward cannot hang, kill or corrupt a run. A reward that never returns costs a
timeout (reward_timeout) or a stop signal, not the run; a reward that raises or calls sys.exit ends the run with
the finished steps saved and the command that continues it; rewards get copies of the rows, so nothing they do
changes the dataset; step 0's validation cache knows one function from another of the same name."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import train_cfg
from rlvr.config import EvalConfig, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.stages.run import RunFailed
from rlvr.tasks.datasets import load_dataset
from rlvr.tasks.records import Example
from rlvr.tasks.reward_base import RewardContext, RewardError, score_batch
from rlvr.tasks.task import load_task

# a reward that misbehaves at the step its trainer_state says (3 steps of 2 questions x 2 samples: global_step
# 0, 1, 2), and behaves otherwise; MODE comes from the environment so one file serves every case
REWARDS = '''
import os, sys, threading, time
from pathlib import Path

def mood(completions, trainer_state, **kwargs):
    if trainer_state.global_step == 1:
        mode = os.environ.get("RLVR_TEST_MODE", "")
        Path(os.environ.get("RLVR_TEST_MARK", "/dev/null")).write_text("in the reward")
        if mode == "hang":
            threading.Event().wait()
        if mode == "raise":
            raise KeyError("no such column")
        if mode == "exit":
            sys.exit(3)
    return [float(len(c) % 3 == 0) for c in completions]
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "moody.py"
    path.write_text(REWARDS)
    return path


def _cfg(model_dir, out, rewards_file, **kw):
    return train_cfg(model_dir, out, rewards={f"{rewards_file}:mood": 1.0}, rollout_batch_size=4, group_size=2,
                     eval_every=0, eval_at_start=False, eval_at_end=False, log_rollouts_every=0, **kw)


@pytest.mark.parametrize("mode, says", [
    ("raise", r"step 2 of 3 failed: reward function '.*moody\.py:mood' raised KeyError on the batch: 'no such column'"),
    ("exit", r"step 2 of 3 failed: reward function '.*moody\.py:mood' on the batch called sys\.exit\(3\)"),
    ("hang", r"step 2 of 3 failed: reward function '.*moody\.py:mood' on the batch did not return within 1 s "
             r"\(reward_timeout=1\)"),
])
def test_a_reward_that_fails_keeps_the_finished_steps_and_resumes_exactly(tmp_path, model_dir, rewards_file,
                                                                           monkeypatch, mode, says):
    """save_every=0: before, an error discarded every step silently (sys.exit ended the run with no output,
    a hang hung forever). Now step 1 is saved, the message says how to go on, and the resumed run (the reward
    fixed) logs what the uninterrupted run logs."""
    from rlvr.training import rl

    whole = _cfg(model_dir, tmp_path / "whole", rewards_file)
    rl.train_grpo(whole)
    monkeypatch.setenv("RLVR_TEST_MODE", mode)
    broken = _cfg(model_dir, tmp_path / "run", rewards_file, save_every=0, reward_timeout=1)
    with pytest.raises(RunFailed, match=says) as failed:
        rl.train_grpo(broken)
    message = str(failed.value)
    assert "step_000001" in message and f"rlvr train out={tmp_path / 'run'} resume=true" in message
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()
    monkeypatch.setenv("RLVR_TEST_MODE", "")
    rl.train_grpo(_cfg(model_dir, tmp_path / "run", rewards_file, save_every=0, reward_timeout=1, resume=True))
    resumed, uninterrupted = (read_jsonl(tmp_path / d / "metrics.jsonl") for d in ("run", "whole"))
    assert [m["step"] for m in resumed] == [1, 2, 3]
    for key in ("train/reward", "train/loss"):
        assert [m.get(key) for m in resumed] == [m.get(key) for m in uninterrupted], key


def _rlvr(args, cwd, env):
    return subprocess.Popen([sys.executable, "-m", "rlvr.cli", *map(str, args)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ, **env},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _args(model_dir, out, rewards_file, **kw):
    settings = dict(model=model_dir, dataset="arithmetic:steps=1,max=9", out=out, steps=3, rollout_batch_size=4,
                    group_size=2, max_new_tokens=6, microbatch_size=4, eval_every=0, eval_at_start="false",
                    eval_at_end="false", tensorboard="false", generation_dtype="float32", precision="fp32",
                    log_rollouts_every=0, save_every=0, **kw)
    return ["train", *(f"{k}={v}" for k, v in settings.items()), f"rewards={{{rewards_file}:mood: 1.0}}"]


def test_sigterm_during_a_stuck_reward_ends_the_run_with_its_finished_steps_saved(tmp_path, model_dir, rewards_file):
    """A scheduler's SIGTERM while a reward hangs (no timeout): before, the process printed "stopping after the
    step in flight" and stayed alive, and the SIGKILL that followed lost the run. Now it stops within seconds,
    saved, saying how to continue."""
    mark = tmp_path / "mark"
    proc = _rlvr(_args(model_dir, tmp_path / "run", rewards_file, reward_timeout="none"), tmp_path,
                 {"RLVR_TEST_MODE": "hang", "RLVR_TEST_MARK": str(mark)})
    deadline = time.monotonic() + 240
    while not mark.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.poll() else "slow"
        time.sleep(0.2)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert time.monotonic() - sent < 30, out
    assert proc.returncode == 130, out
    assert "stopping after the step in flight" in out
    assert "interrupted during step 2 of 3" in out and "was still running" in out
    assert f"rlvr train out={tmp_path / 'run'} resume=true" in out
    assert (tmp_path / "run" / "checkpoints" / "step_000001").is_dir()


def test_a_reward_that_calls_sys_exit_is_an_error_in_one_line_from_the_command_line(tmp_path, model_dir, rewards_file):
    proc = _rlvr(_args(model_dir, tmp_path / "run", rewards_file), tmp_path, {"RLVR_TEST_MODE": "exit"})
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 1, out
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "called sys.exit(3)" in error[0] and "resume=true" in error[0], out
    assert "Traceback" not in out


def test_a_reward_that_changes_the_rows_changes_nothing_of_the_dataset(tmp_path):
    """Rewards got the rows' own objects: one that mutated nested columns or prompt messages changed every later
    prompt ("HIJACKED") and grew list columns step by step."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": [{"role": "system", "content": "Be brief."},
                                                   {"role": "user", "content": f"q{i}"}],
                                        "meta": {"tags": ["a"], "level": i}}) + "\n" for i in range(3)))
    (tmp_path / "vandal.py").write_text(textwrap.dedent('''
        def vandal(prompts, completions, meta, **kwargs):
            for p, m in zip(prompts, meta):
                p[0]["content"] = "HIJACKED"
                m["tags"].append("x")
                m.pop("level")
            return [1.0 for _ in completions]

        def per_row(response, ground_truth, meta, **row):
            meta["tags"].clear()
            return 1.0
        '''))
    cfg = load_config(EvalConfig, overrides={"dataset": str(rows), "prompt": "row", "split": "all", "rewards": {
        f"{tmp_path / 'vandal.py'}:vandal": 1.0, f"{tmp_path / 'vandal.py'}:per_row": 1.0}})
    task = load_task(cfg)
    examples = task.split("all")
    before = [json.dumps([e.fields, e.conversation]) for e in examples]
    for _ in range(3):
        context = RewardContext(prompts=["p"] * 3, completion_ids=[[1]] * 3, rows=examples)
        scores, _ = score_batch(task.reward_fn, ["a", "b", "c"], ["", "", ""], context)
        assert [s["reward"] for s in scores] == [2.0, 2.0, 2.0]
    assert [json.dumps([e.fields, e.conversation]) for e in examples] == before


def test_a_reward_that_pops_metadata_cannot_break_the_reasoning_gym_reward():
    pytest.importorskip("reasoning_gym")
    from rlvr.tasks.rewards import combine_rewards, get_reward_fn
    from rlvr.tasks.user_rewards import UserReward

    def thief(completions, metadata, **kwargs):
        for m in metadata:
            m.clear()
        return [0.0 for _ in completions]

    rows = load_dataset("reasoning_gym:chain_sum:size=2", "train", require_answer=False)
    fn = combine_rewards([("thief", UserReward("python:0:thief", thief), 1.0),
                          ("reasoning_gym", get_reward_fn("reasoning_gym"), 1.0)])
    answers = [f"<answer>{r.answer}</answer>" for r in rows]
    for _ in range(2):
        scores, _ = score_batch(fn, answers, [r.answer for r in rows], RewardContext(rows=rows))
        assert [s["reward/reasoning_gym"] for s in scores] == [1.0, 1.0]


def test_step_0_validation_is_cached_by_what_the_reward_is_not_its_name(tmp_path, model_dir):
    """A second run with another function of the same name reported the first one's accuracy as cached."""
    from rlvr.stages.validation import start_validation_key
    from rlvr.tasks.user_rewards import register_reward

    def score(completions, **kwargs):
        return [1.0 for _ in completions]

    def keys():
        register_reward("score", score)
        cfg = train_cfg(model_dir, tmp_path / "run", rewards={"python:0:score": 1.0})
        return start_validation_key(cfg)

    first = keys()
    assert keys() == first  # the same function: the same key

    def score(completions, **kwargs):  # noqa: F811 -- a notebook cell run again with other code
        return [0.0 for _ in completions]

    assert keys() != first
    helper = tmp_path / "pkg"
    helper.mkdir()
    (helper / "helpers.py").write_text("BONUS = 1.0\n")
    (helper / "rewards.py").write_text("from helpers import BONUS\n\ndef r(completions, **kw):\n"
                                       "    return [BONUS for _ in completions]\n")
    cfg = train_cfg(model_dir, tmp_path / "run", rewards={f"{helper / 'rewards.py'}:r": 1.0})
    before = start_validation_key(cfg)
    (helper / "helpers.py").write_text("BONUS = 2.0\n")  # the helper it imports changed: another reward
    assert start_validation_key(cfg) != before


def test_reward_timeout_is_validated_and_none_means_no_bound(tmp_path):
    assert load_config(TrainConfig, overrides={"reward_timeout": "none"}).reward_timeout is None
    assert load_config(TrainConfig).reward_timeout == 300
    with pytest.raises(ValueError, match="reward_timeout"):
        load_config(TrainConfig, overrides={"reward_timeout": 0})


def test_a_slow_async_reward_is_bounded_too():
    import asyncio

    from rlvr.tasks.user_rewards import UserReward

    async def slow(completions, **kwargs):
        await asyncio.sleep(60)
        return [1.0 for _ in completions]

    fn = UserReward("python:0:slow", slow, timeout=0.5)
    start = time.monotonic()
    with pytest.raises(RewardError, match=r"'slow' on the batch did not return within 0.5 s"):
        score_batch(fn, ["a"], [""], RewardContext(rows=[Example("q", "")]))
    assert time.monotonic() - start < 10

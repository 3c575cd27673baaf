"""DAPO's dynamic sampling (`rlvr train dynamic_sampling=true`): groups without reward spread are replaced by new
questions, so every trained group carries signal."""

import pytest

from conftest import train_cfg
from rlvr import rl as train_module
from rlvr.tracking import read_jsonl


def even_answers_only(response: str, ground_truth: str) -> dict:
    """Questions with an odd answer always score 0 (no spread); even ones score the response's parity."""
    r = float(sum(map(ord, response)) % 2) if int(ground_truth) % 2 == 0 else 0.0
    return {"reward": r, "format_reward": 0.0, "answer_reward": r}


@pytest.fixture(autouse=True)
def _reward(monkeypatch):
    monkeypatch.setattr(train_module, "build_reward_fn", lambda cfg, name: even_answers_only)


def _cfg(model_dir, out, **kw):
    return train_cfg(model_dir, out, **{"rollout_batch_size": 12, "max_new_tokens": 8, "microbatch_size": 4,
                                        "eval_every": 0, "eval_at_start": False, "eval_at_end": False,
                                        "log_rollouts_every": 1, **kw})


def test_dynamic_sampling_trains_only_groups_with_spread(tmp_path, model_dir):
    plain, dynamic = tmp_path / "plain", tmp_path / "dynamic"
    train_module.train_grpo(_cfg(model_dir, plain))
    train_module.train_grpo(_cfg(model_dir, dynamic, dynamic_sampling=True, dynamic_sampling_rounds=6))
    before = [r for r in read_jsonl(plain / "metrics.jsonl") if "train/reward" in r]
    after = [r for r in read_jsonl(dynamic / "metrics.jsonl") if "train/reward" in r]
    assert sum(r["train/frac_groups_zero_std"] for r in before) > 0  # odd answers give dead groups
    for r in after:
        assert r["train/dynamic_kept_groups"] == 3 and r["train/frac_groups_zero_std"] == 0.0
        assert r["train/dynamic_rounds"] >= 1
        assert r["train/dynamic_sampled_rollouts"] >= 12
    rows = read_jsonl(dynamic / "rollouts.jsonl")
    assert rows and all(int(row["ground_truth"]) % 2 == 0 for row in rows)  # only questions that can have spread


def test_dynamic_sampling_short_of_groups_trains_what_it_found(tmp_path, model_dir):
    # one round only: the batch is whatever had spread in it (fewer groups), and the step still trains
    out = tmp_path / "short"
    train_module.train_grpo(_cfg(model_dir, out, dynamic_sampling=True, dynamic_sampling_rounds=1, steps_per_rollout=2,
                                 algorithm="offpolicy_clip", rollout_batch_size=24))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward" in r]
    assert all(r["train/dynamic_rounds"] == 1 and r["train/dynamic_sampled_rollouts"] == 24 for r in rows)
    assert any(0 < r["train/dynamic_kept_groups"] < 6 for r in rows)
    assert all(r["train/nonfinite_steps"] == 0 for r in rows)


def test_dynamic_sampling_questions_oversamples_the_first_round(tmp_path, model_dir):
    # 12 questions x 4 in one round for a batch of 3 groups: about half the questions can have spread, so one
    # round fills the batch and the groups beyond the third are dropped
    out = tmp_path / "over"
    train_module.train_grpo(_cfg(model_dir, out, dynamic_sampling=True, dynamic_sampling_rounds=1,
                                 dynamic_sampling_questions=12))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward" in r]
    assert rows and all(r["train/dynamic_rounds"] == 1 and r["train/dynamic_sampled_rollouts"] == 48 for r in rows)
    assert all(r["train/dynamic_kept_groups"] <= 3 for r in rows)
    assert sum(r["train/dynamic_kept_groups"] == 3 for r in rows) >= len(rows) - 1
    by_step: dict[int, set] = {}
    for row in read_jsonl(out / "rollouts.jsonl"):
        by_step.setdefault(row["step"], set()).add(row["question"])
    assert by_step and all(len(qs) <= 3 for qs in by_step.values())  # extras beyond a full batch are not trained


@pytest.mark.parametrize("kw, field", [({"dynamic_sampling_questions": 8}, "dynamic_sampling=true"),
                                       ({"dynamic_sampling": True, "dynamic_sampling_questions": 2},
                                        "dynamic_sampling_questions=2")])
def test_dynamic_sampling_questions_is_validated(tmp_path, model_dir, kw, field):
    with pytest.raises(ValueError, match=field):
        _cfg(model_dir, tmp_path / "bad", **kw)

"""DAPO's dynamic sampling (`rlvr train dynamic_sampling=true`): groups without reward spread are replaced by new
questions, so every trained group carries signal."""

import pytest

from conftest import train_cfg
from rlvr import stages
from rlvr.core.tracking import read_jsonl
from rlvr.training import rl as train_module


def even_answers_only(response: str, ground_truth: str) -> dict:
    """Questions with an odd answer always score 0 (no spread); even ones score the response's parity."""
    r = float(sum(map(ord, response)) % 2) if int(ground_truth) % 2 == 0 else 0.0
    return {"reward": r, "format_reward": 0.0, "answer_reward": r}


@pytest.fixture(autouse=True)
def _reward(monkeypatch):
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: even_answers_only)


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


def always_right(response: str, ground_truth: str) -> dict:
    return {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}


def always_wrong(response: str, ground_truth: str) -> dict:
    return {"reward": 0.0, "format_reward": 0.0, "answer_reward": 0.0}


def _rows_per_step(out):
    counts: dict[int, int] = {}
    for row in read_jsonl(out / "rollouts.jsonl"):
        counts[row["step"]] = counts.get(row["step"], 0) + 1
    return counts


def test_dynamic_sampling_keeps_the_groups_its_estimator_learns_from(tmp_path, model_dir, monkeypatch):
    """Issue 36 item 4: RFT has no baseline, so an all-right group carries all of its signal: kept, in one round,
    where a spread test would throw every group away and train the oversized last round."""
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: always_right)
    out = tmp_path / "rft"
    train_module.train_grpo(_cfg(model_dir, out, algorithm="rft", steps=2, dynamic_sampling=True,
                                 dynamic_sampling_rounds=3))
    rows = [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward" in r]
    assert all(r["train/dynamic_rounds"] == 1 and r["train/dynamic_kept_groups"] == 3 for r in rows)
    assert all(r["train/updates_trained"] == 1 and r["train/trained_tokens"] > 0 for r in rows)
    assert set(_rows_per_step(out).values()) == {12}


def test_dynamic_sampling_with_nothing_to_learn_trains_no_more_than_a_batch(tmp_path, model_dir, monkeypatch):
    """REINFORCE, one sample a question, every answer wrong: no question has signal in any round; the step
    takes one batch of the last round (8 rollouts), not the 4 x 8 that round generated, and rollout metrics
    describe all 8 + 32 + 32 sampled, with the kept batch's beside them."""
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: always_wrong)
    out = tmp_path / "reinforce"
    train_module.train_grpo(_cfg(model_dir, out, algorithm="reinforce", group_size=1, rollout_batch_size=8, steps=1,
                                 dynamic_sampling=True, dynamic_sampling_rounds=3))
    row = [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward" in r][-1]
    assert row["train/dynamic_kept_groups"] == 0 and row["train/dynamic_sampled_rollouts"] == 8 + 32 + 32
    assert _rows_per_step(out) == {1: 8}
    assert row["train/pass@1"] == 0.0 and row["train/kept_pass@1"] == 0.0
    assert "rollout/kept_mean_tokens" in row and row["rollout/max_tokens"] >= row["rollout/kept_max_tokens"]


def test_dynamic_sampling_metrics_describe_everything_sampled(tmp_path, model_dir):
    out = tmp_path / "metrics"
    train_module.train_grpo(_cfg(model_dir, out, steps=2, dynamic_sampling=True, dynamic_sampling_rounds=6))
    for r in [r for r in read_jsonl(out / "metrics.jsonl") if "train/reward" in r]:
        # pass@1 of equal-sized groups is the mean answer reward: of all sampled, and of the kept batch
        assert r["train/pass@1"] == pytest.approx(r["train/sampled_answer_reward"])
        assert r["train/kept_pass@1"] == pytest.approx(r["train/answer_reward"])
        assert r["train/dynamic_sampled_rollouts"] > 12 or r["train/pass@1"] == r["train/kept_pass@1"]


def right_on_odd_answers_with_shaping(response: str, ground_truth: str) -> dict:
    """Questions with an odd answer are always answered right, and a length-like shaping term (-0.1 on odd
    character sums, like the overlong term) gives their groups reward spread without answer spread; even ones
    score the response's parity, as `even_answers_only`, with the same shaping."""
    parity = sum(map(ord, response)) % 2
    right = 1.0 if int(ground_truth) % 2 else float(parity)
    return {"reward": right - 0.1 * parity, "format_reward": 1.0, "answer_reward": right}


def _trained_truths(out) -> set[int]:
    return {int(row["ground_truth"]) % 2 for row in read_jsonl(out / "rollouts.jsonl")}


def test_dynamic_sampling_judges_groups_by_the_answer_by_default(tmp_path, model_dir, monkeypatch):
    """Issue 56 item 5: an all-right group whose shaped reward varies (the overlong term, a format bonus) has no
    answer spread: DAPO and verl drop it, and so does rlvr by default; `dynamic_sampling_signal=reward` keeps it,
    as the old filter on the shaped reward did (where std normalisation made a 0.1 penalty a full advantage)."""
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: right_on_odd_answers_with_shaping)
    by_answer, by_reward = tmp_path / "answer", tmp_path / "reward"
    train_module.train_grpo(_cfg(model_dir, by_answer, steps=2, dynamic_sampling=True, dynamic_sampling_rounds=6))
    train_module.train_grpo(_cfg(model_dir, by_reward, steps=2, dynamic_sampling=True, dynamic_sampling_rounds=6,
                                 dynamic_sampling_signal="reward"))
    rows = [r for r in read_jsonl(by_answer / "metrics.jsonl") if "train/reward" in r]
    assert rows and all(r["train/dynamic_kept_groups"] == 3 for r in rows)
    assert _trained_truths(by_answer) == {0}  # only questions whose answers can differ
    assert all(0 < r["train/answer_reward"] < 1 for r in rows)
    assert _trained_truths(by_reward) == {0, 1}  # all-right groups with shaped spread were kept


def test_dynamic_sampling_with_an_estimator_of_correctness_judges_by_the_answer(tmp_path, model_dir, monkeypatch):
    """maxrl computes its advantages from the answer: its groups are judged by the answer whatever the setting."""
    monkeypatch.setattr(stages, "build_reward_fn", lambda cfg, name: right_on_odd_answers_with_shaping)
    out = tmp_path / "maxrl"
    train_module.train_grpo(_cfg(model_dir, out, algorithm="maxrl", steps=1, dynamic_sampling=True,
                                 dynamic_sampling_rounds=6, dynamic_sampling_signal="reward"))
    assert _trained_truths(out) == {0}


def test_dynamic_sampling_without_a_reward_advantage_is_refused(tmp_path, model_dir):
    """opd (advantage=none) gives every group zero reward advantage: dynamic sampling would keep nothing and
    generate dynamic_sampling_rounds batches a step. Refused at config time; opd_grpo has one and is accepted."""
    with pytest.raises(ValueError, match="algorithm=opd .*advantage=none.*keep nothing"):
        _cfg(model_dir, tmp_path / "opd", algorithm="opd", teacher=str(model_dir), dynamic_sampling=True)
    _cfg(model_dir, tmp_path / "opd_grpo", algorithm="opd_grpo", teacher=str(model_dir), dynamic_sampling=True)
    with pytest.raises(ValueError, match="dynamic_sampling_signal"):
        _cfg(model_dir, tmp_path / "bad", dynamic_sampling=True, dynamic_sampling_signal="format")

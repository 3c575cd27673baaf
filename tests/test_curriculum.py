"""The online pass-rate curriculum (issue 39.1, rlvr.stages.curriculum): pools by hand, the batch's shares,
determinism for a seed, exact resume, and a run with it on (local and with dynamic sampling)."""

import json
import types

import pytest

from conftest import train_cfg
from test_train import _parity  # noqa: F401 (autouse: a reward with spread in most groups)
from rlvr import stages
from rlvr.config import CurriculumConfig
from rlvr.core.tracking import read_jsonl
from rlvr.stages.curriculum import Curriculum
from rlvr.tasks.records import DataOrder, Example
from rlvr.training import rl as train_module

TRAIN = [Example(f"q{i}", str(i)) for i in range(20)]


def _curriculum(**cfg) -> Curriculum:
    return Curriculum(DataOrder(len(TRAIN), "t"), TRAIN, CurriculumConfig(enabled=True, **cfg), "t")


def _record(c: Curriculum, question: int, right: list[bool]) -> None:
    completions = [types.SimpleNamespace(prompt_index=0) for _ in right]
    c.record([TRAIN[question]], completions, [{"answer_reward": float(r), "reward": float(r)} for r in right])


def test_without_statistics_the_curriculum_draws_the_runs_order():
    c, order = _curriculum(), DataOrder(len(TRAIN), "t")
    assert [c.take(3) for _ in range(10)] == [order.take(3) for _ in range(10)]  # across an epoch too


def test_pools_and_the_batch_shares_by_hand():
    c = _curriculum(hard_fraction=0.1, easy_fraction=0.1, signal_fraction=0.5, min_samples=4)
    for q in (0, 1):
        _record(c, q, [True] * 4)  # easy
    for q in (2, 3):
        _record(c, q, [False] * 4)  # hard
    _record(c, 4, [False] * 3)  # wrong but only 3 samples: not settled yet
    for q in range(5, 12):
        _record(c, q, [True, False, False, False])  # signal
    assert c.pools() == {"easy": [0, 1], "hard": [2, 3], "signal": list(range(5, 12))}
    batch = c.take(10)
    assert len(batch) == len(set(batch)) == 10
    assert len([q for q in batch if q in (0, 1)]) == 1 and len([q for q in batch if q in (2, 3)]) == 1
    assert len([q for q in batch if 5 <= q < 12]) >= 5  # its share, and the run's order may add more
    m = c.last
    assert (m["curriculum/easy"], m["curriculum/hard"], m["curriculum/signal"], m["curriculum/seen"]) == (2, 2, 7, 12)
    known = [q for q in batch if q < 12]
    rates = {0: 1, 1: 1, 2: 0, 3: 0, 4: 0, **{q: 0.25 for q in range(5, 12)}}
    assert m["curriculum/batch_expected_pass_rate"] == pytest.approx(sum(rates[q] for q in known) / len(known))
    # the rest of the batch comes from the order and never from the settled pools beyond their share
    c2 = _curriculum(hard_fraction=0.0, easy_fraction=0.0, signal_fraction=0.0, min_samples=4)
    c2.load(c.state() | {"draws": 0})
    assert not set(c2.take(15)) & {0, 1, 2, 3}


def test_draws_are_deterministic_for_a_seed_and_resume_exactly():
    a, b = _curriculum(), _curriculum()
    for c in (a, b):
        for q in range(8):
            _record(c, q, [q % 2 == 0, q % 3 == 0, True, False])
    assert [a.take(4) for _ in range(6)] == [b.take(4) for _ in range(6)]
    resumed = Curriculum(DataOrder(len(TRAIN), "t", **a.order.state()), TRAIN, a.cfg, "t")
    resumed.load(a.state())
    assert [a.take(4) for _ in range(6)] == [resumed.take(4) for _ in range(6)]
    other = Curriculum(DataOrder(len(TRAIN), "u"), TRAIN, a.cfg, "u")
    other.load(a.state())
    assert [a.take(4) for _ in range(6)] != [other.take(4) for _ in range(6)]


def test_a_batch_larger_than_the_unsettled_questions_is_still_filled():
    c = _curriculum(hard_fraction=0.1, easy_fraction=0.1, signal_fraction=0.0, min_samples=1)
    for q in range(20):
        _record(c, q, [q < 10])  # every question settled: 10 easy, 10 hard
    batch = c.take(6)
    assert len(batch) == len(set(batch)) == 6


def _settled(c: Curriculum) -> None:
    """Questions 0-3 easy, 4-7 hard, 8-11 signal; 12-19 unseen (the run's order supplies them)."""
    for q in range(12):
        _record(c, q, [True] * 4 if q < 4 else [False] * 4 if q < 8 else [True, False, True, False])


def _counts(c: Curriculum, takes: int, k: int = 4) -> list[tuple[int, int, int]]:
    """(hard, easy, signal) questions in each of `takes` batches of k, the statistics left as they are."""
    out = []
    for _ in range(takes):
        batch = c.take(k)
        out.append((sum(4 <= q < 8 for q in batch), sum(q < 4 for q in batch), sum(8 <= q < 12 for q in batch)))
    return out


@pytest.mark.parametrize("k, hard, easy, signal", [(4, 0.1, 0.1, 0.5), (4, 0.15, 0.05, 0.3), (3, 0.1, 0.2, 0.5)])
def test_the_floors_hold_in_expectation_at_a_small_batch(k, hard, easy, signal):
    """Issue 56 item 4: round(4 x 0.1) is 0, so at 4 questions a batch the all-wrong and all-right questions were
    never re-tested. Over 200 batches each pool now gives k x fraction questions a batch on average (the
    fractional part carried: exactly floor(200 k fraction) in all), spread evenly over the batches."""
    c = _curriculum(hard_fraction=hard, easy_fraction=easy, signal_fraction=signal, min_samples=4)
    _settled(c)
    counts = _counts(c, 200, k)
    for pool, fraction in enumerate((hard, easy)):  # the run's order skips these: the floor is all they get
        drawn = [batch[pool] for batch in counts]
        assert sum(drawn) == int(200 * k * fraction + 1e-9)
        assert sum(drawn) / 200 == pytest.approx(k * fraction, abs=1 / 200)
        assert max(drawn) - min(drawn) <= 1  # spread evenly, not in bursts
    # the signal pool's share, and the run's order may add signal questions on top
    assert sum(batch[2] for batch in counts) >= int(200 * k * signal + 1e-9)
    # at k = 4 and 0.1: a hard question in batches 3, 5, 8, 10, ... (credit 0.4, 0.8, 1.2 -> 1, 0.6, 1.0 -> 1)
    if (k, hard) == (4, 0.1):
        assert [h for h, _, _ in counts[:10]] == [0, 0, 1, 0, 1] * 2
    # and the step logs what each floor gave (curriculum/batch_hard_share), the last batch's here
    assert c.last["curriculum/batch_hard_share"] == counts[-1][0]
    assert c.last["curriculum/batch_easy_share"] == counts[-1][1]


def test_a_resumed_curriculum_carries_its_floors_credit():
    """The carried fractional part is in the checkpoint: a curriculum restored after 3 batches draws the next 12
    exactly as the uninterrupted one (hard questions in the same batches)."""
    a = _curriculum(hard_fraction=0.1, easy_fraction=0.1, signal_fraction=0.5, min_samples=4)
    _settled(a)
    _counts(a, 3)
    state = a.state()
    resumed = Curriculum(DataOrder(len(TRAIN), "t", **a.order.state()), TRAIN, a.cfg, "t")
    resumed.load(state)
    straight = [a.take(4) for _ in range(12)]
    assert [resumed.take(4) for _ in range(12)] == straight
    assert sum(4 <= q < 8 for batch in straight for q in batch) == 5  # floor(15 x 0.4) - floor(3 x 0.4)


def test_a_question_is_judged_by_its_recent_results():
    """Right 67 of its first 68 samples, then wrong 16 times in a row (the window): it is hard now, not a
    question with signal forever (67 of 84 counted since the start), and the batch that draws it expects a pass
    rate of 0; one new right answer makes it a signal question again."""
    c = _curriculum(hard_fraction=0.1, easy_fraction=0.1, signal_fraction=0.5, min_samples=4, window=16)
    _record(c, 0, [True] * 30 + [False] + [True] * 37)
    assert c.pools() == {"easy": [0], "hard": [], "signal": []}  # its last 16 all right
    _record(c, 0, [False] * 16)
    assert c.pools() == {"easy": [], "hard": [0], "signal": []}
    assert 0 in c.take(10)  # the hard floor: 10 x 0.1
    assert c.last["curriculum/batch_expected_pass_rate"] == 0.0
    _record(c, 0, [True])
    assert c.pools() == {"easy": [], "hard": [], "signal": [0]}
    assert c.state()["stats"] == {"0": "0" * 15 + "1"}  # what a checkpoint keeps: the window, oldest first
    with pytest.raises(ValueError, match="window"):
        CurriculumConfig(enabled=True, min_samples=8, window=4)


def test_a_checkpoint_of_the_counting_curriculum_still_loads():
    """Checkpoints written before the window kept [samples, right]: they load as windows at the same pass rate
    that keep each question in its pool."""
    c = _curriculum(min_samples=4, window=16)
    c.load({"stats": {"0": [68, 67], "1": [8, 0], "2": [5, 5], "3": [3, 1]}, "draws": 7})
    assert c.draws == 7 and c.stats[0].count(0) == 1 and len(c.stats[0]) == 16
    assert c.pools() == {"easy": [2], "hard": [1], "signal": [0, 3]}


def test_groups_with_spread_are_counted():
    c = _curriculum()
    scores = [{"reward": r} for r in (1, 0, 1, 1, 0, 0)]
    assert c.metrics(2, scores)["curriculum/groups_with_spread"] == 1  # (1, 0) only


def _run(model_dir, out, **kw):
    # six fixed questions, the generator's first (what the tiny model does on them sets the pools below)
    from rlvr.tasks.arithmetic import ArithmeticSpec, arithmetic

    rows = out.parent / "six.jsonl"
    rows.write_text("".join(json.dumps({"question": e.question, "answer": e.answer}) + "\n"
                            for e in arithmetic("train", n=6, spec=ArithmeticSpec(steps=1, max=9))))
    return train_cfg(model_dir, out, **{"dataset": str(rows), "prompt": "r1_zero", "steps": 6,
                                        "rollout_batch_size": 8, "group_size": 4, "eval_every": 0,
                                        "eval_at_start": False, "eval_at_end": False, "curriculum.enabled": True,
                                        "curriculum.min_samples": 4, **kw})


def test_a_run_with_the_curriculum_logs_its_pools_and_resumes_exactly(tmp_path, model_dir, crash_at):
    kw = {"save_every": 2}
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    train_module.train_grpo(_run(model_dir, straight, **kw))
    rows = [r for r in read_jsonl(straight / "metrics.jsonl") if "train/loss" in r]
    assert len(rows) == 6 and all("curriculum/groups_with_spread" in r for r in rows)
    # 2 questions a batch: the hard floor's credit (2 x 0.1 a batch) reaches one question at batch 5, which
    # re-tests the one all-wrong question instead of drawing a new one, so 5 of the 6 are seen by step 6
    assert rows[4]["curriculum/hard"] == 1 and rows[4]["curriculum/batch_seen_fraction"] == 1.0
    assert rows[-1]["curriculum/hard"] == 0 and rows[-1]["curriculum/seen"] == 5
    undo = crash_at(5)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_run(model_dir, killed, **kw))
    undo()
    train_module.train_grpo(_run(model_dir, killed, resume=True, **kw))
    # every number but the times (val/seconds among them: the final validation's wall time)
    strip = lambda rows: [{k: v for k, v in r.items() if not k.startswith("time") and k != "val/seconds"}  # noqa: E731
                          for r in rows]
    assert strip(read_jsonl(killed / "metrics.jsonl")) == strip(read_jsonl(straight / "metrics.jsonl"))


def test_the_curriculum_with_dynamic_sampling_and_a_first_pass(tmp_path, model_dir):
    out = tmp_path / "run"
    train_module.train_grpo(_run(model_dir, out, steps=2, dynamic_sampling=True, **{"curriculum.first_pass": 4}))
    rows = list(read_jsonl(out / "metrics.jsonl"))
    first = rows[0]
    assert first["step"] == 0 and first["curriculum/seen"] == 4 and "time/curriculum_first_pass" in first
    trained = [r for r in rows if "train/dynamic_rounds" in r]
    assert len(trained) == 2 and all(r["curriculum/seen"] >= 4 for r in trained)


def test_the_stages_export_the_curriculum():
    assert stages.question_sampler is not None and "Curriculum" in stages.__all__

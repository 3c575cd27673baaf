"""Issue 63 items 3-5: TRL's reward functions run unchanged (trainer_state, log_metric / log_extra, **kwargs, the
dataset's prompts, rows used as they are, None rows, n - 1 spreads, [f, f]), the answer signal and rates only
from 0/1 signals, and data as written with errors where they are."""

import json
import math

import pytest
import torch

from conftest import train_cfg
from rlvr.config import ConfigError, EvalConfig, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.tasks.datasets import load_dataset
from rlvr.tasks.records import DataError, Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import load_task

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def chat_model_dir(model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(model_dir)
    return model_dir


# ----------------------------------------------------------------------------------------------------
# Item 3: TRL's functions, unchanged.


def test_a_function_of_keywords_only_is_trls_signature():
    from rlvr.tasks.user_rewards import UserReward

    def anything(**kwargs):
        return [float(len(c)) for c in kwargs["completions"]]

    fn = UserReward("python:0:anything", anything)
    assert fn.kind == "batch"
    scores, _ = score_batch(fn, ["ab", "abc"], ["", ""], RewardContext(rows=[Example("q", "")] * 2))
    assert [s["reward"] for s in scores] == [2.0, 3.0]


def test_log_metric_and_log_extra_reach_the_metrics_and_the_rollouts(tmp_path, model_dir):
    import rlvr

    def lengths(completions, log_metric, log_extra, **kwargs):
        log_metric("mean_chars", sum(len(c) for c in completions) / len(completions))
        log_extra("chars", [len(c) for c in completions])
        return [0.0 for _ in completions]

    base = train_cfg(model_dir, tmp_path / "run", steps=2, eval_every=0, eval_at_start=False, eval_at_end=False,
                     log_rollouts_every=1).model_dump(by_alias=True, exclude_unset=True)
    run = rlvr.train(base, reward_funcs=[lengths])
    metrics = read_jsonl(run / "metrics.jsonl")
    rollouts = read_jsonl(run / "rollouts.jsonl")
    first = [r for r in rollouts if r["step"] == 1]
    assert metrics[0]["train/mean_chars"] == pytest.approx(sum(len(r["response"]) for r in first) / len(first))
    assert [r["chars"] for r in first] == [len(r["response"]) for r in first]
    # rollouts.jsonl records the prompt the model was given (r1_zero's template filled in), beside the question
    assert all(r["prompt"].endswith("Assistant: <think>") and r["question"] in r["prompt"] for r in first)


def test_reward_funcs_f_f_weigh_as_trl_does_and_two_lambdas_are_two_terms(tmp_path, model_dir):
    from rlvr.training.api import _reward_terms
    from rlvr.tasks.user_rewards import USER_REWARDS

    def f(completions, **kwargs):
        return [1.0 for _ in completions]

    terms = _reward_terms([f, f], [1.0, 2.0])
    assert list(terms.values()) == [1.0, 2.0] and len(terms) == 2
    cfg = load_config(EvalConfig, overrides={"dataset": "arithmetic", "rewards": terms}, given="rlvr.evaluate")
    scores, _ = score_batch(load_task(cfg).reward_fn, ["x"], ["1"], RewardContext(rows=[Example("q", "1")]))
    assert scores[0]["reward"] == 3.0 and {"reward/f", "reward/f#2"} <= set(scores[0])
    two = _reward_terms([lambda completions, **kw: [1.0] * len(completions),
                         lambda completions, **kw: [5.0] * len(completions)], None)
    assert len(two) == 2
    cfg = load_config(EvalConfig, overrides={"dataset": "arithmetic", "rewards": two})
    assert score_batch(load_task(cfg).reward_fn, ["x"], ["1"], RewardContext(rows=[Example("q", "1")]))[0][0][
        "reward"] == 6.0

    def f(completions, **kwargs):  # noqa: F811 -- the notebook cell run again: the new f replaces the old
        return [7.0 for _ in completions]

    again = _reward_terms([f], None)
    assert USER_REWARDS[next(iter(again))] is f


def test_a_python_reward_named_format_or_overlong_is_the_users(tmp_path, model_dir):
    import rlvr

    def format(completions, **kwargs):  # noqa: A001 -- the name a user may well choose
        return [2.0 for _ in completions]

    def overlong(completions, **kwargs):
        return [3.0 for _ in completions]

    base = train_cfg(model_dir, tmp_path / "run", steps=1, eval_every=0, eval_at_start=False, eval_at_end=False)
    run = rlvr.train(base.model_dump(by_alias=True, exclude_unset=True), reward_funcs=[format, overlong])
    m = read_jsonl(run / "metrics.jsonl")[0]
    assert m["train/reward"] == 5.0 and m["train/reward/format"] == 2.0 and m["train/reward/overlong"] == 3.0


def test_the_reward_gets_the_datasets_prompt_and_the_row_is_used_as_written(tmp_path, chat_model_dir):
    """TRL passes the dataset's prompt (text or conversation), not the chat-rendered string; prompt=row keeps the
    row's text as written ("A: " stayed "A:" before); a row with both `question` and a chat `prompt` (TRL's
    .map(make_conversation)) is the conversation, system message included; a user's rows need no prompt=."""
    from rlvr.core.models import load_tokenizer

    seen = {}

    def spy(prompts, completions, **kwargs):
        seen["prompts"] = prompts
        return [1.0 for _ in completions]

    from rlvr.tasks.user_rewards import register_reward

    key = register_reward("spy", spy)
    conv = [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Colour of snow?"}]
    data = _jsonl(tmp_path / "rows.jsonl", [{"question": "Colour of snow?", "prompt": conv},
                                            {"question": "Q", "prompt": "A: "}])
    cfg = load_config(EvalConfig, overrides={"model": str(chat_model_dir), "dataset": data, "rewards": {key: 1.0},
                                             "split": "all"})
    assert cfg.prompt == "row"  # a user's rows are used as they are
    task = load_task(cfg)
    rows = task.split("all")
    tok = load_tokenizer(str(chat_model_dir))
    rendered = task.render(rows, tok)
    assert rendered[0] == "<|system|>Answer in one word.\n<|user|>Colour of snow?\n<|assistant|>"
    assert rendered[1] == "A: "
    context = RewardContext.of_completions([type("C", (), {"prompt_index": i, "token_ids": [1]})() for i in (0, 1)],
                                           rendered, rows, template=task.prompt)
    score_batch(task.reward_fn, ["White", "B"], ["", ""], context)
    assert seen["prompts"] == [conv, "A: "]


def test_reasoning_gym_alone_takes_its_own_prompt():
    pytest.importorskip("reasoning_gym")
    cfg = load_config(TrainConfig, overrides={"dataset": "reasoning_gym:leg_counting"})
    assert cfg.prompt == "reasoning_gym" and load_task(cfg).reward_fn.name == "reasoning_gym"


def test_a_row_no_function_scores_has_no_reward_and_no_advantage(caplog):
    """TRL >= 1.6: excluded from its group's mean and std, advantage 0, left out of the logged reward, warned."""
    from rlvr.algorithms.spec import EstimatorSpec, compute_advantages
    from rlvr.stages.rollouts import advantages_of
    from rlvr.tasks.rewards import combine_rewards
    from rlvr.tasks.scoring import rewards_and_metadata
    from rlvr.tasks.user_rewards import UserReward

    def maybe(completions, **kwargs):
        return [None if c == "skip" else float(c) for c in completions]

    fn = combine_rewards([("maybe", UserReward("python:0:maybe", maybe), 1.0)])
    scores, _ = score_batch(fn, ["1", "skip", "0", "1"], [""] * 4, RewardContext(rows=[Example("q", "")] * 4))
    assert math.isnan(scores[1]["reward"]) and "reward/maybe" not in scores[1]
    raw, meta = rewards_and_metadata(scores, {})
    assert meta["reward_mean"] == pytest.approx(2 / 3)  # over the rows scored
    spec = EstimatorSpec("mean", "std", "none", "sequence").validate()
    advantages, _ = advantages_of(raw, 4, spec)
    alone, _ = compute_advantages(torch.tensor([1.0, 0.0, 1.0]), 3, spec)  # the group without the unscored row
    assert advantages[1] == 0 and torch.allclose(advantages[[0, 2, 3]], alone)
    whole, _ = compute_advantages(torch.tensor([1.0, 0.5, 0.0, 1.0] * 2), 4, spec)
    mixed, _ = advantages_of(torch.tensor([1.0, 0.5, 0.0, 1.0, 1.0, math.nan, 0.0, 1.0]), 4, spec)
    assert torch.allclose(mixed[:4], whole[:4]) and mixed[5] == 0  # a full group is computed as always


def test_the_answer_signal_with_trls_format_and_accuracy_rewards():
    """[format_reward, accuracy_reward]: the answer signal was the first function's (format), so a group whose
    correctness varied looked signal-free. With a user's functions it is the weighted reward, or the term
    answer_term names; rates and pass@k come only from 0/1 signals."""
    from rlvr.stages.metrics import _group_pass_at_k
    from rlvr.tasks.rewards import combine_rewards
    from rlvr.tasks.scoring import binary_rate
    from rlvr.tasks.user_rewards import UserReward

    def format_reward(completions, **kwargs):
        return [1.0 for _ in completions]

    def accuracy_reward(completions, **kwargs):
        return [float(c == "right") for c in completions]

    parts = [("format_reward", UserReward("python:0:format_reward", format_reward), 1.0),
             ("accuracy_reward", UserReward("python:1:accuracy_reward", accuracy_reward), 1.0)]
    rows = RewardContext(rows=[Example("q", "")] * 2)
    weighted, _ = score_batch(combine_rewards(parts), ["right", "wrong"], ["", ""], rows)
    assert [s["answer_reward"] for s in weighted] == [2.0, 1.0]  # the weighted reward: the group has spread
    named, _ = score_batch(combine_rewards(parts, answer_term="accuracy_reward"), ["right", "wrong"], ["", ""],
                           RewardContext(rows=[Example("q", "")] * 2))
    assert [s["answer_reward"] for s in named] == [1.0, 0.0]
    assert all(math.isnan(s["format_reward"]) for s in named)  # a number says nothing of the format
    assert _group_pass_at_k([s["answer_reward"] for s in weighted], 2) == {}  # real-valued: no pass@k
    assert _group_pass_at_k([s["answer_reward"] for s in named], 2) == {"train/pass@1": 0.5, "train/pass@2": 1.0}
    assert binary_rate([-19.0, 3.0]) is None and binary_rate([1.0, 0.0, math.nan]) == 0.5


def test_answer_term_is_checked_and_rft_refuses_a_real_valued_signal(tmp_path, model_dir):
    import rlvr

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) for c in completions]

    base = train_cfg(model_dir, tmp_path / "run", steps=1, eval_every=0, eval_at_start=False, eval_at_end=False,
                     algorithm="rft").model_dump(by_alias=True, exclude_unset=True)
    with pytest.raises(Exception, match="algorithm=rft trains on correctness"):
        rlvr.train(base, reward_funcs=[reward_len])
    with pytest.raises(ConfigError, match="answer_term='nope' is not one of the run's reward terms"):
        rlvr.train({**base, "out": str(tmp_path / "b"), "answer_term": "nope"}, reward_funcs=[reward_len])


def test_a_real_valued_reward_logs_no_rates_or_pass_at_k(tmp_path, model_dir):
    import rlvr

    def reward_len(completions, **kwargs):
        return [-abs(20 - len(c)) * 1000.0 for c in completions]

    base = train_cfg(model_dir, tmp_path / "run", steps=1, eval_at_end=True, eval_every=0, eval_at_start=False)
    run = rlvr.train(base.model_dump(by_alias=True, exclude_unset=True), reward_funcs=[reward_len])
    m = read_jsonl(run / "metrics.jsonl")[-1]
    assert not [k for k in m if "pass@" in k or "format" in k], m  # before: pass@4 -1,581,579, format rate -19
    assert m["train/reward"] == m["train/answer_reward"] < 0


# ----------------------------------------------------------------------------------------------------
# Item 5: data as written, errors where they are.


def test_csv_json_and_parquet_keep_what_was_written(tmp_path):
    (tmp_path / "z.csv").write_text("question,answer,n,x\nzip?,02139,3,0.5\nfive?,5,4,1.25\n")
    rows = load_dataset(str(tmp_path / "z.csv"), "all")
    assert [r.answer for r in rows] == ["02139", "5"]  # the column holds a leading zero: it stays text
    assert [r.fields["n"] for r in rows] == [3, 4] and [r.fields["x"] for r in rows] == [0.5, 1.25]
    (tmp_path / "j.json").write_text(json.dumps([{"question": "a", "answer": 3, "v": 2.5}, {"question": "b",
                                                                                         "answer": 4, "v": 1}]))
    rows = load_dataset(str(tmp_path / "j.json"), "all")
    assert [r.answer for r in rows] == ["3", "4"] and [r.fields["v"] for r in rows] == [2.5, 1]
    assert isinstance(rows[1].fields["v"], int)
    import pandas as pd

    pd.DataFrame([{"question": "a", "answer": 3}, {"question": "b", "answer": None}, {"question": "c",
                                                                                     "answer": 12}]).to_parquet(
        tmp_path / "p.parquet")  # pandas stores the column as floats (3.0, NaN, 12.0)
    rows = load_dataset(str(tmp_path / "p.parquet"), "all", require_answer=False)
    assert [r.answer for r in rows] == ["3", "", "12"]


def test_data_errors_name_the_file_and_the_line(tmp_path):
    bad = tmp_path / "latin.jsonl"
    bad.write_bytes(b'{"question": "ok", "answer": "1"}\n{"question": "caf\xe9", "answer": "2"}\n')
    with pytest.raises(DataError, match=r"latin\.jsonl:2: not UTF-8"):
        load_dataset(str(bad), "all")
    # through the config check too (it asks whether the file is a code dataset): the same file and line
    with pytest.raises(DataError, match=r"latin\.jsonl:2: not UTF-8"):
        load_task(load_config(TrainConfig, overrides={"dataset": str(bad), "prompt": "r1_zero"})).split("train")
    (tmp_path / "ragged.csv").write_text("question,answer\na,1\nb,2,extra\n")
    with pytest.raises(DataError, match=r"ragged\.csv:3: 3 fields, the header has 2"):
        load_dataset(str(tmp_path / "ragged.csv"), "all")
    with pytest.raises(ConfigError, match=r"^rlvr\.train: unknown field 'num_generations' \(TRL's GRPOConfig "
                                          r"name\); rlvr's is group_size"):
        load_config(TrainConfig, overrides={"num_generations": 8}, given="rlvr.train")
    with pytest.raises(ConfigError, match=r"unknown field 'epsilon' \(TRL's GRPOConfig name\); rlvr's is cliprange"):
        load_config(TrainConfig, overrides={"epsilon": 0.2})


def test_check_task_checks_every_row_and_the_models_context(tmp_path, model_dir):
    """check-task said ok for a template column missing from later rows (training died at step 2), and for
    prompts longer than the model's positions (which then trained silently); it scored the reference with no
    ids, so a reward that counts tokens looked unable to learn."""
    from rlvr.stages.check import check_task, model_context
    from rlvr.core.models import load_tokenizer

    template = tmp_path / "t.txt"
    template.write_text("{question} in {unit}")
    rows = [{"question": f"q{i}", "answer": "1", "unit": "kg"} for i in range(30)] + [{"question": "late",
                                                                                       "answer": "1"}]
    data = _jsonl(tmp_path / "rows.jsonl", rows)
    cfg = load_config(TrainConfig, overrides={"dataset": data, "prompt": str(template), "rewards": {"answer_tag": 1},
                                              "model": str(model_dir)})
    tok = load_tokenizer(str(model_dir))
    with pytest.raises(DataError, match=r"rows:31: prompt .*placeholder \{unit\}"):
        check_task(load_task(cfg), tokenizer=tok, n=2)
    long = _jsonl(tmp_path / "long.jsonl", [{"question": f"{i:02d}" + "x" * 1998, "answer": "1"} for i in range(12)])
    cfg = load_config(TrainConfig, overrides={"dataset": long, "prompt": "row", "rewards": {"answer_tag": 1},
                                              "model": str(model_dir), "max_new_tokens": 64})
    assert model_context(str(model_dir)) == 1024
    with pytest.raises(DataError, match=r"its prompt is 2,000 tokens.*max_new_tokens=64.*1,024 positions"):
        check_task(load_task(cfg), tokenizer=tok, context=1024, max_new_tokens=64)
    from rlvr.training import rl  # rlvr train refuses too, before the model is loaded

    with pytest.raises(DataError, match="1,024 positions"):
        rl.train_grpo(train_cfg(model_dir, tmp_path / "run", dataset=long, prompt="row", rewards={"answer_tag": 1}))
    assert not (tmp_path / "run").exists()
    (tmp_path / "count.py").write_text("def tokens(completions, completion_ids, **kw):\n"
                                       "    return [float(len(ids)) for ids in completion_ids]\n")
    short = _jsonl(tmp_path / "short.jsonl", [{"question": f"q{i}", "answer": "four"} for i in range(12)])
    cfg = load_config(TrainConfig, overrides={"dataset": short, "prompt": "row", "solution_field": "answer",
                                              "rewards": {f"{tmp_path / 'count.py'}:tokens": 1},
                                              "model": str(model_dir)})
    report = check_task(load_task(cfg), tokenizer=tok, n=4)
    assert [s["reward"] for s in report.reference] == [4.0] * 4 and report.warnings == []


def test_check_task_says_an_error_of_every_split_once(tmp_path, model_dir):
    from typer.testing import CliRunner

    from rlvr.cli import app

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{"q": "b"}\n')
    result = CliRunner().invoke(app, ["check-task", f"model={model_dir}", f"dataset={bad}", "prompt=r1_zero"])
    assert result.exit_code != 0
    assert result.output.count("missing field 'question'") == 1, result.output


def test_a_reward_file_imports_its_siblings_and_a_package_of_the_current_folder(tmp_path, monkeypatch):
    from rlvr.tasks.user_rewards import load_reward_callable

    (tmp_path / "helpers.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / "my_rewards.py").write_text("from helpers import double\n\n"
                                            "def r(completions, **kw):\n    return [double(1.0)] * len(completions)\n")
    assert load_reward_callable(f"{tmp_path / 'my_rewards.py'}:r")(completions=["a"]) == [2.0]
    pkg = tmp_path / "here" / "mytask"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "scoring.py").write_text("def r(completions, **kw):\n    return [3.0] * len(completions)\n")
    monkeypatch.chdir(tmp_path / "here")
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", str(tmp_path / "here"))])
    assert load_reward_callable("mytask.scoring:r")(completions=["a"]) == [3.0]


def test_a_ground_truth_column_is_not_silently_replaced(tmp_path):
    from rlvr.tasks.user_rewards import RewardError, UserReward

    def exact(response, ground_truth, **row):
        return float(response == ground_truth)

    rows = [Example("q", "4", fields={"ground_truth": "four", "answer": "4"})]
    with pytest.raises(RewardError, match="has a column 'ground_truth'"):
        score_batch(UserReward("python:0:exact", exact), ["4"], ["4"], RewardContext(rows=rows))


def test_the_guides_python_example_runs_as_written(tmp_path, model_dir, monkeypatch, caplog):
    """docs/your_task.md's code, as written (its three rows, configs/grpo_arithmetic.yaml), on the tiny model at a
    tiny scale: three rows hold no validation out, so the run trains without validating and says so (before, it
    failed: the validation split was loaded, and empty)."""
    import re
    from pathlib import Path

    import rlvr

    root = Path(__file__).resolve().parents[1]
    blocks = re.findall(r"```python\n(.*?)```", (root / "docs" / "your_task.md").read_text(), re.S)
    example = next(b for b in blocks if "rlvr.train(" in b)
    (tmp_path / "configs").symlink_to(root / "configs")
    monkeypatch.chdir(tmp_path)
    small = dict(model=str(model_dir), steps=2, rollout_batch_size=6, group_size=2, max_new_tokens=6,
                 microbatch_size=6, generation_dtype="float32", precision="fp32", tensorboard=False)
    train, evaluate = rlvr.train, rlvr.evaluate
    monkeypatch.setattr(rlvr, "train", lambda config, **kw: train(config, **{**kw, **small}))
    monkeypatch.setattr(rlvr, "evaluate", lambda config, **kw: evaluate(
        {**config, "max_new_tokens": 6, "dtype": "float32"}, **kw))
    scope: dict = {}
    exec(compile(example, "docs/your_task.md", "exec"), scope)
    assert "this run does not validate" in caplog.text
    assert [m["step"] for m in read_jsonl(tmp_path / "runs" / "mine" / "metrics.jsonl")] == [1, 2]
    assert scope["summary"]["n"] == 2  # the two held-out words, every one evaluated


def test_two_reward_files_with_a_helpers_py_of_their_own_each_get_theirs(tmp_path):
    """Seen under make test: one process loaded a rewards file whose helpers.py had no BONUS after another folder's
    helpers.py was imported (sys.modules keeps the first `helpers`)."""
    from rlvr.tasks.user_rewards import load_reward_callable

    for name, value in (("a", 1.0), ("b", 2.0)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "helpers.py").write_text(f"VALUE_{name.upper()} = {value}\n")
        (folder / "r.py").write_text(f"from helpers import VALUE_{name.upper()}\n\n"
                                     f"def r(completions, **kw):\n    return [VALUE_{name.upper()}] * len(completions)\n")
    assert load_reward_callable(f"{tmp_path / 'a' / 'r.py'}:r")(completions=["x"]) == [1.0]
    assert load_reward_callable(f"{tmp_path / 'b' / 'r.py'}:r")(completions=["x"]) == [2.0]

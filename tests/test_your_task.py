"""Issue 57: a user's own task (rows + prompt + reward functions) runs everywhere a built-in task does: reward
functions of both signatures from a file, a module or Python, every table format, chat rows, templates, None
rewards, each bad input with an error that names it, before any model is loaded, resume, and rlvr.train."""

import json
import math
import textwrap

import pytest

from conftest import train_cfg
from rlvr.config import ConfigError, EvalConfig, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.tasks.datasets import load_dataset
from rlvr.tasks.prompts import resolve_prompt
from rlvr.tasks.records import DataError, Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import build_reward_fn, load_task, task_prompt
from rlvr.tasks.user_rewards import USER_REWARDS, RewardError, UserReward

REWARDS = '''
import asyncio

def short_answer(completions, answer, **kwargs):          # TRL's signature
    return [1.0 if str(c).strip() == str(a) else 0.0 for c, a in zip(completions, answer)]

def length_penalty(prompts, completions, completion_ids, trainer_state, **kwargs):
    return [-0.01 * len(ids) for ids in completion_ids]

def only_even(completions, n, **kwargs):                  # None: does not apply to this row
    return [None if x % 2 else 1.0 for x in n]

def per_sample(response, ground_truth, **row):           # rlvr's signature, a dict with its parts
    right = float(response.strip() == ground_truth)
    return {"reward": right, "format_reward": float(bool(response.strip())), "answer_reward": right}

def reads_row(response, ground_truth, unit, **row):
    return 1.0 if response.strip().endswith(unit) else 0.0

async def judge(completions, **kwargs):                  # a remote judge
    await asyncio.sleep(0.01)
    return [0.5 for _ in completions]

def wrong_length(completions, **kwargs):
    return [1.0]

def not_a_number(completions, **kwargs):
    return ["1.0" for _ in completions]

def nan(completions, **kwargs):
    return [float("nan") for _ in completions]

def raises(response, ground_truth, **row):
    raise KeyError("tests")

def neither(x):
    return 0.0

NOT_CALLABLE = 3
'''


@pytest.fixture
def rewards_file(tmp_path):
    path = tmp_path / "my_rewards.py"
    path.write_text(textwrap.dedent(REWARDS))
    return path


def _rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def data(tmp_path):
    return _rows(tmp_path / "rows.jsonl", [{"prompt": f"{i}+{i}=", "answer": str(2 * i), "n": i, "unit": "kg"}
                                           for i in range(20)])


def _score(cfg, responses, rows):
    task = load_task(cfg)
    context = RewardContext(prompts=task.render(rows), completion_ids=[[7] * len(r) for r in responses], rows=rows)
    return score_batch(task.reward_fn, responses, [r.answer for r in rows], context)[0]


def test_both_signatures_from_a_file_mix_with_built_ins_and_each_term_is_logged(rewards_file, data):
    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row", "rewards": {
        f"{rewards_file}:short_answer": 1.0, f"{rewards_file}:length_penalty": 1.0,
        f"{rewards_file}:per_sample": 0.5, "answer_tag": 0.25}})
    rows = load_dataset(data, "all")[:2]
    scores = _score(cfg, ["0", "<answer>9</answer>"], rows)
    # row 0: short 1, length -0.01 x 1, per_sample 1 x 0.5, answer_tag 0 -> 1.49
    assert scores[0]["reward"] == pytest.approx(1.0 - 0.01 + 0.5)
    assert scores[0]["reward/short_answer"] == 1.0 and scores[0]["reward/length_penalty"] == pytest.approx(-0.01)
    # row 1 (answer 2): short 0, length -0.18, per_sample 0, answer_tag 0 ("9" is wrong)
    assert scores[1]["reward"] == pytest.approx(-0.18)
    assert scores[1]["reward/answer_tag"] == 0.0


def test_the_row_columns_reach_both_signatures(rewards_file, data):
    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row",
                                             "rewards": {f"{rewards_file}:reads_row": 1.0}})
    rows = load_dataset(data, "all")[:2]
    assert [s["reward"] for s in _score(cfg, ["3 kg", "3 lb"], rows)] == [1.0, 0.0]
    assert rows[0].fields == {"prompt": "0+0=", "answer": "0", "n": 0, "unit": "kg"}


def test_none_leaves_the_weighted_sum_and_the_term_mean(rewards_file, data):
    from rlvr.tasks.scoring import rewards_and_metadata

    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row", "rewards": {
        f"{rewards_file}:only_even": 1.0, f"{rewards_file}:short_answer": 2.0}})
    rows = load_dataset(data, "all")[:4]  # n = 0, 1, 2, 3
    scores = _score(cfg, ["0", "2", "x", "6"], rows)
    assert [s["reward"] for s in scores] == [3.0, 2.0, 1.0, 2.0]
    assert ["reward/only_even" in s for s in scores] == [True, False, True, False]
    _, meta = rewards_and_metadata(scores, {})
    assert meta["reward/only_even_mean"] == 1.0 and meta["reward/only_even_std"] == 0.0  # over the 2 rows it applies to
    # TRL divides by n - 1 (torch.std): 1, 1, 0, 1 has variance 0.75 / 3
    assert meta["reward/short_answer_mean"] == 0.75 and meta["reward/short_answer_std"] == pytest.approx(0.5)


def test_async_functions_run_and_their_values_count(rewards_file, data):
    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row", "rewards": {
        f"{rewards_file}:judge": 1.0, f"{rewards_file}:short_answer": 1.0}})
    rows = load_dataset(data, "all")[:3]
    assert [s["reward"] for s in _score(cfg, ["0", "1", "4"], rows)] == [1.5, 0.5, 1.5]


@pytest.mark.parametrize("name, message", [
    ("wrong_length", r"'.*:wrong_length' returned 1 values for 2 completions"),
    ("not_a_number", r"returned str '1.0' for row 'rows:1'; expected a number or None"),
    ("nan", r"returned nan for row 'rows:1'; rewards must be finite"),
    ("raises", r"'.*:raises' raised KeyError on row 'rows:1': 'tests'"),
])
def test_bad_output_is_an_error_naming_the_function_and_the_row(rewards_file, data, name, message):
    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row",
                                             "rewards": {f"{rewards_file}:{name}": 1.0}})
    with pytest.raises(RewardError, match=message):
        _score(cfg, ["0", "1"], load_dataset(data, "all")[:2])


@pytest.mark.parametrize("name, message", [
    ("{file}:missing", r"has no 'missing' \(callables there: .*short_answer"),
    ("{file}:NOT_CALLABLE", r"NOT_CALLABLE is a int, not a function"),
    ("{file}:neither", r"has neither signature"),
    ("nowhere/rewards.py:fn", r"no such file nowhere/rewards.py"),
    ("no_such_package.mod:fn", r"cannot import module 'no_such_package.mod'"),
    ("r1_zer0", r"unknown reward function 'r1_zer0'"),
])
def test_a_reward_that_does_not_resolve_fails_when_the_config_is_checked(rewards_file, data, name, message):
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, overrides={"dataset": data, "prompt": "row",
                                            "rewards": {name.format(file=rewards_file): 1.0}})


def test_a_file_that_fails_to_import_names_the_file(tmp_path, data):
    broken = tmp_path / "broken.py"
    broken.write_text("import no_such_module_here\n")
    with pytest.raises(ConfigError, match=r"reward file .*broken.py: importing it raised ModuleNotFoundError"):
        load_config(TrainConfig, overrides={"dataset": data, "prompt": "row", "rewards": {f"{broken}:f": 1.0}})


def test_a_prompt_without_a_reward_needs_rewards_and_unknown_prompts_fail_early(data, tmp_path):
    with pytest.raises(ConfigError, match=r"prompt 'row' has no reward of its own"):
        load_config(TrainConfig, overrides={"dataset": data, "prompt": "row"})
    with pytest.raises(ConfigError, match=r"unknown prompt 'r1_zer0'; did you mean 'r1_zero'"):
        load_config(TrainConfig, overrides={"prompt": "r1_zer0"})
    with pytest.raises(ConfigError, match=r"no such template file"):
        load_config(TrainConfig, overrides={"prompt": str(tmp_path / "nope.txt"), "rewards": {"answer_tag": 1}})


def test_a_reward_from_a_package_module(tmp_path, monkeypatch, data):
    pkg = tmp_path / "mypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "scoring.py").write_text("def exact(response, ground_truth):\n    return float(response == ground_truth)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row", "rewards": {"mypkg.scoring:exact": 1}})
    assert [s["reward"] for s in _score(cfg, ["0", "5"], load_dataset(data, "all")[:2])] == [1.0, 0.0]


# ----------------------------------------------------------------------------------------------------
# Datasets in every format.

ROWS = [{"question": f"What is {i} times 3?", "answer": str(3 * i), "level": i % 3} for i in range(30)]


def _write_all(tmp_path):
    import datasets

    paths = {}
    paths["jsonl"] = _rows(tmp_path / "r.jsonl", ROWS)
    (tmp_path / "r.json").write_text(json.dumps(ROWS))
    paths["json"] = str(tmp_path / "r.json")
    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(tmp_path / "r.parquet")
    paths["parquet"] = str(tmp_path / "r.parquet")
    table.to_csv(tmp_path / "r.csv", index=False)
    paths["csv"] = str(tmp_path / "r.csv")
    table.save_to_disk(tmp_path / "saved")
    paths["saved"] = str(tmp_path / "saved")
    return paths


def test_every_format_gives_the_same_rows_with_every_column(tmp_path):
    for fmt, path in _write_all(tmp_path).items():
        every = load_dataset(path, "all")
        assert [(e.question, e.answer) for e in every] == [(r["question"], r["answer"]) for r in ROWS], fmt
        assert every[4].fields["level"] == 1, fmt
        train, val, test = (load_dataset(path, s) for s in ("train", "validation", "test"))
        assert (len(train), len(val), len(test)) == (24, 3, 3), fmt  # a seeded tenth held out for each, as for JSONL
        assert {e.question for e in val} == {e.question for e in load_dataset(paths_jsonl(tmp_path), "validation")}
        assert {e.question for e in test} == {e.question for e in load_dataset(paths_jsonl(tmp_path), "test")}


def paths_jsonl(tmp_path):
    return str(tmp_path / "r.jsonl")


def test_a_saved_dataset_dict_keeps_its_own_splits(tmp_path):
    import datasets

    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:20]),
                          "validation": datasets.Dataset.from_list(ROWS[20:])}).save_to_disk(tmp_path / "dd")
    assert [e.answer for e in load_dataset(str(tmp_path / "dd"), "validation")] == [r["answer"] for r in ROWS[20:]]
    # no test split of its own: a seeded tenth of its train split is held out for one, and not trained on
    train, test = load_dataset(str(tmp_path / "dd"), "train"), load_dataset(str(tmp_path / "dd"), "test")
    assert (len(train), len(test)) == (18, 2)
    assert not {e.question for e in train} & {e.question for e in test}
    assert {e.question for e in train + test} == {r["question"] for r in ROWS[:20]}


def test_a_validation_file_of_its_own(tmp_path):
    train = _rows(tmp_path / "t.jsonl", ROWS[:10])
    val = _rows(tmp_path / "v.jsonl", ROWS[10:13])
    cfg = load_config(TrainConfig, overrides={"dataset": train, "validation_dataset": val, "prompt": "r1_zero"})
    task = load_task(cfg)
    # the file's test tenth (1 of 10 rows) is still held out; no validation tenth is: validation is the other file
    assert len(task.split("train")) == 9 and [e.answer for e in task.split("validation")] == ["30", "33", "36"]


def test_table_errors_name_the_file_the_row_and_the_column(tmp_path):
    path = _rows(tmp_path / "bad.jsonl", [{"question": "a", "answer": "1"}, {"q": "b", "answer": "2"}])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: missing field 'question' \(fields present: q, answer\)"):
        load_dataset(path, "all")
    import datasets

    datasets.Dataset.from_list([{"question": "a"}, {"question": "b"}]).to_parquet(tmp_path / "bad.parquet")
    with pytest.raises(DataError, match=r"bad\.parquet row 0: missing field 'answer'"):
        load_dataset(str(tmp_path / "bad.parquet"), "all")
    # a user's reward reads what it needs: no answer column is required then
    assert load_dataset(str(tmp_path / "bad.parquet"), "all", require_answer=False)[1].answer == ""
    chat = _rows(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "text": "hi"}]}])
    with pytest.raises(DataError, match=r"chat\.jsonl:1: column 'prompt' message 0 must be \{role"):
        load_dataset(chat, "all", require_answer=False)
    (tmp_path / "broken.csv").write_bytes(b"question,answer\n\"a,1\n")
    with pytest.raises(DataError, match=r"broken\.csv"):
        load_dataset(str(tmp_path / "broken.csv"), "all")


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def test_chat_rows_templates_system_prompt_and_stop(tmp_path, tokenizer):
    tokenizer = type(tokenizer).from_pretrained(_save(tokenizer, tmp_path))
    tokenizer.chat_template = CHAT_TEMPLATE
    chat = _rows(tmp_path / "chat.jsonl", [{"prompt": [{"role": "user", "content": "Name a prime."}], "n": 7}])
    row = load_dataset(chat, "all", require_answer=False)[0]
    assert row.question == "Name a prime." and row.conversation[0]["content"] == "Name a prime."
    prompt = resolve_prompt("row", stop=["</a>"], system_prompt="Be brief.")
    assert prompt.stop == ("</a>",)
    assert prompt.render(row, tokenizer) == "<|system|>Be brief.\n<|user|>Name a prime.\n<|assistant|>"
    with pytest.raises(DataError, match=r"is a chat conversation, which prompt 'r1_zero' cannot format"):
        resolve_prompt("r1_zero").render(row, tokenizer)
    template = tmp_path / "t.txt"
    template.write_text("Q: {question} (answer in {unit}; {{braces}})\nA:")
    plain = Example("How heavy?", "3", fields={"question": "How heavy?", "unit": "kg"}, id="r:1")
    assert resolve_prompt(str(template)).render(plain) == "Q: How heavy? (answer in kg; {braces})\nA:"
    assert resolve_prompt(str(template), chat=True).render(plain, tokenizer) == \
        "<|user|>Q: How heavy? (answer in kg; {braces})\nA:\n<|assistant|>"
    with pytest.raises(DataError, match=r"r:2: prompt '.*t.txt' has the placeholder \{unit\}, but the row has no"):
        resolve_prompt(str(template)).render(Example("q", "1", id="r:2"))
    (tmp_path / "none.txt").write_text("no placeholder here")
    with pytest.raises(ValueError, match="has no placeholder"):
        resolve_prompt(str(tmp_path / "none.txt"))


def _save(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path / "tok")
    return str(tmp_path / "tok")


def test_trl_completions_are_messages_for_conversational_rows(tmp_path, rewards_file):
    seen = {}

    def spy(prompts, completions, **kwargs):
        seen.update(prompts=prompts, completions=completions, kwargs=kwargs)
        return [0.0 for _ in completions]

    USER_REWARDS["spy"] = spy
    try:
        rows = [Example("hi", "", id="c:1", fields={"prompt": [{"role": "user", "content": "hi"}], "n": 1},
                        conversation=({"role": "user", "content": "hi"},)),
                Example("2+2=", "4", id="c:2", fields={"prompt": "2+2=", "n": 2})]
        context = RewardContext(prompts=["<rendered 1>", "2+2="], completion_ids=[[1], [2, 3]], rows=rows, step=5,
                                global_step=4, max_steps=10)
        score_batch(UserReward("spy"), ["yo", "4"], ["", "4"], context)
    finally:
        del USER_REWARDS["spy"]
    assert seen["completions"] == [[{"role": "assistant", "content": "yo"}], "4"]
    assert seen["prompts"] == [[{"role": "user", "content": "hi"}], "2+2="]
    assert seen["kwargs"]["n"] == [1, 2] and seen["kwargs"]["completion_ids"] == [[1], [2, 3]]
    state = seen["kwargs"]["trainer_state"]  # TRL's: transformers' TrainerState, the optimizer steps done
    assert (state.global_step, state.max_steps, state["global_step"]) == (4, 10, 4)


# ----------------------------------------------------------------------------------------------------
# The loops: train with a user's reward (metrics, resume), eval, check-task, rlvr.train from Python.


def test_train_logs_each_user_reward_and_resumes_exactly(tmp_path, model_dir, rewards_file, data, crash_at):
    rewards = {f"{rewards_file}:length_penalty": 1.0, f"{rewards_file}:per_sample": 1.0}
    common = dict(dataset=data, prompt="row", rewards=rewards, stop=["\n"])
    from rlvr.training import rl

    rl.train_grpo(train_cfg(model_dir, tmp_path / "a", save_every=2, **common))
    whole = read_jsonl(tmp_path / "a" / "metrics.jsonl")
    assert {"train/reward/length_penalty", "train/reward/length_penalty_std", "train/reward/per_sample"} <= set(whole[1])
    assert whole[1]["train/reward"] == pytest.approx(whole[1]["train/reward/length_penalty"]
                                                     + whole[1]["train/reward/per_sample"])
    assert whole[1]["train/reward/length_penalty"] < 0
    from rlvr.experiments.plots import TERMS_FIGURE, build_figures
    from rlvr.experiments.runs import load_groups

    figure = build_figures(load_groups([tmp_path / "a"]))[TERMS_FIGURE]  # the report's panel per reward term
    assert [ax.get_title() for ax in figure.axes] == ["train/reward/length_penalty", "train/reward/per_sample"]
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        rl.train_grpo(train_cfg(model_dir, tmp_path / "b", keep_checkpoints=2, save_every=2, **common))
    undo()
    rl.train_grpo(train_cfg(model_dir, tmp_path / "b", keep_checkpoints=2, save_every=2, resume=True, **common))
    resumed = read_jsonl(tmp_path / "b" / "metrics.jsonl")
    for key in ("train/reward", "train/reward/length_penalty", "train/loss"):
        assert [r.get(key) for r in resumed if r["step"] == 3] == [r.get(key) for r in whole if r["step"] == 3]


def test_check_task_says_when_a_reward_cannot_vary(tmp_path, rewards_file, data):
    from rlvr.stages.check import check_task

    constant = load_config(TrainConfig, overrides={"dataset": data, "prompt": "row", "solution_field": "answer",
                                                   "rewards": {f"{rewards_file}:judge": 1.0}})
    report = check_task(load_task(constant), n=4)
    assert report.rows == {"train": 16, "validation": 2, "test": 2}
    assert report.prompts == ["0+0=", "1+1="] or len(report.prompts) == 2
    assert report.reward_range == (0.5, 0.5)
    assert any("GRPO would learn nothing" in w for w in report.warnings)
    useful = load_config(TrainConfig, overrides={"dataset": data, "prompt": "row", "solution_field": "answer",
                                                 "rewards": {f"{rewards_file}:short_answer": 1.0}})
    report = check_task(load_task(useful), n=4)
    assert report.warnings == [] and [s["reward"] for s in report.reference] == [1.0] * 4


def test_check_task_command(tmp_path, model_dir, rewards_file, data):
    from typer.testing import CliRunner

    from rlvr.cli import app

    result = CliRunner().invoke(app, ["check-task", f"model={model_dir}", f"dataset={data}", "prompt=row",
                                      "solution_field=answer", "--rows", "3",
                                      f"rewards={{{rewards_file}:judge: 1.0}}"])
    assert result.exit_code == 0, result.output
    assert "rows: train 16, validation 2, test 2" in result.output and "prompt tokens: mean" in result.output
    assert "GRPO would learn nothing" in result.output


def test_rlvr_train_from_python_with_callables_and_rows_in_memory(tmp_path, model_dir):
    import rlvr

    def ends_in_digit(completions, **kwargs):
        return [float(c[-1:].isdigit()) for c in completions]

    def per_row(response, ground_truth, weight_col):
        return weight_col * float(ground_truth in response)

    rows = [{"prompt": f"{i}*2=", "answer": str(2 * i), "weight_col": 0.5} for i in range(10)]
    base = train_cfg(model_dir, tmp_path / "py").model_dump(by_alias=True, exclude_unset=True)
    run = rlvr.train({**base, "steps": 2, "prompt": "row", "eval_every": 0, "eval_at_start": False},
                     reward_funcs=[ends_in_digit, per_row], reward_weights=[1.0, 2.0], train_dataset=rows,
                     eval_dataset=rows[:2])
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert "train/reward/ends_in_digit" in metrics[0] and "train/reward/per_row" in metrics[0]
    cfg = load_config(TrainConfig, run / "config.yaml")
    assert cfg.rewards == {"python:0:ends_in_digit": 1.0, "python:1:per_row": 2.0}
    assert cfg.validation_dataset.endswith(".jsonl")
    summary = rlvr.evaluate({"model": str(model_dir), "prompt": "row", "max_new_tokens": 4, "out": str(tmp_path / "e"),
                             "dtype": "float32"}, reward_funcs=[ends_in_digit], dataset=rows[:3])
    assert summary["n"] == 3 and 0.0 <= summary["accuracy"] <= 1.0 and not math.isnan(summary["accuracy"])


def test_python_callables_are_refused_in_a_distributed_run(tmp_path, model_dir):
    import rlvr

    with pytest.raises(ConfigError, match="needs it in a file"):
        rlvr.train({"model": str(model_dir), "prompt": "row", "distributed": {"rollout_workers": 1}},
                   reward_funcs=lambda completions, **kw: [0.0] * len(completions), train_dataset=[{"prompt": "x"}])


def test_build_reward_fn_names_terms_by_function(rewards_file, data):
    cfg = load_config(TrainConfig, overrides={"dataset": data, "prompt": "row",
                                              "rewards": {f"{rewards_file}:short_answer": 1.0, "answer_tag": 1.0}})
    fn = build_reward_fn(cfg, task_prompt(cfg))
    assert [name for name, _, _ in fn.components] == ["short_answer", "answer_tag"]


def test_the_worked_example_trains_two_steps(tmp_path, model_dir, monkeypatch):
    """examples/your_task as shipped (its rows, rewards file and config), on the tiny model: two steps log both of
    its reward terms, and check-task finds its reward able to tell the reference from nothing."""
    from pathlib import Path

    from rlvr.stages.check import check_task
    from rlvr.training import rl

    root = Path(__file__).resolve().parents[1]
    example = root / "examples" / "your_task"
    monkeypatch.chdir(root)  # the config's paths are relative to a checkout
    overrides = dict(model=str(model_dir), out=str(tmp_path / "run"), steps=2, rollout_batch_size=8, group_size=4,
                     max_new_tokens=8, eval_every=0, eval_at_start=False, eval_at_end=False, precision="fp32",
                     generation_dtype="float32", tensorboard=False)
    tokenizer_dir = model_dir  # the tiny tokenizer has no chat template: the example's chat rendering is tested
    from transformers import AutoTokenizer  # with one set on a copy of it

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(model_dir)
    cfg = load_config(TrainConfig, example / "config.yaml", overrides)
    assert cfg.prompt == "row" and cfg.chat_template
    report = check_task(load_task(cfg), tokenizer=tok, n=4)
    assert report.warnings == [] and [s["reward"] for s in report.reference] == [1.1] * 4
    rl.train_grpo(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert {"train/reward/largest", "train/reward/brief"} <= set(rows[0])


def test_sft_trains_on_a_user_tasks_solution_column(tmp_path, model_dir, data):
    from rlvr.config import SFTConfig
    from rlvr.training.sft import train_sft

    cfg = load_config(SFTConfig, overrides=dict(
        model=str(model_dir), dataset=data, prompt="row", solution_field="answer", out=str(tmp_path / "sft"),
        rewards={"answer_tag": 1.0}, steps=2, batch_size=4, microbatch_size=2, eval_every=0, eval_at_start=False,
        generation_dtype="float32", precision="fp32", tensorboard=False))
    train_sft(cfg)
    rows = read_jsonl(tmp_path / "sft" / "metrics.jsonl")
    assert [r["step"] for r in rows if "train/loss" in r] == [1, 2]
    with pytest.raises(ConfigError, match="has no SFT target"):
        train_sft(load_config(SFTConfig, overrides=dict(model=str(model_dir), dataset=data, prompt="row",
                                                        rewards={"answer_tag": 1.0}, out=str(tmp_path / "x"))))


def test_an_edited_reward_or_rows_file_is_not_served_a_cached_validation(tmp_path, model_dir, rewards_file, data):
    from pathlib import Path

    from rlvr.stages.validation import start_validation_key

    cfg = train_cfg(model_dir, tmp_path / "run", dataset=data, prompt="row", rewards={f"{rewards_file}:judge": 1.0})
    key = start_validation_key(cfg)
    assert key is not None and start_validation_key(cfg) == key
    rewards_file.write_text(rewards_file.read_text() + "\n# an edit\n")
    edited = start_validation_key(cfg)
    assert edited != key
    Path(data).write_text(Path(data).read_text() + '{"prompt": "9+9=", "answer": "18", "n": 9, "unit": "kg"}\n')
    assert start_validation_key(cfg) not in (key, edited)


def test_async_functions_are_awaited_together(data):
    """Two async judges that each wait for the other: awaited one after the other they would never finish."""
    import asyncio

    started, answered = asyncio.Event(), asyncio.Event()

    async def first(completions, **kwargs):
        started.set()
        await asyncio.wait_for(answered.wait(), 5)
        return [1.0 for _ in completions]

    async def second(completions, **kwargs):
        await asyncio.wait_for(started.wait(), 5)
        answered.set()
        return [0.5 for _ in completions]

    USER_REWARDS.update(first=first, second=second)
    try:
        cfg = load_config(EvalConfig, overrides={"dataset": data, "prompt": "row",
                                                 "rewards": {"first": 1.0, "second": 1.0}})
        assert [s["reward"] for s in _score(cfg, ["0", "2"], load_dataset(data, "all")[:2])] == [1.5, 1.5]
    finally:
        del USER_REWARDS["first"], USER_REWARDS["second"]


def test_a_trl_reward_reads_the_training_step(tmp_path, model_dir, data):
    seen = []

    def steps(completions, trainer_state, **kwargs):
        seen.append((trainer_state.global_step, trainer_state.max_steps))
        return [0.0 for _ in completions]

    import rlvr

    base = train_cfg(model_dir, tmp_path / "run", dataset=data, prompt="row", eval_every=0, eval_at_start=False,
                     eval_at_end=False, algorithm="grpo_clip", steps_per_rollout=2, rewards={"answer_tag": 1.0})
    rlvr.train(base.model_dump(by_alias=True, exclude_unset=True), reward_funcs=[steps])
    # TRL's value: the optimizer steps done when the batch was sampled (2 a rollout batch here), of 3 x 2
    assert seen[-3:] == [(0, 6), (2, 6), (4, 6)]  # (before them: the start-of-run task check)

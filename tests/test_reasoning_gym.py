"""reasoning-gym's tasks as datasets (rlvr.tasks.reasoning_gym, issue 57 item 4): names and their options,
rows per split, the reward through score_batch, the config check, and `rlvr eval` on a tiny model."""

import dataclasses
import json
import sys
from collections import Counter

import pytest

reasoning_gym = pytest.importorskip("reasoning_gym")  # `make install` installs the extra

from rlvr.tasks.datasets import load_dataset
from rlvr.tasks.reasoning_gym import (
    MissingExtra,
    parse_name,
    reasoning_gym_reward,
    reasoning_gym_rows,
    split_seed,
)
from rlvr.tasks.records import DataError, Example
from rlvr.tasks.rewards import RewardContext, get_reward_fn, score_batch

LEGS = "reasoning_gym:leg_counting"


def _score(responses, rows):
    return score_batch(get_reward_fn("reasoning_gym"), responses, [r.answer for r in rows],
                       RewardContext(rows=list(rows)))[0]


def tagged(text):
    return f"Let me think. <answer>{text}</answer>"


# ----------------------------------------------------------------------------------------------------
# Rows.


def test_rows_are_the_tasks_entries_at_a_seed_of_their_own_per_split():
    sizes = {split: len(load_dataset(LEGS, split)) for split in ("train", "validation", "test")}
    assert sizes == {"train": 500, "validation": 200, "test": 500}
    seeds = {split: split_seed(0, split) for split in ("train", "validation", "test")}
    assert len(set(seeds.values())) == 3 and all(0 <= s < 2**31 for s in seeds.values())
    for split, seed in seeds.items():
        rows = reasoning_gym_rows(LEGS + ":size=300", split)
        size = {"train": 300, "validation": 200, "test": 300}[split]  # train: size; the others at most 200 / 500
        direct = list(reasoning_gym.create_dataset("leg_counting", size=size, seed=seed))
        assert len(rows) == len(direct) == size
        assert [r.question for r in rows] == [e["question"] for e in direct]
        assert [r.answer for r in rows] == [e["answer"] for e in direct]
        assert [r.fields for r in rows] == [{**e, "task_options": {}} for e in direct]
        assert [r.id for r in rows[:2]] == [f"leg_counting:{split}:0", f"leg_counting:{split}:1"]
    train, validation, test = ({r.question for r in load_dataset(LEGS, s)} for s in ("train", "validation", "test"))
    assert not train & validation and not train & test and not validation & test


def test_rows_are_the_same_every_time_and_seeds_one_apart_share_nothing():
    from rlvr.tasks import reasoning_gym as rg

    first = [(r.question, r.answer, r.id) for r in reasoning_gym_rows(LEGS + ":size=50,seed=3", "train")]
    rg._rows.cache_clear()
    rg.parse_name.cache_clear()
    again = [(r.question, r.answer, r.id) for r in reasoning_gym_rows(LEGS + ":size=50,seed=3", "train")]
    assert first == again
    # reasoning-gym draws row i from Random(seed + i): plain seeds 3 and 4 would share 49 of 50 rows
    nearby = {r.question for r in reasoning_gym_rows(LEGS + ":size=50,seed=4", "train")}
    assert not nearby & {q for q, _, _ in first}
    assert load_dataset(LEGS + ":size=50", "validation", limit=7) == reasoning_gym_rows(LEGS + ":size=50",
                                                                                      "validation")[:7]


def test_a_tasks_own_options_are_parsed_by_the_type_of_its_config_field():
    spec = parse_name("reasoning_gym:basic_arithmetic:size=6,seed=2,min_terms=3,max_terms=3,operators=+|-,"
                      "allow_parentheses=false,format_style=natural")
    assert (spec.size, spec.seed) == (6, 2)
    assert dict(spec.tasks[0].options) == {"min_terms": 3, "max_terms": 3, "operators": ["+", "-"],
                                           "allow_parentheses": False, "format_style": "natural"}
    assert dict(parse_name("reasoning_gym:graph_color:edge_probability=1").tasks[0].options) == {
        "edge_probability": 1.0}
    rows = reasoning_gym_rows("reasoning_gym:chain_sum:size=20,min_terms=4,max_terms=4,allow_negation=true", "train")
    assert len(rows) == 20 and {r.fields["metadata"]["num_terms"] for r in rows} == {4}
    assert rows[0].fields["task_options"] == {"allow_negation": True, "max_terms": 4, "min_terms": 4}


@pytest.mark.parametrize("name, message", [
    ("reasoning_gym:leg_countin", "no task 'leg_countin'; did you mean leg_counting"),
    ("reasoning_gym:chain_sum:max_term=3", ("unknown option 'max_term' for task chain_sum; its options: "
                                            "allow_negation, max_digits, max_terms, min_digits, min_terms")),
    ("reasoning_gym:chain_sum:max_terms=many", "chain_sum option max_terms is a number; got 'many'"),
    ("reasoning_gym:chain_sum:allow_negation=2", "option allow_negation is true or false"),
    ("reasoning_gym:chain_sum:size=0", "size must be >= 1"),
    ("reasoning_gym:chain_sum:seed=x", "seed must be a whole number"),
    ("reasoning_gym:chain_sum:max_terms", "options are key=value"),
    ("reasoning_gym:chain_sum:min_terms=9,max_terms=3", "reasoning-gym refused the options"),
    ("reasoning_gym:composite", "write a composite as reasoning_gym:TASK*WEIGHT+TASK"),
    ("reasoning_gym:chain_sum*2", "a weight needs two or more tasks"),
    ("reasoning_gym:chain_sum+chain_sum", "task chain_sum is named twice"),
    ("reasoning_gym:chain_sum*0+gcd", "the weight of chain_sum must be > 0"),
    ("reasoning_gym:chain_sum*x+gcd", "the weight of chain_sum must be a number"),
    ("reasoning_gym:chain_sum+", "a task name is missing"),
    ("reasoning_gym:chain_sum+gcd:max_terms=3", "a composite takes size, seed and TASK.option"),
    ("reasoning_gym:chain_sum+gcd:lcm.max_value=3", "names task 'lcm', which is not one of its tasks"),
    ("reasoning_gym:chain_sum+gcd:chain_sum.size=3", "size and seed are the dataset's, not one task's"),
    ("reasoning_gym:chain_sum:a=1:b=2", "expected reasoning_gym:TASK"),
])
def test_a_bad_name_fails_naming_the_dataset_and_what_is_valid(name, message):
    with pytest.raises(DataError, match="dataset 'reasoning_gym:") as err:
        load_dataset(name, "train")
    assert message in str(err.value)


def test_a_composite_draws_each_row_from_one_task_by_weight():
    name = "reasoning_gym:leg_counting*3+chain_sum:size=400,seed=1,chain_sum.max_terms=2"
    spec = parse_name(name)
    assert [(t.name, t.weight, t.options) for t in spec.tasks] == [
        ("leg_counting", 3.0, ()), ("chain_sum", 1.0, (("max_terms", 2),))]
    rows = reasoning_gym_rows(name, "train")
    tasks = Counter(r.fields["metadata"]["source_dataset"] for r in rows)
    assert sum(tasks.values()) == 400 and 255 <= tasks["leg_counting"] <= 345  # 300 +- 5 sd of a binomial(400, 3/4)
    assert all(r.id == f"{r.fields['metadata']['source_dataset']}:train:{i}" for i, r in enumerate(rows))
    assert {r.fields["metadata"]["num_terms"] for r in rows if r.id.startswith("chain_sum")} == {2}
    assert {json.dumps(r.fields["task_options"]) for r in rows} == {"{}", '{"max_terms": 2}'}
    from reasoning_gym.composite import DatasetSpec  # reasoning-gym's own composite at the train split's seed

    direct = reasoning_gym.create_dataset("composite", size=400, seed=split_seed(1, "train"), datasets=[
        DatasetSpec("leg_counting", 3, {}), DatasetSpec("chain_sum", 1, {"max_terms": 2})])
    assert [r.question for r in rows] == [e["question"] for e in direct]
    assert len(reasoning_gym_rows(name, "validation")) == 200


# ----------------------------------------------------------------------------------------------------
# The reward.


@pytest.mark.parametrize("task", ["leg_counting", "chain_sum", "basic_arithmetic", "gcd", "spell_backward",
                                  "word_sorting", "countdown", "letter_counting"])
def test_the_gold_answer_in_answer_tags_scores_one(task):
    rows = reasoning_gym_rows(f"reasoning_gym:{task}:size=4", "validation")
    assert all(r.answer for r in rows)
    scores = _score([tagged(r.answer) for r in rows], rows)
    assert scores == [{"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}] * 4


def test_partial_credit_is_kept_and_only_a_full_score_is_correct():
    chain = reasoning_gym_rows("reasoning_gym:chain_sum:size=1", "train")[0]
    assert chain.answer == "-39"
    countdown = reasoning_gym_rows("reasoning_gym:countdown:size=1", "train")[0]
    rows = [chain, chain, chain, countdown, countdown, countdown]
    responses = [tagged("x-39"),  # chain_sum's substring credit: len("-39") / len("x-39")
                 "<answer>7</answer> then <answer>-39</answer>",  # the last answer counts
                 "-39",  # no answer tags: the scorer gets None
                 tagged("1 + 2"),  # countdown: a wrong expression 0.05
                 "no tags",  # countdown: no answer 0.01
                 tagged(countdown.answer)]
    scores = _score(responses, rows)
    assert [s["reward"] for s in scores] == [0.75, 1.0, 0.0, 0.05, 0.01, 1.0]
    assert [s["answer_reward"] for s in scores] == [0.0, 1.0, 0.0, 0.0, 0.0, 1.0]
    assert [s["format_reward"] for s in scores] == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]


def test_a_task_without_a_gold_answer_is_scored_on_the_response_itself():
    rows = reasoning_gym_rows("reasoning_gym:graph_color:size=3", "test")
    assert [r.answer for r in rows] == ["", "", ""] and all(r.fields["answer"] is None for r in rows)
    coloring = json.dumps({str(k): v for k, v in rows[0].fields["metadata"]["possible_answer"].items()})
    assert rows[1].fields["metadata"]["puzzle"]["edges"]  # so one colour for every vertex is not a colouring
    clash = json.dumps({str(v): 1 for v in rows[1].fields["metadata"]["puzzle"]["vertices"]})
    scores = _score([tagged(coloring), tagged(clash), "I cannot"], rows)
    assert [(s["reward"], s["answer_reward"], s["format_reward"]) for s in scores] == [
        (1.0, 1.0, 1.0), (0.01, 0.0, 1.0), (0.0, 0.0, 0.0)]  # graph_color: 0.01 for a colouring that clashes


def test_a_scorer_that_reads_its_config_scores_with_the_options_the_rows_were_made_with():
    rows = reasoning_gym_rows("reasoning_gym:time_intervals:size=2,task_types=date,max_date_difference_days=400",
                              "train")
    days = int(rows[0].answer.split()[0])
    # time_intervals' partial credit is 1 - |error| / max_date_difference_days: 1 - 10/400 here, 1 - 10/100 with
    # the task's default config
    assert _score([tagged(f"{days + 10} days")], rows[:1])[0]["reward"] == 0.975
    assert reasoning_gym.get_score_answer_fn("time_intervals")(f"{days + 10} days", rows[0].fields) == 0.9


def test_the_reward_needs_the_rows_and_says_so():
    fn = get_reward_fn("reasoning_gym")
    assert fn is reasoning_gym_reward() and fn.name == "reasoning_gym"
    with pytest.raises(ValueError, match="needs the batch's rows"):
        score_batch(fn, [tagged("4")], ["4"])
    with pytest.raises(ValueError, match="needs the batch's rows"):
        fn(tagged("4"), "4")
    rows = reasoning_gym_rows(LEGS + ":size=2", "train")
    with pytest.raises(ValueError, match="2 rows for 1 responses"):
        score_batch(fn, [tagged("4")], ["4"], RewardContext(rows=rows))
    with pytest.raises(ValueError, match="row 'mine:1' is not a reasoning-gym entry"):
        _score([tagged("4")], [Example("q", "4", id="mine:1", fields={"question": "q", "answer": "4"})])


def test_the_format_term_and_a_combination_read_the_same_rows():
    from rlvr.tasks.rewards import combine_rewards, format_reward_fn

    rows = reasoning_gym_rows("reasoning_gym:chain_sum:size=1", "train") * 3
    fn = combine_rewards([("reasoning_gym", get_reward_fn("reasoning_gym"), 1.0),
                          ("format", format_reward_fn("reasoning_gym"), 0.5)])
    scores, _ = score_batch(fn, [tagged("x-39"), tagged("-39"), "-39"], ["-39"] * 3, RewardContext(rows=rows))
    assert [s["reward"] for s in scores] == [1.25, 1.5, 0.0]
    assert [s["answer_reward"] for s in scores] == [0.0, 1.0, 0.0]


# ----------------------------------------------------------------------------------------------------
# Prompt, config, missing extra.


def test_the_prompt_is_reasoning_gyms_default_system_prompt_and_the_question(tokenizer):
    from reasoning_gym.utils import SYSTEM_PROMPTS

    from rlvr.tasks.prompts import get_prompt

    prompt = get_prompt("reasoning_gym")
    assert (prompt.template, prompt.stop, prompt.reward, prompt.chat) == ("{question}", ("</answer>",),
                                                                          "reasoning_gym", True)
    assert prompt.system == SYSTEM_PROMPTS["default"] and "<answer>" in prompt.system
    tok = _chat_tokenizer(tokenizer)
    row = reasoning_gym_rows(LEGS + ":size=1", "train")[0]
    assert prompt.render(row, tok) == f"<|system|>{SYSTEM_PROMPTS['default']}<|user|>{row.question}<|assistant|>"


def test_the_config_refuses_a_reasoning_gym_dataset_graded_by_another_prompts_reward():
    from rlvr.config import ConfigError, EvalConfig, TrainConfig, load_config

    with pytest.raises(ConfigError, match="reasoning-gym's tasks are graded by their own score_answer, and "
                                          "prompt=r1_zero grades with a reward of its own: use prompt=reasoning_gym"):
        load_config(EvalConfig, overrides={"dataset": LEGS, "prompt": "r1_zero"})
    assert load_config(EvalConfig, overrides={"dataset": LEGS, "prompt": "reasoning_gym"}).prompt == "reasoning_gym"
    cfg = load_config(TrainConfig, overrides={"dataset": LEGS, "prompt": "r1_zero",
                                                    "rewards": {"reasoning_gym": 1.0}})
    assert cfg.rewards == {"reasoning_gym": 1.0}


def test_without_the_package_every_entry_point_says_how_to_install_it(monkeypatch):
    from rlvr.tasks import reasoning_gym as rg
    from rlvr.tasks.prompts import get_prompt

    rg.parse_name.cache_clear()
    rg._rows.cache_clear()
    rg.reasoning_gym_reward.cache_clear()
    get_prompt.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # `import reasoning_gym` raises ImportError
    for call in (lambda: load_dataset(LEGS, "train"), lambda: get_reward_fn("reasoning_gym"),
                 lambda: get_prompt("reasoning_gym")):
        with pytest.raises(MissingExtra, match=r"pip install 'rlvr\[reasoning-gym\]'") as err:
            call()
        assert isinstance(err.value, ImportError) and isinstance(err.value, ValueError)  # the CLI reports ValueErrors


# ----------------------------------------------------------------------------------------------------
# rlvr eval: the prompting baseline of a reasoning-gym task.


def _chat_tokenizer(tokenizer):
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    return tok


def test_rlvr_eval_gives_the_prompting_baseline_of_a_task(tmp_path, tiny_model, tokenizer, monkeypatch):
    """The real CLI path on a tiny model: rows, the chat prompt with reasoning-gym's system prompt, generation
    stopped at </answer>, the task's scorer. The model's texts are replaced after it generated them by scripted
    ones, so every number below is computed by hand."""
    from reasoning_gym.utils import SYSTEM_PROMPTS
    from typer.testing import CliRunner

    from rlvr.cli import app
    from rlvr.engines.hf import HFEngine

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    _chat_tokenizer(tokenizer).save_pretrained(model_dir)
    rows = reasoning_gym_rows(LEGS + ":size=4", "test")
    gold = [r.answer for r in rows]
    script = [tagged(gold[0]), tagged(f"{gold[1]} legs"), f"It is {gold[2]}.", tagged(str(int(gold[3]) + 1))]
    generate, stops = HFEngine.generate, []

    def scripted(self, prompts, sampling, *args, **kwargs):
        stops.append(sampling.stop)
        out = generate(self, prompts, sampling, *args, **kwargs)  # the model really generates
        index = [next(i for i, r in enumerate(rows) if r.question in p) for p in prompts]
        return [dataclasses.replace(c, text=script[index[c.prompt_index]]) for c in out]

    monkeypatch.setattr(HFEngine, "generate", scripted)
    out = tmp_path / "eval"
    result = CliRunner().invoke(app, ["eval", f"model={model_dir}", f"dataset={LEGS}:size=4", "prompt=reasoning_gym",
                                      "max_new_tokens=6", "dtype=float32", "examples_per_category=0", f"out={out}"])
    assert result.exit_code == 0, result.output
    assert stops and all(tuple(s) == ("</answer>",) for s in stops)
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [f"leg_counting:test:{i}" for i in range(4)]
    assert records[0]["prompt"] == f"<|system|>{SYSTEM_PROMPTS['default']}<|user|>{rows[0].question}<|assistant|>"
    partial = len(gold[1]) / len(f"{gold[1]} legs")  # the base scorer's credit for an answer holding the gold one
    assert [r["reward"] for r in records] == [1.0, partial, 0.0, 0.0]
    assert [r["format_reward"] for r in records] == [1.0, 1.0, 0.0, 1.0]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["accuracy"] == pytest.approx((1.0 + partial) / 4)
    assert (summary["answer_rate"], summary["format_rate"], summary["n"]) == (0.25, 0.75, 4)
    assert summary["dataset"] == f"{LEGS}:size=4"


def test_a_prompt_that_opens_the_answer_tag_counts_as_the_responses():
    from rlvr.tasks.reward_base import RewardContext, score_batch
    from rlvr.tasks.reasoning_gym import reasoning_gym_reward, reasoning_gym_rows

    rows = reasoning_gym_rows("reasoning_gym:chain_sum:size=1", "train") * 3  # 24 - 63 = -39
    prompts = ["... assistant\n<answer>", "... assistant\n<answer>", "no tag opened"]
    scores, _ = score_batch(reasoning_gym_reward(), ["-39</answer>", "<answer>-39</answer>", "-39</answer>"],
                            [r.answer for r in rows], RewardContext(prompts=prompts, rows=rows))
    assert [s["reward"] for s in scores] == [1.0, 1.0, 0.0]
    assert [s["format_reward"] for s in scores] == [1.0, 1.0, 0.0]

"""Datasets, the arithmetic task, SFT targets and prompt templates."""

import re

import pytest

from rlvr.tasks.arithmetic import ArithmeticSpec, arithmetic
from rlvr.tasks.datasets import load_dataset
from rlvr.tasks.gsm8k import few_shot_examples, gsm8k, r1_zero_response
from rlvr.tasks.prompts import get_prompt
from rlvr.tasks.records import DataError, Example, load_jsonl
from rlvr.tasks.rewards import r1_zero_reward_fn


def test_gsm8k_splits_are_fixed_disjoint_and_exclude_few_shot():
    train, val, test = gsm8k("train"), gsm8k("validation"), gsm8k("test")
    assert (len(train), len(val), len(test)) == (7473 - 3 - 500, 500, 1319)
    assert not {e.question for e in train} & {e.question for e in val}
    shots = {e.question for e in few_shot_examples()}
    assert len(shots) == 3 and not shots & ({e.question for e in train} | {e.question for e in val})
    assert [e.question for e in gsm8k("validation")] == [e.question for e in val]  # fixed by seed
    assert [e.question for e in gsm8k("validation", seed=1)] != [e.question for e in val]
    assert test[0].answer == "18" and "<<" in test[0].solution


def test_load_jsonl_custom_fields_and_plain_answers(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text('{"q": "What is 2+2?", "a": 4}\n\n{"q": "Half of 9?", "a": "4.5"}\n')
    rows = load_jsonl(path, question_field="q", answer_field="a")
    assert [(r.question, r.answer) for r in rows] == [("What is 2+2?", "4"), ("Half of 9?", "4.5")]
    assert rows[1].id == "mine:3"
    assert load_dataset(str(path), "all", question_field="q", answer_field="a")[0].answer == "4"


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"question": "a", "answer": "#### 1"}\n{"question": "b", "answer": \n', r"bad\.jsonl:2: not valid JSON"),
        ('{"question": "a"}\n', r"bad\.jsonl:1: missing field 'answer'"),
        ('["a", "b"]\n', r"bad\.jsonl:1: expected a JSON object"),
        ('{"question": "", "answer": "1"}\n', r"bad\.jsonl:1: field 'question' must be a non-empty string"),
        ('{"question": "a", "answer": "no hashes"}\n{"question": "b", "answer": "#### "}\n', r"bad\.jsonl:2"),
        ("\n\n", r"bad\.jsonl: no examples"),
        # issue 41.5: the column of the mistake itself (the trailing comma's next character, column 44; the bad
        # literal, column 50), on any line
        ('{"question": "a", "answer": "1"}\n{"question": "What is 3+3?", "answer": "6",}\n',
         r"bad\.jsonl:2: not valid JSON \(Expecting property name enclosed in double quotes at column 44\)"),
        ('{"question": "What is 2+2?", "answer": "4", "x": tru}\n', r"bad\.jsonl:1: .* at column 50\)"),
    ],
)
def test_load_jsonl_errors_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(DataError, match=message):
        load_jsonl(path)


def test_a_byte_order_mark_is_not_a_json_error(tmp_path):
    # files saved by some Windows editors start with U+FEFF, which json.loads reports at column 1
    path = tmp_path / "bom.jsonl"
    path.write_text('\ufeff{"question": "a", "answer": "1"}\n', encoding="utf-8")
    assert [e.question for e in load_jsonl(path)] == ["a"]


def test_load_dataset_errors(tmp_path):
    with pytest.raises(DataError, match="unknown dataset 'gsm9k'"):
        load_dataset("gsm9k")
    with pytest.raises(DataError, match="unknown split 'dev'"):
        load_dataset("gsm8k", "dev")
    with pytest.raises(DataError, match="steps=<int>,max=<int>"):
        load_dataset("arithmetic:depth=3")
    with pytest.raises(DataError, match="no such file"):
        load_jsonl(tmp_path / "missing.jsonl")


def _replay(solution: str) -> int:
    """Recompute the arithmetic task's answer from its worked steps."""
    value = int(re.match(r".* starts with (\d+)", solution).group(1))
    for a, op, b, c in re.findall(r"(\d+) ([-+*]) (\d+) = (\d+)\.", solution):
        assert int(a) == value
        value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert value == int(c)
    return value


@pytest.mark.parametrize("name", ["arithmetic", "arithmetic:steps=1,max=9", "arithmetic:steps=4,max=99"])
def test_arithmetic_task_is_seeded_consistent_and_graded_by_the_same_reward(name):
    spec = ArithmeticSpec.parse(name)
    rows = arithmetic("train", n=200, spec=spec)
    assert rows == arithmetic("train", n=200, spec=spec)
    assert rows[:5] != arithmetic("test", n=5, spec=spec)
    for ex in rows:
        assert _replay(ex.solution) == int(ex.answer) >= 0
        assert ex.solution.count("=") == spec.steps
        assert r1_zero_reward_fn(r1_zero_response(ex), ex.answer)["reward"] == 1.0


def test_r1_zero_sft_targets_earn_full_reward_on_all_of_gsm8k_train():
    rows = load_jsonl(__import__("rlvr.tasks.gsm8k", fromlist=["gsm8k_file"]).gsm8k_file("train"))
    for ex in rows:
        response = r1_zero_response(ex)
        assert "<<" not in response
        assert r1_zero_reward_fn(response, ex.answer) == {"reward": 1.0, "format_reward": 1.0, "answer_reward": 1.0}


def test_r1_zero_response_format():
    ex = Example("q", "72", "48/2 = <<48/2=24>>24 clips.\n48+24 = <<48+24=72>>72 clips.")
    assert r1_zero_response(ex) == " 48/2 = 24 clips.\n48+24 = 72 clips. </think> <answer> 72 </answer>"


def test_prompt_templates(tokenizer):
    r1 = get_prompt("r1_zero")
    text = r1.format("What is 2+2?")
    assert text.startswith("A conversation between User and Assistant.")
    assert text.endswith("User: What is 2+2?\nAssistant: <think>")
    assert r1.stop == ("</answer>",) and r1.reward == "r1_zero"
    qo = get_prompt("question_only")
    assert qo.format("What is 2+2?") == "What is 2+2? Please put your final answer within \\boxed{}."
    assert qo.stop == () and qo.reward == "question_only"
    three = get_prompt("r1_zero_three_shot").format("What is {2+2}?")
    assert three.count("User: ") == 4 and three.count("</answer>\nUser: ") == 3
    assert three.endswith("User: What is {2+2}?\nAssistant: <think>")
    for ex in few_shot_examples():
        assert ex.question in three and f"<answer> {ex.answer} </answer>" in three
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        get_prompt("chat").format("hi", tokenizer)
    with pytest.raises(ValueError, match="unknown prompt 'cot'; valid: question_only, r1_zero"):
        get_prompt("cot")


def test_chat_prompt_uses_the_chat_template(tokenizer):
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    text = get_prompt("chat").format("What is 2+2?", tok)
    assert text.startswith("<|user|>What is 2+2?") and text.endswith("<|assistant|>")
    assert "<answer></answer>" in text and get_prompt("chat").reward == "answer_tag"


def test_jsonl_dataset_holds_out_a_fixed_validation_tenth(tmp_path):
    path = tmp_path / "many.jsonl"
    path.write_text("".join(f'{{"q": "question {i}?", "a": {i}}}\n' for i in range(50)))
    fields = {"question_field": "q", "answer_field": "a"}
    train = load_dataset(str(path), "train", **fields)
    val = load_dataset(str(path), "validation", **fields)
    test = load_dataset(str(path), "test", **fields)
    assert (len(train), len(val), len(test)) == (40, 5, 5)
    assert not {e.question for e in train} & {e.question for e in val}
    assert not {e.question for e in train + val} & {e.question for e in test}
    assert [e.answer for e in load_dataset(str(path), "validation", **fields)] == [e.answer for e in val]

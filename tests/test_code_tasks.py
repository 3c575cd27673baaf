"""The code data layer: the generated `code` task, code JSONL files, dispatch, the code prompts and their SFT
targets, and the config check that pairs a code dataset with a code prompt."""

import ast
import json
import re

import pytest

from rlvr.config import ConfigError, EvalConfig, SFTConfig, TrainConfig, load_config
from rlvr.tasks import code as code_tasks
from rlvr.tasks.code import (
    CodeSpec,
    code_answer,
    code_families,
    code_reasoning,
    code_response,
    code_task,
    load_code_jsonl,
)
from rlvr.tasks.datasets import is_code_dataset, load_dataset
from rlvr.tasks.gsm8k import r1_zero_response
from rlvr.tasks.prompts import get_prompt
from rlvr.tasks.records import DataError, Example

LEVELS = (1, 2, 3)


def _tests(ex: Example) -> list[str]:
    truth = json.loads(ex.answer)
    assert set(truth) == {"entry_point", "tests"}
    return truth["tests"]


def _call(test: str) -> ast.Call:
    node = ast.parse(test).body[0]
    assert isinstance(node, ast.Assert) and isinstance(node.test, ast.Compare)
    assert isinstance(node.test.ops[0], ast.Eq) and isinstance(node.test.left, ast.Call)
    return node.test


# ----------------------------------------------------------------------------------------------------
# The generated task.


@pytest.mark.parametrize("level", LEVELS)
def test_generator_is_deterministic_and_the_splits_share_no_question(level):
    spec = CodeSpec(level)
    train, val, test = (code_task(split, spec=spec) for split in ("train", "validation", "test"))
    assert (len(train), len(val), len(test)) == (20000, 500, 1000)
    code_tasks._generate.cache_clear()
    assert code_task("validation", spec=spec) == val  # fixed: the same seeded stream every time
    assert code_task("train", n=300, spec=spec) == train[:300]
    questions = [{e.question for e in rows} for rows in (train, val, test)]
    assert not questions[0] & questions[1] and not questions[0] & questions[2] and not questions[1] & questions[2]
    assert len(questions[0]) > 4000 and len(questions[1]) > 250  # varied, though a spec is sometimes asked twice
    assert [e.id for e in val[:3]] == ["code:0", "code:1", "code:2"]
    assert code_task("train", n=50, spec=CodeSpec(level % 3 + 1)) != train[:50]


@pytest.mark.parametrize("level", LEVELS)
def test_every_reference_solution_passes_its_own_hidden_tests(level):
    for ex in code_task("train", n=300, spec=CodeSpec(level)) + code_task("test", n=100, spec=CodeSpec(level)):
        truth = json.loads(ex.answer)
        name = truth["entry_point"]
        assert ex.solution.startswith(f"def {name}(") and "```" not in ex.solution
        assert f"`{ex.solution.splitlines()[0][4:-1]}`" in ex.question  # the signature is asked for as written
        tests = truth["tests"]
        assert 4 <= len(tests) <= 6 and len(set(tests)) == len(tests)
        for test in tests:
            namespace: dict = {}
            exec(ex.solution, namespace)  # our own trusted reference code
            exec(test, namespace)
            assert _call(test).left.func.id == name
        # not all the same expected value: a constant function must not pass
        assert len({ast.unparse(_call(t).comparators[0]) for t in tests}) >= 2, ex


@pytest.mark.parametrize("level", LEVELS)
def test_hidden_test_inputs_are_not_in_the_question(level):
    empties = 0
    for ex in code_task("validation", n=300, spec=CodeSpec(level)):
        for test in _tests(ex):
            call = _call(test).left
            args = ", ".join(ast.unparse(a) for a in call.args)
            assert args not in ex.question, (args, ex.question)
            assert all(isinstance(ast.literal_eval(a), (int, str, list)) for a in call.args)
            empties += args in ("[]", "''", "[], []")
    assert empties > 100  # the edge cases are tested too


def test_levels_have_their_own_families_and_shapes():
    families = [set(code_families(level)) for level in LEVELS]
    assert [len(f) >= 12 for f in families] == [True] * 3
    assert not families[0] & families[1] and not families[1] & families[2] and not families[0] & families[2]
    rows = {level: code_task("train", n=300, spec=CodeSpec(level)) for level in LEVELS}
    names = {level: {json.loads(e.answer)["entry_point"] for e in rows[level]} for level in LEVELS}
    assert not names[1] & names[2] and not names[2] & names[3] and not names[1] & names[3]
    assert all(len(e.solution.splitlines()) == 2 and "    return " in e.solution for e in rows[1])  # one expression
    assert sum("for " in e.solution for e in rows[2]) > 200
    assert sum(e.solution.count("\n") >= 4 for e in rows[3]) > 200  # loops with conditions, dictionaries
    assert sum("{" in e.solution for e in rows[3]) > 50
    # parameters vary: the same family asks for other constants under other names
    added = [re.fullmatch(r"def (\w+)\((\w+)\):\n    return \[x \+ (\d) for x in \2\]", e.solution) for e in rows[1]]
    added = [m.groups() for m in added if m]
    assert len(added) > 10 and len({k for _, _, k in added}) >= 6
    assert len({n for n, _, _ in added}) >= 3 and len({p for _, p, _ in added}) >= 4
    assert len(names[2]) > 30


def test_one_example_end_to_end():
    assert code_task("validation", n=1, spec=CodeSpec(1))[0] == Example(
        "Write a Python function `biggest(nums)` that returns the largest number in the non-empty list `nums`.",
        '{"entry_point": "biggest", "tests": ["assert biggest([3, 9, 2, 9, -4, 6]) == 9", "assert biggest([1, 8]) == '
        '8", "assert biggest([1, -4, 8, 1]) == 8", "assert biggest([-2, 6, -5, 7, 3, 4]) == 7", "assert biggest([12, '
        '7, 7, 5, 7, 2, 1]) == 12"]}',
        "def biggest(nums):\n    return max(nums)",
        id="code:0",
    )


@pytest.mark.parametrize(
    "name, level",
    [("code", 2), ("code:level=1", 1), ("code:level=3", 3), ("code: level=3", 3)],
)
def test_code_spec_parse(name, level):
    assert CodeSpec.parse(name) == CodeSpec(level)


@pytest.mark.parametrize(
    "name, message",
    [
        ("code:level=4", r"dataset 'code:level=4': level must be 1, 2 or 3; got 4"),
        ("code:level=0", r"level must be 1, 2 or 3; got 0"),
        ("code:depth=2", r"dataset 'code:depth=2': expected option level=<1, 2 or 3>; got 'depth=2'"),
        ("code:level=x", r"expected option level=.*got 'level=x'"),
        ("code:level", r"expected option level=.*got 'level'"),
    ],
)
def test_code_spec_errors_name_the_option(name, message):
    with pytest.raises(DataError, match=message):
        CodeSpec.parse(name)
    with pytest.raises(DataError, match=message):
        load_dataset(name)


# ----------------------------------------------------------------------------------------------------
# Code JSONL files.


def _write(path, rows):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_load_code_jsonl_reads_the_three_forms_of_tests(tmp_path):
    block = "from solution import double\n\ndef test_double():\n    assert double(2) == 4\n"
    path = _write(tmp_path / "tasks.jsonl", [
        {"prompt": "Add one.", "tests": ["assert inc(1) == 2", "assert inc(-1) == 0"], "entry_point": "inc",
         "solution": "def inc(x):\n    return x + 1"},
        "",
        {"prompt": "  Double it. ", "tests": block},
        {"prompt": "Join.", "entry_point": "join", "solution": None,
         "tests": [{"input": [["a", "b"], "-"], "output": "a-b"}, {"input": 3, "output": [3]},
                   {"input": [], "output": None}, {"input": {"k": True}, "output": 1.5}]},
    ])
    rows = load_code_jsonl(path)
    assert [r.id for r in rows] == ["tasks:1", "tasks:3", "tasks:4"]
    assert [r.question for r in rows] == ["Add one.", "Double it.", "Join."]
    assert rows[0].answer == '{"entry_point": "inc", "tests": ["assert inc(1) == 2", "assert inc(-1) == 0"]}'
    assert rows[0].solution == "def inc(x):\n    return x + 1"
    assert rows[1].answer == code_answer([block], None) and rows[1].solution == ""
    assert json.loads(rows[1].answer) == {"entry_point": None, "tests": [block]}
    assert _tests(rows[2]) == ["assert join(['a', 'b'], '-') == 'a-b'", "assert join(3) == [3]",
                               "assert join() == None", "assert join({'k': True}) == 1.5"]
    assert rows[2].answer == json.dumps({"entry_point": "join", "tests": _tests(rows[2])}, sort_keys=True)


def test_load_code_jsonl_field_names_are_configurable(tmp_path):
    path = _write(tmp_path / "mbpp.jsonl", [
        {"task_id": 2, "text": "Write a function to find the shared elements of two lists.",
         "code": "def similar_elements(a, b):\n    return tuple(set(a) & set(b))",
         "test_list": ["assert set(similar_elements((3, 4), (4, 5))) == {4}"]},
    ])
    rows = load_code_jsonl(path, question_field="text", tests_field="test_list", solution_field="code")
    assert rows[0].solution.startswith("def similar_elements(a, b):")
    assert _tests(rows[0]) == ["assert set(similar_elements((3, 4), (4, 5))) == {4}"]
    with pytest.raises(DataError, match=r"mbpp\.jsonl:1: missing field 'prompt' \(fields present: task_id, text"):
        load_code_jsonl(path)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a", "tests": ["assert f(1) == 1"]', r"bad\.jsonl:2: not valid JSON"),
        ('["a"]', r"bad\.jsonl:2: expected a JSON object, got list"),
        ('{"prompt": "a"}', r"bad\.jsonl:2: missing field 'tests' \(fields present: prompt\)"),
        ('{"tests": ["assert f(1) == 1"]}', r"bad\.jsonl:2: missing field 'prompt'"),
        ('{"prompt": " ", "tests": ["assert f(1) == 1"]}', r"bad\.jsonl:2: field 'prompt' must be a non-empty string"),
        ('{"prompt": "a", "tests": 3}', r"bad\.jsonl:2: field 'tests' must be a list of tests or a string"),
        ('{"prompt": "a", "tests": []}', r"bad\.jsonl:2: field 'tests' is empty"),
        ('{"prompt": "a", "tests": ""}', r"bad\.jsonl:2: field 'tests' item 1: empty test"),
        ('{"prompt": "a", "tests": ["assert f(1) =="]}', r"bad\.jsonl:2: field 'tests' item 1: not valid Python"),
        ('{"prompt": "a", "tests": ["assert f(1) == 1", 7]}',
         r"bad\.jsonl:2: field 'tests' item 2: expected an assert string or an input/output pair; got int"),
        ('{"prompt": "a", "tests": [{"input": [1], "output": 2}]}',
         r"bad\.jsonl:2: field 'tests' item 1: input/output pairs need an entry point \(field 'entry_point'\)"),
        ('{"prompt": "a", "entry_point": "f", "tests": [{"input": [1]}]}',
         r"bad\.jsonl:2: field 'tests' item 1: an input/output pair needs exactly the keys 'input' and 'output'"),
        ('{"prompt": "a", "entry_point": "f", "tests": [{"input": [1], "output": NaN}]}',
         r"bad\.jsonl:2: field 'tests' item 1: a value has no Python literal"),
        ('{"prompt": "a", "entry_point": "my f", "tests": ["assert 1"]}',
         r"bad\.jsonl:2: field 'entry_point' must be a Python name or null; got 'my f'"),
        ('{"prompt": "a", "solution": 3, "tests": ["assert 1"]}', r"bad\.jsonl:2: field 'solution' must be a string"),
    ],
)
def test_load_code_jsonl_errors_name_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine", "tests": ["assert f(1) == 1"]}\n' + line + "\n")
    with pytest.raises(DataError, match=message):
        load_code_jsonl(path)


def test_load_code_jsonl_missing_and_empty_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_code_jsonl(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match=r"empty\.jsonl: no examples"):
        load_code_jsonl(tmp_path / "empty.jsonl")


# ----------------------------------------------------------------------------------------------------
# Dispatch.


def test_load_dataset_dispatches_code_names_and_code_jsonl(tmp_path):
    assert load_dataset("code:level=1", "validation", limit=5) == code_task("validation", n=5, spec=CodeSpec(1))
    assert load_dataset("code", "test", limit=3) == code_task("test", n=3)
    path = _write(tmp_path / "many.jsonl", [
        {"question": f"Return {i}.", "tests": [f"assert f() == {i}"], "entry_point": "f",
         "solution": f"def f():\n    return {i}"} for i in range(50)])
    train, val, test = (load_dataset(str(path), split) for split in ("train", "validation", "test"))
    assert (len(train), len(val), len(test)) == (40, 5, 5)  # the same holdout as a math JSONL
    assert not {e.question for e in train} & {e.question for e in val}
    assert [e.question for e in load_dataset(str(path), "validation")] == [e.question for e in val]
    every = load_dataset(str(path), "all")
    assert _tests(every[7]) == ["assert f() == 7"] and every[7].solution == "def f():\n    return 7"
    # the configured field names reach the code loader; a math JSONL is still read by load_jsonl
    mbpp = _write(tmp_path / "mbpp.jsonl", [{"text": "Return 1.", "test_list": ["assert g() == 1"], "code": "x"}])
    rows = load_dataset(str(mbpp), "all", question_field="text", tests_field="test_list", solution_field="code")
    assert rows[0].question == "Return 1." and rows[0].solution == "x"
    with pytest.raises(DataError, match=r"mbpp\.jsonl:1: missing field 'question'"):
        load_dataset(str(mbpp), "all")  # without its tests field named it is a math file
    math = _write(tmp_path / "math.jsonl", [{"question": "1+1?", "answer": 2}])
    assert load_dataset(str(math), "all")[0].answer == "2"


def test_is_code_dataset(tmp_path):
    assert is_code_dataset("code") and is_code_dataset("code:level=3")
    assert not any(is_code_dataset(name) for name in ("gsm8k", "arithmetic", "arithmetic:steps=3,max=99"))
    code = _write(tmp_path / "code.jsonl", ["", {"prompt": "p", "tests": ["assert 1"]}, "not json"])
    math = _write(tmp_path / "math.jsonl", [{"question": "q", "answer": "1"}])
    mbpp = _write(tmp_path / "mbpp.jsonl", [{"text": "q", "test_list": ["assert 1"]}])
    assert is_code_dataset(str(code)) and not is_code_dataset(str(math)) and not is_code_dataset(str(mbpp))
    assert is_code_dataset(str(mbpp), tests_field="test_list")
    assert not is_code_dataset(str(_write(tmp_path / "broken.jsonl", ["{oops"])))
    with pytest.raises(DataError, match="no such file"):
        is_code_dataset(str(tmp_path / "missing.jsonl"))


# ----------------------------------------------------------------------------------------------------
# Prompts and SFT targets.

QUESTION = "Write a Python function `sum_evens(nums)` that returns the sum of the even numbers in the list `nums`."
SOLUTION = "def sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)"
EXAMPLE = Example(QUESTION, code_answer(["assert sum_evens([1, 2, 4]) == 6"], "sum_evens"), SOLUTION, id="code:0")


def test_code_prompt_format_and_sft_target():
    prompt = get_prompt("code")
    assert (prompt.stop, prompt.reward, prompt.chat) == (("\n```\n",), "code_tests:think", False)
    assert prompt.format(QUESTION) == (
        "A conversation between User and Assistant. The User asks for a Python function, and the Assistant writes "
        "it. The Assistant first thinks about the reasoning process in the mind and then provides the User with the "
        "program. The reasoning process is enclosed within <think> </think> and the program is written in one "
        "Python code block that starts with ```python and ends with ```, i.e., <think> reasoning process here "
        "</think>\n```python\nprogram here\n```\n"
        f"User: {QUESTION}\nAssistant: <think>"
    )
    assert prompt.format("Use {braces} and `f(x)`.").endswith("User: Use {braces} and `f(x)`.\nAssistant: <think>")
    assert prompt.sft_response(EXAMPLE) == (
        " I need `sum_evens(nums)` to return the sum of the even numbers in the list `nums`. </think>\n"
        "```python\ndef sum_evens(nums):\n    return sum(x for x in nums if x % 2 == 0)\n```\n"
    )


def test_code_chat_prompt_format_and_sft_target(tokenizer):
    prompt = get_prompt("code_chat")
    assert (prompt.stop, prompt.reward, prompt.chat) == (("\n```\n",), "code_tests", True)
    tok = tokenizer.__class__(tokenizer_object=tokenizer.backend_tokenizer, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}{% endfor %}<|assistant|>"
    assert prompt.format(QUESTION, tok) == (
        f"<|user|>{QUESTION}\n\nWrite the Python function in a single ```python code block. No explanation is "
        "needed.<|assistant|>"
    )
    with pytest.raises(ValueError, match="needs a tokenizer with a chat template"):
        prompt.format(QUESTION, tokenizer)
    assert prompt.sft_response(EXAMPLE) == f"```python\n{SOLUTION}\n```\n"


@pytest.mark.parametrize("name", ["code", "code_chat"])
def test_generation_stops_right_after_the_sft_target(name):
    prompt = get_prompt(name)
    for level in LEVELS:
        for ex in code_task("train", n=200, spec=CodeSpec(level)):
            response = prompt.sft_response(ex)
            assert response.find(prompt.stop[0]) == len(response) - len(prompt.stop[0])  # first stop = the end
            code = response.split("```python\n", 1)[1][: -len("\n```\n")]
            assert code == ex.solution
            if name == "code":
                assert response.startswith(" I need `") and response.count("</think>") == 1


def test_sft_response_of_the_other_prompts():
    math = Example("q", "72", "48/2 = <<48/2=24>>24 clips.")
    assert get_prompt("r1_zero").sft_response(math) == r1_zero_response(math)
    assert get_prompt("r1_zero_three_shot").sft_response(math) == " 48/2 = 24 clips. </think> <answer> 72 </answer>"
    for name in ("question_only", "chat"):
        with pytest.raises(ValueError, match=f"prompt '{name}' has no SFT target"):
            get_prompt(name).sft_response(math)
    with pytest.raises(ValueError, match="example 'mbpp:3' has no reference solution"):
        get_prompt("code").sft_response(Example("Write a function.", code_answer(["assert 1"], None), "", "mbpp:3"))


@pytest.mark.parametrize(
    "question, entry_point, reasoning",
    [
        ("Write a function to find the shared elements from the given two lists.  More text.", "similar",
         "I need to write a function to find the shared elements from the given two lists. The function is "
         "`similar`."),
        ("Given a list, return its length!", None, "I need to solve this: Given a list, return its length!"),
        ('def add(a, b):\n    """Add two numbers."""\n', "add", "I need to complete the function `add`."),
        ("import math\n", None, "I need to write the program."),
    ],
)
def test_code_reasoning_for_questions_from_files(question, entry_point, reasoning):
    ex = Example(question, code_answer(["assert 1"], entry_point), "x")
    assert code_reasoning(ex) == reasoning
    assert code_response(ex, think=True) == f" {reasoning} </think>\n```python\nx\n```\n"


# ----------------------------------------------------------------------------------------------------
# Configs: a code dataset needs a code prompt, and a math dataset a math prompt.

@pytest.mark.parametrize("cls", [EvalConfig, SFTConfig, TrainConfig], ids=lambda c: c.__name__)
def test_configs_pair_code_datasets_with_code_prompts(cls, tmp_path):
    with pytest.raises(ConfigError, match=r"dataset='code' is a code dataset.*prompt='r1_zero' is not a code "
                                          r"prompt: use prompt=code or code_chat"):
        load_config(cls, overrides={"dataset": "code", "prompt": "r1_zero"})
    with pytest.raises(ConfigError, match=r"prompt='code' is a code prompt, but dataset='gsm8k' is not a code "
                                          r"dataset"):
        load_config(cls, overrides={"prompt": "code"})
    with pytest.raises(ConfigError, match=r"prompt='code_chat' is a code prompt, but dataset='arithmetic:steps=1'"):
        load_config(cls, overrides={"dataset": "arithmetic:steps=1", "prompt": "code_chat"})
    code_file = _write(tmp_path / "code.jsonl", [{"question": "q", "tests": ["assert 1"]}])
    with pytest.raises(ConfigError, match=r"is a code dataset.*prompt='question_only'"):
        load_config(cls, overrides={"dataset": str(code_file), "prompt": "question_only"})
    for dataset, prompt in (("code:level=3", "code"), ("code", "code_chat"), (str(code_file), "code"),
                            ("gsm8k", "r1_zero"), ("arithmetic", "r1_zero")):
        cfg = load_config(cls, overrides={"dataset": dataset, "prompt": prompt})
        assert (cfg.dataset, cfg.prompt) == (dataset, prompt)
    # a dataset file that is not there yet is checked when it is loaded, not here
    assert load_config(cls, overrides={"dataset": str(tmp_path / "later.jsonl"), "prompt": "code"}).prompt == "code"


def test_sft_config_takes_the_prompts_with_an_sft_target():
    with pytest.raises(ConfigError, match=r"prompt='chat' has no SFT target; SFT takes prompt=r1_zero or "
                                          r"r1_zero_three_shot \(math datasets\), code or code_chat"):
        load_config(SFTConfig, overrides={"prompt": "chat"})
    for prompt in ("r1_zero", "r1_zero_three_shot"):
        assert load_config(SFTConfig, overrides={"prompt": prompt}).prompt == prompt
    cfg = load_config(TrainConfig, overrides={"dataset": "code", "prompt": "code",
                                              "rewards": {"code_tests": 1.0, "format": 0.05}})
    assert cfg.rewards == {"code_tests": 1.0, "format": 0.05}


def test_sft_trains_on_code_targets(tmp_path, model_dir):
    from rlvr.training.sft import train_sft

    base = dict(model=str(model_dir), dataset="code:level=1", prompt="code", steps=2, batch_size=2,
                microbatch_size=2, train_limit=8, eval_at_start=False, eval_at_end=False, eval_every=0,
                precision="fp32", tensorboard=False)
    summary = train_sft(load_config(SFTConfig, overrides={**base, "out": str(tmp_path / "run")}))
    assert summary["steps"] == 2 and (tmp_path / "run" / "final" / "DONE").is_file()
    # a code file without reference solutions fails before any model is loaded, naming the example
    path = _write(tmp_path / "nosol.jsonl", [{"question": f"q{i}", "tests": ["assert 1"]} for i in range(20)])
    with pytest.raises(ValueError, match=r"example 'nosol:\d+' has no reference solution"):
        train_sft(load_config(SFTConfig, overrides={**base, "dataset": str(path), "model": "/nonexistent",
                                                    "out": str(tmp_path / "nosol")}))

"""Issue 63 item 1: train, validation and test never share a row, for every dataset kind, with and without a
validation set of its own, in every command's config; train is the source's own train split minus what is held
out of it; a table too small to hold validation rows out trains without validating."""

import json

import pytest

from rlvr.config import DPOConfig, EvalConfig, SFTConfig, TrainConfig, load_config
from rlvr.tasks.datasets import content_key, load_dataset, load_split
from rlvr.tasks.gsm8k import FEW_SHOT_INDICES, gsm8k_file
from rlvr.tasks.records import DataError, load_jsonl

ROWS = [{"question": f"What is {i} plus {i}?", "answer": str(2 * i), "solution": f"{i}+{i}={2 * i}", "k": i}
        for i in range(60)]
VALIDATION = [{"question": f"What is {i} times 3?", "answer": str(3 * i), "solution": f"{i}*3", "k": i}
              for i in range(7)]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _sources(tmp_path) -> dict:
    """Every kind of dataset a user can name: (name, {split: raw rows the source has of its own} or None when it
    is one table, dataset-specific overrides)."""
    import datasets

    table = datasets.Dataset.from_list(ROWS)
    table.to_parquet(tmp_path / "r.parquet")
    table.to_csv(tmp_path / "r.csv", index=False)
    (tmp_path / "r.json").write_text(json.dumps(ROWS))
    table.save_to_disk(tmp_path / "saved")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:50]),
                          "test": datasets.Dataset.from_list(ROWS[50:])}).save_to_disk(tmp_path / "dd")
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:40]),
                          "validation": datasets.Dataset.from_list(ROWS[40:50]),
                          "test": datasets.Dataset.from_list(ROWS[50:])}).save_to_disk(tmp_path / "dd3")
    code = [{"question": f"Write f{i}(x) returning x + {i}.", "tests": [f"assert f{i}(1) == {1 + i}"],
             "entry_point": f"f{i}"} for i in range(30)]
    user = {"prompt": "r1_zero"}
    return {
        "jsonl": (_jsonl(tmp_path / "r.jsonl", ROWS), None, user),
        "json": (str(tmp_path / "r.json"), None, user),
        "csv": (str(tmp_path / "r.csv"), None, user),
        "parquet": (str(tmp_path / "r.parquet"), None, user),
        "saved": (str(tmp_path / "saved"), None, user),
        "dataset_dict_train_test": (str(tmp_path / "dd"), {"train": ROWS[:50], "test": ROWS[50:]}, user),
        "dataset_dict_three": (str(tmp_path / "dd3"), {"train": ROWS[:40], "validation": ROWS[40:50],
                                                       "test": ROWS[50:]}, user),
        "code_jsonl": (_jsonl(tmp_path / "code.jsonl", code), None, {"prompt": "code"}),
        "gsm8k": ("gsm8k", "gsm8k", {}),
        "arithmetic": ("arithmetic:steps=1,max=9", "generated", {}),
        "code": ("code:level=1", "generated", {"prompt": "code"}),
        "reasoning_gym": ("reasoning_gym:chain_sum:size=60", "generated", {}),
    }


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    return _sources(tmp_path_factory.mktemp("sources"))


COMMANDS = {"train": TrainConfig, "sft": SFTConfig, "dpo": DPOConfig, "distributed": TrainConfig, "eval": EvalConfig}


def _cfg(command, name, overrides, validation):
    extra = {"dataset": name, **overrides}
    if command == "sft" and extra.get("prompt") not in ("code",) and not name.startswith(("gsm8k", "arithmetic")):
        extra = {**extra, "prompt": "row", "solution_field": "solution", "rewards": {"answer_tag": 1.0}} \
            if not name.startswith(("code", "reasoning_gym")) else extra
    if command == "sft" and name.startswith("reasoning_gym"):
        pytest.skip("reasoning_gym rows have no SFT target")
    if command == "distributed":
        extra["distributed"] = {"rollout_workers": 1}
    if validation:
        extra["validation_dataset"] = validation
    return load_config(COMMANDS[command], overrides=extra)


def _keys(rows):
    return [content_key(r) for r in rows]


@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("separate", [False, True], ids=["holdout", "validation_dataset"])
@pytest.mark.parametrize("kind", ["jsonl", "json", "csv", "parquet", "saved", "dataset_dict_train_test",
                                  "dataset_dict_three", "code_jsonl", "gsm8k", "arithmetic", "code", "reasoning_gym"])
def test_train_validation_and_test_never_share_a_row(sources, tmp_path, kind, separate, command):
    name, own, overrides = sources[kind]
    validation = None
    if separate:
        validation = _jsonl(tmp_path / "v.jsonl", VALIDATION) if kind != "code_jsonl" else \
            _jsonl(tmp_path / "v.jsonl", [{"question": "Write g(x) returning 0.", "tests": ["assert g(1) == 0"],
                                           "entry_point": "g"}])
    cfg = _cfg(command, name, overrides, validation)
    train, val, test = (load_split(cfg, s) for s in ("train", "validation", "test"))
    keys = {s: set(_keys(rows)) for s, rows in (("train", train), ("validation", val), ("test", test))}
    assert not keys["train"] & keys["validation"], "train and validation share rows"
    assert not keys["train"] & keys["test"], "train and test share rows"
    assert not keys["validation"] & keys["test"], "validation and test share rows"
    if separate:  # validation is the other file, whole; train keeps the tenth a holdout would have taken
        assert _keys(val) == _keys(load_dataset(validation, "all", question_field="question"))
    if own is None:  # one table: train is the table minus a validation tenth (unless given apart) and a test tenth
        every = _keys(load_dataset(name, "all", question_field="question", require_answer=False,
                                   tests_field="tests"))
        n = len(every)
        assert len(test) == n // 10
        assert len(val) == (len(VALIDATION if kind != "code_jsonl" else [0]) if separate else n // 10)
        assert sorted(_keys(train) + _keys(test) + ([] if separate else _keys(val))) == sorted(every)
    elif own == "gsm8k":
        source = [content_key(r) for i, r in enumerate(load_jsonl(gsm8k_file("train"))) if i not in FEW_SHOT_INDICES]
        assert _keys(test) == _keys(load_jsonl(gsm8k_file("test")))
        assert len(train) == len(source) - (0 if separate else 500)
        assert set(_keys(train)) <= set(source) and (separate or set(_keys(val)) <= set(source))
    elif isinstance(own, dict):  # a DatasetDict: its own splits, and a test tenth held out of train when it has none
        assert _keys(test) == ([content_key(r) for r in load_dataset(name, "test")] if "test" not in own
                               else [" ".join(r["question"].split()) for r in own["test"]])
        source = [" ".join(r["question"].split()) for r in own["train"]]
        held = set(_keys(test)) | (set() if separate or "validation" in own else set(_keys(val)))
        assert sorted(_keys(train)) == sorted(k for k in source if k not in held)
    if command == "eval":  # `rlvr eval split=all` evaluates every row of the source
        everything = load_split(cfg.model_copy(update={"split": "all"}), "all")
        assert set(_keys(train)) | set(_keys(test)) <= set(_keys(everything))


def test_with_a_validation_set_gsm8k_trains_on_its_train_split_never_its_test_split(tmp_path):
    """The issue's reproduction: `dataset=gsm8k validation_dataset=v.jsonl` trained on GSM8K's 1,319 test
    questions."""
    cfg = load_config(TrainConfig, overrides={"dataset": "gsm8k", "validation_dataset": _jsonl(tmp_path / "v.jsonl",
                                                                                               VALIDATION)})
    train = load_split(cfg, "train")
    test = {content_key(r) for r in load_jsonl(gsm8k_file("test"))}
    assert len(train) == 7473 - len(FEW_SHOT_INDICES) and not test & set(_keys(train))


def test_a_validation_file_that_repeats_training_rows_is_kept_out_of_training(tmp_path, caplog):
    data = _jsonl(tmp_path / "r.jsonl", ROWS)
    val = _jsonl(tmp_path / "v.jsonl", ROWS[:5] + VALIDATION)
    cfg = load_config(TrainConfig, overrides={"dataset": data, "validation_dataset": val, "prompt": "r1_zero"})
    train = load_split(cfg, "train")
    assert not {content_key(r) for r in load_split(cfg, "validation")} & set(_keys(train))
    assert "left out of train" in caplog.text
    same = load_config(TrainConfig, overrides={"dataset": data, "validation_dataset": data, "prompt": "r1_zero"})
    with pytest.raises(DataError, match="every row of its train split is also in the validation"):
        load_split(same, "train")


def test_a_hub_dataset_without_a_validation_split_holds_one_out_of_train(monkeypatch):
    """hf:NAME with only a train split validated on a tenth of the rows it also trained on (20 of 20); with
    train and test, `split=test` read the train split. The hub is the datasets library's (no network here):
    its loader is given the DatasetDict a hub would return."""
    import datasets

    from rlvr.tasks import tables

    hub = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS[:40])})
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None: hub)
    monkeypatch.setattr(tables, "_HUB", {})
    cfg = load_config(TrainConfig, overrides={"dataset": "hf:someone/rows", "prompt": "r1_zero"})
    train, val, test = (load_split(cfg, s) for s in ("train", "validation", "test"))
    assert (len(train), len(val), len(test)) == (32, 4, 4)
    assert not set(_keys(train)) & (set(_keys(val)) | set(_keys(test))) and not set(_keys(val)) & set(_keys(test))


def test_a_table_of_three_rows_trains_without_validating(tmp_path, model_dir, caplog):
    """Fewer than 10 rows hold no validation rows out: the run trains on all of them and says it does not
    validate (validation off: the split is not even read)."""
    from rlvr.core.tracking import read_jsonl
    from rlvr.training import rl

    from conftest import train_cfg

    rows = _jsonl(tmp_path / "three.jsonl", [{"prompt": f"{w} backwards:", "answer": w[::-1]} for w in
                                             ("cat", "dog", "sun")])
    cfg = train_cfg(model_dir, tmp_path / "run", dataset=rows, prompt="row", rewards={"answer_tag": 1.0}, steps=1,
                    rollout_batch_size=4, group_size=2)
    assert len(load_split(cfg, "train")) == 3
    rl.train_grpo(cfg)
    assert "this run does not validate" in caplog.text
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")] == [1]


def test_rlvr_train_trains_only_on_the_train_split(tmp_path, model_dir):
    """End to end: with a validation set of its own, the questions a run samples are train questions, never the
    dataset's test rows (rollouts.jsonl records each one)."""
    from rlvr.core.tracking import read_jsonl
    from rlvr.training import rl

    from conftest import train_cfg

    data = _jsonl(tmp_path / "r.jsonl", ROWS)
    val = _jsonl(tmp_path / "v.jsonl", VALIDATION)
    cfg = train_cfg(model_dir, tmp_path / "run", dataset=data, validation_dataset=val, prompt="r1_zero", steps=4,
                    rollout_batch_size=16, group_size=2, log_rollouts_every=1, eval_every=0, eval_at_end=False)
    rl.train_grpo(cfg)
    seen = {" ".join(r["question"].split()) for r in read_jsonl(tmp_path / "run" / "rollouts.jsonl")}
    assert len(seen) >= 8
    assert seen <= set(_keys(load_split(cfg, "train")))
    assert not seen & (set(_keys(load_split(cfg, "test"))) | set(_keys(load_split(cfg, "validation"))))

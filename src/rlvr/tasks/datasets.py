"""One entry point for every named dataset: a string names it, so configs and the command line can choose it.

    "gsm8k"                          GSM8K; splits train / validation / test (rlvr.tasks.gsm8k)
    "arithmetic"                     generated word problems (default difficulty: 2 steps, numbers <= 20)
    "arithmetic:steps=3,max=99"      the same with a difficulty knob (rlvr.tasks.arithmetic)
    "code"                           generated Python-function problems with hidden tests (default: level 2)
    "code:level=3"                   the same with a difficulty knob, level 1..3 (see `rlvr.tasks.code`)
    "path/to/file.jsonl"             any JSONL; column names configurable (rlvr.tasks.tables); a file whose
                                     first row has a `tests` field is a code dataset (see `code.load_code_jsonl`)
    "rows.json|.parquet|.csv", a folder saved by `datasets`, "hf:NAME[:CONFIG]"   a user's table (rlvr.tasks.tables)
    "reasoning_gym:NAME[:key=value,...]"   reasoning-gym's generated tasks (rlvr.tasks.reasoning_gym, an extra)
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

from rlvr.tasks.arithmetic import ArithmeticSpec, arithmetic
from rlvr.tasks.code import CodeSpec, code_task, load_code_jsonl
from rlvr.tasks.gsm8k import GSM8K_VALIDATION_SIZE, gsm8k
from rlvr.tasks.records import SPLITS, DataError, EmptySplit, Example
from rlvr.tasks.tables import FORMATS, is_table, load_table, table_splits

ALL = "all"  # every row of a dataset, whatever its splits (`rlvr eval split=all`: a test file of one's own)
log = logging.getLogger(__name__)


def load_split(cfg, split: str, limit: int | None = None, require_answer: bool = True) -> list[Example]:
    """`split` of the dataset a config names, read with its column names and its `split_seed` (never the run
    seed: every run of a sweep, and the SFT before them, must hold out the same questions). A config's
    `validation_dataset` is the validation split (its own validation split, or all of it), and the dataset's
    train split then keeps the rows a validation holdout would have taken. Train, validation and test never
    share a row (`load_dataset`); a separate validation set's rows are kept out of training and out of
    nothing else, and its rows that are test rows are left out of it."""
    separate = getattr(cfg, "validation_dataset", None)
    columns = dict(seed=cfg.split_seed, question_field=cfg.question_field or "question",
                   answer_field=cfg.answer_field, solution_field=cfg.solution_field, tests_field=cfg.tests_field,
                   entry_point_field=cfg.entry_point_field, require_answer=require_answer,
                   prompt_column=cfg.question_field is None and getattr(cfg, "prompt", None) == "row")
    if not separate or split in ("test", ALL):
        return load_dataset(cfg.dataset, split, limit, holdout_validation=not separate, **columns)
    if split == "validation":
        own = "validation" if "validation" in (own_splits(separate) or ()) else ALL
        rows = load_dataset(separate, own, **columns)
        rows = _without(rows, _keys(load_dataset(cfg.dataset, "test", **columns)), separate, "validation", "test")
    else:
        rows = load_dataset(cfg.dataset, split, holdout_validation=False, **columns)
        held = load_dataset(separate, "validation" if "validation" in (own_splits(separate) or ()) else ALL, **columns)
        rows = _without(rows, _keys(held), cfg.dataset, split, f"validation ({separate})")
    return _limited(rows, limit, separate if split == "validation" else cfg.dataset, split)


def content_key(example: Example) -> str:
    """What makes two rows the same question to the model: the conversation, or the question's words."""
    if example.conversation is not None:
        return json.dumps(example.conversation, sort_keys=True)
    return " ".join(example.question.split())


def _keys(rows: list[Example]) -> set[str]:
    return {content_key(r) for r in rows}


def _without(rows: list[Example], held: set[str], name: str, split: str, other: str) -> list[Example]:
    """`rows` without those whose question is in `held` (another split's), said once when any are left out."""
    kept = [r for r in rows if content_key(r) not in held]
    if len(kept) < len(rows):  # expected of a generated task's small question space, news of a user's rows
        log.log(logging.WARNING if is_user_table(name) else logging.INFO,
                "dataset %r: %d of the %s split's %d rows ask a question of the %s split and are left out of %s",
                name, len(rows) - len(kept), split, len(rows), other, split)
    if rows and not kept:
        raise DataError(f"dataset {name!r}: every row of its {split} split is also in the {other} split, so "
                        f"nothing is left to {'train on' if split == 'train' else 'use'}")
    return kept


def _limited(rows: list[Example], limit: int | None, name: str, split: str) -> list[Example]:
    if limit is not None:
        if limit < 1:
            raise DataError(f"limit must be >= 1; got {limit}")
        rows = rows[:limit]
    if not rows:
        raise EmptySplit(f"dataset {name!r} split {split!r} is empty")
    return rows


def _first_row(path: str | Path):
    """The first non-empty row of a JSONL file, parsed; None when there is none or it is not valid JSON (or not
    UTF-8: reading the rows reports where)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open("rb") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line.decode("utf-8-sig"))
                except (UnicodeDecodeError, json.JSONDecodeError):
                    return None
    return None


def _is_generated_code(name: str) -> bool:
    return name == "code" or name.startswith("code:")


def _is_arithmetic(name: str) -> bool:
    return name == "arithmetic" or name.startswith("arithmetic:")


def _is_jsonl(name: str) -> bool:
    # a file of another table format (parquet, csv, json) is read by rlvr.tasks.tables instead
    return name.endswith(".jsonl") or (Path(name).is_file() and Path(name).suffix.lower() not in FORMATS)


def is_code_dataset(name: str, tests_field: str = "tests") -> bool:
    """Whether a dataset name is a code dataset (graded by running tests) rather than a math one. Cheap: a
    JSONL file is a code dataset when its first row has `tests_field`; a missing file is a DataError.

    >>> is_code_dataset("code:level=1"), is_code_dataset("gsm8k")
    (True, False)
    """
    if _is_generated_code(name):
        return True
    if name == "gsm8k" or _is_arithmetic(name) or not _is_jsonl(name):
        return False
    row = _first_row(name)
    return isinstance(row, dict) and tests_field in row


def is_user_table(name: str) -> bool:
    """Whether `dataset=` names a user's rows (a file, a saved folder, hf:NAME) rather than a built-in task."""
    return not (name == "gsm8k" or _is_arithmetic(name) or _is_generated_code(name)
                or name.startswith("reasoning_gym:"))


def default_prompt(dataset: str, tests_field: str = "tests") -> str:
    """The prompt a dataset gets when none is named: seed 004's r1_zero for GSM8K and arithmetic, code for code
    datasets, reasoning-gym's own for its tasks, and `row` (the rows as they are) for a user's rows. A name that
    is none of these keeps r1_zero, so that loading it says what is wrong with the name."""
    if dataset.startswith("reasoning_gym:"):
        return "reasoning_gym"
    try:
        if is_code_dataset(dataset, tests_field):
            return "code"
    except DataError:  # a file not there: loading the rows says so
        return "r1_zero"
    exists = dataset.startswith("hf:") or Path(dataset).exists()
    return "row" if is_user_table(dataset) and exists else "r1_zero"


def own_splits(name: str) -> tuple[str, ...] | None:
    """The splits a dataset has of its own: GSM8K's train and test (its validation is held out of train),
    every split of a generated task, a saved DatasetDict's or a hub dataset's; None for one table (a file)."""
    if name == "gsm8k":
        return ("train", "test")
    if _is_arithmetic(name) or _is_generated_code(name) or name.startswith("reasoning_gym:"):
        return SPLITS
    if is_table(name) and not _is_jsonl(name):
        return table_splits(name)
    return None


def holdout_size(n: int) -> int:
    """Rows a table without a validation (or test) split of its own holds out for it: a tenth, at most 500."""
    return min(GSM8K_VALIDATION_SIZE, n // 10)


def _holdout(rows: list[Example], split: str, seed: int, missing: tuple[str, ...], validation: bool) -> list[Example]:
    """`split` of rows that lack the `missing` splits of their own: a seeded tenth (at most 500 rows) is
    "validation", another, drawn from the rest, is "test", and "train" is what is left (with the validation
    tenth when `validation` is False: a validation set of its own is given)."""
    n = len(rows)
    held = {"validation": set(), "test": set()}
    if "validation" in missing:
        held["validation"] = set(random.Random(seed).sample(range(n), holdout_size(n)))
    if "test" in missing:
        rest = [i for i in range(n) if i not in held["validation"]]
        held["test"] = set(random.Random(f"{seed}-test").sample(rest, min(holdout_size(n), len(rest))))
    if split != "train":
        return [r for i, r in enumerate(rows) if i in held[split]]
    out = held["test"] | (held["validation"] if validation else set())
    return [r for i, r in enumerate(rows) if i not in out]


def _source_rows(name: str, split: str, seed: int, validation: bool, columns: dict) -> list[Example]:
    """`split` of a source as the source has it (or `ALL` its splits' rows), before any row is checked against
    another split's."""
    if name == "gsm8k":
        if split == ALL:
            return gsm8k("train", validation_size=0, seed=seed) + gsm8k("test")
        return gsm8k(split, seed=seed, validation_size=GSM8K_VALIDATION_SIZE if validation else 0)
    if _is_arithmetic(name) or _is_generated_code(name) or name.startswith("reasoning_gym:"):
        if split == ALL:
            return [r for s in SPLITS for r in _source_rows(name, s, seed, validation, columns)]
        if _is_arithmetic(name):
            return arithmetic(split, spec=ArithmeticSpec.parse(name))
        if _is_generated_code(name):
            return code_task(split, spec=CodeSpec.parse(name))
        from rlvr.tasks.reasoning_gym import reasoning_gym_rows

        return reasoning_gym_rows(name, split)
    own = own_splits(name)
    if _is_jsonl(name) and is_code_dataset(name, columns["tests_field"]):
        read = lambda _split: load_code_jsonl(  # noqa: E731
            name, columns["question_field"], columns["tests_field"], columns["entry_point_field"],
            columns["solution_field"] or "solution")
    elif is_table(name) or _is_jsonl(name):
        keep = ("question_field", "answer_field", "solution_field", "require_answer", "prompt_column")
        read = lambda _split: load_table(name, _split, **{k: columns[k] for k in keep})  # noqa: E731
    else:
        import difflib

        close = difflib.get_close_matches(name.split(":")[0], ["gsm8k", "arithmetic", "code"], n=1, cutoff=0.6)
        raise DataError(f"unknown dataset {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}valid: gsm8k, "
                        "arithmetic[:steps=N,max=M], code[:level=N], reasoning_gym:NAME, a .jsonl / .json / "
                        ".parquet / .csv file, a folder saved by datasets, or hf:NAME[:CONFIG]")
    if own is None:  # one table: its splits are held out of it
        rows = read(None)
        return rows if split == ALL else _holdout(rows, split, seed, ("validation", "test"), validation)
    if split == ALL:
        return [r for s in own for r in read(s)]
    if split in own and split != "train":
        return read(split)
    if "train" not in own:
        raise DataError(f"dataset {name!r}: has splits {', '.join(own)} and no train split to hold "
                        f"{split!r} out of")
    missing = tuple(s for s in ("validation", "test") if s not in own)
    return _holdout(read("train"), split, seed, missing, validation)


def load_dataset(
    name: str,
    split: str = "train",
    limit: int | None = None,
    seed: int = 0,
    *,
    question_field: str = "question",
    answer_field: str = "answer",
    solution_field: str | None = None,
    tests_field: str = "tests",
    entry_point_field: str = "entry_point",
    require_answer: bool = True,
    holdout_validation: bool = True,
    prompt_column: bool = False,
) -> list[Example]:
    """Examples of a named dataset (see the module docstring), at most `limit` of them.

    Splits: a dataset's own (GSM8K's train and test, a generated task's three, a saved DatasetDict's or a hub
    dataset's); a split it lacks is held out of its train split, and a single table (a file) lacks all three: a
    seeded tenth (at most 500 rows) is "validation", another "test", and "train" the rest. `holdout_validation`
    False: a validation set is given apart, and train keeps the validation tenth. `split="all"`: every row.
    Train, validation and test never share a row: a row whose question (`content_key`) is also in a later split
    (validation, then test) is left out of the earlier one, with a warning. The field names are those of
    `rlvr.tasks.tables.row_example` (math) and `code.load_code_jsonl` (code; `solution_field` None means
    "solution" there)."""
    if split not in SPLITS + (ALL,):
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS + (ALL,))}")
    columns = dict(question_field=question_field, answer_field=answer_field, solution_field=solution_field,
                   tests_field=tests_field, entry_point_field=entry_point_field, require_answer=require_answer,
                   prompt_column=prompt_column)
    rows = _source_rows(name, split, seed, holdout_validation, columns)
    later = {"train": ("validation", "test") if holdout_validation else ("test",), "validation": ("test",)}
    for other in later.get(split, ()):
        if rows:
            rows = _without(rows, _keys(_source_rows(name, other, seed, holdout_validation, columns)), name,
                            split, other)
    return _limited(rows, limit, name, split)

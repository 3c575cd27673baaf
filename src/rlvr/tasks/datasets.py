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
import random
from pathlib import Path

from rlvr.tasks.arithmetic import ArithmeticSpec, arithmetic
from rlvr.tasks.code import CodeSpec, code_task, load_code_jsonl
from rlvr.tasks.gsm8k import GSM8K_VALIDATION_SIZE, gsm8k
from rlvr.tasks.records import SPLITS, DataError, Example
from rlvr.tasks.tables import FORMATS, is_table, load_table


def load_split(cfg, split: str, limit: int | None = None, require_answer: bool = True) -> list[Example]:
    """`split` of the dataset a config names, read with its column names and its `split_seed` (never the run
    seed: every run of a sweep, and the SFT before them, must hold out the same questions). A config's
    `validation_dataset` is the validation split, whole, and the dataset's train split is then all of it.
    `require_answer`: every row must have an answer (False when the run's rewards are a user's functions)."""
    separate = getattr(cfg, "validation_dataset", None)
    name = separate if separate and split == "validation" else cfg.dataset
    return load_dataset(name, "test" if separate and split != "test" else split, limit=limit,
                        seed=cfg.split_seed, question_field=cfg.question_field, answer_field=cfg.answer_field,
                        solution_field=cfg.solution_field, tests_field=cfg.tests_field,
                        entry_point_field=cfg.entry_point_field, require_answer=require_answer)


def _first_row(path: str | Path):
    """The first non-empty row of a JSONL file, parsed; None when there is none or it is not valid JSON."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8-sig") as f:
        for line in f:
            if line.strip():
                try:
                    return json.loads(line)
                except json.JSONDecodeError:
                    return None
    return None


def _is_generated_code(name: str) -> bool:
    return name == "code" or name.startswith("code:")


def _is_jsonl(name: str) -> bool:
    # a file of another table format (parquet, csv, json) is read by the datasets library instead
    return name.endswith(".jsonl") or (Path(name).is_file() and Path(name).suffix.lower() not in FORMATS)


def is_code_dataset(name: str, tests_field: str = "tests") -> bool:
    """Whether a dataset name is a code dataset (graded by running tests) rather than a math one. Cheap: a
    JSONL file is a code dataset when its first row has `tests_field`; a missing file is a DataError.

    >>> is_code_dataset("code:level=1"), is_code_dataset("gsm8k")
    (True, False)
    """
    if _is_generated_code(name):
        return True
    if name in ("gsm8k", "arithmetic") or name.startswith("arithmetic:") or not _is_jsonl(name):
        return False
    row = _first_row(name)
    return isinstance(row, dict) and tests_field in row


def _holdout(rows: list[Example], split: str, seed: int) -> list[Example]:
    """A JSONL file's split: "test" is the whole file; like GSM8K, a fixed seeded tenth of it (at most 500
    rows) is "validation" and the rest "train"."""
    if split == "test":
        return rows
    held = set(random.Random(seed).sample(range(len(rows)), min(GSM8K_VALIDATION_SIZE, len(rows) // 10)))
    return [r for i, r in enumerate(rows) if (i in held) == (split == "validation")]


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
) -> list[Example]:
    """Examples of a named dataset (see the module docstring), at most `limit` of them. For a JSONL file,
    "test" is the whole file and "validation" a fixed seeded tenth of it (at most 500 rows) that "train"
    leaves out. The field names are those of `load_jsonl` (math) and `code.load_code_jsonl` (code;
    `solution_field` None means "solution" there)."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if name == "gsm8k":
        rows = gsm8k(split, seed=seed)
    elif name == "arithmetic" or name.startswith("arithmetic:"):
        rows = arithmetic(split, spec=ArithmeticSpec.parse(name))
    elif _is_generated_code(name):
        rows = code_task(split, spec=CodeSpec.parse(name))
    elif name.startswith("reasoning_gym:"):
        from rlvr.tasks.reasoning_gym import reasoning_gym_rows

        rows = reasoning_gym_rows(name, split)
    elif _is_jsonl(name) and is_code_dataset(name, tests_field):
        rows = load_code_jsonl(name, question_field, tests_field, entry_point_field, solution_field or "solution")
        rows = _holdout(rows, split, seed)
    elif is_table(name) or _is_jsonl(name):
        rows, own_split = load_table(name, split, question_field=question_field, answer_field=answer_field,
                                     solution_field=solution_field, require_answer=require_answer)
        rows = rows if own_split else _holdout(rows, split, seed)
    else:
        import difflib

        close = difflib.get_close_matches(name.split(":")[0], ["gsm8k", "arithmetic", "code"], n=1, cutoff=0.6)
        raise DataError(f"unknown dataset {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}valid: gsm8k, "
                        "arithmetic[:steps=N,max=M], code[:level=N], reasoning_gym:NAME, a .jsonl / .json / "
                        ".parquet / .csv file, a folder saved by datasets, or hf:NAME[:CONFIG]")
    if limit is not None:
        if limit < 1:
            raise DataError(f"limit must be >= 1; got {limit}")
        rows = rows[:limit]
    if not rows:
        raise DataError(f"dataset {name!r} split {split!r} is empty")
    return rows

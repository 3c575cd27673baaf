"""A user's rows, in the formats people have: JSONL, JSON, Parquet, CSV, a folder saved by Hugging Face
`datasets` (`Dataset.save_to_disk`), or a hub name `hf:NAME[:CONFIG]` on a machine that reaches a hub. Every
format but JSONL is read through the `datasets` library; JSONL is read line by line so that an error names the
line. A row becomes an `Example` that keeps every column (`Example.fields`).

Column names come from the config: `question_field` (falling back to a `prompt` column, TRL's name, when the
row has no `question`), `answer_field` (optional unless the reward grades against it), `solution_field`. A
question may be text or a chat conversation (a list of {role, content}). Errors name the source, the row and
the column.
"""

from __future__ import annotations

from pathlib import Path

from rlvr.tasks.records import DataError, Example, jsonl_rows, split_answer

FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
ROLES = ("system", "user", "assistant", "tool")


def is_table(name: str) -> bool:
    """Whether a dataset name is a user's table (a file of a known format, a saved folder or hf:NAME)."""
    if name.startswith("hf:"):
        return True
    path = Path(name)
    return path.suffix.lower() in FORMATS or (path.is_dir() and _saved_folder(path))


def _saved_folder(path: Path) -> bool:
    return (path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file()


def read_rows(name: str, split: str = "train") -> tuple[list[tuple[str, str, dict]], bool]:
    """[(where, id, row)] of a table, and whether the source had this split itself (a saved DatasetDict or a hub
    dataset with splits: no split is held out of another then)."""
    if name.startswith("hf:"):
        return _hub_rows(name, split)
    path = Path(name)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        return _saved_rows(path, split)
    if path.suffix.lower() == ".jsonl":
        return [(where, f"{path.stem}:{line}", row) for line, where, row in jsonl_rows(path)], False
    import datasets

    try:
        table = datasets.load_dataset(FORMATS[path.suffix.lower()], data_files=str(path), split="train")
    except Exception as err:  # the library's errors say what failed to parse; name the file with them
        raise DataError(f"{path}: could not be read as {path.suffix[1:]}: {err}") from None
    return [(f"{path} row {i}", f"{path.stem}:{i}", dict(row)) for i, row in enumerate(table)], False


def _saved_rows(path: Path, split: str):
    import datasets

    try:
        table = datasets.load_from_disk(str(path))
    except Exception as err:
        raise DataError(f"{path}: not a folder saved by datasets' save_to_disk: {err}") from None
    if isinstance(table, datasets.DatasetDict):
        if split not in table:
            raise DataError(f"{path}: has splits {', '.join(table)}, not {split!r}")
        return [(f"{path}[{split}] row {i}", f"{path.name}:{split}:{i}", dict(r))
                for i, r in enumerate(table[split])], True
    return [(f"{path} row {i}", f"{path.name}:{i}", dict(r)) for i, r in enumerate(table)], False


def _hub_rows(name: str, split: str):
    import datasets

    _, _, rest = name.partition(":")
    hub, _, config = rest.partition(":")
    try:
        tables = datasets.load_dataset(hub, config or None)
    except Exception as err:  # no network, no such dataset: say so with the name
        raise DataError(f"dataset {name!r}: could not be loaded from the hub: {err}") from None
    own = split in tables
    part = split if own else next(iter(tables))
    return [(f"{name}[{part}] row {i}", f"{hub}:{part}:{i}", dict(r)) for i, r in enumerate(tables[part])], own


def conversation(value, where: str, column: str) -> tuple | None:
    """A chat conversation as a tuple of {role, content} dicts, or None when `value` is text."""
    if isinstance(value, str):
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise DataError(f"{where}: column {column!r} must be text or a non-empty list of {{role, content}} "
                        f"messages; got {type(value).__name__}")
    out = []
    for k, message in enumerate(value):
        if not (isinstance(message, dict) and message.get("role") in ROLES and isinstance(message.get("content"), str)):
            raise DataError(f"{where}: column {column!r} message {k} must be {{role: {'|'.join(ROLES)}, content: "
                            f"text}}; got {message!r:.120}")
        out.append({"role": message["role"], "content": message["content"]})
    return tuple(out)


def row_example(where: str, row: dict, id: str = "", question_field: str = "question", answer_field: str = "answer",
                solution_field: str | None = None, require_answer: bool = True) -> Example:
    """One row as an Example keeping all its columns. The answer may be bare or GSM8K's "... #### x"."""
    column = question_field if question_field in row or "prompt" not in row else "prompt"
    if column not in row:
        raise DataError(f"{where}: missing field {question_field!r} (fields present: {', '.join(row)}); set "
                        "question_field to the column that holds the question or prompt")
    value = row[column]
    chat = conversation(value, where, column)
    if chat is None and not value.strip():
        raise DataError(f"{where}: field {column!r} must be a non-empty string")
    question = value.strip() if chat is None else next(
        (m["content"] for m in reversed(chat) if m["role"] == "user"), chat[-1]["content"])
    raw = row.get(answer_field)
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        raw = str(raw)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        if require_answer:
            raise DataError(f"{where}: missing field {answer_field!r}: the reward grades against it (a user "
                            "reward function needs none; set answer_field to the column that holds the answer)")
        answer, solution = "", ""
    elif not isinstance(raw, str):
        answer, solution = "", ""  # a structured reference (a dict, a list): the reward reads it from `fields`
        if require_answer:
            raise DataError(f"{where}: column {answer_field!r} must be text or a number; got {type(raw).__name__}")
    else:
        answer, solution = split_answer(raw, f"{where}: column {answer_field!r}")
    if solution_field:
        if solution_field not in row:
            raise DataError(f"{where}: missing field {solution_field!r} (solution_field)")
        solution = str(row[solution_field])
    return Example(question, answer, solution, id=id or where, fields=dict(row), conversation=chat)


def load_table(name: str, split: str = "train", **columns) -> tuple[list[Example], bool]:
    """A table's rows as Examples (see `row_example` for `columns`), and whether the split was the source's own."""
    rows, own_split = read_rows(name, split)
    if not rows:
        raise DataError(f"{name}: no rows")
    return [row_example(where, row, id, **columns) for where, id, row in rows], own_split

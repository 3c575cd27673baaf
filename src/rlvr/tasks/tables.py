"""A user's rows, in the formats people have: JSONL, JSON, Parquet, CSV, a folder saved by Hugging Face
`datasets` (`Dataset.save_to_disk`, a `DatasetDict` with its splits), or a hub name `hf:NAME[:CONFIG]` on a
machine that reaches a hub. A row becomes an `Example` that keeps every column (`Example.fields`).

Values arrive as they were written: JSONL and JSON through Python's json (an int stays an int beside floats in
its column), Parquet through pyarrow with the file's own types, CSV through Python's csv with a column turned
into ints or floats only when every value in it reads back as the same text ("02139" stays text, and so does a
column holding it). Errors name the file and the line (or row) and the column.

The prompt of a row is its `prompt` column (TRL's name) when it has one, else `question_field`; each may be
text, kept as written, or a chat conversation (a list of {role, content}). `answer_field` is optional unless
the reward grades against it.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

from rlvr.tasks.records import DataError, Example, decode_text, jsonl_rows, split_answer

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


def table_splits(name: str) -> tuple[str, ...] | None:
    """The splits a source has of its own (a saved DatasetDict, a hub dataset), or None for one table."""
    if name.startswith("hf:"):
        return tuple(_hub(name))
    path = Path(name)
    if path.is_dir() and (path / "dataset_dict.json").is_file():
        try:
            return tuple(json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))["splits"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise DataError(f"{path}/dataset_dict.json: not a DatasetDict's index ({err})") from None
    return None


def read_rows(name: str, split: str | None = None) -> list[tuple[str, str, dict]]:
    """[(where, id, row)] of a table: the whole table, or one of its own splits (`table_splits`)."""
    if name.startswith("hf:"):
        return _hub_rows(name, split)
    path = Path(name)
    if not path.exists():
        raise DataError(f"{path}: no such file or folder")
    if path.is_dir():
        return _saved_rows(path, split)
    suffix = path.suffix.lower()
    if suffix == ".json":
        rows = _json_rows(path)
        if rows is None:  # JSON Lines in a .json file
            return [(where, f"{path.stem}:{line}", row) for line, where, row in jsonl_rows(path)]
        return [(f"{path} row {i}", f"{path.stem}:{i}", row) for i, row in enumerate(rows)]
    if suffix == ".csv":
        return _csv_rows(path)
    if suffix == ".parquet":
        return _parquet_rows(path)
    return [(where, f"{path.stem}:{line}", row) for line, where, row in jsonl_rows(path)]


def _json_rows(path: Path) -> list[dict] | None:
    """A JSON file's records: a list of objects, an object of equal-length columns, or an object holding one
    list of objects ({"data": [...]}). None when the file is JSON Lines instead."""
    text = decode_text(path.read_bytes(), path)
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":
            return None
        raise DataError(f"{path}:{err.lineno}: not valid JSON ({err.msg} at column {err.colno})") from None
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list)]
        if lists and len(lists) == len(value) and len({len(v) for v in lists}) == 1 and \
                not all(isinstance(x, dict) for x in lists[0]):
            value = [dict(zip(value, items)) for items in zip(*value.values())]  # columns
        elif len(lists) == 1 and all(isinstance(x, dict) for x in lists[0]):
            value = lists[0]
    if not isinstance(value, list):
        raise DataError(f"{path}: expected a list of row objects (or columns, or {{\"data\": [rows]}}); got a "
                        f"{type(value).__name__}")
    for i, row in enumerate(value):
        if not isinstance(row, dict):
            raise DataError(f"{path} row {i}: expected a JSON object, got {type(row).__name__}")
    return value


_INT = re.compile(r"-?(0|[1-9][0-9]*)")


def _column_type(values: list[str]):
    """int or float when every value of a CSV column reads back as the same text, else None (text)."""
    present = [v for v in values if v != ""]
    if not present:
        return None
    if all(_INT.fullmatch(v) for v in present):
        return int
    try:
        if all(repr(float(v)) == v for v in present):
            return float
    except ValueError:
        pass
    return None


def _csv_rows(path: Path) -> list[tuple[str, str, dict]]:
    text = decode_text(path.read_bytes(), path)
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"{path}: empty (no header line)")
        records = []
        for record in reader:
            if not record:
                continue
            if len(record) != len(header):
                raise DataError(f"{path}:{reader.line_num}: {len(record)} fields, the header has {len(header)} "
                                f"({', '.join(header)})")
            records.append((reader.line_num, record))
    except csv.Error as err:
        raise DataError(f"{path}:{reader.line_num}: not valid CSV ({err})") from None
    types = [_column_type([r[k] for _, r in records]) for k in range(len(header))]
    rows = []
    for line, record in records:
        row = {col: (None if v == "" else kind(v) if kind else v) for col, v, kind in zip(header, record, types)}
        rows.append((f"{path}:{line}", f"{path.stem}:{line}", row))
    return rows


def _parquet_rows(path: Path) -> list[tuple[str, str, dict]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as err:  # pyarrow's errors say what failed to parse; name the file with them
        raise DataError(f"{path}: could not be read as parquet: {err}") from None
    return [(f"{path} row {i}", f"{path.stem}:{i}", row) for i, row in enumerate(table.to_pylist())]


def _saved_rows(path: Path, split: str | None):
    import datasets

    try:
        table = datasets.load_from_disk(str(path))
    except Exception as err:
        raise DataError(f"{path}: not a folder saved by datasets' save_to_disk: {err}") from None
    if isinstance(table, datasets.DatasetDict):
        if split not in table:
            raise DataError(f"{path}: has splits {', '.join(table)}, not {split!r}")
        return [(f"{path}[{split}] row {i}", f"{path.name}:{split}:{i}", dict(r)) for i, r in enumerate(table[split])]
    return [(f"{path} row {i}", f"{path.name}:{i}", dict(r)) for i, r in enumerate(table)]


_HUB: dict[str, object] = {}


def _hub(name: str):
    if name not in _HUB:
        import datasets

        _, _, rest = name.partition(":")
        hub, _, config = rest.partition(":")
        try:
            _HUB[name] = datasets.load_dataset(hub, config or None)
        except Exception as err:  # no network, no such dataset: say so with the name
            raise DataError(f"dataset {name!r}: could not be loaded from the hub: {err}") from None
    return _HUB[name]


def _hub_rows(name: str, split: str | None):
    tables = _hub(name)
    if split not in tables:
        raise DataError(f"dataset {name!r}: has splits {', '.join(tables)}, not {split!r}")
    hub = name.split(":")[1]
    return [(f"{name}[{split}] row {i}", f"{hub}:{split}:{i}", dict(r)) for i, r in enumerate(tables[split])]


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


def _answer_text(raw) -> str | None:
    """A number column's value as the answer's text: an int as written; a float that is whole (a Parquet or
    pandas column of ints with a missing value holds floats) without its ".0"."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        return str(raw)
    if isinstance(raw, float):
        return str(int(raw)) if raw.is_integer() else repr(raw)
    return None


def row_example(where: str, row: dict, id: str = "", question_field: str = "question", answer_field: str = "answer",
                solution_field: str | None = None, require_answer: bool = True,
                prompt_column: bool = False) -> Example:
    """One row as an Example keeping all its columns. The answer may be bare or GSM8K's "... #### x".
    `prompt_column`: a `prompt` column (TRL's name) is the prompt even when the row has `question_field` too
    (prompt=row: the row is used as it is)."""
    column = "prompt" if "prompt" in row and (prompt_column or question_field not in row) else question_field
    if column not in row:
        raise DataError(f"{where}: missing field {question_field!r} (fields present: {', '.join(row)}); set "
                        "question_field to the column that holds the question or prompt")
    value = row[column]
    chat = conversation(value, where, column)
    if chat is None and not value.strip():
        raise DataError(f"{where}: field {column!r} must be a non-empty string")
    question = value if chat is None else next(
        (m["content"] for m in reversed(chat) if m["role"] == "user"), chat[-1]["content"])
    raw = row.get(answer_field)
    number = _answer_text(raw)
    raw = number if number is not None else raw
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


def load_table(name: str, split: str | None = None, **columns) -> list[Example]:
    """A table's rows as Examples (see `row_example` for `columns`): the whole table, or one of its own splits."""
    rows = read_rows(name, split)
    if not rows:
        raise DataError(f"{name}: no rows")
    return [row_example(where, row, id, **columns) for where, id, row in rows]

"""The records every task is made of: `Example` (one problem), the splits, `DataOrder` (the seeded order of a
run's questions, resumed exactly), and reading JSONL files with errors that name the file and line.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Iterator
from pathlib import Path

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: the question, its final answer (a string the grader compares, "" when the task's reward
    needs none), a worked solution, and every column of the row it came from (`fields`: what a user's reward
    functions and environments read). `conversation` is the row's prompt when it is a chat conversation (a
    list of {role, content}), rendered with the tokenizer's chat template; `question` is then its last user
    turn."""

    question: str
    answer: str
    solution: str = ""
    id: str = ""
    fields: dict = dataclasses.field(default_factory=dict, compare=False, repr=False)
    conversation: tuple | None = dataclasses.field(default=None, compare=False, repr=False)


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


class EmptySplit(DataError):
    """A split with no rows (a table of fewer than 10 rows holds out no validation rows)."""


def parse_gsm8k_answer(solution: str) -> str:
    """The final answer of a GSM8K solution: the text after the last "####", without thousands commas.

    >>> parse_gsm8k_answer("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\\n#### 1,234")
    '1234'
    """
    text = str(solution)
    if "####" not in text:
        raise ValueError(f"GSM8K solution has no '####' final-answer line: ...{text[-120:]!r}")
    answer = text.rsplit("####", 1)[1].strip().replace(",", "")
    if not answer:
        raise ValueError(f"GSM8K solution has nothing after its '####': ...{text[-120:]!r}")
    return answer


class DataOrder:
    """A seeded order over n examples, epoch after epoch, that a checkpoint resumes exactly.

    Each epoch is its own permutation, keyed by (key, epoch), so the order after a resume is the order the
    uninterrupted run would have taken; `state()` is what a checkpoint stores.

    >>> order = DataOrder(3, "demo"); a = order.take(4); resumed = DataOrder(3, "demo", **order.state())
    >>> order.take(2) == resumed.take(2)
    True
    """

    def __init__(self, n: int, key: str, epoch: int = 0, position: int = 0):
        if n < 1:
            raise ValueError("DataOrder needs at least one example")
        self.n, self.key, self.epoch, self.position = n, key, epoch, position
        self._order = self._permutation(epoch)

    def _permutation(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(f"{self.key}-{epoch}").shuffle(order)
        return order

    def take(self, k: int) -> list[int]:
        """The next k example indices, crossing into the next epoch when this one runs out."""
        out = []
        while len(out) < k:
            if self.position >= self.n:
                self.epoch, self.position = self.epoch + 1, 0
                self._order = self._permutation(self.epoch)
            out.append(self._order[self.position])
            self.position += 1
        return out

    @property
    def epochs_done(self) -> float:
        return self.epoch + self.position / self.n

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


# ----------------------------------------------------------------------------------------------------
# Loading JSONL.


def decode_text(data: bytes, path: str | Path) -> str:
    """A file's bytes as UTF-8 text (a byte-order mark dropped); anything else fails naming the file and line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not UTF-8 text (byte {data[err.start]:#04x} at offset {err.start}); save "
                        "the file as UTF-8") from None


def jsonl_rows(path: str | Path, required: tuple[str, ...] = ()) -> Iterator[tuple[int, str, dict]]:
    """(line number, "path:line", row) for each non-empty line of a JSONL file whose row is an object holding
    the `required` fields; anything else (not UTF-8, not JSON, not an object) fails with a DataError naming the
    file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open("rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{path}:{lineno}"
            try:  # a byte-order mark is not data (json.loads calls it column 1)
                line = raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{where}: not UTF-8 text (byte {raw[err.start]:#04x} at column {err.start + 1}); "
                                "save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
            for field in required:
                if field not in row:
                    raise DataError(f"{where}: missing field {field!r} (fields present: {', '.join(row)})")
            yield lineno, where, row


def split_answer(raw: str, where: str, gsm8k: bool | None = None) -> tuple[str, str]:
    """(final answer, worked solution) of an answer field: a bare answer, or GSM8K's "... #### x" (detected when
    `gsm8k` is None), whose text before "####" is the solution; a malformed one is a DataError at `where`."""
    if not (("####" in raw) if gsm8k is None else gsm8k):
        return raw.strip(), ""
    try:
        return parse_gsm8k_answer(raw), raw.rsplit("####", 1)[0].strip()
    except ValueError as err:
        raise DataError(f"{where}: {err}") from None


def load_jsonl(
    path: str | Path,
    question_field: str = "question",
    answer_field: str = "answer",
    solution_field: str | None = None,
    gsm8k_answers: bool | None = None,
) -> list[Example]:
    """Read a JSONL file into Examples.

    `answer_field` holds either a bare final answer or a GSM8K-style solution ending in "#### <answer>";
    with `gsm8k_answers` left None this is detected per line. The worked solution is `solution_field`, or
    the GSM8K text before "####". A malformed line fails with the file and line number.
    """
    path = Path(path)
    examples = []
    required = (question_field, answer_field) + ((solution_field,) if solution_field else ())
    for lineno, where, row in jsonl_rows(path, required):
        question, raw_answer = row[question_field], row[answer_field]
        if not isinstance(question, str) or not question.strip():
            raise DataError(f"{where}: field {question_field!r} must be a non-empty string")
        if isinstance(raw_answer, (int, float)) and not isinstance(raw_answer, bool):
            raw_answer = str(raw_answer)
        if not isinstance(raw_answer, str) or not raw_answer.strip():
            raise DataError(f"{where}: field {answer_field!r} must be a non-empty string or number")
        answer, solution = split_answer(raw_answer, where, gsm8k_answers)
        if solution_field:
            solution = str(row[solution_field])
        examples.append(Example(question.strip(), answer, solution, id=f"{path.stem}:{lineno}", fields=row))
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def dataset_options(name: str, keys: tuple[str, ...], expected: str) -> dict[str, int]:
    """The whole-number options of a dataset name: "arithmetic:steps=3,max=99" -> {"steps": 3, "max": 99}; an
    option outside `keys`, or not a whole number, fails naming the dataset and what was `expected`."""
    _, _, options = name.partition(":")
    values = {}
    for item in filter(None, options.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key.strip() not in keys or not value.strip().isdigit():
            raise DataError(f"dataset {name!r}: expected {expected}; got {item!r}")
        values[key.strip()] = int(value)
    return values


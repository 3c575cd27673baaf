"""Tasks as typed records: GSM8K (shipped in the package), any JSONL, and a generated `arithmetic` task.

A dataset is named by a string, so configs and the command line can choose it:

    "gsm8k"                          GSM8K; splits train / validation / test
    "arithmetic"                     generated word problems (default difficulty: 2 steps, numbers <= 20)
    "arithmetic:steps=3,max=99"      the same with a difficulty knob
    "code"                           generated Python-function problems with hidden tests (default: level 2)
    "code:level=3"                   the same with a difficulty knob, level 1..3 (see `rlvr.code_tasks`)
    "path/to/file.jsonl"             any JSONL; field names configurable (see `load_jsonl`); a file whose first
                                     row has a `tests` field is a code dataset (see `code_tasks.load_code_jsonl`)

The validation split is a fixed, seeded subset of GSM8K's training set, so the test set stays untouched;
the three worked examples of the `r1_zero_three_shot` prompt are taken out of both training and validation.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from importlib import resources
from collections.abc import Iterator
from pathlib import Path

SPLITS = ("train", "validation", "test")
GSM8K_VALIDATION_SIZE = 500
# Indices in GSM8K train.jsonl of the three worked examples used by the r1_zero_three_shot prompt.
FEW_SHOT_INDICES = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Example:
    """One problem: the question, its final answer (a string the grader compares), a worked solution."""

    question: str
    answer: str
    solution: str = ""
    id: str = ""


class DataError(ValueError):
    """Bad input data; the message names the file and line."""


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


def jsonl_rows(path: str | Path, required: tuple[str, ...] = ()) -> Iterator[tuple[int, str, dict]]:
    """(line number, "path:line", row) for each non-empty line of a JSONL file whose row is an object holding
    the `required` fields; anything else fails with a DataError naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
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
        is_gsm8k = ("####" in raw_answer) if gsm8k_answers is None else gsm8k_answers
        if is_gsm8k:
            try:
                answer = parse_gsm8k_answer(raw_answer)
            except ValueError as err:
                raise DataError(f"{where}: {err}") from None
            solution = raw_answer.rsplit("####", 1)[0].strip()
        else:
            answer, solution = raw_answer.strip(), ""
        if solution_field:
            solution = str(row[solution_field])
        examples.append(Example(question.strip(), answer, solution, id=f"{path.stem}:{lineno}"))
    if not examples:
        raise DataError(f"{path}: no examples (the file is empty)")
    return examples


def _gsm8k_file(split: str) -> Path:
    return Path(str(resources.files("rlvr") / "data" / "gsm8k" / f"{split}.jsonl"))


def gsm8k(split: str = "train", validation_size: int = GSM8K_VALIDATION_SIZE, seed: int = 0) -> list[Example]:
    """GSM8K. "validation" is a fixed seeded subset of train; "train" is the rest, minus the few-shot examples."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if split == "test":
        return load_jsonl(_gsm8k_file("test"))
    rows = load_jsonl(_gsm8k_file("train"))
    pool = [i for i in range(len(rows)) if i not in FEW_SHOT_INDICES]
    validation = set(random.Random(seed).sample(pool, validation_size))
    chosen = [i for i in pool if (i in validation) == (split == "validation")]
    return [rows[i] for i in chosen]


def few_shot_examples() -> list[Example]:
    """The worked GSM8K training examples of the r1_zero_three_shot prompt (never trained or validated on)."""
    rows = load_jsonl(_gsm8k_file("train"))
    return [rows[i] for i in FEW_SHOT_INDICES]


# ----------------------------------------------------------------------------------------------------
# The arithmetic task: word problems a 135M model can learn on a CPU in minutes.

_NAMES = ["Sam", "Mia", "Ravi", "Lena", "Omar", "Kofi", "Ana", "Ben", "Yuki", "Zoe", "Ivan", "Nora"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "cookies", "stamps"]


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
    """Difficulty knob: `steps` operations on integers up to `max` (answers stay in [0, max * 10])."""

    steps: int = 2
    max: int = 20

    @classmethod
    def parse(cls, name: str) -> ArithmeticSpec:
        """"arithmetic" or "arithmetic:steps=3,max=99"."""
        _, _, options = name.partition(":")
        values = {}
        for item in filter(None, options.split(",")):
            key, eq, value = item.partition("=")
            key = key.strip()
            if not eq or key not in ("steps", "max") or not value.strip().isdigit():
                raise DataError(f"dataset {name!r}: expected options steps=<int>,max=<int>; got {item!r}")
            values[key] = int(value)
        spec = cls(**values)
        if not 1 <= spec.steps <= 8 or not 2 <= spec.max <= 10**6:
            raise DataError(f"dataset {name!r}: need 1 <= steps <= 8 and 2 <= max <= 1000000")
        return spec


def _arithmetic_example(rng: random.Random, spec: ArithmeticSpec, index: int) -> Example:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(1, spec.max)
    sentences = [f"{name} has {value} {item}."]
    steps = [f"{name} starts with {value} {item}."]
    for _ in range(spec.steps):
        op = rng.choice(["add", "sub", "mul"] if value * 2 <= spec.max * 10 else ["add", "sub"])
        if op == "sub" and value < 2:
            op = "add"
        if op == "add":
            n = rng.randint(1, spec.max)
            sentences.append(rng.choice([f"Then {name} finds {n} more.", f"A friend gives {name} {n} more."]))
            steps.append(f"{value} + {n} = {value + n}.")
            value += n
        elif op == "sub":
            n = rng.randint(1, value - 1)
            sentences.append(rng.choice([f"Then {name} gives away {n}.", f"Then {name} loses {n}."]))
            steps.append(f"{value} - {n} = {value - n}.")
            value -= n
        else:
            k = rng.choice([2, 3]) if value * 3 <= spec.max * 10 else 2
            word = {2: "doubles", 3: "triples"}[k]
            sentences.append(f"Then {name} {word} the number of {item}.")
            steps.append(f"{value} * {k} = {value * k}.")
            value *= k
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    solution = "\n".join(steps)
    return Example(question, str(value), solution, id=f"arithmetic:{index}")


def arithmetic(split: str = "train", n: int | None = None, spec: ArithmeticSpec | None = None) -> list[Example]:
    """Generated problems; each split draws from its own seeded stream, so splits never overlap by chance."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    spec = spec or ArithmeticSpec()
    n = n if n is not None else {"train": 20000, "validation": 500, "test": 1000}[split]
    rng = random.Random(f"rlvr-arithmetic-{split}-{spec.steps}-{spec.max}")
    return [_arithmetic_example(rng, spec, i) for i in range(n)]


# ----------------------------------------------------------------------------------------------------
# One entry point for every named dataset.


def load_split(cfg, split: str, limit: int | None = None) -> list[Example]:
    """`split` of the dataset a config names, read with its JSONL field names and its `split_seed` (never
    the run seed: every run of a sweep, and the SFT before them, must hold out the same questions)."""
    return load_dataset(cfg.dataset, split, limit=limit, seed=cfg.split_seed,
                        question_field=cfg.question_field, answer_field=cfg.answer_field,
                        solution_field=cfg.solution_field, tests_field=cfg.tests_field,
                        entry_point_field=cfg.entry_point_field)


def _first_row(path: str | Path):
    """The first non-empty row of a JSONL file, parsed; None when there is none or it is not valid JSON."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    with path.open(encoding="utf-8") as f:
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
    return name.endswith(".jsonl") or Path(name).is_file()


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
) -> list[Example]:
    """Examples of a named dataset (see the module docstring), at most `limit` of them. For a JSONL file,
    "test" is the whole file and "validation" a fixed seeded tenth of it (at most 500 rows) that "train"
    leaves out. The field names are those of `load_jsonl` (math) and `code_tasks.load_code_jsonl` (code;
    `solution_field` None means "solution" there)."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if name == "gsm8k":
        rows = gsm8k(split, seed=seed)
    elif name == "arithmetic" or name.startswith("arithmetic:"):
        rows = arithmetic(split, spec=ArithmeticSpec.parse(name))
    elif _is_generated_code(name):
        from rlvr.code_tasks import CodeSpec, code_task  # code_tasks imports this module

        rows = code_task(split, spec=CodeSpec.parse(name))
    elif _is_jsonl(name):
        if is_code_dataset(name, tests_field):
            from rlvr.code_tasks import load_code_jsonl

            rows = load_code_jsonl(name, question_field, tests_field, entry_point_field, solution_field or "solution")
        else:
            rows = load_jsonl(name, question_field, answer_field, solution_field)
        rows = _holdout(rows, split, seed)
    else:
        import difflib

        close = difflib.get_close_matches(name.split(":")[0], ["gsm8k", "arithmetic", "code"], n=1, cutoff=0.6)
        raise DataError(f"unknown dataset {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}valid: gsm8k, "
                        "arithmetic[:steps=N,max=M], code[:level=N], or a .jsonl path")
    if limit is not None:
        if limit < 1:
            raise DataError(f"limit must be >= 1; got {limit}")
        rows = rows[:limit]
    if not rows:
        raise DataError(f"dataset {name!r} split {split!r} is empty")
    return rows


# ----------------------------------------------------------------------------------------------------
# SFT targets in the r1_zero answer format.

_CALCULATOR = re.compile(r"<<[^<>]*>>")


def r1_zero_response(example: Example) -> str:
    """The r1_zero-format response for supervised training: worked steps inside the think block, then
    the answer. GSM8K's calculator annotations (<<48/2=24>>) are removed.

    >>> r1_zero_response(Example("q", "72", "48/2 = <<48/2=24>>24 clips.\\n48+24 = <<48+24=72>>72."))
    ' 48/2 = 24 clips.\\n48+24 = 72. </think> <answer> 72 </answer>'
    """
    steps = _CALCULATOR.sub("", example.solution).strip()
    return f" {steps} </think> <answer> {example.answer} </answer>"

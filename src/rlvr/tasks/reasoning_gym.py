"""reasoning-gym's generated tasks as rlvr datasets, graded by each task's own `score_answer` (an extra:
`pip install 'rlvr[reasoning-gym]'`; reasoning_gym is imported only when a run names one of its tasks).

    "reasoning_gym:leg_counting"                          500 train rows, seed 0, the task's default options
    "reasoning_gym:chain_sum:size=1000,seed=3,max_terms=4"  size, seed and the task's own config fields
    "reasoning_gym:leg_counting*2+chain_sum:size=1000,chain_sum.max_terms=4"
                                                          a composite: each row drawn from one task, with
                                                          probability proportional to its weight (default 1);
                                                          TASK.option sets one task's option

Rows: train holds `size` rows, validation min(size, 200), test min(size, 500); each split has its own seed,
hashed from (seed, split), so the splits are different draws (a task with few distinct questions can repeat
one across splits). An Example's `fields` is the task's entry (question, answer, metadata) plus
`task_options` (the options its task was generated with, which a few scorers read); its answer is "" when the
task has no single gold answer (graph_color, rubiks_cube, ...: the scorer checks the response itself).

Reward (`reasoning_gym`): the last <answer>...</answer> of the response (reasoning_gym.utils.extract_answer;
rlvr extracts nothing of its own) scored by `score_answer(answer, entry)` of the row's task: reward is that
score (partial credit kept), answer_reward 1 when it is 1, format_reward 1 when there was an answer tag.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import logging
import math
import typing

from rlvr.grading.extract import as_text
from rlvr.tasks.records import DataError, Example
from rlvr.tasks.reward_base import RewardContext, RewardFn, Scores, score_batch

PREFIX = "reasoning_gym:"
DEFAULT_SIZE, DEFAULT_SEED = 500, 0
SPLIT_SIZES = {"validation": 200, "test": 500}  # at most this many rows; train has `size`
STOP = ("</answer>",)
INSTALL = "pip install 'rlvr[reasoning-gym]'"
log = logging.getLogger(__name__)


class MissingExtra(ImportError, ValueError):
    """reasoning-gym is not installed (a ValueError too, so the CLI reports it as the user's to fix)."""


def _rg():
    try:
        import reasoning_gym
    except ImportError as err:
        raise MissingExtra(f"reasoning-gym's tasks need the reasoning-gym package: {INSTALL}") from err
    return reasoning_gym


def system_prompt() -> str:
    """reasoning-gym's default system prompt (it asks for the final answer in <answer></answer>)."""
    _rg()
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return SYSTEM_PROMPTS["default"]


# ----------------------------------------------------------------------------------------------------
# Dataset names.


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a dataset name: its reasoning-gym name, its weight in a composite, its own options."""

    name: str
    weight: float = 1.0
    options: tuple[tuple[str, object], ...] = ()


@dataclasses.dataclass(frozen=True)
class RGSpec:
    """A parsed `reasoning_gym:` name: its tasks (one, or several for a composite), size and seed."""

    tasks: tuple[TaskSpec, ...]
    size: int = DEFAULT_SIZE
    seed: int = DEFAULT_SEED


def _config_fields(task: str, dataset: str) -> dict[str, dataclasses.Field]:
    from reasoning_gym.factory import DATASETS

    if task == "composite":
        raise DataError(f"dataset {dataset!r}: write a composite as reasoning_gym:TASK*WEIGHT+TASK (e.g. "
                        "reasoning_gym:leg_counting*2+chain_sum), not reasoning_gym:composite")
    if task not in DATASETS:
        close = difflib.get_close_matches(task, DATASETS, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise DataError(f"dataset {dataset!r}: reasoning-gym has no task {task!r}; {hint}its {len(DATASETS) - 1} "
                        "tasks: python -c 'import reasoning_gym; print(sorted(reasoning_gym.factory.DATASETS))'")
    return {f.name: f for f in dataclasses.fields(DATASETS[task][1])}


def _scalar(raw: str, kind) -> object:
    """A value as the field's type wants it: int, float, bool, None, or the text itself."""
    if kind is str or typing.get_origin(kind) is typing.Literal:
        return raw
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for number in (int, float):
        try:
            return number(raw)
        except ValueError:
            pass
    return raw


def _value(raw: str, field: dataclasses.Field, task: str, dataset: str) -> object:
    """An option's text as its config field's type: numbers, true/false, none, text; a list or tuple field
    takes its items separated by '|' (operators=+|-)."""
    kind = field.type
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    if typing.get_origin(kind) is typing.Union and len(args) == 1:  # Optional[X]
        kind = args[0]
    origin = typing.get_origin(kind) or kind
    if origin in (list, tuple):
        item = (typing.get_args(kind) or (None,))[0]
        items = [_scalar(part.strip(), item) for part in raw.split("|")]
        return items if origin is list else tuple(items)
    if kind in (int, float, bool, str) or typing.get_origin(kind) is typing.Literal:
        value = _scalar(raw, kind)
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise DataError(f"dataset {dataset!r}: {task} option {field.name} is a number; got {raw!r}")
        if kind is bool and not isinstance(value, bool):
            raise DataError(f"dataset {dataset!r}: {task} option {field.name} is true or false; got {raw!r}")
        return value
    raise DataError(f"dataset {dataset!r}: {task} option {field.name} has type {field.type}, which a dataset name "
                    "cannot spell (numbers, true/false, text and '|'-separated lists can be)")


def _option(task: str, key: str, raw: str, dataset: str) -> tuple[str, object]:
    fields = _config_fields(task, dataset)
    own = sorted(set(fields) - {"size", "seed"})
    if key in ("size", "seed") or key not in fields:
        why = "size and seed are the dataset's, not one task's" if key in ("size", "seed") else "unknown option"
        raise DataError(f"dataset {dataset!r}: {why} {key!r} for task {task}; its options: "
                        f"{', '.join(own) or '(none)'}")
    return key, _value(raw, fields[key], task, dataset)


def _number(key: str, raw: str, dataset: str) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise DataError(f"dataset {dataset!r}: {key} must be a whole number; got {raw!r}") from None
    if value < (1 if key == "size" else 0):
        raise DataError(f"dataset {dataset!r}: {key} must be >= {1 if key == 'size' else 0}; got {value}")
    return value


@functools.lru_cache(maxsize=64)
def parse_name(dataset: str) -> RGSpec:
    """The tasks, size and seed a `reasoning_gym:` dataset name asks for; anything wrong fails with a DataError
    that names the dataset (an unknown task with the close names, an unknown option with the task's options).

    >>> parse_name("reasoning_gym:leg_counting*2+chain_sum:size=9,chain_sum.max_terms=4").tasks[1]
    TaskSpec(name='chain_sum', weight=1.0, options=(('max_terms', 4),))
    """
    _rg()
    if not dataset.startswith(PREFIX):
        raise DataError(f"dataset {dataset!r} is not a reasoning-gym name ({PREFIX}TASK[:key=value,...])")
    tasks_part, _, options_part = dataset[len(PREFIX):].partition(":")
    if ":" in options_part:
        raise DataError(f"dataset {dataset!r}: expected {PREFIX}TASK[*WEIGHT][+TASK...][:key=value,...]")
    weights: dict[str, float] = {}
    for part in tasks_part.split("+"):
        name, star, weight = part.strip().partition("*")
        name = name.strip()
        if not name:
            raise DataError(f"dataset {dataset!r}: a task name is missing (expected {PREFIX}TASK or TASK*2+TASK)")
        _config_fields(name, dataset)
        if name in weights:
            raise DataError(f"dataset {dataset!r}: task {name} is named twice; give it one weight")
        try:
            weights[name] = float(weight) if star else 1.0
        except ValueError:
            raise DataError(f"dataset {dataset!r}: the weight of {name} must be a number; got {weight!r}") from None
        if not (math.isfinite(weights[name]) and weights[name] > 0):
            raise DataError(f"dataset {dataset!r}: the weight of {name} must be > 0; got {weight!r}")
    composite = len(weights) > 1
    if not composite and "*" in tasks_part:
        raise DataError(f"dataset {dataset!r}: a weight needs two or more tasks (TASK*2+OTHER)")
    numbers = {"size": DEFAULT_SIZE, "seed": DEFAULT_SEED}
    options: dict[str, list] = {name: [] for name in weights}
    for item in filter(None, (i.strip() for i in options_part.split(","))):
        key, eq, raw = (s.strip() for s in item.partition("="))
        if not eq:
            raise DataError(f"dataset {dataset!r}: options are key=value; got {item!r}")
        task, dot, option = key.rpartition(".") if composite else ("", "", key)
        if key in numbers:
            numbers[key] = _number(key, raw, dataset)
        elif composite and not dot:
            raise DataError(f"dataset {dataset!r}: a composite takes size, seed and TASK.option (e.g. "
                            f"{next(iter(weights))}.<option>); got {key!r}")
        elif composite and task not in weights:
            raise DataError(f"dataset {dataset!r}: {key!r} names task {task!r}, which is not one of its tasks "
                            f"({', '.join(weights)})")
        else:
            options[task or next(iter(weights))].append(_option(task or next(iter(weights)), option, raw, dataset))
    specs = tuple(TaskSpec(name, weights[name], tuple(sorted(options[name]))) for name in weights)
    return RGSpec(specs, numbers["size"], numbers["seed"])


# ----------------------------------------------------------------------------------------------------
# Rows.


def split_seed(seed: int, split: str) -> int:
    """The seed of one split's rows: a hash of (seed, split), below 2**31 (reasoning-gym draws row i from
    Random(seed + i), so seeds one apart would share all but one row; hashed seeds land far apart)."""
    digest = hashlib.sha256(f"rlvr-reasoning-gym:{seed}:{split}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


def split_size(size: int, split: str) -> int:
    return size if split == "train" else min(size, SPLIT_SIZES[split])


def _generator(spec: RGSpec, dataset: str, split: str):
    rg = _rg()
    size, seed = split_size(spec.size, split), split_seed(spec.seed, split)
    try:
        if len(spec.tasks) == 1:
            task = spec.tasks[0]
            return rg.create_dataset(task.name, size=size, seed=seed, **dict(task.options))
        from reasoning_gym.composite import DatasetSpec

        parts = [DatasetSpec(name=t.name, weight=t.weight, config=dict(t.options)) for t in spec.tasks]
        return rg.create_dataset("composite", size=size, seed=seed, datasets=parts)
    except (AssertionError, ValueError, TypeError) as err:  # reasoning-gym validates its configs with asserts
        raise DataError(f"dataset {dataset!r}: reasoning-gym refused the options: {err or type(err).__name__}") from None


@functools.lru_cache(maxsize=16)
def _rows(dataset: str, split: str) -> tuple[Example, ...]:
    spec = parse_name(dataset)
    options = {t.name: dict(t.options) for t in spec.tasks}
    rows = []
    for index, entry in enumerate(_generator(spec, dataset, split)):
        task = entry["metadata"]["source_dataset"]
        answer = entry.get("answer")
        rows.append(Example(entry["question"], "" if answer is None else str(answer), id=f"{task}:{split}:{index}",
                            fields={**entry, "task_options": options[task]}))
    return tuple(rows)


def reasoning_gym_rows(name: str, split: str) -> list[Example]:
    """The rows of one split of a `reasoning_gym:` dataset (see the module docstring): the same rows every
    time for the same name and split."""
    if split not in SPLIT_SIZES and split != "train":
        raise DataError(f"unknown split {split!r}; valid: train, validation, test")
    return list(_rows(name, split))


# ----------------------------------------------------------------------------------------------------
# The reward.


@functools.lru_cache(maxsize=64)
def _scorer(task: str, options: str):
    """The bound `score_answer` of `task` configured with `options` (JSON): built once, as building a task
    can be slow and a few tasks' scorers read their config (puzzle24's number range, decimal_arithmetic's
    precision, time_intervals' tolerance)."""
    rg = _rg()
    return rg.create_dataset(task, **{"size": 1, "seed": 0, **json.loads(options)}).score_answer


class ReasoningGymReward(RewardFn):
    """Each response scored by its row's reasoning-gym task (see the module docstring). It reads the rows
    (`RewardContext.rows`, one per response): the ground-truth strings are not used.

    >>> rows = reasoning_gym_rows("reasoning_gym:chain_sum:size=1", "train")
    >>> rows[0].question, rows[0].answer
    ('State the final answer to the following arithmetic problem: 24 - 63 =', '-39')
    >>> responses = ["<answer>-39</answer>", "<answer>x-39</answer>", "-39"]
    >>> [s["reward"] for s in reasoning_gym_reward().batch_rows(responses, rows * 3)]  # chain_sum's partial credit
    [1.0, 0.75, 0.0]
    """

    name = "reasoning_gym"

    def extract(self, response: str) -> tuple[float, str | None]:
        _rg()
        from reasoning_gym.utils import extract_answer

        answer = extract_answer(as_text(response))
        return float(answer is not None), answer

    def score(self, response: str, row: Example) -> Scores:
        entry = row.fields
        task = (entry.get("metadata") or {}).get("source_dataset") if isinstance(entry, dict) else None
        if not isinstance(task, str):
            raise ValueError(f"reward reasoning_gym: row {row.id!r} is not a reasoning-gym entry (its fields have no "
                             "metadata.source_dataset); it scores the rows of dataset=reasoning_gym:TASK")
        fmt, answer = self.extract(response)
        scorer = _scorer(task, json.dumps(entry.get("task_options") or {}, sort_keys=True))
        try:
            value = float(scorer(answer, entry))
        except Exception as err:  # noqa: BLE001 -- a task's scorer that chokes on an answer: that answer is wrong
            log.warning("reasoning-gym %s: score_answer failed on row %s (%s: %s); scored 0", task, row.id,
                        type(err).__name__, err)
            value = 0.0
        if not math.isfinite(value):
            value = 0.0
        return {"reward": value, "format_reward": fmt, "answer_reward": float(value >= 1.0)}

    def plan(self, responses, ground_truths, context: RewardContext | None = None):
        rows = context.rows if context is not None else None
        if rows is None:
            raise ValueError("reward reasoning_gym scores each response with its row's task: it needs the batch's "
                             "rows (score_batch(..., context=RewardContext(rows=examples)))")
        if len(rows) != len(responses):
            raise ValueError(f"reward reasoning_gym: {len(rows)} rows for {len(responses)} responses (one row each)")
        # a prompt that opens the answer itself ("... <answer>", a prefilled assistant turn) leaves the response
        # "-39</answer>": the tag it opened is the response's too
        prompts = context.prompts or [""] * len(responses)
        responses = [f"<answer>{r}" if str(p).rstrip().endswith("<answer>") and "<answer>" not in r else r
                     for r, p in zip(responses, prompts)]
        scores = [self.score(r, row) for r, row in zip(responses, rows)]
        return [], lambda _: scores

    def batch_rows(self, responses: list[str], rows: list[Example]) -> list[Scores]:
        """The scores of responses to these rows (one row per response)."""
        return score_batch(self, responses, [r.answer for r in rows], RewardContext(rows=list(rows)))[0]


@functools.lru_cache(maxsize=1)
def reasoning_gym_reward() -> ReasoningGymReward:
    """The `reasoning_gym` reward function (rewards={reasoning_gym: 1.0}, prompt=reasoning_gym)."""
    _rg()
    return ReasoningGymReward()

"""Checking a task before hours are spent on it (`rlvr check-task`, and the start of `rlvr train`): its rows
load, its prompts render, and its reward can tell answers apart. Every reward function runs on two given
completions per row, the reference (the prompt's SFT target, else the row's solution or answer) and an empty
one; a reward that scores both the same on every row gives GRPO nothing to learn from, and says so.
"""

from __future__ import annotations

import dataclasses
import logging

from rlvr.tasks.records import DataError, Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import Task

log = logging.getLogger(__name__)


@dataclasses.dataclass
class TaskReport:
    rows: dict[str, int | str]  # per split: a count, or the error that stopped it loading
    prompts: list[str]  # two rendered prompts
    prompt_tokens: dict[str, float]  # mean and max over the rows checked (when a tokenizer was given)
    reference: list[dict]  # each checked row's scores of its reference completion
    empty: list[dict]  # and of an empty completion
    warnings: list[str]

    @property
    def reward_range(self) -> tuple[float, float]:
        values = [float(s["reward"]) for s in self.reference + self.empty]
        return (min(values), max(values)) if values else (0.0, 0.0)


def reference_completion(task: Task, example: Example) -> str | None:
    """What a right answer to `example` looks like under the task's prompt, or None when the row has none."""
    try:
        return task.prompt.sft_response(example)
    except ValueError:
        return example.solution or example.answer or None


def check_task(task: Task, rows: list[Example] | None = None, tokenizer=None, n: int = 16,
               splits: tuple[str, ...] = ("train", "validation", "test")) -> TaskReport:
    """Load each split (or use `rows` as the train split), render prompts, score the first `n` train rows'
    reference and empty completions with the task's reward, and say what would make training learn nothing."""
    counts: dict[str, int | str] = {}
    loaded: dict[str, list[Example]] = {}
    for split in splits:
        if rows is not None and split == "train":
            loaded[split] = rows
        else:
            try:
                loaded[split] = task.split(split)
            except (DataError, ValueError) as err:
                counts[split] = f"error: {err}"
                continue
        counts[split] = len(loaded[split])
    train = loaded.get("train") or next((v for v in loaded.values() if v), [])
    if not train:
        raise DataError(f"the task has no rows to check: {counts}")
    sample = train[:n]
    prompts = [task.prompt.render(ex, tokenizer) for ex in sample]
    lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in prompts] if tokenizer else []
    warnings = []
    with_ref = [(ex, p, reference_completion(task, ex)) for ex, p in zip(sample, prompts)]
    with_ref = [(ex, p, r) for ex, p, r in with_ref if r]
    reference = _score(task, [(ex, p, r) for ex, p, r in with_ref])
    empty = _score(task, [(ex, p, "") for ex, p in zip(sample, prompts)])
    if not with_ref:
        warnings.append("no row has a reference answer or solution: the reward was checked on empty completions "
                        "only, so whether it rewards a right answer is unknown")
    else:
        same = [float(a["reward"]) == float(b["reward"]) for a, b in zip(reference, empty)]
        if all(same):
            warnings.append(f"the reward gives the reference answer and an empty completion the same score on all "
                            f"{len(same)} rows checked ({float(reference[0]['reward']):g}): a group whose answers "
                            "all score alike has no spread, and GRPO would learn nothing. Check the reward "
                            "function against the prompt's answer format")
        if max(float(s["reward"]) for s in reference) <= min(float(s["reward"]) for s in empty):
            warnings.append("the reference answers score no higher than empty completions")
    return TaskReport(counts, prompts[:2], {"mean": sum(lengths) / len(lengths), "max": max(lengths)}
                      if lengths else {}, reference, empty, warnings)


def _score(task: Task, items: list[tuple[Example, str, str]]) -> list[dict]:
    if not items:
        return []
    examples, prompts, texts = zip(*items)
    context = RewardContext(prompts=list(prompts), completion_ids=[[] for _ in texts], rows=list(examples), step=0,
                            row_prompts=[task.prompt.reward_prompt(ex) for ex in examples])
    scores, _ = score_batch(task.reward_fn, list(texts), [ex.answer for ex in examples], context)
    return scores


def warn_unlearnable(task: Task, rows: list[Example], tokenizer) -> list[str]:
    """The start of `rlvr train`: the same checks on a few rows, logged as warnings (the run goes on)."""
    report = check_task(task, rows, tokenizer, n=8, splits=("train",))
    for warning in report.warnings:
        log.warning("task check: %s", warning)
    return report.warnings

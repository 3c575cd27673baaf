"""Checking a task before hours are spent on it (`rlvr check-task`, and the start of every loop): its rows load,
every row's prompt fills and fits the model's context with room to answer, and its reward can tell answers
apart. Every reward function runs on two given completions per row, the reference (the prompt's SFT target,
else the row's solution or answer, tokenized as the model would write it) and an empty one; a reward that scores
both the same on every row gives GRPO nothing to learn from, and says so.
"""

from __future__ import annotations

import dataclasses
import logging

from rlvr.tasks.records import DataError, Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import Task

log = logging.getLogger(__name__)
LONGEST = 256  # rows whose prompts are tokenized to find the longest: the longest by characters


@dataclasses.dataclass
class TaskReport:
    rows: dict[str, int]  # per split that loaded: its row count
    prompts: list[str]  # two rendered prompts
    prompt_tokens: dict[str, float]  # mean over the rows checked, max over the longest (when a tokenizer was given)
    reference: list[dict]  # each checked row's scores of its reference completion
    empty: list[dict]  # and of an empty completion
    warnings: list[str]
    errors: dict[str, str] = dataclasses.field(default_factory=dict)  # per split that did not load: why

    @property
    def reward_range(self) -> tuple[float, float]:
        values = [float(s["reward"]) for s in self.reference + self.empty if s["reward"] == s["reward"]]
        return (min(values), max(values)) if values else (0.0, 0.0)


def reference_completion(task: Task, example: Example) -> str | None:
    """What a right answer to `example` looks like under the task's prompt, or None when the row has none."""
    try:
        return task.prompt.sft_response(example)
    except ValueError:
        return example.solution or example.answer or None


def model_context(model: str) -> int | None:
    """The positions the model has (its config's max_position_embeddings), read without loading its weights."""
    from transformers import AutoConfig

    from rlvr.core.models import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model))
    except (OSError, ValueError):
        return None
    return getattr(config, "max_position_embeddings", None)


def check_prompts(task: Task, rows: list[Example], tokenizer, context: int | None, max_new_tokens: int,
                  split: str = "train") -> dict[str, float]:
    """Every row's prompt fills (a DataError names the first row whose template placeholder it lacks), and the
    longest prompts, with `max_new_tokens` to answer in, fit the model's `context` positions (a DataError names
    the longest row otherwise). Returns the prompt tokens' mean (over the rows tokenized) and max."""
    fills = [task.prompt.fill(ex) if ex.conversation is None else str(ex.conversation) for ex in rows]
    longest = sorted(range(len(rows)), key=lambda i: -len(fills[i]))[:LONGEST]
    if tokenizer is None or not longest:
        return {}
    rendered = [task.prompt.render(rows[i], tokenizer) for i in longest]
    lengths = [len(ids) for ids in tokenizer(rendered, add_special_tokens=False).input_ids]
    worst = max(range(len(longest)), key=lambda k: lengths[k])
    if context is not None and lengths[worst] + max_new_tokens > context:
        over = sum(n + max_new_tokens > context for n in lengths)
        raise DataError(f"{rows[longest[worst]].id}: its prompt is {lengths[worst]:,} tokens, and with "
                        f"max_new_tokens={max_new_tokens} that is past the model's {context:,} positions ({over} of "
                        f"the {split} split's {len(longest)} longest prompts are); shorten the prompts, lower "
                        "max_new_tokens, or leave those rows out")
    return {"mean": sum(lengths) / len(lengths), "max": lengths[worst]}


def check_task(task: Task, rows: list[Example] | None = None, tokenizer=None, n: int = 16,
               splits: tuple[str, ...] = ("train", "validation", "test"), context: int | None = None,
               max_new_tokens: int = 0, score: bool = True) -> TaskReport:
    """Load each split (or use `rows` as the train split), check every row's prompt (check_prompts), score the
    first `n` train rows' reference and empty completions with the task's reward, and say what would make
    training learn nothing. `score=False`: no scoring (an agent's episodes are scored on their conversations,
    which a text completion does not have)."""
    counts: dict[str, int] = {}
    errors: dict[str, str] = {}
    loaded: dict[str, list[Example]] = {}
    for split in splits:
        if rows is not None and split == "train":
            loaded[split] = rows
        else:
            try:
                loaded[split] = task.split(split)
            except (DataError, ValueError) as err:
                errors[split] = str(err)
                continue
        counts[split] = len(loaded[split])
    train = loaded.get("train") or next((v for v in loaded.values() if v), [])
    if not train:
        raise DataError("the task has no rows to check: " + "; ".join(dict.fromkeys(errors.values())))
    stats = {}
    for split, examples in loaded.items():
        found = check_prompts(task, examples, tokenizer, context, max_new_tokens, split)
        stats = stats or found
        if found and stats is not found:
            stats = {"mean": stats["mean"], "max": max(stats["max"], found["max"])}
    sample = train[:n]
    prompts = [task.prompt.render(ex, tokenizer) for ex in sample]
    warnings = []
    with_ref = [(ex, p, reference_completion(task, ex)) for ex, p in zip(sample, prompts)]
    with_ref = [(ex, p, r) for ex, p, r in with_ref if r] if score else []
    reference = _score(task, with_ref, tokenizer)
    empty = _score(task, [(ex, p, "") for ex, p in zip(sample, prompts)], tokenizer) if score else []
    if score and not with_ref:
        warnings.append("no row has a reference answer or solution: the reward was checked on empty completions "
                        "only, so whether it rewards a right answer is unknown")
    elif score:
        same = [float(a["reward"]) == float(b["reward"]) for a, b in zip(reference, empty)]
        if all(same):
            warnings.append(f"the reward gives the reference answer and an empty completion the same score on all "
                            f"{len(same)} rows checked ({float(reference[0]['reward']):g}): a group whose answers "
                            "all score alike has no spread, and GRPO would learn nothing. Check the reward "
                            "function against the prompt's answer format")
        finite = [float(s["reward"]) for s in reference if s["reward"] == s["reward"]]
        blank = [float(s["reward"]) for s in empty if s["reward"] == s["reward"]]
        if finite and blank and max(finite) <= min(blank):
            warnings.append("the reference answers score no higher than empty completions")
    return TaskReport(counts, prompts[:2], stats, reference, empty, warnings, errors)


def _score(task: Task, items: list[tuple[Example, str, str]], tokenizer) -> list[dict]:
    if not items:
        return []
    examples, prompts, texts = zip(*items)
    # the ids the model would have sampled: a reward that counts tokens sees the reference's, not none
    ids = [tokenizer(t, add_special_tokens=False).input_ids if tokenizer is not None and t else [] for t in texts]
    context = RewardContext(prompts=list(prompts), completion_ids=ids, rows=list(examples), step=0,
                            global_step=0, row_prompts=[task.prompt.reward_prompt(ex) for ex in examples])
    scores, _ = score_batch(task.reward_fn, list(texts), [ex.answer for ex in examples], context)
    return scores


def check_before_loading(task: Task, cfg, rows: list[Example], tokenizer=None) -> None:
    """The start of a loop, before any model is loaded: every row's prompt fills and fits the model's context
    with max_new_tokens to answer in (check_prompts; a DataError names the row)."""
    from rlvr.core.models import load_tokenizer
    from rlvr.stages.run import check_out

    if getattr(cfg, "grades_code", False):  # a sandbox that cannot isolate programs is said before any model
        cfg.sandbox.apply()
    check_out(cfg)  # the cheap mistakes first: no model is converted to say that out= is a file
    tokenizer = tokenizer or load_tokenizer(cfg.model)
    budget = max(getattr(cfg, "max_new_tokens", 0), getattr(cfg, "eval_max_new_tokens", 0))
    check_prompts(task, rows, tokenizer, model_context(cfg.model), budget)


def warn_unlearnable(task: Task, rows: list[Example], tokenizer) -> list[str]:
    """The start of `rlvr train`: the same checks on a few rows, logged as warnings (the run goes on)."""
    report = check_task(task, rows, tokenizer, n=8, splits=("train",))
    for warning in report.warnings:
        log.warning("task check: %s", warning)
    return report.warnings

"""The shape every reward function has (`RewardFn`, what it may read: `RewardContext`) and scoring a batch
with one (`score_batch`): the slow-path answers of a batch are graded together in the pool, async user
functions awaited together. The named reward functions are in rlvr.tasks.rewards, a user's in
rlvr.tasks.user_rewards.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from typing import Callable, Sequence

from rlvr.core.interrupts import CallTimedOut, call_bounded
from rlvr.grading import grade_pairs, grading_stats
from rlvr.grading.extract import as_text
from rlvr.sandbox import sandbox_stats

Scores = dict[str, float]


class RewardError(ValueError):
    """A user's reward function that cannot be loaded or gave a value that is not a reward."""


def bounded_reward_call(call: Callable, timeout: float | None, what: str):
    """call() in a thread of its own within `timeout` seconds (rlvr.core.interrupts.call_bounded); a timeout,
    sys.exit or KeyboardInterrupt in it is a RewardError naming `what`. A stop signal still gives it up."""
    try:
        return call_bounded(call, timeout, what, "reward_timeout")
    except (CallTimedOut, RuntimeError) as err:
        if isinstance(err, RuntimeError) and not str(err).startswith(what):
            raise
        raise RewardError(str(err)) from None


def scores_of(format_ok: float, right: bool) -> Scores:
    return {"reward": float(right), "format_reward": float(format_ok), "answer_reward": float(right)}


@dataclasses.dataclass
class RewardContext:
    """What a batch's reward functions may read beside the responses and ground truths: the rendered prompts,
    the sampled ids, the rows (Examples, with every column in `fields`) and the training step (None outside
    training). `results` holds what async functions computed concurrently before `plan` runs."""

    prompts: list | None = None
    completion_ids: list | None = None
    rows: list | None = None
    step: int | None = None
    global_step: int | None = None  # optimizer steps done when the batch was sampled (TRL's trainer_state)
    max_steps: int | None = None
    epoch: float | None = None
    row_prompts: list | None = None  # each row's prompt as TRL passes it (PromptTemplate.reward_prompt)
    # an agent's episodes (rlvr.stages.agents): each one's conversation after its prompt (TRL's conversational
    # `completions`, None where a completion has none), and keywords TRL hands its functions (`environments`)
    messages: list | None = None
    reward_kwargs: dict | None = None
    results: dict = dataclasses.field(default_factory=dict)
    metrics: dict = dataclasses.field(default_factory=dict)  # log_metric(name, value): name -> values
    extras: dict = dataclasses.field(default_factory=dict)  # log_extra(column, values): column -> one per row

    @classmethod
    def of_completions(cls, completions, prompts: list, rows: list, step: int | None = None, template=None,
                       **training) -> "RewardContext":
        """The context of completions (anything with `prompt_index` and `token_ids`: the engine's) of these
        rendered prompts and rows, one of each per prompt index; `template` (a PromptTemplate) gives each row's
        prompt as a reward function sees it; `training`: global_step, max_steps, epoch."""
        row_prompts = [template.reward_prompt(r) for r in rows] if template is not None else None
        messages = [getattr(c, "messages", None) for c in completions]
        environments = [getattr(c, "environment", None) for c in completions]
        return cls(prompts=[prompts[c.prompt_index] for c in completions],
                   messages=messages if any(m is not None for m in messages) else None,
                   reward_kwargs={"environments": environments} if any(e is not None for e in environments) else None,
                   completion_ids=[list(c.token_ids) for c in completions],
                   rows=[rows[c.prompt_index] for c in completions], step=step,
                   row_prompts=[row_prompts[c.prompt_index] for c in completions] if row_prompts else None,
                   **training)


class RewardFn:
    """A reward function `fn(response, ground_truth) -> {"reward", "format_reward", "answer_reward"}`
    that can also grade a batch in parallel (`fn.batch`). Subclasses say where the answer is (`extract`)."""

    name = "reward"

    def extract(self, response: str) -> tuple[float, str | None]:
        """(format_reward, the answer to grade or None when there is none)."""
        raise NotImplementedError

    def start(self, responses: list[str], ground_truths: list[str], context: RewardContext):
        """An awaitable that computes this function's values for the batch (async user functions), or None; a
        combination awaits every component's together and leaves each result in `context.results`."""
        return None

    def plan(self, responses: list[str], ground_truths: list[str], context: RewardContext | None = None):
        """The (answer, ground truth) pairs to grade, and a function from their verdicts to the scores."""
        extracted = []
        for response in responses:
            try:
                extracted.append(self.extract(response))
            except Exception:  # a bug here must cost one sample its reward, not the run
                extracted.append((0.0, None))
        pairs = [(a, g) for (_, a), g in zip(extracted, ground_truths) if a is not None]

        def finish(verdicts: list[bool]) -> list[Scores]:
            it = iter(verdicts)
            return [scores_of(f, a is not None and next(it)) for f, a in extracted]

        return pairs, finish

    def __call__(self, response: str, ground_truth: str) -> Scores:
        return self.batch([response], [ground_truth])[0][0]

    def batch(self, responses: Sequence[str], ground_truths: Sequence[str]) -> tuple[list[Scores], dict]:
        return score_batch(self, responses, ground_truths)

    def __repr__(self) -> str:
        return f"<reward fn {self.name}>"


def run_awaitables(awaitables: list, timeout: float | None = None, what: str = "reward functions") -> list:
    """The results of awaitables run concurrently, from synchronous code, in an event loop of their own in a
    thread of its own (so a notebook's running loop is no obstacle), within `timeout` seconds
    (bounded_reward_call)."""
    async def gather():
        return await asyncio.gather(*awaitables)

    return bounded_reward_call(lambda: asyncio.run(gather()), timeout, what)


def score_batch(
    reward_fn: Callable[[str, str], Scores], responses: Sequence[str], ground_truths: Sequence[str],
    context: RewardContext | None = None,
) -> tuple[list[Scores], dict]:
    """Score many responses at once: the same dicts as calling `reward_fn` one by one, but the slow-path
    gradings of a RewardFn run concurrently in the pool. A plain callable is called one by one.

    `context`: the prompts, sampled ids, rows and step, which a user's reward functions read (rlvr.tasks.user_rewards).
    Metadata: "grading/<count>" for the counts of `grading_stats` in this batch, and "grading/seconds".

    >>> from rlvr.tasks.rewards import r1_zero_reward_fn
    >>> scores, meta = score_batch(r1_zero_reward_fn, [" </think> <answer> $72 </answer>", "72"], ["72", "72"])
    >>> [s["reward"] for s in scores], meta["grading/fast_path"], meta["grading/slow_path"]
    ([1.0, 0.0], 1, 0)
    """
    responses, ground_truths = list(responses), list(ground_truths)
    if len(responses) != len(ground_truths):
        raise ValueError(
            f"score_batch: responses ({len(responses)}) and ground_truths ({len(ground_truths)}) differ in length"
        )
    responses = [as_text(r) for r in responses]
    ground_truths = [as_text(g) for g in ground_truths]
    start, ran_before = time.perf_counter(), sandbox_stats()
    if isinstance(reward_fn, RewardFn):
        context = context or RewardContext()
        awaitable = reward_fn.start(responses, ground_truths, context)
        if awaitable is not None:
            shown = getattr(reward_fn, "shown", reward_fn.name)
            context.results[id(reward_fn)] = run_awaitables([awaitable], getattr(reward_fn, "timeout", None),
                                                            f"reward function {shown!r} on the batch")[0]
        pairs, finish = reward_fn.plan(responses, ground_truths, context)  # a code reward runs its programs here
        verdicts, counts = grade_pairs(pairs)
        # a user's function alone that says None ("does not apply") gives the row no reward, nor a signal: NaN
        scores = [{k: (math.nan if v is None else v) for k, v in s.items()} for s in finish(verdicts)]
    else:
        before = grading_stats()
        scores = [reward_fn(r, g) for r, g in zip(responses, ground_truths)]
        after = grading_stats()
        counts = {key: after[key] - before[key] for key in after}
    counts["seconds"] = time.perf_counter() - start
    ran = {key: value - ran_before[key] for key, value in sandbox_stats().items()}
    if ran["programs"]:  # programs run in the sandbox, by outcome (distinct programs: repeats run once)
        counts.update({f"code_{key}": value for key, value in ran.items()})
    meta = {f"grading/{key}": value for key, value in counts.items()}
    if context is not None:
        _user_logs(context, scores, meta)
    return scores, meta


def _user_logs(context: RewardContext, scores: list[Scores], meta: dict) -> None:
    """TRL's log_metric (the step's mean, as `reward_metric/<name>`) and log_extra (a column of each row's
    record, as `log/<column>` in its scores) from what the batch's reward functions called."""
    for name, values in context.metrics.items():
        numbers = [float(v) for v in values if isinstance(v, (int, float)) or hasattr(v, "__float__")]
        if numbers:
            meta[f"reward_metric/{name}"] = sum(numbers) / len(numbers)
    for column, values in context.extras.items():
        for score, value in zip(scores, values):
            score[f"log/{column}"] = value

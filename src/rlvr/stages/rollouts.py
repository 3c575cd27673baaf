"""Sampling and scoring a step's rollouts (seed 004 Algorithm 1, lines 3-7), with typed records between them:

    next_questions -> collect_rollouts / dynamic_rollouts -> Rollouts -> score_rollouts -> Scored (a TrainBatch)

Every rollout is reproducible from (seed, step, question, sample index): `rollout_sampling` keys the engine's
random streams by the step.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import torch

from rlvr.algorithms.policy import tokenize_prompt_and_ids
from rlvr.algorithms.spec import EstimatorSpec, compute_advantages
from rlvr.algorithms.update import TrainBatch
from rlvr.config import TrainConfig, sampling_params
from rlvr.engines.base import Completion, RolloutEngine
from rlvr.environments import environment_factory
from rlvr.stages.agents import rollout_source
from rlvr.stages.episodes import apply_env_rewards, generate
from rlvr.stages.trajectories import is_agentic, sequence_batch
from rlvr.tasks.prompts import PromptTemplate
from rlvr.tasks.records import DataOrder, Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.task import build_reward_fn as task_reward_fn
from rlvr.tasks.task import task_prompt
from rlvr.tasks.scoring import rewards_and_metadata, soft_overlong_penalty

log = logging.getLogger(__name__)


def build_reward_fn(cfg: TrainConfig, prompt_reward: str | None):
    """The prompt's reward, or the weighted combination `rewards=` names: built-ins such as {r1_zero: 1.0,
    format: 0.2} (seed 002) and a user's functions (rlvr.tasks.task). The length term `overlong` is not a
    function of the text: `score_completions` adds it."""
    return task_reward_fn(cfg, dataclasses.replace(task_prompt(cfg), reward=prompt_reward))


@dataclasses.dataclass
class Rollouts:
    """One rollout batch: the questions, their prompts and G completions each (prompt-major)."""

    questions: list[Example]
    prompts: list[str]
    completions: list[Completion]
    step: int | None = None  # the training step that sampled them (a user's reward reads it as trainer_state)

    @property
    def responses(self) -> list[str]:
        return [c.text for c in self.completions]

    @property
    def truths(self) -> list[str]:
        return [self.questions[c.prompt_index].answer for c in self.completions]

    @property
    def truncated(self) -> torch.Tensor:
        return torch.tensor([c.finish_reason == "length" for c in self.completions])


@dataclasses.dataclass
class Scored:
    """A rollout batch's rewards and the TrainBatch its advantages make; `unknown_rows`: rollouts whose
    engine gave no sampling log-probs (no mismatch measured or corrected on them)."""

    scores: list[dict]
    reward_meta: dict
    adv_meta: dict
    batch: TrainBatch
    unknown_rows: int = 0
    rows: list[list[int]] | None = None  # the batch rows of each rollout, when they are not one each (agents)


def sampled_log_probs(completions: list[Completion], labels: torch.Tensor, response_mask: torch.Tensor):
    """The engine's sampling-time log-probs placed at the batch's response positions, (N, T), NaN elsewhere and
    for a row whose engine gave none (or whose trained ids are not its sampled ids: a guard, score_rollouts
    trains the sampled ids). Returns (log-probs, rows unknown)."""
    out = torch.full(labels.shape, float("nan"))
    unknown = 0
    for j, c in enumerate(completions):
        positions = response_mask[j].nonzero().squeeze(-1)
        ids = labels[j, positions].tolist()
        keep = c.loss_mask if c.loss_mask is not None else [True] * len(c.token_ids)  # the sampled ids
        sampled = [t for t, k in zip(c.token_ids, keep) if k]
        logprobs = [x for x, k in zip(c.logprobs, keep) if k] if c.logprobs is not None else None
        if logprobs is not None and sampled == ids and len(logprobs) == len(ids):
            out[j, positions] = torch.tensor(logprobs, dtype=torch.float32)
        elif ids:
            unknown += 1
    return out, unknown


def next_questions(train: list[Example], order: DataOrder, prompt: PromptTemplate, tokenizer, cfg: TrainConfig,
                   count: int | None = None):
    """The next `count` questions (default: a rollout batch's) and their prompts."""
    questions = [train[i] for i in order.take(count or cfg.rollout_batch_size // cfg.group_size)]
    return questions, [prompt.render(q, tokenizer) for q in questions]


def rollout_sampling(cfg: TrainConfig, prompt: PromptTemplate, step: int):
    """Step `step`'s sampling: the seed makes every rollout a function of (seed, step, question, sample). The
    engine reports its sampling log-probs: the update measures and corrects the rollout-vs-trainer mismatch."""
    sampling = sampling_params(cfg, stop=prompt.stop, seed=cfg.seed * 1_000_003 + step)
    return dataclasses.replace(sampling, logprobs=True)


def collect_rollouts(engine: RolloutEngine, model, train: list[Example], order: DataOrder, prompt: PromptTemplate,
                     tokenizer, cfg: TrainConfig, step: int) -> Rollouts:
    questions, prompts = next_questions(train, order, prompt, tokenizer, cfg)
    engine.sync_weights(model)
    sampling = rollout_sampling(cfg, prompt, step)
    return Rollouts(questions, prompts, generate(engine, rollout_source(cfg), questions, prompts, sampling, tokenizer),
                    step)


def dynamic_rollouts(engine: RolloutEngine, model, train: list[Example], order: DataOrder, prompt: PromptTemplate,
                     tokenizer, cfg: TrainConfig, step: int, reward_fn, spec: EstimatorSpec):
    """DAPO's dynamic sampling, for every estimator: a group teaches nothing when the run's own estimator gives
    it zero advantage on every rollout of the group's signal (a mean baseline: the signal without spread; no
    baseline, as in rft and reinforce: all wrong; DAPO's masking: every rollout with signal truncated; a
    registered advantage: whatever it says). The signal is `dynamic_sampling_signal`: the answer's correctness
    by default, as DAPO and verl filter on accuracy, so shaping (a format bonus, the overlong term) cannot keep
    an all-right or all-wrong group whose std normalisation would blow a length penalty up into a full-size
    advantage; `reward` judges by the shaped reward. Such groups are dropped and new questions sampled in their
    place, up to
    `dynamic_sampling_rounds` generations, until the batch holds rollout_batch_size / group_size groups with
    signal (the first round generates `dynamic_sampling_questions` questions when set, later rounds as many as
    the keep rate so far says will fill the batch). Short of that, the step trains the groups it found; none
    found: the last round's first groups, never more rows than the configured batch. Each group is judged by
    the advantage function on that group alone (a group estimator's advantages are exactly that).

    Returns the batch, what the sampling cost (`train/dynamic_*`), the batch's (scores, grading counts of every
    round) for `score_rollouts`, so nothing is graded twice, and (everything sampled, its scores) for the
    step's rollout metrics."""
    want, g = cfg.rollout_batch_size // cfg.group_size, cfg.group_size
    # what a group is judged by; an estimator of correctness (rft, maxrl) computes its advantages from it anyway
    by_answer = cfg.dynamic_sampling_signal == "answer" or spec.reward_signal == "correctness"
    key = "answer_reward" if by_answer else "reward"
    questions, prompts, completions, kept_scores = [], [], [], []
    everything = Rollouts([], [], [])
    every_score: list[dict] = []
    grading: dict[str, float] = {}
    sampled, right, rounds = 0, 0.0, 0
    source = rollout_source(cfg)
    engine.sync_weights(model)
    while len(questions) < want and rounds < cfg.dynamic_sampling_rounds:
        missing = want - len(questions)
        # after the first round, ask for as many questions as this step's keep rate says will fill the batch
        rate = max(len(questions) * g / sampled, 1 / want) if sampled else 1.0
        first = cfg.dynamic_sampling_questions or missing
        count = first if not sampled else min(max(4 * want, first), math.ceil(missing / rate))
        new_q, new_p = next_questions(train, order, prompt, tokenizer, cfg, count=count)
        sampling = rollout_sampling(cfg, prompt, step)
        sampling = dataclasses.replace(sampling, seed=sampling.seed + 1_000_000_007 * rounds)
        batch = Rollouts(new_q, new_p, generate(engine, source, new_q, new_p, sampling, tokenizer), step)
        rounds += 1
        scores, counts = score_completions(reward_fn, batch, cfg)
        for name, value in counts.items():  # counts add up over the rounds; a reward's log_metric: the last
            grading[name] = grading.get(name, 0) + value if name.startswith("grading/") else value
        sampled += len(scores)
        right += sum(float(s["answer_reward"]) for s in scores if not math.isnan(float(s["answer_reward"])))
        offset = len(everything.questions)
        everything.questions += new_q
        everything.prompts += new_p
        everything.completions += [dataclasses.replace(c, prompt_index=c.prompt_index + offset)
                                   for c in batch.completions]
        every_score += scores
        last = batch, scores
        for q in range(len(new_q)):
            group = slice(q * g, (q + 1) * g)
            advantages, _ = advantages_of(torch.tensor([float(s[key]) for s in scores[group]]), g, spec)
            if spec.mask_truncated_completions:  # score_rollouts zeroes these, so they carry no signal
                advantages = torch.where(batch.truncated[group], torch.zeros_like(advantages), advantages)
            if bool((advantages != 0).any()) and len(questions) < want:  # extras beyond a full batch are dropped
                completions += [dataclasses.replace(c, prompt_index=len(questions)) for c in batch.completions[group]]
                kept_scores += scores[group]
                questions.append(new_q[q])
                prompts.append(new_p[q])
    meta = {"train/dynamic_rounds": rounds, "train/dynamic_kept_groups": len(questions),
            "train/dynamic_sampled_rollouts": sampled, "train/sampled_answer_reward": right / max(sampled, 1)}
    # nothing had signal: the last round's first batch of groups (a zero-gradient step, unless shaping the filter
    # did not judge by gives it advantages)
    if not questions:
        batch, scores = last
        kept = Rollouts(batch.questions[:want], batch.prompts[:want], batch.completions[: want * g], step)
        return kept, meta, (scores[: want * g], grading), (everything, every_score)
    return Rollouts(questions, prompts, completions, step), meta, (kept_scores, grading), (everything, every_score)


def score_completions(reward_fn, rollouts: Rollouts, cfg: TrainConfig) -> tuple[list[dict], dict]:
    """(scores, grading counts) of a rollout batch: its reward function on the texts, plus the length term of
    `rewards={..., overlong: w}` (DAPO's soft overlong punishment, `overlong_buffer` tokens before the
    budget) on the sampled token counts, logged as `reward/overlong`. An episode (`env=`) counts the ids the
    model sampled, not the observations' (loss_mask), against the episode's budget (the environment's
    max_total_tokens, else max_new_tokens)."""
    k = cfg.estimator.steps_per_rollout  # TRL's trainer_state.global_step: the optimizer steps done before
    training = {"global_step": (rollouts.step - 1) * k, "max_steps": cfg.steps * k} if rollouts.step else {}
    context = RewardContext.of_completions(rollouts.completions, rollouts.prompts, rollouts.questions, rollouts.step,
                                           template=task_prompt(cfg), **training)
    scores, grading = score_batch(reward_fn, rollouts.responses, rollouts.truths, context)
    apply_env_rewards(scores, rollouts.completions)
    weight = (cfg.rewards or {}).get("overlong")
    if weight:
        budget = environment_factory(cfg.env).episode_budget(cfg.max_new_tokens) if cfg.env else cfg.max_new_tokens
        if getattr(cfg, "agentic", False):  # an agent's episode: every id it sampled, against its budget
            budget = cfg.agents.max_tokens or cfg.agents.max_calls * cfg.max_new_tokens
        for score, c in zip(scores, rollouts.completions):
            sampled = sum(c.loss_mask) if c.loss_mask is not None else len(c.token_ids)
            penalty = soft_overlong_penalty(sampled, budget, cfg.overlong_buffer)
            score["reward"] = float(score["reward"]) + weight * penalty
            score["reward/overlong"] = penalty
    return scores, grading


def advantages_of(raw_rewards: torch.Tensor, group_size: int, spec: EstimatorSpec):
    """compute_advantages, with the rollouts that have no reward (NaN: every function said None) left out of
    their group's statistics and given advantage 0, as TRL's nan-mean and nan-std do. A group's remaining rows
    are a group of their own size; groups without such rows are computed together, unchanged."""
    unscored = torch.isnan(raw_rewards)
    if not unscored.any():
        return compute_advantages(raw_rewards, group_size, spec)
    advantages = torch.zeros_like(raw_rewards, dtype=torch.float32)
    groups = unscored.view(-1, group_size).any(dim=1)
    whole = (~groups).repeat_interleave(group_size)
    metadata = {}
    if whole.any():
        advantages[whole], metadata = compute_advantages(raw_rewards[whole], group_size, spec)
    zero_std = []
    for g in groups.nonzero().flatten().tolist():
        rows = torch.arange(g * group_size, (g + 1) * group_size)[~unscored[g * group_size:(g + 1) * group_size]]
        if len(rows):
            advantages[rows], _ = compute_advantages(raw_rewards[rows], len(rows), spec)
        zero_std.append(float(len(rows) < 2 or bool((raw_rewards[rows] == raw_rewards[rows][0]).all())))
    full = int(whole.sum()) // group_size
    frac = (float(metadata.get("frac_groups_zero_std", 0.0)) * full + sum(zero_std)) / (full + len(zero_std))
    scored = raw_rewards[~unscored]
    return advantages, {**metadata, "frac_groups_zero_std": torch.tensor(frac),
                        "reward_std": scored.std() if scored.numel() > 1 else torch.zeros(())}


def _correctness(scores: list[dict], algorithm: str) -> torch.Tensor:
    """RFT's indicator, MaxRL's success: the answer signal, which must be 0 or 1 (NaN: no reward)."""
    values = torch.tensor([float(s["answer_reward"]) for s in scores])
    odd = values[~torch.isnan(values) & (values != 0) & (values != 1)]
    if odd.numel():
        raise ValueError(f"algorithm={algorithm} trains on correctness, a 0/1 signal, and the answer signal took the "
                         f"value {float(odd[0]):g}: with reward functions of your own it is their weighted reward "
                         "unless answer_term= names a term that scores 0 or 1")
    return values


def _warn_unscored(scores: list[dict], rollouts: Rollouts) -> None:
    unscored = [j for j, s in enumerate(scores) if math.isnan(float(s["reward"]))]
    if unscored:
        c = rollouts.completions[unscored[0]]
        row = rollouts.questions[c.prompt_index]
        log.warning("%d of %d rollouts got None from every reward function (e.g. row %s, response %r): they are "
                    "left out of their group's mean and std and trained with advantage 0; make at least one "
                    "function score every row", len(unscored), len(scores), row.id, c.text[:80])


def score_rollouts(rollouts: Rollouts, reward_fn, spec: EstimatorSpec, cfg: TrainConfig, tokenizer,
                   graded: tuple[list[dict], dict] | None = None) -> Scored:
    """Rewards and advantages over the whole rollout batch, then the tokens the update trains on. `graded`:
    the batch's (scores, grading counts) when they are known already (dynamic sampling graded them)."""
    scores, grading = graded if graded is not None else score_completions(reward_fn, rollouts, cfg)
    _warn_unscored(scores, rollouts)
    raw_rewards, reward_meta = rewards_and_metadata(scores, grading)
    if spec.reward_signal == "correctness":  # RFT's indicator, MaxRL's success: shaping does not enter
        raw_rewards = _correctness(scores, cfg.algorithm)
    advantages, adv_meta = advantages_of(raw_rewards, cfg.group_size, spec)  # over episodes, not sequences
    truncated = rollouts.truncated
    rows = None
    if is_agentic(rollouts.completions):  # an episode is the sequences its calls made, each with its advantage
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        input_ids, labels, mask, sampled, rows = sequence_batch(rollouts.completions, pad)
        owner = torch.tensor([j for j, of in enumerate(rows) for _ in of] or [0], dtype=torch.long)
        advantages = advantages[owner] if any(rows) else torch.zeros(1)
        truncated = truncated[owner] if any(rows) else torch.zeros(1, dtype=torch.bool)
        tokens, unknown = {"input_ids": input_ids, "labels": labels, "response_mask": mask}, 0
    else:
        # the sampled ids are what is trained (EOS included when it was sampled), never the text encoded again
        tokens = tokenize_prompt_and_ids([rollouts.prompts[c.prompt_index] for c in rollouts.completions],
                                         [c.token_ids for c in rollouts.completions], tokenizer,
                                         [c.loss_mask for c in rollouts.completions])
        sampled, unknown = sampled_log_probs(rollouts.completions, tokens["labels"], tokens["response_mask"])
    mask = tokens["response_mask"]
    if spec.mask_truncated_completions:
        mask = mask & ~truncated.unsqueeze(-1)
        advantages = torch.where(truncated, torch.zeros_like(advantages), advantages)
    batch = TrainBatch(tokens["input_ids"], tokens["labels"], mask, advantages,
                       rollout_log_probs=sampled if unknown < len(rollouts.completions) else None)
    return Scored(scores, reward_meta, adv_meta, batch, unknown, rows)

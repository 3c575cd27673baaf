"""`rlvr train`: the RL loop of seed 004 Algorithm 1, for every estimator (preset or user-registered).

    for step in 1..steps:
        rollouts   <- G samples for each of the next questions, from the engine (weights synced)  Rollouts
        scored     <- rewards, advantages over the whole rollout batch, tokens                   TrainBatch
        [teacher log-probs -> per-token advantages]                                (distill > 0: opd)
        [old log-probs of train batches 2..k, once, before the first update]      (off-policy)
        [reference log-probs]                                                      (beta > 0)
        for each of the k = steps_per_rollout train batches: one policy_gradient_update
        log; validate every eval_every; checkpoint every save_every

Entry logic (seed 000): if `out` already holds a finished model, it is evaluated instead of trained.
Every rollout is reproducible from (seed, step, question, sample index).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import statistics
import time
from contextlib import contextmanager
from pathlib import Path

import torch

from rlvr import checkpoint as ckpt
from rlvr.algorithms import EstimatorSpec, compute_advantages
from rlvr.config import TrainConfig, sampling_params
from rlvr.data import DataOrder, Example, load_split
from rlvr.estimators import distill_advantages
from rlvr.evaluate import pass_at_k
from rlvr.hf_engine import HFEngine
from rlvr.loop_common import (StopRequests, build_engines, build_optimizer, frozen_dtype, load_frozen,
                              load_policy, native_precision, open_logger,
                              placement, restore, start_run, start_validation, trainer_state, validate)
from rlvr.policy import tokenize_prompt_and_ids
from rlvr.prompts import PromptTemplate, get_prompt
from rlvr.rewards import combine_rewards, format_reward_fn, get_reward_fn, rewards_and_metadata, score_batch
from rlvr.rollout import Completion, RolloutEngine
from rlvr.update import NonFiniteLoss, TrainBatch, policy_gradient_update, score_log_probs, trained_rows

log = logging.getLogger(__name__)


def build_reward_fn(cfg: TrainConfig, prompt_reward: str):
    """The prompt's reward, or a weighted combination such as {r1_zero: 1.0, format: 0.2} (seed 002)."""
    if not cfg.rewards:
        return get_reward_fn(prompt_reward)
    parts = []
    for name, weight in cfg.rewards.items():
        fn = format_reward_fn(prompt_reward) if name == "format" else get_reward_fn(name)
        parts.append((name, fn, weight))
    return combine_rewards(parts)


class RunMonitor:
    """Seed 002's warning signs: response length exploding, entropy collapsing, KL spiking, no signal."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens
        self.first_length: float | None = None
        self.first_entropy: float | None = None
        self.kl_history: list[float] = []
        self.no_signal_streak = 0

    def check(self, m: dict, trained: bool = True) -> list[str]:
        """Warnings for this step's metrics. A step that trained nothing (every rollout pruned) cannot have
        caused an entropy collapse or a KL spike, so those two never fire on it."""
        warnings = []
        length, entropy = m.get("rollout/mean_tokens"), m.get("train/token_entropy")
        if self.first_length is None and length:
            self.first_length = length
        if self.first_entropy is None and entropy:
            self.first_entropy = entropy
        if length and self.first_length and length > 2 * self.first_length and m.get("rollout/truncated_rate", 0) > 0.5:
            warnings.append(f"response length exploding: {length:.0f} tokens (started at {self.first_length:.0f}), "
                            f"{m['rollout/truncated_rate']:.0%} truncated -- read the rollouts for reward hacking")
        if trained and entropy is not None and self.first_entropy and entropy < 0.2 * self.first_entropy:
            warnings.append(f"entropy collapsing: {entropy:.3f} (started at {self.first_entropy:.3f}); "
                            "the reward will plateau -- lower the learning rate or raise the temperature")
        kl = m.get("train/kl")
        if kl is not None and trained:
            if len(self.kl_history) >= 3 and kl > 0.05 and kl > 5 * statistics.median(self.kl_history):
                warnings.append(f"KL spiking: {kl:.4f} vs median {statistics.median(self.kl_history):.4f} -- an "
                                "exploit or a learning rate that is too high")
            self.kl_history.append(kl)
        no_signal = m.get("train/frac_groups_zero_std", 0.0)
        self.no_signal_streak = self.no_signal_streak + 1 if no_signal > 0.8 else 0
        if self.no_signal_streak >= 3:
            warnings.append(f"{no_signal:.0%} of groups had no reward spread for {self.no_signal_streak} steps: "
                            "they teach nothing -- use easier questions, more samples, or SFT first")
        return warnings

    def state(self) -> dict:
        return dict(vars(self))

    def load(self, state: dict) -> None:
        vars(self).update(state)


# ----------------------------------------------------------------------------------------------------
# The stages of one step, with typed records between them.


@dataclasses.dataclass
class Rollouts:
    """One rollout batch: the questions, their prompts and G completions each (prompt-major)."""

    questions: list[Example]
    prompts: list[str]
    completions: list[Completion]

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


def sampled_log_probs(completions: list[Completion], labels: torch.Tensor, response_mask: torch.Tensor):
    """The engine's sampling-time log-probs placed at the batch's response positions, (N, T), NaN elsewhere and
    for a row whose engine gave none (or whose trained ids are not its sampled ids: a guard, score_rollouts
    trains the sampled ids). Returns (log-probs, rows unknown)."""
    out = torch.full(labels.shape, float("nan"))
    unknown = 0
    for j, c in enumerate(completions):
        positions = response_mask[j].nonzero().squeeze(-1)
        ids = labels[j, positions].tolist()
        if c.logprobs is not None and list(c.token_ids) == ids and len(c.logprobs) == len(ids):
            out[j, positions] = torch.tensor(c.logprobs, dtype=torch.float32)
        elif ids:
            unknown += 1
    return out, unknown


@contextmanager
def _timed(times: dict, phase: str):
    start = time.perf_counter()
    yield
    times[phase] = times.get(phase, 0.0) + time.perf_counter() - start


def next_questions(train: list[Example], order: DataOrder, prompt: PromptTemplate, tokenizer, cfg: TrainConfig,
                   count: int | None = None):
    """The next `count` questions (default: a rollout batch's) and their prompts."""
    questions = [train[i] for i in order.take(count or cfg.rollout_batch_size // cfg.group_size)]
    return questions, [prompt.format(q.question, tokenizer) for q in questions]


def rollout_sampling(cfg: TrainConfig, prompt: PromptTemplate, step: int):
    """Step `step`'s sampling: the seed makes every rollout a function of (seed, step, question, sample). The
    engine reports its sampling log-probs: the update measures and corrects the rollout-vs-trainer mismatch."""
    sampling = sampling_params(cfg, stop=prompt.stop, seed=cfg.seed * 1_000_003 + step)
    return dataclasses.replace(sampling, logprobs=True)


def collect_rollouts(engine: RolloutEngine, model, train: list[Example], order: DataOrder, prompt: PromptTemplate,
                     tokenizer, cfg: TrainConfig, step: int) -> Rollouts:
    questions, prompts = next_questions(train, order, prompt, tokenizer, cfg)
    engine.sync_weights(model)
    return Rollouts(questions, prompts, engine.generate(prompts, rollout_sampling(cfg, prompt, step)))


def dynamic_rollouts(engine: RolloutEngine, model, train: list[Example], order: DataOrder, prompt: PromptTemplate,
                     tokenizer, cfg: TrainConfig, step: int, reward_fn, spec: EstimatorSpec):
    """DAPO's dynamic sampling, for every estimator: a group teaches nothing when the run's own estimator gives
    it zero advantage on every rollout (a mean baseline: rewards without spread; no baseline, as in rft and
    reinforce: all wrong; DAPO's masking: every rollout with signal truncated; a registered advantage: whatever
    it says), so such groups are dropped and new questions sampled in their place, up to
    `dynamic_sampling_rounds` generations, until the batch holds rollout_batch_size / group_size groups with
    signal (the first round generates `dynamic_sampling_questions` questions when set, later rounds as many as
    the keep rate so far says will fill the batch). Short of that, the step trains the groups it found; none
    found: the last round's first groups, never more rows than the configured batch. Each group is judged by
    the advantage function on that group alone (a group estimator's advantages are exactly that).

    Returns the batch, what the sampling cost (`train/dynamic_*`), the batch's (scores, grading counts of every
    round) for `score_rollouts`, so nothing is graded twice, and (everything sampled, its scores) for the
    step's rollout metrics."""
    want, g = cfg.rollout_batch_size // cfg.group_size, cfg.group_size
    key = "answer_reward" if spec.reward_signal == "correctness" else "reward"  # the advantage's signal
    questions, prompts, completions, kept_scores = [], [], [], []
    everything = Rollouts([], [], [])
    every_score: list[dict] = []
    grading: dict[str, float] = {}
    sampled, right, rounds = 0, 0.0, 0
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
        batch = Rollouts(new_q, new_p, engine.generate(new_p, sampling))
        rounds += 1
        scores, counts = score_batch(reward_fn, batch.responses, batch.truths)
        for name, value in counts.items():
            grading[name] = grading.get(name, 0) + value
        sampled += len(scores)
        right += sum(float(s["answer_reward"]) for s in scores)
        offset = len(everything.questions)
        everything.questions += new_q
        everything.prompts += new_p
        everything.completions += [dataclasses.replace(c, prompt_index=c.prompt_index + offset)
                                   for c in batch.completions]
        every_score += scores
        last = batch, scores
        for q in range(len(new_q)):
            group = slice(q * g, (q + 1) * g)
            advantages, _ = compute_advantages(torch.tensor([float(s[key]) for s in scores[group]]), g, spec)
            if spec.mask_truncated_completions:  # score_rollouts zeroes these, so they carry no signal
                advantages = torch.where(batch.truncated[group], torch.zeros_like(advantages), advantages)
            if bool((advantages != 0).any()) and len(questions) < want:  # extras beyond a full batch are dropped
                completions += [dataclasses.replace(c, prompt_index=len(questions)) for c in batch.completions[group]]
                kept_scores += scores[group]
                questions.append(new_q[q])
                prompts.append(new_p[q])
    meta = {"train/dynamic_rounds": rounds, "train/dynamic_kept_groups": len(questions),
            "train/dynamic_sampled_rollouts": sampled, "train/sampled_answer_reward": right / max(sampled, 1)}
    if not questions:  # nothing had signal: the last round's first batch of groups (a zero-gradient step)
        batch, scores = last
        kept = Rollouts(batch.questions[:want], batch.prompts[:want], batch.completions[: want * g])
        return kept, meta, (scores[: want * g], grading), (everything, every_score)
    return Rollouts(questions, prompts, completions), meta, (kept_scores, grading), (everything, every_score)


def score_rollouts(rollouts: Rollouts, reward_fn, spec: EstimatorSpec, cfg: TrainConfig, tokenizer,
                   graded: tuple[list[dict], dict] | None = None) -> Scored:
    """Rewards and advantages over the whole rollout batch, then the tokens the update trains on. `graded`:
    the batch's (scores, grading counts) when they are known already (dynamic sampling graded them)."""
    scores, grading = graded if graded is not None else score_batch(reward_fn, rollouts.responses, rollouts.truths)
    raw_rewards, reward_meta = rewards_and_metadata(scores, grading)
    if spec.reward_signal == "correctness":  # RFT's indicator, MaxRL's success: shaping does not enter
        raw_rewards = torch.tensor([float(s["answer_reward"]) for s in scores])
    advantages, adv_meta = compute_advantages(raw_rewards, cfg.group_size, spec)
    # the sampled ids are what is trained (EOS included when it was sampled), never the text encoded again
    tokens = tokenize_prompt_and_ids([rollouts.prompts[c.prompt_index] for c in rollouts.completions],
                                     [c.token_ids for c in rollouts.completions], tokenizer)
    mask = tokens["response_mask"]
    sampled, unknown = sampled_log_probs(rollouts.completions, tokens["labels"], mask)
    if spec.mask_truncated_completions:
        truncated = rollouts.truncated
        mask = mask & ~truncated.unsqueeze(-1)
        advantages = torch.where(truncated, torch.zeros_like(advantages), advantages)
    batch = TrainBatch(tokens["input_ids"], tokens["labels"], mask, advantages,
                       rollout_log_probs=sampled if unknown < len(rollouts.completions) else None)
    return Scored(scores, reward_meta, adv_meta, batch, unknown)


def train_on_rollouts(model, optimizer, scheduler, reference, batch: TrainBatch, spec: EstimatorSpec,
                      cfg: TrainConfig, step: int, times: dict, parallel=None, teacher=None) -> list[dict]:
    """The k = steps_per_rollout optimizer steps on one rollout batch (k > 1 is off-policy). `parallel`: this
    process is one data-parallel learner of several (rlvr.parallel); it scores and trains its rows only.
    `teacher`: on-policy distillation's, for distill_kl reverse / forward (its KL is part of every update's loss).
    pi_old is the policy before this batch's first update (the live policy in that update, scored before it
    for the later ones), in every mode; the sampler's own log-probs (`batch.rollout_log_probs`: its numerics,
    in async RL its older weights) enter through `cfg.rollout_correction`, as in decoupled PPO."""
    k = spec.steps_per_rollout
    rows = list(range(len(batch)))
    if k > 1:
        random.Random(f"{cfg.seed}-{step}-minibatches").shuffle(rows)
    size = math.ceil(len(rows) / k)  # train_batch_size, unless dynamic sampling found fewer groups
    splits = [split for split in (rows[i * size : (i + 1) * size] for i in range(k)) if split]

    def my_rows(split: list[int]) -> list[int]:
        """The rows of a train batch this learner backpropagates: the ones policy_gradient_update will pick."""
        part = batch.rows(split)
        local = trained_rows(part, spec)
        if parallel is not None:
            local = parallel.shard(local, part.input_ids, part.response_mask)
        return [split[j] for j in local]

    with _timed(times, "old_logprobs"):
        if spec.needs_old_log_probs and k > 1:  # before any update; the first uses the live policy
            later = [r for split in splits[1:] for r in my_rows(split)]
            batch.old_log_probs = score_log_probs(model, batch.input_ids, batch.labels, batch.response_mask,
                                                  cfg.microbatch_size, cfg.precision, rows=later,
                                                  share_prefix=cfg.share_prefix, temperature=cfg.temperature)
    with _timed(times, "reference"):
        if spec.beta > 0:
            batch.reference_log_probs = _reference_log_probs(
                reference, model, batch, cfg,
                rows=None if parallel is None else [r for split in splits for r in my_rows(split)])
    updates = []
    with _timed(times, "train"):
        for i, split in enumerate(splits):
            part = batch.rows(split)
            if i == 0:
                part.old_log_probs = None  # the live policy is pi_old for the first update
            try:
                loss, meta = policy_gradient_update(
                    model, optimizer, part, spec, math.ceil(len(split) / cfg.microbatch_size), cfg.max_grad_norm,
                    on_policy_ratio=spec.needs_old_log_probs and part.old_log_probs is None, precision=cfg.precision,
                    share_prefix=cfg.share_prefix, temperature=cfg.temperature, parallel=parallel,
                    rollout_correction=cfg.rollout_correction.spec(), teacher=teacher)
                updates.append({"loss": float(loss), **meta})
            except NonFiniteLoss as err:
                log.error("step %d, train batch %d: %s", step, i, err)
                updates.append({"nonfinite": 1.0})
            scheduler.step()
    return updates


# ----------------------------------------------------------------------------------------------------
# The loop.


def train_grpo(cfg: TrainConfig) -> dict:
    finished = ckpt.finished_model(Path(cfg.out))
    if finished is not None:
        return evaluate_finished(cfg, finished)
    if cfg.distributed.enabled:  # Ray roles: the same step, split over processes and machines
        from rlvr.cluster import train_distributed

        return train_distributed(cfg)
    where = placement(cfg)  # a device this machine lacks stops the run here, before anything is written
    ckpt.seed_everything(cfg.seed)
    prompt, spec = get_prompt(cfg.prompt), cfg.estimator
    train = load_split(cfg, "train", cfg.train_limit)
    val = load_split(cfg, "validation", cfg.eval_limit)
    run_dir = start_run(cfg)  # (after the data's checks: a run that cannot start leaves no directory behind)
    cfg = native_precision(cfg, where)
    reward_fn = build_reward_fn(cfg, prompt.reward)
    model, tokenizer, state = load_policy(cfg, run_dir, where.policy)
    optimizer, scheduler = build_optimizer(model, cfg, cfg.steps * spec.steps_per_rollout)
    reference = _reference_model(cfg, where.reference)
    teacher = _teacher_model(cfg, tokenizer, where.teacher)
    monitor = RunMonitor(cfg.max_new_tokens)
    step, order = restore(state, optimizer, scheduler, DataOrder(len(train), f"grpo-{cfg.seed}"))
    if state is not None:
        monitor.load(state["monitor"])
    logger = open_logger(run_dir, cfg, state)
    engine, val_engine = build_engines(model, tokenizer, cfg, where)
    if step == 0 and cfg.eval_at_start:
        metrics = start_validation(val_engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: accuracy %.3f, format %.3f", metrics["val/accuracy"], metrics["val/format_rate"])

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.algorithm}", unit="step")
    metrics: dict = {}
    with StopRequests() as stop:
        while step < cfg.steps:
            step += 1
            times: dict[str, float] = {}
            dynamic, graded, sampled = {}, None, None
            with _timed(times, "generate"):
                if cfg.dynamic_sampling:
                    rollouts, dynamic, graded, sampled = dynamic_rollouts(engine, model, train, order, prompt,
                                                                          tokenizer, cfg, step, reward_fn, spec)
                else:
                    rollouts = collect_rollouts(engine, model, train, order, prompt, tokenizer, cfg, step)
            with _timed(times, "score"):
                scored = score_rollouts(rollouts, reward_fn, spec, cfg, tokenizer, graded)
            with _timed(times, "teacher"):
                # (distill_kl reverse / forward: the update scores the teacher itself, logs train/teacher_kl_exact)
                distilled = distill_from_teacher(scored.batch, model, teacher, spec, cfg) \
                    if teacher is not None and not spec.exact_distill else {}
            updates = train_on_rollouts(model, optimizer, scheduler, reference, scored.batch, spec, cfg, step, times,
                                        teacher=teacher)

            metrics = {**_step_metrics(cfg, rollouts, scored, updates, times, scheduler.get_last_lr()[0], sampled),
                       **distilled,
                       **dynamic}
            if validation_due(cfg, step):
                with _timed(times, "validate"):
                    val_metrics, _ = validate(val_engine, model, val, prompt, tokenizer, cfg)
                metrics.update(val_metrics, **{"time/validate": times["validate"]})
            log_step(step, metrics, rollouts, scored, times, monitor, logger, bar, cfg)
            # the periodic checkpoint; on Ctrl-C / SIGTERM this step saved and the run stopped with one line
            stop.after_step(cfg, run_dir, step, "rlvr train", close=(bar.close, logger.close),
                            save=lambda: ckpt.save_checkpoint(
                                run_dir, step, model, tokenizer,
                                trainer_state(optimizer, scheduler, order, monitor=monitor.state()),
                                keep=cfg.keep_checkpoints))
    bar.close()
    summary = {"steps": step, "algorithm": cfg.algorithm,
               **{k_: v for k_, v in metrics.items() if k_.startswith("val/")}}
    final = ckpt.save_final(run_dir, model, tokenizer, summary)
    logger.close()
    log.info("training finished: %s; model in %s", finished_validation(summary), final)
    return {**summary, "final": str(final)}


def validation_due(cfg: TrainConfig, step: int) -> bool:
    return bool(cfg.eval_every and step % cfg.eval_every == 0 or (step == cfg.steps and cfg.eval_at_end))


def log_step(step: int, metrics: dict, rollouts: Rollouts, scored: Scored, times: dict, monitor: RunMonitor,
             logger, bar, cfg: TrainConfig) -> None:
    """The end of a step in every loop: seed 002's warnings, the metrics line, the sampled rollouts, the bar."""
    for warning in monitor.check(metrics, trained=metrics["train/trained_tokens"] > 0):
        log.warning("step %d: %s", step, warning)
        metrics.setdefault("warnings", []).append(warning)
    logger.log(step, metrics)
    if cfg.log_rollouts_every and (step % cfg.log_rollouts_every == 0 or step == 1):
        logger.log_rows("rollouts", step, _rollout_rows(rollouts, scored))
    bar.update(1)
    bar.set_postfix(reward=f"{metrics['train/reward']:.3f}", gen=f"{times['generate']:.0f}s",
                    train=f"{times['train']:.0f}s", **({"val": f"{metrics['val/accuracy']:.3f}"}
                                                       if "val/accuracy" in metrics else {}))


def finished_validation(summary: dict) -> str:
    if "val/accuracy" not in summary:
        return "no validation (eval_at_end=false and no eval_every step)"
    return f"validation accuracy {summary['val/accuracy']:.3f}, format rate {summary['val/format_rate']:.3f}"


def distill_from_teacher(batch: TrainBatch, model, teacher, spec: EstimatorSpec, cfg: TrainConfig) -> dict:
    """On-policy distillation: the teacher scores every token the student sampled, and the batch's
    advantages become per token, A_t = A_reward + distill * sum_t' gamma^(t'-t) (log p_teacher - log p_student)
    (`estimators.distill_advantages`). The student is scored at the sampling temperature, as the policy
    gradient scores it; the teacher at temperature 1, its own distribution. Returns the step's metrics.
    (With distill_kl reverse / forward this is not called: the update adds the exact KL to the loss itself.)"""
    args = (batch.input_ids, batch.labels, batch.response_mask, cfg.microbatch_size, cfg.precision)
    student = score_log_probs(model, *args, share_prefix=cfg.share_prefix, temperature=cfg.temperature)
    # a teacher padded past the student's vocabulary is a distribution over the student's ids
    teacher_lp = score_log_probs(teacher, *args, share_prefix=cfg.share_prefix, temperature=1.0,
                                 vocab=model.get_output_embeddings().weight.shape[0])
    mask = batch.response_mask
    per_token = distill_advantages(student, teacher_lp, mask, spec.distill_discount)
    batch.advantages = (batch.advantages.unsqueeze(-1) * mask + spec.distill * per_token).masked_fill(~mask, 0.0)
    gap = (student - teacher_lp).masked_fill(~mask, 0.0)  # log p_student - log p_teacher of the sampled tokens
    tokens = max(int(mask.sum()), 1)
    rows = mask.any(dim=1)
    return {"train/teacher_reverse_kl": float(gap.sum()) / tokens,  # per token (k1 estimate, on-policy)
            "train/teacher_reverse_kl_per_sequence": float(gap.sum(dim=1)[rows].mean()) if rows.any() else 0.0,
            "train/teacher_log_prob": float(teacher_lp.masked_fill(~mask, 0.0).sum()) / tokens}


def _teacher_model(cfg: TrainConfig, tokenizer, device="cpu"):
    """The frozen teacher of on-policy distillation; it must share the student's tokenizer (the signal
    compares the two models' log-probs of the same token ids)."""
    if not cfg.teacher or not cfg.distill:  # a teacher named in a shared config is unused without distill
        return None
    teacher, teacher_tokenizer = load_frozen(cfg.teacher, device, frozen_dtype(cfg.precision, device))
    if teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(f"teacher={cfg.teacher!r} and model={cfg.model!r} have different tokenizers "
                         f"({len(teacher_tokenizer)} vs {len(tokenizer)} tokens); on-policy distillation "
                         "compares log-probs of the same token ids, so they must share one")
    # one tokenizer, but the embedding matrices may be padded to other sizes: the exact KL compares the ids
    # both models have (rlvr.policy._scores), which must hold every id of the tokenizer
    rows = teacher.get_output_embeddings().weight.shape[0]
    if rows < len(tokenizer):
        raise ValueError(f"teacher={cfg.teacher!r} scores {rows} token ids, fewer than the tokenizer's "
                         f"{len(tokenizer)}: it cannot score every token the student may sample")
    return teacher


def _reference_model(cfg: TrainConfig, device="cpu"):
    """A frozen copy of the starting policy (`model=`, also after a resume) for the KL term, on its own device;
    with LoRA the adapter-free base serves."""
    if not cfg.beta:
        return None
    if cfg.lora_rank > 0:
        return None  # `disable_adapter()` on the policy itself gives the reference
    return load_frozen(cfg.model, device, frozen_dtype(cfg.precision, device))[0]


def _reference_log_probs(reference, model, batch: TrainBatch, cfg: TrainConfig, rows: list[int] | None = None):
    args = (batch.input_ids, batch.labels, batch.response_mask, cfg.microbatch_size, cfg.precision)
    kwargs = dict(share_prefix=cfg.share_prefix, temperature=cfg.temperature, rows=rows)
    if reference is not None:
        return score_log_probs(reference, *args, **kwargs)
    with model.disable_adapter():
        return score_log_probs(model, *args, **kwargs)


def _rollout_rows(rollouts: Rollouts, scored: Scored) -> list[dict]:
    truths = rollouts.truths
    return [{"question": rollouts.questions[c.prompt_index].question, "ground_truth": truths[j], "response": c.text,
             "reward": scored.scores[j]["reward"], "format_reward": scored.scores[j]["format_reward"],
             "answer_reward": scored.scores[j]["answer_reward"], "advantage": _row_advantage(scored.batch, j),
             "tokens": len(c.token_ids), "finish_reason": c.finish_reason, "sample_index": c.sample_index,
             "token_ids": list(c.token_ids)}  # what was trained (the text is its decoding)
            for j, c in enumerate(rollouts.completions)]


def _row_advantage(batch: TrainBatch, row: int) -> float:
    """A rollout's advantage; for per-token advantages (distillation), their mean over its response."""
    if batch.advantages.dim() == 1:
        return float(batch.advantages[row])
    mask = batch.response_mask[row]
    return float(batch.advantages[row][mask].mean()) if mask.any() else 0.0


def _group_pass_at_k(correct: list[float], group_size: int) -> dict[str, float]:
    groups = [correct[i : i + group_size] for i in range(0, len(correct), group_size)]
    return {f"train/pass@{k}": sum(pass_at_k(group_size, int(sum(g)), k) for g in groups) / len(groups)
            for k in range(1, group_size + 1)}


def _rollout_shape(completions: list[Completion], prefix: str = "") -> dict:
    lengths = [len(c.token_ids) for c in completions]
    return {f"rollout/{prefix}mean_tokens": sum(lengths) / len(lengths), f"rollout/{prefix}max_tokens": max(lengths),
            f"rollout/{prefix}truncated_rate": sum(c.finish_reason == "length" for c in completions) / len(completions)}


def _step_metrics(cfg, rollouts: Rollouts, scored: Scored, updates, times, lr: float,
                  sampled: tuple[Rollouts, list[dict]] | None = None) -> dict:
    """The step's metrics. `sampled`: (everything generated, its scores) when dynamic sampling kept only part
    of it: rollout/*, train/pass@k and the generation rate then describe everything sampled, and the kept
    batch's numbers sit beside them (rollout/kept_*, train/kept_pass@k)."""
    completions, reward_meta = rollouts.completions, scored.reward_meta
    every, every_scores = sampled if sampled is not None else (rollouts, scored.scores)
    lengths = [len(c.token_ids) for c in every.completions]
    ok = [u for u in updates if "nonfinite" not in u]
    # an update on a fully pruned train batch is a zero-gradient step: its loss and grad norm are 0 by
    # construction, and averaging them in would make a step look quieter than its training was
    trained = [u for u in ok if u["trained_rollouts"] > 0]
    entropies = [e for c in completions for e in (c.entropies or [])]
    m = {
        "train/reward": reward_meta["reward_mean"],
        "train/format_reward": reward_meta["format_reward_mean"],
        "train/answer_reward": reward_meta["answer_reward_mean"],
        "train/frac_groups_zero_std": float(scored.adv_meta["frac_groups_zero_std"]),
        "train/reward_std": float(scored.adv_meta["reward_std"]),
        **_rollout_shape(every.completions),
        "train/lr": lr,
        "train/nonfinite_steps": len(updates) - len(ok),
        "train/updates_trained": len(trained),
        "train/trained_tokens": sum(u["trained_tokens"] for u in ok),
    }
    if entropies:  # the whole rollout batch's, from the sampler: pruning cannot bias it
        m["train/token_entropy"] = sum(entropies) / len(entropies)
    for key, value in reward_meta.items():
        if key.startswith("reward/"):
            m[f"train/{key.removesuffix('_mean')}"] = value
        elif key.startswith("grading/") and key != "grading/seconds":
            m[key] = value
    m.update(_group_pass_at_k([s["answer_reward"] for s in every_scores], cfg.group_size))
    if sampled is not None:
        m.update(_rollout_shape(completions, "kept_"))
        kept = _group_pass_at_k([s["answer_reward"] for s in scored.scores], cfg.group_size)
        m.update({k.replace("train/", "train/kept_"): v for k, v in kept.items()})
    if ok:
        m["train/pruned_fraction"] = sum(u["pruned_fraction"] for u in ok) / len(ok)
    if trained:
        for key in ("loss", "grad_norm", "clip_fraction", "kl", "ratio_mean", "teacher_kl_exact"):
            values = [u[key] for u in trained if key in u]
            if values:
                m[f"train/{key}"] = sum(values) / len(values)
        m["train/grad_norm_max"] = max(u["grad_norm"] for u in trained)
        if any("ratio_max" in u for u in trained):
            m["train/ratio_max"] = max(u["ratio_max"] for u in trained if "ratio_max" in u)
            m["train/ratio_min"] = min(u["ratio_min"] for u in trained if "ratio_min" in u)
        if any("is_weight_mean" in u for u in trained):
            weighted = [u for u in trained if "is_weight_mean" in u]
            tokens = max(sum(u["trained_tokens"] for u in weighted), 1)
            for key in ("is_weight_mean", "is_capped_fraction", "is_masked_fraction"):
                m[f"train/{key}"] = sum(u[key] * u["trained_tokens"] for u in weighted) / tokens
            m["train/is_weight_max"] = max(u["is_weight_max"] for u in weighted)
        measured = [u for u in trained if "mismatch_kl" in u]
        if measured:  # the engine's sampling log-probs against the trainer's pi_old, over the trained tokens
            tokens = sum(u["mismatch_tokens"] for u in measured)
            for key in ("mismatch_kl", "mismatch_outside_band_fraction"):
                m[f"train/{key}"] = sum(u[key] * u["mismatch_tokens"] for u in measured) / tokens
            m["train/mismatch_max_abs_log_ratio"] = max(u["mismatch_max_abs_log_ratio"] for u in measured)
        m["train/trained_token_entropy"] = (sum(u["trained_token_entropy_sum"] for u in trained)
                                            / max(m["train/trained_tokens"], 1))
    for phase, seconds in times.items():
        m[f"time/{phase}"] = seconds
    m["time/step"] = sum(times.values())
    m["time/generate_tokens_per_second"] = sum(lengths) / max(times["generate"], 1e-9)
    if trained and times["train"] > 0:
        m["time/train_tokens_per_second"] = m["train/trained_tokens"] / times["train"]
    return m


def evaluate_finished(cfg: TrainConfig, final: Path) -> dict:
    """Seed 000's entry logic: a finished run is evaluated, not trained again."""
    from rlvr.models import load_model

    log.info("%s holds a finished model; evaluating it instead of training", final)
    where = placement(cfg)
    if cfg.grades_code:
        cfg.sandbox.apply()
    cfg = native_precision(cfg, where)
    model, tokenizer = load_model(str(final), device=where.eval)
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype)
    val = load_split(cfg, "validation", cfg.eval_limit)
    metrics, _ = validate(engine, model, val, get_prompt(cfg.prompt), tokenizer, cfg)
    log.info("finished model: %s", ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return {**metrics, "final": str(final), "already_finished": True}

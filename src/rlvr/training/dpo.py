"""`rlvr dpo`: Direct Preference Optimization (seed 004's optional part) with a frozen reference model.

Pairs come from the verifier (`pairs=rollouts`, the default): each step the policy samples `group_size`
answers to each of `questions_per_step` questions, the reward function grades them, and a right and a wrong
answer to the same question make a pair (questions whose answers are all right or all wrong give none):
online DPO, the preference-learning counterpart of GRPO at the same rollout cost. Or they come from a JSONL
(`pairs=file.jsonl`, rows {"question", "chosen", "rejected"}). The loop reads top to bottom:

    pairs -> reference log-probs (no grad, once per step) -> microbatched DPO loss (`estimators.dpo_loss`)
    -> clip -> AdamW step -> log -> validate -> checkpoint
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from pathlib import Path

import torch

from rlvr import stages
from rlvr.algorithms.losses import dpo_loss
from rlvr.algorithms.policy import autocast, get_response_log_probs, tokenize_prompt_and_ids
from rlvr.config import DPOConfig
from rlvr.core import checkpoint as ckpt
from rlvr.core.devices import input_device
from rlvr.engines.base import SamplingParams
from rlvr.stages.validation import validate, validation_rows
from rlvr.tasks.prompts import PromptTemplate
from rlvr.tasks.records import DataError, DataOrder, Example, jsonl_rows
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.scoring import rewards_and_metadata
from rlvr.tasks.task import eval_reward_fn, load_task

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Pair:
    """A preference: for this question, `chosen` is better than `rejected`."""

    question: str
    chosen: str
    rejected: str
    id: str = ""
    # sampled pairs (online DPO) carry the ids the engine sampled, and those are trained; pairs from a file
    # have text only, which is tokenised
    chosen_ids: tuple[int, ...] | None = None
    rejected_ids: tuple[int, ...] | None = None
    example: Example | None = None  # the row a sampled pair came from: its prompt is rendered from all its columns

    def prompt(self, template: PromptTemplate, tokenizer) -> str:
        return template.render(self.example, tokenizer) if self.example else template.format(self.question, tokenizer)

    def response(self, side: str) -> str | tuple[int, ...]:
        ids = self.chosen_ids if side == "chosen" else self.rejected_ids
        return ids if ids is not None else getattr(self, side)


def load_pairs(path: str | Path) -> list[Pair]:
    """Pairs from a JSONL of {"question", "chosen", "rejected"} (strings); a bad line names file and line."""
    path = Path(path)
    pairs = []
    for lineno, where, row in jsonl_rows(path):
        for field in ("question", "chosen", "rejected"):
            if not isinstance(row.get(field), str) or not row[field].strip():
                raise DataError(f"{where}: field {field!r} must be a non-empty string")
        pairs.append(Pair(row["question"], row["chosen"], row["rejected"], id=f"{path.stem}:{lineno}"))
    if not pairs:
        raise DataError(f"{path}: no pairs (the file is empty)")
    return pairs


def rollout_pairs(engine, questions: list[Example], prompt: PromptTemplate, reward_fn, cfg: DPOConfig, step: int,
                  tokenizer) -> tuple[list[Pair], dict]:
    """Sample `group_size` answers per question, grade them, and pair right answers with wrong ones."""
    sampling = SamplingParams(temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, stop=prompt.stop,
                              n=cfg.group_size, seed=cfg.seed * 1_000_003 + step)
    prompts = [prompt.render(q, tokenizer) for q in questions]
    completions = engine.generate(prompts, sampling)
    truths = [questions[c.prompt_index].answer for c in completions]
    scores, grading = score_batch(reward_fn, [c.text for c in completions], truths,
                                  RewardContext.of_completions(completions, prompts, questions, step,
                                                               template=prompt))
    _, meta = rewards_and_metadata(scores, grading)
    right: dict[int, dict[str, tuple[int, ...]]] = {}
    wrong: dict[int, dict[str, tuple[int, ...]]] = {}
    for c, s in zip(completions, scores):
        bucket = (right if s["answer_reward"] > 0 else wrong).setdefault(c.prompt_index, {})
        bucket.setdefault(c.text, tuple(c.token_ids))  # the same text twice is no extra evidence
    pairs = []
    for i, q in enumerate(questions):
        for (chosen, c_ids), (rejected, r_ids) in list(zip(right.get(i, {}).items(),
                                                            wrong.get(i, {}).items()))[: cfg.pairs_per_question]:
            pairs.append(Pair(q.question, chosen, rejected, id=q.id, chosen_ids=c_ids, rejected_ids=r_ids, example=q))
    metrics = {"train/reward": meta["reward_mean"], "train/answer_reward": meta["answer_reward_mean"],
               "train/format_reward": meta["format_reward_mean"], "train/pairs": len(pairs),
               "train/questions_with_pair": len({p.id for p in pairs}) / len(questions),
               **{k: v for k, v in meta.items() if k.startswith("grading/") and k != "grading/seconds"}}
    return pairs, metrics


def _sequence_log_probs(model, prompts: list[str], responses: list, tokenizer, cfg: DPOConfig):
    """Summed log-prob of each response (text, or the token ids it was sampled as) given its prompt, (P,),
    with gradient when enabled."""
    ids = [tokenizer(r, add_special_tokens=False)["input_ids"] if isinstance(r, str) else r for r in responses]
    tok = tokenize_prompt_and_ids(prompts, ids, tokenizer)
    with autocast(cfg.precision, model):
        out = get_response_log_probs(model, tok["input_ids"], tok["labels"], positions=tok["response_mask"],
                                     share_prefix=cfg.share_prefix)
    log_probs = out["log_probs"].float()
    return (log_probs * tok["response_mask"].to(log_probs.device)).sum(dim=-1).to(input_device(model))


def _reference_log_probs(reference, model, pairs: list[Pair], prompt, tokenizer, cfg: DPOConfig):
    """(chosen, rejected) summed log-probs under the frozen reference, (P,) each."""
    prompts = [p.prompt(prompt, tokenizer) for p in pairs]
    scorer = model if reference is None else reference
    # LoRA: the adapter-free base is the reference
    base = model.disable_adapter() if reference is None else contextlib.nullcontext()
    chosen, rejected = [], []
    with torch.no_grad(), base:
        for m in range(0, len(pairs), cfg.microbatch_size):
            sl = slice(m, m + cfg.microbatch_size)
            for side, out in (("chosen", chosen), ("rejected", rejected)):
                responses = [p.response(side) for p in pairs[sl]]
                out.append(_sequence_log_probs(scorer, prompts[sl], responses, tokenizer, cfg))
    return torch.cat(chosen), torch.cat(rejected)


def dpo_update(model, optimizer, reference, pairs: list[Pair], prompt, tokenizer, cfg: DPOConfig) -> dict:
    """One optimizer step of the mean DPO loss over `pairs`, in microbatches of pairs (chosen and
    rejected of a pair are always scored in the same microbatch)."""
    ref_chosen, ref_rejected = _reference_log_probs(reference, model, pairs, prompt, tokenizer, cfg)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "rewards_chosen": 0.0, "rewards_rejected": 0.0, "margin": 0.0, "accuracy": 0.0}
    per_mb = max(1, cfg.microbatch_size // 2)
    for m in range(0, len(pairs), per_mb):
        mb = pairs[m : m + per_mb]
        prompts = [p.prompt(prompt, tokenizer) for p in mb]
        responses = [p.response("chosen") for p in mb] + [p.response("rejected") for p in mb]
        logps = _sequence_log_probs(model, prompts + prompts, responses, tokenizer, cfg)
        chosen, rejected = logps[: len(mb)], logps[len(mb):]
        ref = [r[m : m + len(mb)].to(logps.device) for r in (ref_chosen, ref_rejected)]  # the reference's device
        loss, meta = dpo_loss(chosen, rejected, *ref, cfg.beta)
        (loss.sum() / len(pairs)).backward()  # the mean over all pairs of the step
        totals["loss"] += float(loss.detach().sum())
        for key in ("rewards_chosen", "rewards_rejected", "margin", "accuracy"):
            totals[key] += float(meta[key]) * len(mb)
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                               cfg.max_grad_norm or float("inf"))
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return {f"train/{k}": v / len(pairs) for k, v in totals.items()} | {"train/grad_norm": float(grad_norm)}


def _frozen_reference(cfg: DPOConfig, device):
    if cfg.lora_rank > 0:
        return None  # the adapter-free base of the policy itself
    return stages.load_frozen(cfg.model, device, stages.frozen_dtype(cfg.precision, device))[0]


# ----------------------------------------------------------------------------------------------------
# The loop.


def train_dpo(cfg: DPOConfig) -> dict:
    done = ckpt.finished_model(Path(cfg.out))
    if done is not None:
        log.info("%s already holds a finished model; nothing to do", done)
        return {"final": str(done), "already_finished": True}
    where = stages.placement(cfg)  # a device this machine lacks stops the run here, before anything is written
    run_dir = stages.start_run(cfg)
    cfg = stages.native_precision(cfg, where)
    ckpt.seed_everything(cfg.seed)
    task = load_task(cfg)
    prompt, reward_fn = task.prompt, eval_reward_fn(cfg, task.prompt)
    from_rollouts = cfg.pairs == "rollouts"
    source = task.split("train", cfg.train_limit) if from_rollouts else load_pairs(cfg.pairs)
    val = validation_rows(task, cfg)
    if from_rollouts:  # every row's prompt fills and fits the model's context, before the model loads
        stages.check_before_loading(task, cfg, source + val)
    model, tokenizer, state = stages.load_policy(cfg, run_dir, where.policy)
    reference = _frozen_reference(cfg, where.reference)
    optimizer, scheduler = stages.build_optimizer(model, cfg, cfg.steps)
    step, order = stages.restore(state, optimizer, scheduler, DataOrder(len(source), f"dpo-{cfg.seed}"))
    logger = stages.open_logger(run_dir, cfg, state)
    engine, val_engine = stages.build_engines(model, tokenizer, cfg, where)
    if step == 0 and cfg.eval_at_start and val:
        metrics, _ = validate(val_engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: %s", stages.fmt_metrics(metrics))
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc="dpo", unit="step")
    metrics: dict = {}
    with stages.StopRequests() as stop:
        while step < cfg.steps:
            step += 1
            started = time.perf_counter()
            if from_rollouts:
                engine.sync_weights(model)
                questions = [source[i] for i in order.take(cfg.questions_per_step)]
                pairs, metrics = rollout_pairs(engine, questions, prompt, reward_fn, cfg, step, tokenizer)
            else:
                pairs, metrics = [source[i] for i in order.take(cfg.batch_size)], {}
            generated = time.perf_counter() - started
            lr = scheduler.get_last_lr()[0]
            if pairs:
                metrics.update(dpo_update(model, optimizer, reference, pairs, prompt, tokenizer, cfg))
            else:  # no question had both a right and a wrong answer: nothing to prefer, no step taken
                log.info("step %d: no preference pair in this batch", step)
            scheduler.step()
            metrics.update({"train/lr": lr, "train/epoch": order.epochs_done, "time/generate": generated,
                            "time/step_seconds": time.perf_counter() - started})
            if val and stages.validation_due(cfg, step):
                val_metrics, _ = validate(val_engine, model, val, prompt, tokenizer, cfg)
                metrics.update(val_metrics)
                log.info("step %d: %s", step, stages.fmt_metrics(metrics))
            logger.log(step, metrics)
            if cfg.log_rollouts_every and (step % cfg.log_rollouts_every == 0 or step == 1):
                logger.log_rows("pairs", step, [dataclasses.asdict(p) for p in pairs])
            bar.update(1)
            if "train/loss" in metrics:
                bar.set_postfix(loss=f"{metrics['train/loss']:.3f}", acc=f"{metrics['train/accuracy']:.2f}")
            # the periodic checkpoint; on Ctrl-C / SIGTERM this step saved and the run stopped with one line
            stop.after_step(cfg, run_dir, step, "rlvr dpo", close=(bar.close, logger.close),
                            save=lambda: ckpt.save_checkpoint(run_dir, step, model, tokenizer,
                                                              stages.trainer_state(optimizer, scheduler, order),
                                                              keep=cfg.keep_checkpoints))
    bar.close()
    return stages.finish_run(run_dir, model, tokenizer, step, metrics, logger, "DPO")

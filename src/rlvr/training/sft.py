"""`rlvr sft`: supervised fine-tuning on worked solutions written in the prompt's answer format (the r1_zero
format for math, a fenced Python block for code: `PromptTemplate.sft_response`).

RL sharpens what a model sometimes does and rarely invents it (seed 002); SmolLM2-135M never writes the
r1_zero format unprompted, so RL starts from this stage's checkpoint (seed 000). The loop reads top to
bottom: batch -> microbatched NLL (`sft_microbatch_train_step`) -> clip -> AdamW step -> log -> validate
-> checkpoint.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from rlvr import stages
from rlvr.algorithms.policy import (
    autocast,
    autocast_paused,
    get_response_log_probs,
    sft_microbatch_train_step,
    tokenize_prompt_and_ids,
    tokenize_prompt_and_output,
)
from rlvr.config import SFTConfig
from rlvr.core import checkpoint as ckpt
from rlvr.environments import environment_factory
from rlvr.stages.validation import validate, validation_rows
from rlvr.tasks.task import load_task
from rlvr.tasks.records import DataOrder

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------
# The SFT loop.


def tokenize_prompt_and_segments(prompts: list[str], segments: list[list[tuple[str, bool]]], tokenizer):
    """SFT targets in (text, trained) pieces, each tokenised alone as an episode's turns and observations are
    (`rlvr sft env=...`): the environment's pieces are context, out of the loss."""
    ids, masks = [], []
    for pieces in segments:
        row, mask = [], []
        for text, trained in pieces:
            piece = tokenizer(text, add_special_tokens=False).input_ids
            row += piece
            mask += [trained] * len(piece)
        ids.append(row)
        masks.append(mask)
    return tokenize_prompt_and_ids(prompts, ids, tokenizer, masks)


def train_sft(cfg: SFTConfig) -> dict:
    done = ckpt.finished_model(Path(cfg.out))
    if done is not None:
        log.info("%s already holds a finished model; nothing to do", done)
        return {"final": str(done), "already_finished": True}
    where = stages.placement(cfg)  # a device this machine lacks stops the run here, before anything is written
    ckpt.seed_everything(cfg.seed)
    task = load_task(cfg)
    prompt, train, val = task.prompt, task.split("train", cfg.train_limit), validation_rows(task, cfg)
    env = environment_factory(cfg.env) if cfg.env else None
    annotations = env is not None and env.sft_annotations
    for ex in train:  # an example without a target (a code row without a solution) fails before the model loads
        prompt.sft_response(ex, annotations)
    stages.check_before_loading(task, cfg, train + val)  # every row's prompt fills and fits the model's context
    run_dir = stages.start_run(cfg)  # (after the data's checks: a run that cannot start leaves no directory behind)
    cfg = stages.native_precision(cfg, where)
    model, tokenizer, state = stages.load_policy(cfg, run_dir, where.policy)
    optimizer, scheduler = stages.build_optimizer(model, cfg, cfg.steps)
    step, order = stages.restore(state, optimizer, scheduler, DataOrder(len(train), f"sft-{cfg.seed}"))
    logger = stages.open_logger(run_dir, cfg, state)
    engine = stages.build_engines(model, tokenizer, cfg, where, rollout=False)[1]  # validation only
    accumulation = cfg.batch_size // cfg.microbatch_size

    if step == 0 and cfg.eval_at_start and val:
        metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: %s", stages.fmt_metrics(metrics))
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc="sft", unit="step")
    with stages.StopRequests() as stop:
        while step < cfg.steps:
            started = time.perf_counter()
            batch = [train[i] for i in order.take(cfg.batch_size)]
            model.train()
            loss_total, tokens, nll = 0.0, 0, 0.0
            with autocast(cfg.precision, model):  # one region: each weight cast to bf16 once a step
                for m in range(0, cfg.batch_size, cfg.microbatch_size):
                    micro = batch[m : m + cfg.microbatch_size]
                    prompts = [prompt.render(ex, tokenizer) for ex in micro]
                    if env is None:
                        tok = tokenize_prompt_and_output(prompts, [prompt.sft_response(ex) for ex in micro], tokenizer)
                    else:
                        tok = tokenize_prompt_and_segments(prompts, [env(ex).sft_segments(prompt.sft_response(
                            ex, annotations)) for ex in micro], tokenizer)
                    out = get_response_log_probs(model, tok["input_ids"], tok["labels"],
                                                 positions=tok["response_mask"], share_prefix=cfg.share_prefix,
                                                 pack=True)  # no FLOP on padding (rlvr.algorithms.packing)
                    with autocast_paused(cfg.precision, model):  # the loss and backward at their own precision
                        loss, meta = sft_microbatch_train_step(out["log_probs"], tok["response_mask"], accumulation,
                                                               cfg.normalize_constant)
                    loss_total += loss.item()
                    tokens += int(meta["response_tokens"])
                    nll += meta["nll_per_token"].item() * int(meta["response_tokens"])
            grad_norm = torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], cfg.max_grad_norm or float("inf"))
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            seconds = time.perf_counter() - started
            metrics = {"train/loss": loss_total, "train/nll_per_token": nll / max(tokens, 1),
                       "train/grad_norm": float(grad_norm), "train/lr": lr, "train/response_tokens": tokens,
                       "train/epoch": order.epochs_done, "time/step_seconds": seconds,
                       "time/tokens_per_second": tokens / seconds}
            if val and stages.validation_due(cfg, step):
                val_metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
                metrics.update(val_metrics)
                log.info("step %d: %s", step, stages.fmt_metrics(metrics))
            logger.log(step, metrics)
            bar.update(1)
            bar.set_postfix(nll=f"{metrics['train/nll_per_token']:.3f}", s=f"{seconds:.1f}")
            # the periodic checkpoint; on Ctrl-C / SIGTERM this step saved and the run stopped with one line
            stop.after_step(cfg, run_dir, step, "rlvr sft", close=(bar.close, logger.close),
                            save=lambda: ckpt.save_checkpoint(run_dir, step, model, tokenizer,
                                                              stages.trainer_state(optimizer, scheduler, order),
                                                              keep=cfg.keep_checkpoints))
    bar.close()
    return stages.finish_run(run_dir, model, tokenizer, step, metrics, logger, "SFT")

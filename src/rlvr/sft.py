"""`rlvr sft`: supervised fine-tuning on worked solutions written in the r1_zero answer format.

RL sharpens what a model sometimes does and rarely invents it (seed 002); SmolLM2-135M never writes the
r1_zero format unprompted, so RL starts from this stage's checkpoint (seed 000). The loop reads top to
bottom: batch -> microbatched NLL (`sft_microbatch_train_step`) -> clip -> AdamW step -> log -> validate
-> checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
from pathlib import Path

import torch

from rlvr import checkpoint as ckpt
from rlvr.config import SFTConfig, TrainingFields
from rlvr.data import Example, load_dataset, r1_zero_response
from rlvr.evaluate import evaluate
from rlvr.models import load_model, prepare_for_training
from rlvr.policy import get_response_log_probs, sft_microbatch_train_step, tokenize_prompt_and_output
from rlvr.prompts import PromptTemplate, get_prompt
from rlvr.rollout import HFEngine, SamplingParams
from rlvr.tracking import MetricsLogger

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------
# Pieces shared with `rlvr train`.


def autocast(precision: str):
    """bf16 autocast for matmuls (master weights stay fp32); a no-op for fp32."""
    if precision == "bf16":
        return torch.autocast("cpu" if not torch.cuda.is_available() else "cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def build_optimizer(model, cfg: TrainingFields, total_steps: int):
    """AdamW over the trainable parameters, with a warmup then constant or cosine schedule."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay)
    if cfg.lr_schedule == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, cfg.warmup_steps, total_steps, min_lr_rate=cfg.min_lr_ratio)
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, cfg.warmup_steps)
    return optimizer, scheduler


def load_policy(cfg: TrainingFields, run_dir: Path):
    """The trainable model and tokenizer, from the last checkpoint when resuming. Returns (model, tokenizer,
    trainer state or None)."""
    resume_from = ckpt.latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:
        log.warning("--resume: no checkpoint in %s; starting from the beginning", run_dir)
    model, tokenizer = load_model(cfg.model)
    model = prepare_for_training(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout,
                                 gradient_checkpointing=cfg.gradient_checkpointing)
    state = None
    if resume_from is not None:
        ckpt.load_weights_into(model, resume_from)
        state = ckpt.load_state(resume_from)
        log.info("resuming from %s (step %d)", resume_from, state["step"])
    return model, tokenizer, state


def validate(engine: HFEngine, policy, examples: list[Example], prompt: PromptTemplate, tokenizer,
             cfg: TrainingFields, prefix: str = "val") -> tuple[dict, list[dict]]:
    """Greedy (by default) validation through the evaluation code; returns metrics and the records."""
    engine.sync_weights(policy)
    sampling = SamplingParams(temperature=cfg.eval_temperature, max_new_tokens=cfg.eval_max_new_tokens,
                              stop=prompt.stop, seed=cfg.seed)
    result = evaluate(engine, examples, prompt, sampling, tokenizer=tokenizer)
    s = result.summary
    metrics = {
        f"{prefix}/accuracy": s["accuracy"],
        f"{prefix}/format_rate": s["format_rate"],
        f"{prefix}/mean_response_tokens": s["mean_response_tokens"],
        f"{prefix}/truncated_rate": s["truncated_rate"],
        f"{prefix}/seconds": s["seconds"],
    }
    return metrics, result.records


def start_run(cfg: TrainingFields) -> Path:
    run_dir = Path(cfg.out)
    if (run_dir / "metrics.jsonl").exists() and not cfg.resume and ckpt.finished_model(run_dir) is None:
        raise FileExistsError(f"{run_dir} already holds a run; pass resume=true to continue it or choose another out")
    run_dir.mkdir(parents=True, exist_ok=True)
    cfg.save(run_dir / "config.yaml")
    return run_dir


# ----------------------------------------------------------------------------------------------------
# The SFT loop.


def _epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    order = list(range(n))
    random.Random(f"{seed}-{epoch}").shuffle(order)
    return order


def train_sft(cfg: SFTConfig) -> dict:
    done = ckpt.finished_model(Path(cfg.out))
    if done is not None:
        log.info("%s already holds a finished model; nothing to do", done)
        return {"final": str(done), "already_finished": True}
    run_dir = start_run(cfg)
    ckpt.seed_everything(cfg.seed)
    prompt = get_prompt(cfg.prompt)
    train = load_dataset(cfg.dataset, "train", limit=cfg.train_limit, seed=cfg.seed)
    val = load_dataset(cfg.dataset, "validation", limit=cfg.eval_limit, seed=cfg.seed)
    model, tokenizer, state = load_policy(cfg, run_dir)
    optimizer, scheduler = build_optimizer(model, cfg, cfg.steps)
    step, epoch, position = 0, 0, 0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        step, epoch, position = state["step"], state["epoch"], state["position"]
    logger = MetricsLogger(run_dir, cfg.tensorboard, cfg.wandb_project, cfg.model_dump(),
                           resume_step=step if state is not None else None)
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype)
    accumulation = cfg.batch_size // cfg.microbatch_size
    order = _epoch_order(len(train), cfg.seed, epoch)

    if step == 0:
        metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: %s", _fmt(metrics))
    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc="sft", unit="step")
    while step < cfg.steps:
        started = time.perf_counter()
        batch = []
        while len(batch) < cfg.batch_size:
            if position >= len(order):
                epoch, position = epoch + 1, 0
                order = _epoch_order(len(train), cfg.seed, epoch)
            batch.append(train[order[position]])
            position += 1
        model.train()
        loss_total, tokens, nll = 0.0, 0, 0.0
        for m in range(0, cfg.batch_size, cfg.microbatch_size):
            micro = batch[m : m + cfg.microbatch_size]
            tok = tokenize_prompt_and_output([prompt.format(ex.question, tokenizer) for ex in micro],
                                             [r1_zero_response(ex) for ex in micro], tokenizer)
            with autocast(cfg.precision):
                out = get_response_log_probs(model, tok["input_ids"], tok["labels"], positions=tok["response_mask"])
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
                   "train/epoch": epoch + position / len(train), "time/step_seconds": seconds,
                   "time/tokens_per_second": tokens / seconds}
        if cfg.eval_every and step % cfg.eval_every == 0 or step == cfg.steps:
            val_metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
            metrics.update(val_metrics)
            log.info("step %d: %s", step, _fmt(metrics))
        logger.log(step, metrics)
        bar.update(1)
        bar.set_postfix(nll=f"{metrics['train/nll_per_token']:.3f}", s=f"{seconds:.1f}")
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
            ckpt.save_checkpoint(run_dir, step, model, tokenizer, {
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": ckpt.rng_state(),
                "epoch": epoch, "position": position}, keep=cfg.keep_checkpoints)
    bar.close()
    summary = {"steps": step, **{k: v for k, v in metrics.items() if k.startswith("val/")}}
    final = ckpt.save_final(run_dir, model, tokenizer, summary)
    logger.close()
    log.info("SFT finished: %s; model in %s", _fmt(summary), final)
    return {**summary, "final": str(final)}


def _fmt(metrics: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())

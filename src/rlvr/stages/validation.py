"""Validation during training: the evaluation of `rlvr.stages.evaluation` on the validation split, greedy and
optionally sampled, and step 0's cache shared by the runs of a sweep that start from the same model."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import torch

from rlvr.config import TrainingFields, sampling_params
from rlvr.core import checkpoint as ckpt
from rlvr.core.models import cache_dir
from rlvr.engines.base import RolloutEngine
from rlvr.stages.agents import rollout_source
from rlvr.stages.evaluation import evaluate
from rlvr.tasks.prompts import PromptTemplate
from rlvr.tasks.records import EmptySplit, Example
from rlvr.tasks.task import Task, eval_reward_fn
from rlvr.tasks.user_rewards import reward_digest

log = logging.getLogger(__name__)


def validation_rows(task: Task, cfg: TrainingFields) -> list[Example]:
    """The validation rows a loop validates on, or [] when it never validates (eval_at_start, eval_every and
    eval_at_end all off: the split is not even read) or its rows hold none out (a table of fewer than 10 rows,
    said once; a validation_dataset= that is empty is an error). Loops validate only when this is not []."""
    if not (cfg.eval_at_start or cfg.eval_every or cfg.eval_at_end):
        return []
    try:
        return task.split("validation", cfg.eval_limit)
    except EmptySplit as err:
        if getattr(cfg, "validation_dataset", None):
            raise
        log.warning("%s: this run does not validate (a table holds out a tenth of its rows; give a validation set "
                    "of its own with validation_dataset=, or turn validation off with eval_every=0 "
                    "eval_at_start=false eval_at_end=false)", err)
        return []


def validate(engine: RolloutEngine, policy, examples: list[Example], prompt: PromptTemplate, tokenizer,
             cfg: TrainingFields, prefix: str = "val") -> tuple[dict, list[dict]]:
    """Greedy (by default) validation through the evaluation code, and with `eval_sampled_samples` the sampled
    one beside it (metrics under `<prefix>_sampled/`, e.g. val_sampled/accuracy, the sampled pass@1); returns
    metrics and the records of the first."""
    engine.sync_weights(policy)
    runs = [(prefix, sampling_params(cfg, stop=prompt.stop, seed=cfg.seed, validation=True))]
    if cfg.eval_sampled_samples:
        runs.append((f"{prefix}_sampled", sampling_params(cfg, stop=prompt.stop, seed=cfg.seed, validation=True,
                                                          sampled=True)))
    metrics, results = {}, []
    source = rollout_source(cfg)
    for name, sampling in runs:
        result = evaluate(engine, examples, prompt, sampling, tokenizer=tokenizer, env=source,
                          reward_fn=eval_reward_fn(cfg, prompt))
        results.append(result)
        s = result.summary
        metrics.update({
            f"{name}/accuracy": s["accuracy"],
            **({f"{name}/format_rate": s["format_rate"]} if s["format_rate"] is not None else {}),
            f"{name}/mean_response_tokens": s["mean_response_tokens"],
            f"{name}/truncated_rate": s["truncated_rate"],
            f"{name}/seconds": s["seconds"],
            **{f"{name}/pass@{k}": v for k, v in s.get("pass_at_k", {}).items()},
            # val/env/first_turn_reward, ..., and an agent's val/agent/tool_call_success, ...
            **{f"{name}/{k}": v for k, v in s.get("env", {}).items()},
        })
    return metrics, results[0].records


# Fields that cannot change step 0's validation (the start model, before any update, through the evaluation
# engine): the optimizer, the estimator, the rollouts' sampling, the schedule of steps, logs and checkpoints. Every
# other field, and any field added later, is part of the cache key, so a field missing here costs a cache miss,
# never a wrong number.
NOT_IN_START_VALIDATION = frozenset((
    "out", "resume", "steps", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "max_grad_norm",
    "warmup_steps", "lr_schedule", "min_lr_ratio", "microbatch_size", "gradient_checkpointing", "share_prefix",
    "save_every", "keep_checkpoints", "tensorboard", "wandb_project", "eval_every", "eval_at_end",
    "eval_start_cache", "log_rollouts_every", "algorithm", "baseline", "advantage_normalizer", "advantage",
    "advantage_eps", "importance_reweighting_method", "cliprange", "cliprange_high", "loss_normalization",
    "normalization_constant", "beta", "entropy_coef", "overlong_buffer", "curriculum", "kl_estimator",
    "steps_per_rollout", "mask_truncated_completions",
    "reward_signal", "distill", "distill_discount", "distill_kl", "rollout_batch_size", "group_size", "temperature",
    "top_p", "max_new_tokens", "min_new_tokens", "repetition_penalty", "dynamic_sampling", "dynamic_sampling_rounds",
    "dynamic_sampling_questions", "dynamic_sampling_signal",
))


def _code_digest() -> str:
    """sha256 of rlvr's own source files: a change anywhere in rlvr invalidates every cached validation."""
    root = Path(__file__).resolve().parents[1]  # the whole rlvr package
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str | None]:
    """The versions of what validation computes with besides rlvr: the model code, tokenizer and grader."""
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "tokenizers", "math-verify"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def _task_files(cfg: TrainingFields) -> dict[str, str]:
    """sha256 of the user's files that validation reads, by path: the rows (a file, or every file of a saved
    folder), a template file, the reward functions' files. Their names are in the config; an edited file with the
    same name must not reuse a cached validation."""
    names = [cfg.dataset, getattr(cfg, "validation_dataset", None), cfg.prompt]
    names += [key.rpartition(":")[0] for key in (getattr(cfg, "rewards", None) or {}) if ":" in key]
    out = {}
    for name in filter(None, names):
        path = Path(name)
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path] if path.is_file() else []
        if files:
            digest = hashlib.sha256()
            for file in files:
                digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
                digest.update(file.read_bytes())
            out[name] = digest.hexdigest()
    return out


def start_validation_key(cfg: TrainingFields) -> str | None:
    """The cache key of step 0's validation, or None when the start model has no weight files to hash (a hub
    name, a GGUF) and so is not cached. Besides the config: the weights, rlvr's code, the packages it computes
    with, the processor and torch's thread count (bf16 sums round differently with either)."""
    weights = ckpt.model_digest(Path(cfg.model))
    if weights is None:
        return None
    fields = {k: v for k, v in cfg.model_dump(mode="json", by_alias=True).items() if k not in NOT_IN_START_VALIDATION}
    # a user's reward function by what it is (its code, the files beside it, what it reads), not by its name
    rewards = {name: reward_digest(name) for name in (getattr(cfg, "rewards", None) or {})}
    key = {"config": fields, "weights": weights, "code": _code_digest(), "packages": _versions(),
           "cpu": ckpt.cpu_name(), "threads": torch.get_num_threads(), "files": _task_files(cfg), "rewards": rewards}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def validation_cache() -> Path:
    return cache_dir() / "validation"


def start_validation(engine: RolloutEngine, policy, examples: list[Example], prompt: PromptTemplate, tokenizer,
                     cfg: TrainingFields) -> dict:
    """Step 0's validation metrics. They depend on the start model and the eval settings only, so the runs of a
    sweep that share them (other algorithms, learning rates) compute them once: the first run writes them to
    $RLVR_CACHE/validation/<key>.json and the others read them, logged with `time/validate_cached` = 1 (their
    val/seconds is the first run's). Validation draws from its own random streams, so skipping it changes
    nothing that follows."""
    key = start_validation_key(cfg) if cfg.eval_start_cache else None
    path = validation_cache() / f"{key}.json" if key else None
    if path is not None and path.is_file():
        try:
            metrics = json.loads(path.read_text(encoding="utf-8"))
            log.info("step 0 validation from the cache (%s)", path)
            return {**metrics, "time/validate_cached": 1.0}
        except ValueError:  # a damaged entry is computed again and replaced
            pass
    metrics, _ = validate(engine, policy, examples, prompt, tokenizer, cfg)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(metrics), encoding="utf-8")
        os.replace(tmp, path)
    return metrics

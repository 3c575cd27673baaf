"""`rlvr train`: the RL loop of seed 004 Algorithm 1, for every estimator of the preset table.

    for step in 1..steps:
        questions  <- next rollout_batch_size / G questions (seeded epoch order)
        rollouts   <- G samples each from the rollout engine (weights synced from the policy)
        rewards    <- the reward function(s); advantages <- group normalisation over the rollout batch
        [old log-probs of train batches 2..k, once, before the first update]      (off-policy)
        [reference log-probs]                                                      (beta > 0)
        for each of the k = steps_per_rollout train batches: one policy_gradient_update
        log; validate every eval_every; checkpoint every save_every

Entry logic (seed 000): if `out` already holds a finished model, it is evaluated instead of trained.
Every rollout is reproducible from (seed, step, question, sample index).
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time
from pathlib import Path

import torch

from rlvr import checkpoint as ckpt
from rlvr.config import TrainConfig
from rlvr.data import load_split
from rlvr.estimators import compute_group_normalized_rewards
from rlvr.evaluate import pass_at_k
from rlvr.grpo import NonFiniteLoss, policy_gradient_update, score_log_probs
from rlvr.policy import tokenize_prompt_and_output
from rlvr.prompts import get_prompt
from rlvr.rewards import combine_rewards, format_reward_fn, get_reward_fn, rewards_and_metadata, score_batch
from rlvr.rollout import HFEngine, SamplingParams
from rlvr.training import build_optimizer, epoch_order, load_policy, open_logger, restore, start_run, validate

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


def _group_pass_at_k(correct: list[float], group_size: int) -> dict[str, float]:
    groups = [correct[i : i + group_size] for i in range(0, len(correct), group_size)]
    return {f"train/pass@{k}": sum(pass_at_k(group_size, int(sum(g)), k) for g in groups) / len(groups)
            for k in range(1, group_size + 1)}


def train_grpo(cfg: TrainConfig) -> dict:
    run_dir = Path(cfg.out)
    prompt = get_prompt(cfg.prompt)
    finished = ckpt.finished_model(run_dir)
    if finished is not None:
        return evaluate_finished(cfg, finished)
    run_dir = start_run(cfg)
    ckpt.seed_everything(cfg.seed)
    train = load_split(cfg, "train", cfg.train_limit)
    val = load_split(cfg, "validation", cfg.eval_limit)
    reward_fn = build_reward_fn(cfg, prompt.reward)
    model, tokenizer, state = load_policy(cfg, run_dir)
    k = cfg.steps_per_rollout
    optimizer, scheduler = build_optimizer(model, cfg, cfg.steps * k)
    reference = _reference_model(cfg)
    monitor = RunMonitor(cfg.max_new_tokens)
    step, epoch, position = restore(state, optimizer, scheduler)
    if state is not None:
        monitor.load(state["monitor"])
    logger = open_logger(run_dir, cfg, state)
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype)
    n_questions = cfg.rollout_batch_size // cfg.group_size
    order = epoch_order(len(train), f"grpo-{cfg.seed}", epoch)
    if step == 0 and cfg.eval_at_start:
        metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: accuracy %.3f, format %.3f", metrics["val/accuracy"], metrics["val/format_rate"])

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.algorithm}", unit="step")
    metrics: dict = {}
    while step < cfg.steps:
        step += 1
        times = {}
        # 1. questions, then G rollouts each from the current policy
        questions = []
        while len(questions) < n_questions:
            if position >= len(order):
                epoch, position = epoch + 1, 0
                order = epoch_order(len(train), f"grpo-{cfg.seed}", epoch)
            questions.append(train[order[position]])
            position += 1
        prompts = [prompt.format(q.question, tokenizer) for q in questions]
        t = time.perf_counter()
        engine.sync_weights(model)
        sampling = SamplingParams(
            temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
            min_new_tokens=cfg.min_new_tokens, repetition_penalty=cfg.repetition_penalty, stop=prompt.stop,
            n=cfg.group_size, seed=cfg.seed * 1_000_003 + step, entropy=True)
        completions = engine.generate(prompts, sampling)
        times["generate"] = time.perf_counter() - t
        responses = [c.text for c in completions]
        repeated_prompts = [prompts[c.prompt_index] for c in completions]
        truths = [questions[c.prompt_index].answer for c in completions]
        truncated = torch.tensor([c.finish_reason == "length" for c in completions])

        # 2. rewards and advantages over the whole rollout batch
        t = time.perf_counter()
        scores, grading = score_batch(reward_fn, responses, truths)
        raw_rewards, reward_meta = rewards_and_metadata(scores, grading)
        if cfg.reward_signal == "correctness":  # RFT's indicator, MaxRL's success: shaping does not enter
            raw_rewards = torch.tensor([float(s_["answer_reward"]) for s_ in scores])
        advantages, adv_meta = compute_group_normalized_rewards(
            raw_rewards, cfg.group_size, cfg.baseline, cfg.advantage_eps, cfg.advantage_normalizer)
        times["score"] = time.perf_counter() - t
        batch = tokenize_prompt_and_output(repeated_prompts, responses, tokenizer)
        mask = batch["response_mask"]
        if cfg.mask_truncated_completions:
            mask = mask & ~truncated.unsqueeze(-1)
            advantages = torch.where(truncated, torch.zeros_like(advantages), advantages)

        # 3. train batches: k optimizer steps on one rollout batch (k > 1 is off-policy)
        rows = list(range(cfg.rollout_batch_size))
        if k > 1:
            random.Random(f"{cfg.seed}-{step}-minibatches").shuffle(rows)
        splits = [rows[i * cfg.train_batch_size : (i + 1) * cfg.train_batch_size] for i in range(k)]
        needs_old = cfg.importance_reweighting_method != "none"
        old_log_probs = None
        t = time.perf_counter()
        if needs_old and k > 1:  # before any update; the first train batch uses the live (identical) policy
            later = [r for s in splits[1:] for r in s if cfg.beta > 0 or advantages[r] != 0]
            old_log_probs = score_log_probs(model, batch["input_ids"], batch["labels"], mask, cfg.microbatch_size,
                                            cfg.precision, rows=later, share_prefix=cfg.share_prefix,
                                            temperature=cfg.temperature)
        times["old_logprobs"] = time.perf_counter() - t
        t = time.perf_counter()
        reference_log_probs = None
        if cfg.beta > 0:
            reference_log_probs = _reference_log_probs(reference, model, batch, mask, cfg)
        times["reference"] = time.perf_counter() - t

        t = time.perf_counter()
        updates = []
        for i, split in enumerate(splits):
            idx = torch.tensor(split)
            try:
                loss, meta = policy_gradient_update(
                    model, optimizer, batch["input_ids"][idx], batch["labels"][idx], mask[idx], advantages[idx],
                    gradient_accumulation_steps=math.ceil(len(split) / cfg.microbatch_size),
                    max_grad_norm=cfg.max_grad_norm, importance_reweighting_method=cfg.importance_reweighting_method,
                    old_log_probs=old_log_probs[idx] if old_log_probs is not None and i > 0 else None,
                    cliprange=cfg.cliprange, cliprange_high=cfg.cliprange_high,
                    loss_normalization=cfg.loss_normalization, normalization_constant=cfg.normalization_constant,
                    beta=cfg.beta, reference_log_probs=reference_log_probs[idx] if reference_log_probs is not None else None,
                    kl_estimator=cfg.kl_estimator, precision=cfg.precision, on_policy_ratio=needs_old and i == 0,
                    share_prefix=cfg.share_prefix, temperature=cfg.temperature)
            except NonFiniteLoss as err:
                log.error("step %d, train batch %d: %s", step, i, err)
                updates.append({"nonfinite": 1.0})
                scheduler.step()
                continue
            scheduler.step()
            updates.append({"loss": float(loss), **meta})
        times["train"] = time.perf_counter() - t

        # 4. metrics, warnings, validation, rollouts, checkpoint
        metrics = _step_metrics(cfg, completions, scores, reward_meta, adv_meta, updates, times, scheduler)
        if cfg.eval_every and step % cfg.eval_every == 0 or (step == cfg.steps and cfg.eval_at_end):
            t = time.perf_counter()
            val_metrics, _ = validate(engine, model, val, prompt, tokenizer, cfg)
            metrics.update(val_metrics)
            metrics["time/validate"] = time.perf_counter() - t
        for warning in monitor.check(metrics, trained=metrics.get("train/trained_tokens", 0) > 0):
            log.warning("step %d: %s", step, warning)
            metrics.setdefault("warnings", []).append(warning)
        logger.log(step, metrics)
        if cfg.log_rollouts_every and (step % cfg.log_rollouts_every == 0 or step == 1):
            logger.log_rows("rollouts", step, [
                {"question": questions[c.prompt_index].question, "ground_truth": truths[j], "response": c.text,
                 "reward": scores[j]["reward"], "format_reward": scores[j]["format_reward"],
                 "answer_reward": scores[j]["answer_reward"], "advantage": float(advantages[j]),
                 "tokens": len(c.token_ids), "finish_reason": c.finish_reason, "sample_index": c.sample_index}
                for j, c in enumerate(completions)])
        bar.update(1)
        bar.set_postfix(reward=f"{metrics['train/reward']:.3f}", gen=f"{times['generate']:.0f}s",
                        train=f"{times['train']:.0f}s", **({"val": f"{metrics['val/accuracy']:.3f}"}
                                                           if "val/accuracy" in metrics else {}))
        if cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps:
            ckpt.save_checkpoint(run_dir, step, model, tokenizer, {
                "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": ckpt.rng_state(),
                "epoch": epoch, "position": position, "monitor": monitor.state()}, keep=cfg.keep_checkpoints)
    bar.close()
    summary = {"steps": step, "algorithm": cfg.algorithm,
               **{k_: v for k_, v in metrics.items() if k_.startswith("val/")}}
    final = ckpt.save_final(run_dir, model, tokenizer, summary)
    logger.close()
    log.info("training finished: %s; model in %s", finished_validation(summary), final)
    return {**summary, "final": str(final)}


def finished_validation(summary: dict) -> str:
    if "val/accuracy" not in summary:
        return "no validation (eval_at_end=false and no eval_every step)"
    return f"validation accuracy {summary['val/accuracy']:.3f}, format rate {summary['val/format_rate']:.3f}"


def _reference_model(cfg: TrainConfig):
    """A frozen copy of the starting policy (`model=`, also after a resume) for the KL term; with LoRA the
    adapter-free base serves."""
    if not cfg.beta:
        return None
    if cfg.lora_rank > 0:
        return None  # `disable_adapter()` on the policy itself gives the reference
    from rlvr.models import load_model

    reference, _ = load_model(cfg.model)
    reference.eval()
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def _reference_log_probs(reference, model, batch, mask, cfg: TrainConfig) -> torch.Tensor:
    if reference is not None:
        return score_log_probs(reference, batch["input_ids"], batch["labels"], mask, cfg.microbatch_size, cfg.precision,
                               share_prefix=cfg.share_prefix, temperature=cfg.temperature)
    with model.disable_adapter():
        return score_log_probs(model, batch["input_ids"], batch["labels"], mask, cfg.microbatch_size, cfg.precision,
                               share_prefix=cfg.share_prefix, temperature=cfg.temperature)


def _step_metrics(cfg, completions, scores, reward_meta, adv_meta, updates, times, scheduler) -> dict:
    lengths = [len(c.token_ids) for c in completions]
    ok = [u for u in updates if "nonfinite" not in u]
    # an update on a fully pruned train batch is a zero-gradient step: its loss and grad norm are 0 by
    # construction, and averaging them in would make a step look quieter than its training was
    trained = [u for u in ok if u["trained_rollouts"] > 0]
    entropies = [e for c in completions for e in (c.entropies or [])]
    m = {
        "train/reward": reward_meta["reward_mean"],
        "train/format_reward": reward_meta["format_reward_mean"],
        "train/answer_reward": reward_meta["answer_reward_mean"],
        "train/frac_groups_zero_std": float(adv_meta["frac_groups_zero_std"]),
        "train/reward_std": float(adv_meta["reward_std"]),
        "rollout/mean_tokens": sum(lengths) / len(lengths),
        "rollout/max_tokens": max(lengths),
        "rollout/truncated_rate": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "train/lr": scheduler.get_last_lr()[0],
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
    m.update(_group_pass_at_k([s["answer_reward"] for s in scores], cfg.group_size))
    if ok:
        m["train/pruned_fraction"] = sum(u["pruned_fraction"] for u in ok) / len(ok)
    if trained:
        for key in ("loss", "grad_norm", "clip_fraction", "kl", "ratio_mean"):
            values = [u[key] for u in trained if key in u]
            if values:
                m[f"train/{key}"] = sum(values) / len(values)
        m["train/grad_norm_max"] = max(u["grad_norm"] for u in trained)
        if any("ratio_max" in u for u in trained):
            m["train/ratio_max"] = max(u["ratio_max"] for u in trained if "ratio_max" in u)
            m["train/ratio_min"] = min(u["ratio_min"] for u in trained if "ratio_min" in u)
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
    model, tokenizer = load_model(str(final))
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype)
    val = load_split(cfg, "validation", cfg.eval_limit)
    metrics, _ = validate(engine, model, val, get_prompt(cfg.prompt), tokenizer, cfg)
    log.info("finished model: %s", ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return {**metrics, "final": str(final), "already_finished": True}

"""A step's metrics and what the loops do with them: the metrics of a step (`step_metrics`), seed 002's warning
signs (`RunMonitor`), the end of a step in every loop (`log_step`), per-phase timing (`timed`).
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from contextlib import contextmanager

from rlvr.algorithms.update import TrainBatch
from rlvr.config import TrainConfig, TrainingFields
from rlvr.engines.base import Completion
from rlvr.stages.episodes import episode_metrics
from rlvr.stages.evaluation import pass_at_k
from rlvr.stages.rollouts import Rollouts, Scored
from rlvr.tasks.scoring import binary_rate

log = logging.getLogger(__name__)


@contextmanager
def timed(times: dict, phase: str):
    start = time.perf_counter()
    yield
    times[phase] = times.get(phase, 0.0) + time.perf_counter() - start


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


def step_metrics(cfg, rollouts: Rollouts, scored: Scored, updates, times, lr: float,
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
    entropies = [e for c in completions for e in (c.entropies or []) if not math.isnan(e)]  # NaN: observation ids
    m = {
        "train/reward": reward_meta["reward_mean"],
        "train/frac_groups_zero_std": float(scored.adv_meta["frac_groups_zero_std"]),
        "train/reward_std": float(scored.adv_meta["reward_std"]),
        **_rollout_shape(every.completions),
        "train/lr": lr,
        "train/nonfinite_steps": len(updates) - len(ok),
        "train/updates_trained": len(trained),
        "train/trained_tokens": sum(u["trained_tokens"] for u in ok),
    }
    for signal in ("format_reward", "answer_reward"):  # absent when no row has one (a user's functions' format)
        if f"{signal}_mean" in reward_meta:
            m[f"train/{signal}"] = reward_meta[f"{signal}_mean"]
    if entropies:  # the whole rollout batch's, from the sampler: pruning cannot bias it
        m["train/token_entropy"] = sum(entropies) / len(entropies)
    for key, value in reward_meta.items():
        if key.startswith("reward/"):
            m[f"train/{key.removesuffix('_mean')}"] = value
        elif key.startswith("grading/") and key != "grading/seconds":
            m[key] = value
    for key, value in reward_meta.items():  # a reward function's log_metric(name, value): train/<name>
        if key.startswith("reward_metric/"):
            m.setdefault(f"train/{key.removeprefix('reward_metric/')}", value)
    m.update(_group_pass_at_k([s["answer_reward"] for s in every_scores], cfg.group_size))
    m.update(episode_metrics(every.completions))  # env/*: multi-turn episodes only
    if sampled is not None:
        m.update(_rollout_shape(completions, "kept_"))
        kept = _group_pass_at_k([s["answer_reward"] for s in scored.scores], cfg.group_size)
        m.update({k.replace("train/", "train/kept_"): v for k, v in kept.items()})
    if ok:
        m["train/pruned_fraction"] = sum(u["pruned_fraction"] for u in ok) / len(ok)
    if trained:
        for key in ("loss", "grad_norm", "clip_fraction", "kl", "ratio_mean", "teacher_kl_exact", "entropy_loss"):
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


def _rollout_shape(completions: list[Completion], prefix: str = "") -> dict:
    lengths = [len(c.token_ids) for c in completions]
    return {f"rollout/{prefix}mean_tokens": sum(lengths) / len(lengths), f"rollout/{prefix}max_tokens": max(lengths),
            f"rollout/{prefix}truncated_rate": sum(c.finish_reason == "length" for c in completions) / len(completions)}


def _group_pass_at_k(correct: list[float], group_size: int) -> dict[str, float]:
    """pass@k of each group's answer signal, when it is a 0/1 signal (rows without a reward left out of their
    group, k up to the fewest scored rows of a group); {} when it is real-valued: pass@k would mean nothing."""
    if binary_rate(correct) is None:
        return {}
    groups = [[v for v in correct[i : i + group_size] if not math.isnan(v)] for i in range(0, len(correct), group_size)]
    fewest = min(len(g) for g in groups)
    return {f"train/pass@{k}": sum(pass_at_k(len(g), int(sum(g)), k) for g in groups) / len(groups)
            for k in range(1, fewest + 1)}


def log_step(step: int, metrics: dict, rollouts: Rollouts, scored: Scored, times: dict, monitor: RunMonitor,
             logger, bar, cfg: TrainConfig) -> None:
    """The end of a step in every loop: seed 002's warnings, the metrics line, the sampled rollouts, the bar."""
    for warning in monitor.check(metrics, trained=metrics["train/trained_tokens"] > 0):
        log.warning("step %d: %s", step, warning)
        metrics.setdefault("warnings", []).append(warning)
    logger.log(step, metrics)
    if cfg.log_rollouts_every and (step % cfg.log_rollouts_every == 0 or step == 1):
        logger.log_rows("rollouts", step, rollout_rows(rollouts, scored))
    bar.update(1)
    bar.set_postfix(reward=f"{metrics['train/reward']:.3f}", gen=f"{times['generate']:.0f}s",
                    train=f"{times['train']:.0f}s", **({"val": f"{metrics['val/accuracy']:.3f}"}
                                                       if "val/accuracy" in metrics else {}))


def rollout_rows(rollouts: Rollouts, scored: Scored) -> list[dict]:
    truths = rollouts.truths
    # `prompt`: what the model was given (template, system prompt and chat template applied), as TRL's table shows it
    return [{"question": rollouts.questions[c.prompt_index].question, "prompt": rollouts.prompts[c.prompt_index],
             "ground_truth": truths[j], "response": c.text,
             **{k: _number_or_none(scored.scores[j][k]) for k in ("reward", "format_reward", "answer_reward")},
             "advantage": _row_advantage(scored.batch, j if scored.rows is None else
                                         scored.rows[j][0] if scored.rows[j] else None),
             "tokens": len(c.token_ids), "finish_reason": c.finish_reason, "sample_index": c.sample_index,
             "token_ids": list(c.token_ids),  # what was trained (the text is its decoding)
             **{k.removeprefix("log/"): v for k, v in scored.scores[j].items() if k.startswith("log/")}}
            for j, c in enumerate(rollouts.completions)]


def _number_or_none(value):
    """NaN (no reward, no format signal) as null: JSON has no NaN."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _row_advantage(batch: TrainBatch, row: int | None) -> float | None:
    """A rollout's advantage; for per-token advantages (distillation), their mean over its response. None: the
    rollout has no row (an agent's episode that sampled nothing)."""
    if row is None:
        return None
    if batch.advantages.dim() == 1:
        return float(batch.advantages[row])
    mask = batch.response_mask[row]
    return float(batch.advantages[row][mask].mean()) if mask.any() else 0.0


def validation_due(cfg: TrainingFields, step: int) -> bool:
    """Whether a loop validates after this step: every eval_every steps, and after the last with eval_at_end."""
    return bool(cfg.eval_every and step % cfg.eval_every == 0 or (step == cfg.steps and cfg.eval_at_end))


def finished_validation(summary: dict) -> str:
    if "val/accuracy" not in summary:
        return "no validation (eval_at_end=false and no eval_every step)"
    rate = summary.get("val/format_rate")
    return f"validation accuracy {summary['val/accuracy']:.3f}" + ("" if rate is None else f", format rate {rate:.3f}")

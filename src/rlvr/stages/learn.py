"""Learning from one scored rollout batch: the k = steps_per_rollout optimizer steps (`train_on_rollouts`),
with pi_old, the KL reference and on-policy distillation's teacher (seed 004 Algorithm 1, lines 8-12).
"""

from __future__ import annotations

import logging
import math
import random

from rlvr.algorithms.estimators import distill_advantages
from rlvr.algorithms.spec import EstimatorSpec
from rlvr.algorithms.update import NonFiniteLoss, TrainBatch, policy_gradient_update, score_log_probs, trained_rows
from rlvr.config import TrainConfig
from rlvr.stages.metrics import timed
from rlvr.stages.run import frozen_dtype, load_frozen

log = logging.getLogger(__name__)


def train_on_rollouts(model, optimizer, scheduler, reference, batch: TrainBatch, spec: EstimatorSpec,
                      cfg: TrainConfig, step: int, times: dict, parallel=None, teacher=None) -> list[dict]:
    """The k = steps_per_rollout optimizer steps on one rollout batch (k > 1 is off-policy). `parallel`: this
    process is one data-parallel learner of several (rlvr.distributed.parallel); it scores and trains its rows only.
    `teacher`: on-policy distillation's, for distill_kl reverse / forward (its KL is part of every update's loss).
    pi_old is the policy before this batch's first update (the live policy in that update, scored before it
    for the later ones), in every mode; the sampler's own log-probs (`batch.rollout_log_probs`: its numerics,
    in async RL its older weights) enter through `cfg.rollout_correction`, as in decoupled PPO. The correction's
    weight pi_old / mu needs pi_old on every train batch, so pi_old is scored once per rollout batch when the
    correction is on, also for an estimator without a ratio (offpolicy_naive); with mode none such an estimator
    measures the mismatch on the first train batch only, where the live policy is pi_old."""
    k = spec.steps_per_rollout
    correction = cfg.rollout_correction.spec()
    corrected = correction.mode != "none" and batch.rollout_log_probs is not None
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

    with timed(times, "old_logprobs"):
        if (spec.needs_old_log_probs or corrected) and k > 1:  # before any update; the first uses the live policy
            later = [r for split in splits[1:] for r in my_rows(split)]
            batch.old_log_probs = score_log_probs(model, batch.input_ids, batch.labels, batch.response_mask,
                                                  cfg.microbatch_size, cfg.precision, rows=later,
                                                  share_prefix=cfg.share_prefix, temperature=cfg.temperature)
    with timed(times, "reference"):
        if spec.beta > 0:
            batch.reference_log_probs = reference_log_probs(
                reference, model, batch, cfg,
                rows=None if parallel is None else [r for split in splits for r in my_rows(split)])
    updates = []
    with timed(times, "train"):
        for i, split in enumerate(splits):
            part = batch.rows(split)
            if i == 0:
                part.old_log_probs = None  # the live policy is pi_old for the first update
            elif part.old_log_probs is None:
                part.rollout_log_probs = None  # no pi_old to compare the sampler with (the live policy has drifted)
            try:
                loss, meta = policy_gradient_update(
                    model, optimizer, part, spec, math.ceil(len(split) / cfg.microbatch_size), cfg.max_grad_norm,
                    on_policy_ratio=spec.needs_old_log_probs and part.old_log_probs is None, precision=cfg.precision,
                    share_prefix=cfg.share_prefix, temperature=cfg.temperature, parallel=parallel,
                    rollout_correction=correction, teacher=teacher)
                updates.append({"loss": float(loss), **meta})
            except NonFiniteLoss as err:
                log.error("step %d, train batch %d: %s", step, i, err)
                updates.append({"nonfinite": 1.0})
            scheduler.step()
    return updates


def reference_model(cfg: TrainConfig, device="cpu"):
    """A frozen copy of the starting policy (`model=`, also after a resume) for the KL term, on its own device;
    with LoRA the adapter-free base serves."""
    if not cfg.beta:
        return None
    if cfg.lora_rank > 0:
        return None  # `disable_adapter()` on the policy itself gives the reference
    return load_frozen(cfg.model, device, frozen_dtype(cfg.precision, device))[0]


def reference_log_probs(reference, model, batch: TrainBatch, cfg: TrainConfig, rows: list[int] | None = None):
    args = (batch.input_ids, batch.labels, batch.response_mask, cfg.microbatch_size, cfg.precision)
    kwargs = dict(share_prefix=cfg.share_prefix, temperature=cfg.temperature, rows=rows)
    if reference is not None:
        return score_log_probs(reference, *args, **kwargs)
    with model.disable_adapter():
        return score_log_probs(model, *args, **kwargs)


def teacher_model(cfg: TrainConfig, tokenizer, device="cpu"):
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
    # both models have (rlvr.algorithms.policy._scores), which must hold every id of the tokenizer
    rows = teacher.get_output_embeddings().weight.shape[0]
    if rows < len(tokenizer):
        raise ValueError(f"teacher={cfg.teacher!r} scores {rows} token ids, fewer than the tokenizer's "
                         f"{len(tokenizer)}: it cannot score every token the student may sample")
    return teacher


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

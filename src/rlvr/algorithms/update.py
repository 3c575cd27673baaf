"""The RL update: one optimizer step of a policy-gradient estimator on a batch of scored rollouts
(seed 004 §4.2.4, §5.4, §6.4).

`policy_gradient_update(model, optimizer, batch, spec, ...)` is the whole step on one screen: prune,
split the rest into microbatches of similar length, score them, per-token loss of the spec's estimator,
aggregate with whole-batch normalisers, backward, clip, step, clear. `grpo_train_step`
(rlvr.algorithms.train_step) is the assignment's interface on top of it (it computes rewards and advantages
itself); the training loop computes those once per rollout batch and calls `policy_gradient_update` for each
train batch.

Departures from seed 004's reference step, each keeping the update exactly the same:
  1. Rollouts with zero advantage (unless a KL term needs them) or no response token are never trained;
     the normalisers still count them (N sequences, all response tokens), so the gradient is unchanged,
     and a fully pruned batch still hands the optimizer its zero gradient, as the unpruned step would.
  2. Rows are ordered by prompt, then length, before being cut into microbatches, and each microbatch is
     trimmed to its longest row, so little time goes into padding.
  3. The vocabulary projection runs only at response positions (`get_response_log_probs(positions=...)`),
     and a microbatch's shared prompt runs through the model once (`share_prefix`).
  4. No FLOP on padding (`pack`, rlvr.algorithms.packing): each microbatch's rows are packed into a few
     sequences, each row cut at its last response token and a group's prompt written once per sequence.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rlvr.algorithms.estimators import kl_penalty
from rlvr.algorithms.losses import (
    aggregate_loss_across_microbatch,
    microbatch_loss_scale,
    rollout_correction_weights,
    whole_batch_normalizer,
)
from rlvr.algorithms.packing import attention_weight, microbatches, pack_rows, packable, row_widths
from rlvr.algorithms.policy import autocast, autocast_paused, get_response_log_probs, shared_prefix_columns
from rlvr.algorithms.spec import EstimatorSpec, policy_loss
from rlvr.core.devices import input_device


class NonFiniteLoss(RuntimeError):
    """The loss or gradient norm was NaN/inf; the optimizer step was skipped and the gradients cleared."""


@dataclasses.dataclass(frozen=True)
class RolloutCorrection:
    """How an update corrects for the sampler not being the trainer's old policy (`rollout_correction_weights`
    in rlvr.algorithms.estimators): mode none | token_tis | sequence_tis | token_mask | sequence_mask, the TIS cap, and the
    band [low, high] a masked ratio must lie in."""

    mode: str = "token_tis"
    cap: float = 2.0
    band: tuple[float, float] = (0.5, 2.0)


@dataclasses.dataclass
class TrainBatch:
    """Scored rollouts ready for an update: (N, T) token tensors, advantages (N,) -- or (N, T), one per token
    (on-policy distillation) -- and the log-probs of the sampling policy (off-policy) and of the reference
    (KL term) when the estimator needs them. `rollout_log_probs`: what the engine reported when it sampled
    (NaN where unknown), for the rollout-vs-trainer mismatch and its correction."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    response_mask: torch.Tensor
    advantages: torch.Tensor
    old_log_probs: torch.Tensor | None = None
    reference_log_probs: torch.Tensor | None = None
    rollout_log_probs: torch.Tensor | None = None

    def __post_init__(self):
        n = self.input_ids.shape[0]
        if not (self.labels.shape == self.response_mask.shape == self.input_ids.shape) or (
                self.advantages.shape not in ((n,), self.labels.shape)):
            raise ValueError("input_ids, labels, response_mask must share one (N, T) shape and advantages be (N,) "
                             "or (N, T)")
        for name in ("old_log_probs", "reference_log_probs", "rollout_log_probs"):
            value = getattr(self, name)
            if value is not None and value.shape != self.labels.shape:
                raise ValueError(f"{name} has shape {tuple(value.shape)}; the batch has {tuple(self.labels.shape)}")
        self.response_mask = self.response_mask.bool()

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def has_signal(self, row: int) -> bool:
        """Whether the row's advantage is nonzero anywhere (a zero-advantage row has zero gradient)."""
        return bool((self.advantages[row] != 0).any())

    def advantage_columns(self, idx: torch.Tensor, width: int) -> torch.Tensor:
        """The advantages of rows `idx` for a microbatch trimmed to `width` columns."""
        return self.advantages[idx] if self.advantages.dim() == 1 else self.advantages[idx, :width]

    def rows(self, index) -> "TrainBatch":
        index = torch.as_tensor(index)
        pick = lambda t: t[index] if t is not None else None  # noqa: E731
        return TrainBatch(*(pick(getattr(self, f.name)) for f in dataclasses.fields(self)))


def token_slots(model, input_ids: torch.Tensor, response_mask: torch.Tensor, microbatch_size: int,
                rows: list[int] | None = None, grouped: bool = True) -> dict:
    """The token slots the decoder runs for `rows` (default: those with a response token), microbatched as the
    update does (`grouped`: by prompt and length; else in order, as rlvr sft): padded (each microbatch trimmed to
    its longest row, its shared prefix once) and packed as `pack=True` lays them out for this model (attention pairs
    not counted); with the number of microbatches and of packed sequences. What bench/train_profile.py prints."""
    has_tokens = response_mask.any(dim=1)
    rows = [r for r in (range(len(input_ids)) if rows is None else rows) if has_tokens[r]]
    parts = (microbatches(rows, input_ids, response_mask, microbatch_size) if grouped
             else [rows[i : i + microbatch_size] for i in range(0, len(rows), microbatch_size)])
    widths = row_widths(response_mask)
    padded = packed = sequences = 0
    for part in parts:
        w = int(widths[part].max())
        ids, mask = input_ids[part, :w], response_mask[part, :w]
        prefix = shared_prefix_columns(model, ids, mask)
        layout = pack_rows(ids, mask, prefix, attention_weight(model)) if len(part) > 1 and packable(model, w) else None
        padded += prefix + len(part) * (w - prefix)
        packed += prefix + (layout.input_ids.numel() if layout is not None else len(part) * (w - prefix))
        sequences += layout.input_ids.shape[0] if layout is not None else len(part)
    return {"padded": padded, "packed": packed, "packed_share": packed / max(padded, 1), "sequences": sequences,
            "microbatches": len(parts)}


@torch.no_grad()
def score_log_probs(model, input_ids, labels, response_mask, microbatch_size: int, precision: str = "fp32",
                    rows: list[int] | None = None, share_prefix: bool = True, temperature: float = 1.0,
                    return_token_entropy: bool = False, vocab: int | None = None, pack: bool = True):
    """Log-probs (N, T) of the response tokens under `model` at `temperature`, without gradient (old policy,
    reference, teacher); rows not in `rows` are left at 0. With `return_token_entropy`, (log-probs, entropy).
    `vocab`: over the first `vocab` token ids only (a teacher padded past the student's vocabulary). `pack`: the
    rows padding-free (`get_response_log_probs(pack=True)`)."""
    out = torch.zeros(labels.shape, dtype=torch.float32)
    entropy = torch.zeros(labels.shape, dtype=torch.float32) if return_token_entropy else None
    rows = list(range(labels.shape[0])) if rows is None else rows
    has_tokens = response_mask.any(dim=1)
    rows = [r for r in rows if has_tokens[r]]  # a row with no response token scores nothing: no forward for it
    widths = row_widths(response_mask)
    was_training = model.training
    model.eval()
    for mb in microbatches(rows, input_ids, response_mask, microbatch_size):
        idx = torch.tensor(mb)
        w = int(widths[idx].max())
        with autocast(precision, model):
            lp = get_response_log_probs(model, input_ids[idx, :w], labels[idx, :w], return_token_entropy,
                                        positions=response_mask[idx, :w], share_prefix=share_prefix,
                                        temperature=temperature, vocab=vocab, pack=pack)
        out[idx, :w] = lp["log_probs"].float().cpu()
        if entropy is not None:
            entropy[idx, :w] = lp["token_entropy"].float().cpu()
    model.train(was_training)
    return (out, entropy) if return_token_entropy else out


_CORRECTION_SUMS = ("tokens", "known_tokens", "mismatch_k3", "outside_band", "weight_sum", "capped", "masked")


class _UpdateStats:
    """What an update reports, summed over its microbatches: tokens, entropy, KL, ratio and clip statistics."""

    def __init__(self):
        self.tokens = self.sequences = 0
        self.entropy = self.kl = self.ratio_sum = self.clip_sum = self.ratio_weight = 0.0
        self.ratio_min, self.ratio_max = math.inf, -math.inf
        self.teacher_kl = 0.0
        self.corrected = False  # a rollout correction weighted the loss (set by the update, for the whole batch)
        self.correction = dict.fromkeys(_CORRECTION_SUMS, 0.0)
        self.is_max = self.mismatch_max = -math.inf

    def add(self, mask: torch.Tensor, entropy: torch.Tensor, meta: dict, kl: torch.Tensor | None,
            correction: dict | None = None, teacher_kl: torch.Tensor | None = None) -> None:
        tokens = int(mask.sum())
        if teacher_kl is not None:
            self.teacher_kl += float((teacher_kl.detach() * mask).sum())
        if correction is not None and tokens:
            # one transfer from the device for all of them, not one per number
            *sums, weight_max, ratio_max = torch.stack([correction[name].float() for name in _CORRECTION_SUMS]
                                                       + [correction["weight_max"].float(),
                                                          correction["max_abs_log_ratio"].float()]).tolist()
            for name, value in zip(_CORRECTION_SUMS, sums):
                self.correction[name] += value
            self.is_max = max(self.is_max, weight_max)
            self.mismatch_max = max(self.mismatch_max, ratio_max)
        self.tokens += tokens
        self.sequences += mask.shape[0]
        self.entropy += float((entropy * mask).sum())
        if kl is not None:
            self.kl += float((kl.detach() * mask).sum())
        if "ratio_mean" in meta:
            # GSPO's ratio and clip fraction are per sequence, the others' per token: weight by what they count
            weight = float(meta["sequences"]) if "sequences" in meta else tokens
            self.ratio_weight += weight
            self.ratio_sum += float(meta["ratio_mean"]) * weight
            self.clip_sum += float(meta.get("clip_fraction", 0.0)) * weight
            self.ratio_min = min(self.ratio_min, float(meta["ratio_min"]))
            self.ratio_max = max(self.ratio_max, float(meta["ratio_max"]))

    def reduce(self, parallel, extra: list[float]) -> list[float]:
        """The whole group's statistics on every rank (data-parallel learners), in one sum and one max; `extra`
        are more numbers to sum in the same collective, returned summed."""
        sums = ("tokens", "sequences", "entropy", "kl", "ratio_sum", "clip_sum", "ratio_weight", "teacher_kl")
        summed = parallel.sum_floats([float(getattr(self, name)) for name in sums]
                                     + [self.correction[name] for name in _CORRECTION_SUMS] + list(extra))
        for name, value in zip(sums, summed):
            setattr(self, name, int(value) if name in ("tokens", "sequences") else value)
        self.correction = dict(zip(_CORRECTION_SUMS, summed[len(sums):]))
        low, high, self.is_max, self.mismatch_max = parallel.max_floats(
            [-self.ratio_min, self.ratio_max, self.is_max, self.mismatch_max])
        self.ratio_min, self.ratio_max = -low, high
        return summed[len(sums) + len(_CORRECTION_SUMS):]

    def metadata(self, grad_norm: float, kept: int, n: int, microbatches: int, spec: EstimatorSpec) -> dict:
        out = {"grad_norm": grad_norm, "trained_rollouts": kept, "trained_tokens": self.tokens,
               "trained_token_entropy_sum": self.entropy, "pruned_fraction": 1 - kept / n, "microbatches": microbatches}
        if self.tokens:
            out["trained_token_entropy"] = self.entropy / self.tokens
        if self.ratio_weight > 0:
            out.update(clip_fraction=self.clip_sum / self.ratio_weight, ratio_mean=self.ratio_sum / self.ratio_weight,
                       ratio_min=self.ratio_min, ratio_max=self.ratio_max)
        if spec.beta > 0 and self.tokens:
            out["kl"] = self.kl / self.tokens
        if spec.exact_distill and self.tokens:
            out["teacher_kl_exact"] = self.teacher_kl / self.tokens  # per trained token, over the vocabulary (its direction)
        c = self.correction
        if c["known_tokens"]:  # the engine's sampling log-probs were known: the mismatch with the trainer
            out.update(mismatch_kl=c["mismatch_k3"] / c["known_tokens"], mismatch_max_abs_log_ratio=self.mismatch_max,
                       mismatch_outside_band_fraction=c["outside_band"] / c["known_tokens"],
                       mismatch_tokens=c["known_tokens"])
        if self.corrected and c["tokens"]:
            out.update(is_weight_mean=c["weight_sum"] / c["tokens"], is_weight_max=self.is_max,
                       is_capped_fraction=c["capped"] / c["tokens"], is_masked_fraction=c["masked"] / c["tokens"])
        return out


def trained_rows(batch: TrainBatch, spec: EstimatorSpec) -> list[int]:
    """The rows an update backpropagates. A rollout with no response token (EOS sampled first) or zero
    advantage (and no KL term) has exactly zero gradient; skipping it keeps the step the same and cannot leave
    a microbatch with nothing to differentiate."""
    has_tokens = batch.response_mask.any(dim=1)
    dense = spec.beta > 0 or spec.exact_distill or spec.entropy_coef > 0  # a loss on every token
    return [i for i in range(len(batch)) if has_tokens[i] and (dense or batch.has_signal(i))]


def policy_gradient_update(
    model,
    optimizer,
    batch: TrainBatch,
    spec: EstimatorSpec,
    gradient_accumulation_steps: int,
    max_grad_norm: float | None,
    *,
    on_policy_ratio: bool = False,
    precision: str = "fp32",
    share_prefix: bool = True,
    temperature: float = 1.0,
    parallel=None,
    rollout_correction: RolloutCorrection | None = None,
    teacher=None,
    pack: bool = True,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One optimizer step of `spec`'s estimator on the N rollouts of `batch`.

    `on_policy_ratio=True` uses the current policy's (detached) log-probs as the old ones -- exact for the
    first update on a fresh rollout batch, and free. `temperature`: the rollouts' sampling temperature; the
    policy is scored at logits / temperature (old and reference log-probs must be scored the same way).
    Gradients left on the model by the caller are discarded first: the step is exactly this batch's.
    `parallel` (an rlvr.distributed.parallel.DataParallel): this process is one of M data-parallel learners holding the
    same batch; it backpropagates its shard of the rows and the gradients are summed over the group, so the
    step equals the single-process one. `rollout_correction`: with `batch.rollout_log_probs` (what the engine
    reported when it sampled; NaN where unknown), each token's loss is weighted by the correction of
    `rlvr.algorithms.estimators.rollout_correction_weights` for the gap between that sampler (its numerics, in async RL
    its older weights) and the trainer's old policy (the live policy for the first update of a rollout batch,
    `old_log_probs` after it); the mismatch is reported whenever rollout_log_probs is known. `teacher`: the frozen
    teacher of `spec.distill_kl` reverse / forward, whose exact per-token KL (weighted by `spec.distill`) joins each
    token's loss. `pack`: each microbatch runs padding-free (`get_response_log_probs(pack=True)`: the same
    gradient, to float rounding). Returns the whole batch's
    loss (the sum of the backpropagated microbatch losses) and metadata; its entropy (`trained_token_entropy`)
    is over the rollouts that were trained, not the whole batch.
    """
    n = len(batch)
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1; got {gradient_accumulation_steps}")
    if spec.beta > 0 and batch.reference_log_probs is None:
        raise ValueError("beta > 0 needs reference_log_probs")
    if spec.exact_distill and teacher is None:
        raise ValueError(f"distill_kl={spec.distill_kl!r} needs the teacher model (teacher=)")
    if spec.needs_old_log_probs and batch.old_log_probs is None and not on_policy_ratio:
        raise ValueError(f"importance_reweighting_method={spec.importance_reweighting_method!r} needs old_log_probs")
    correction = rollout_correction or RolloutCorrection("none")
    mask_all = batch.response_mask
    normalizer = whole_batch_normalizer(spec.loss_normalization, mask_all, spec.normalization_constant)
    microbatch_size = math.ceil(n / gradient_accumulation_steps)
    kept_all = trained_rows(batch, spec)
    kept = parallel.shard(kept_all, batch.input_ids, mask_all) if parallel is not None else kept_all
    widths = row_widths(mask_all)
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.grad = None

    model.train()
    device = input_device(model)  # the batch lives on the CPU; each microbatch's part goes to the model
    total_loss, stats, diverged = torch.zeros((), device=device), _UpdateStats(), False
    total_entropy_loss = torch.zeros((), device=device)
    # decided for the whole batch, not per microbatch: every data-parallel rank reports the same metrics
    stats.corrected = correction.mode != "none" and batch.rollout_log_probs is not None
    # one autocast region for every microbatch: each weight is cast to bf16 once per update, not once per
    # microbatch; the loss and the backward pass run with it paused, at their own precision
    with autocast(precision, model):
        for mb in microbatches(kept, batch.input_ids, mask_all, microbatch_size):
            idx, w = torch.tensor(mb), int(widths[mb].max())
            mask = mask_all[idx, :w].to(device, non_blocking=True)
            on_device = lambda t: t[idx, :w].to(device, non_blocking=True)  # noqa: E731
            scored = get_response_log_probs(model, batch.input_ids[idx, :w], batch.labels[idx, :w],
                                            return_token_entropy=True, positions=mask, share_prefix=share_prefix,
                                            temperature=temperature, teacher=teacher if spec.exact_distill else None,
                                            kl_direction=spec.distill_kl, entropy_grad=spec.entropy_coef > 0,
                                            pack=pack)
            with autocast_paused(precision, model):
                log_probs = scored["log_probs"]
                if not bool(torch.isfinite(log_probs[mask]).all()):
                    diverged = True  # raised below, after the collective every learner must reach
                    break
                old = log_probs.detach() if on_policy_ratio else (
                    on_device(batch.old_log_probs).to(log_probs.dtype) if batch.old_log_probs is not None else None)
                if old is not None and not on_policy_ratio:
                    old = torch.where(torch.isnan(old), log_probs.detach(), old)
                weights = None
                if batch.rollout_log_probs is not None:
                    # the policy the rollouts should have come from: pi_old, or the live policy where there is none
                    weights, corr = rollout_correction_weights(
                        old if old is not None else log_probs.detach(),
                        on_device(batch.rollout_log_probs).to(log_probs.dtype), mask, correction.mode, correction.cap,
                        correction.band)
                per_token, meta = policy_loss(spec, batch.advantage_columns(idx, w).to(device), log_probs, old,
                                              mask)
                if weights is not None and correction.mode != "none":
                    per_token = per_token * weights
                if spec.exact_distill:
                    per_token = per_token + spec.distill * scored["teacher_kl"]
                kl = None
                if spec.beta > 0:
                    kl = kl_penalty(log_probs, on_device(batch.reference_log_probs).to(log_probs.dtype),
                                    spec.kl_estimator)
                    per_token = per_token + spec.beta * kl
                scale = microbatch_loss_scale(spec.loss_normalization, len(mb), n)
                if spec.entropy_coef > 0:
                    bonus = -spec.entropy_coef * scored["token_entropy"]  # aggregated as the loss is: its exact share
                    per_token = per_token + bonus
                    total_entropy_loss += aggregate_loss_across_microbatch(
                        bonus.detach(), mask, spec.loss_normalization, normalizer) * scale
                loss = aggregate_loss_across_microbatch(per_token, mask, spec.loss_normalization, normalizer)
                loss = loss * scale
                loss.backward()
                total_loss += loss.detach()
                stats.add(mask, scored["token_entropy"].detach(), meta, kl, corr if weights is not None else None,
                          scored.get("teacher_kl"))

    passes = math.ceil(len(kept) / microbatch_size) if kept else 0
    if parallel is not None:  # every learner reaches this, diverged or not, before any of them gives up
        summed = stats.reduce(parallel, [float(diverged), float(passes), float(total_loss),
                                         float(total_entropy_loss)])
        diverged, passes, total_loss = summed[0] > 0, int(summed[1]), torch.tensor(summed[2], device=device)
        total_entropy_loss = torch.tensor(summed[3], device=device)
    if diverged:
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLoss("the policy's log-probs are NaN/inf (diverged weights?); step skipped, gradients cleared")
    if parallel is not None:
        parallel.all_reduce_gradients(params)  # a rank without rows adds zeros, as the unpruned step would
    elif not kept:
        # Every gradient is exactly zero. Seed 004's unpruned step still hands AdamW a zero gradient (its
        # moments decay, its step count advances, the weights move by momentum and weight decay), whereas a
        # None gradient would make it skip the parameter: give it the zeros.
        for p in params:
            p.grad = torch.zeros_like(p)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm if max_grad_norm else float("inf"))
    if not (torch.isfinite(total_loss) and torch.isfinite(grad_norm)):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteLoss(f"non-finite loss ({float(total_loss)}) or gradient norm ({float(grad_norm)}); "
                            "step skipped, gradients cleared")
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    meta = stats.metadata(float(grad_norm), len(kept_all), n, passes, spec)
    if spec.entropy_coef > 0:  # the bonus's part of `loss` (negative): the share of the loss it is
        meta["entropy_loss"] = float(total_entropy_loss)
    return total_loss, meta



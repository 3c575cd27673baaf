"""The policy side: tokenising prompt + response pairs, scoring response tokens, the SFT microbatch step
(seed 004 §4.2.1).

`get_response_log_probs` never builds a float32 log-softmax over the whole [batch, length, vocab]: for
models whose logits are a plain linear head on the decoder's last hidden state (Llama, Qwen, OLMo,
SmolLM, ...) it runs the head on chunks of positions inside activation checkpoints, so neither the
forward nor the backward pass holds more than one chunk of logits (when every scored position fits in one
chunk, that chunk is kept for the backward pass instead of recomputed); other models fall back to chunking
the log-softmax over the model's own logits.

With `share_prefix=True` the rows' longest common prefix (a GRPO group's prompt, or the r1_zero
instructions every prompt starts with) runs through the model once; the rest of each row attends to its
KV cache, and gradients flow back through the cache into the shared prefix. Same values and gradients,
fewer FLOPs: a group of 8 rollouts of 40 tokens after a 150-token prompt costs 470 token-passes, not 1,520.
With `pack=True` the rest runs padding-free (rlvr.algorithms.packing): 4 groups of 4 rows of one microbatch, each
question written once in a packed sequence of its own after the instructions they share, rather than 16 padded rows
that each repeat their question.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

from rlvr.algorithms.estimators import masked_normalize
from rlvr.algorithms.packing import Packing, attention_mask_for, attention_weight, pack_rows, packable
from rlvr.core.devices import input_device
from rlvr.core.models import cache_keyword

# Elements of one chunk of logits (positions x vocab): 2^25 float32 = 128 MiB.
CHUNK_ELEMENTS = 1 << 25
# A shared prefix shorter than this is not worth a separate forward pass.
MIN_SHARED_PREFIX = 8
# Config attributes of heads that are more than a linear map of the last hidden state.
_SPECIAL_HEADS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def autocast(precision: str, model=None):
    """bf16 autocast for matmuls (master weights stay fp32) on `model`'s device type (default the CPU); a no-op
    for fp32."""
    if precision == "bf16":
        return torch.autocast(input_device(model).type if model is not None else "cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def autocast_paused(precision: str, model=None):
    """Inside an `autocast` region, a stretch at each op's own precision (a loss, a backward pass) that does not
    end the region: autocast keeps its bf16 copy of each weight until its outermost region ends, so an update
    whose microbatches share one region casts every weight once instead of once per microbatch."""
    if precision == "bf16":
        return torch.autocast(input_device(model).type if model is not None else "cpu", enabled=False)
    return contextlib.nullcontext()


def tokenize_prompt_and_output(prompt_strs: list[str], output_strs: list[str], tokenizer) -> dict[str, torch.Tensor]:
    """Tokenise prompts and outputs separately (no special tokens), concatenate, pad on the right.

    Returns input_ids (all but the last token), labels (all but the first) and response_mask, each
    (batch, max_len - 1); the mask is true exactly where the label is a response token.

    >>> # prompt [p0 p1], output [o0 o1]:  input_ids [p0 p1 o0], labels [p1 o0 o1], mask [0 1 1]
    """
    if len(prompt_strs) != len(output_strs):
        raise ValueError(f"prompt_strs has {len(prompt_strs)} items but output_strs has {len(output_strs)}")
    outputs = tokenizer(list(output_strs), add_special_tokens=False)["input_ids"] if output_strs else []
    return tokenize_prompt_and_ids(prompt_strs, outputs, tokenizer)


def tokenize_prompt_and_ids(prompt_strs: list[str], response_ids: list[list[int]], tokenizer,
                            response_masks: list[list[bool] | None] | None = None) -> dict[str, torch.Tensor]:
    """`tokenize_prompt_and_output` for responses given as token ids: the ids a rollout engine sampled, trained
    as they were sampled (a final end-of-sequence token included). Decoding sampled ids and encoding the text
    again need not give the same ids (a merge the sampler did not make, bytes that are not UTF-8, a dropped
    EOS), and the policy would then be trained on tokens nobody sampled. The prompt is encoded as the engines
    encode it: `tokenizer(prompt, add_special_tokens=False)`. `response_masks`: per response, which ids are
    trained (a multi-turn episode's observation ids are in the sequence, and out of the response mask); None:
    all of them."""
    if len(prompt_strs) != len(response_ids):
        raise ValueError(f"prompt_strs has {len(prompt_strs)} items but response_ids has {len(response_ids)}")
    masks = list(response_masks) if response_masks is not None else [None] * len(response_ids)
    if len(masks) != len(response_ids) or any(m is not None and len(m) != len(o) for m, o in zip(masks, response_ids)):
        raise ValueError("response_masks must give one flag per response id")
    if not prompt_strs:
        raise ValueError("prompt_strs is empty")
    prompts = tokenizer(list(prompt_strs), add_special_tokens=False)["input_ids"]
    outputs = [list(o) for o in response_ids]
    width = max(len(p) + len(o) for p, o in zip(prompts, outputs))
    if width < 2:
        raise ValueError("every prompt + output is shorter than 2 tokens; nothing to predict")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.bool)
    for i, (p, o) in enumerate(zip(prompts, outputs)):
        ids[i, : len(p) + len(o)] = torch.tensor(p + o, dtype=torch.long)
        mask[i, len(p) : len(p) + len(o)] = True if masks[i] is None else torch.tensor(masks[i], dtype=torch.bool)
    return {"input_ids": ids[:, :-1], "labels": ids[:, 1:], "response_mask": mask[:, 1:]}


def _head_parts(model):
    """(decoder, head) when the logits are head(decoder(x).last_hidden_state), else None."""
    get_decoder = getattr(model, "get_decoder", None)
    get_head = getattr(model, "get_output_embeddings", None)
    if get_decoder is None or get_head is None:
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _SPECIAL_HEADS):
        return None
    try:
        decoder, head = get_decoder(), get_head()
    except (AttributeError, NotImplementedError):
        return None
    if decoder is None or head is None or decoder is model:
        return None
    return decoder, head


def _scores(logits: torch.Tensor, labels: torch.Tensor, with_entropy: bool, temperature: float = 1.0,
            teacher_log_probs: torch.Tensor | None = None, kl_direction: str = "reverse", vocab: int | None = None,
            entropy_grad: bool = False):
    """From a chunk of logits / temperature, in float32: the gathered log-prob of each label, the (detached)
    entropy when asked, and with `teacher_log_probs` (the teacher's log-softmax at these positions) the exact
    KL over the vocabulary, differentiable: reverse KL(p || teacher) or forward KL(teacher || p).
    `vocab`: the distribution over the first `vocab` ids only (rows past them are padding).
    (log-prob, entropy or None, KL or None)"""
    logits, labels = logits.float(), labels.to(logits.device)
    if vocab is not None and vocab < logits.shape[-1]:
        logits = logits[..., :vocab]
    if temperature != 1.0:
        logits = logits / temperature
    lse = torch.logsumexp(logits, dim=-1)
    log_probs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - lse
    kl = None
    if teacher_log_probs is not None:
        log_p, log_q = logits - lse.unsqueeze(-1), teacher_log_probs.to(logits.device)
        if log_q.shape[-1] != log_p.shape[-1]:
            # one tokenizer, embedding matrices padded to other sizes (Qwen2.5 0.5B vs 7B): the ids past the
            # shorter matrix are padding; compare the two distributions over the ids both have, renormalised
            vocab = min(log_p.shape[-1], log_q.shape[-1])
            log_p, log_q = (torch.log_softmax(t[..., :vocab], dim=-1) for t in (log_p, log_q))
        kl = ((log_p.exp() * (log_p - log_q)) if kl_direction == "reverse" else (log_q.exp() * (log_q - log_p))).sum(-1)
    if not with_entropy:
        return log_probs, None, kl
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):  # an entropy bonus differentiates it
        p = torch.softmax(logits, dim=-1)
        entropy = lse - (p * logits.masked_fill(p == 0, 0.0)).sum(-1)
    return log_probs, entropy, kl


def _head_scores(head, hidden, labels, with_entropy, temperature=1.0, teacher_log_probs=None, kl_direction="reverse",
                 vocab=None, entropy_grad=False):
    return _scores(head(hidden), labels, with_entropy, temperature, teacher_log_probs, kl_direction, vocab,
                   entropy_grad)


def _scored_states(model, parts, input_ids: torch.Tensor, positions: torch.Tensor | None, offset: int,
                   packing: Packing | None = None) -> torch.Tensor:
    """(positions, features) at the scored positions, in the batch's row-major order (every position when
    `positions` is None), on the model's device: the decoder's last hidden states when the model has a plain head
    (`parts`), else its logits. Columns :offset run once, from row 0 (they hold no scored position); `packing`:
    the rows run in that padding-free layout instead (a plain head, an attention that takes its mask)."""
    ids = input_ids.to(input_device(model), non_blocking=True)
    if packing is not None and parts is not None and packable(model, ids.shape[1]):
        return _packed_hidden(model, parts[0], ids, packing)
    if parts is not None:
        states = _decoder_hidden(model, parts[0], ids, offset)
    else:
        states = model(input_ids=ids).logits[:, offset:]
    states = states.reshape(-1, states.shape[-1])
    if positions is None:
        return states
    return states[positions[:, offset:].reshape(-1).nonzero().squeeze(-1).to(states.device)]


class _TeacherScores:
    """The teacher's log-softmax at temperature 1, chunk by chunk, at the positions the student scores: its
    decoder runs once, without gradient, on its own device; each chunk's vocabulary projection when asked for."""

    def __init__(self, teacher, input_ids: torch.Tensor, positions: torch.Tensor | None, offset: int,
                 packing: Packing | None):
        parts = _head_parts(teacher)
        self.head = parts[1] if parts is not None else None
        with torch.no_grad():
            self.states = _scored_states(teacher, parts, input_ids, positions, offset if parts is not None else 0,
                                         packing)

    def log_probs(self, start: int, stop: int, device) -> torch.Tensor:
        with torch.no_grad():
            chunk = self.states[start:stop]
            logits = self.head(chunk) if self.head is not None else chunk
            return torch.log_softmax(logits.float(), dim=-1).to(device)


def _checkpointing(model) -> bool:
    """Whether activation checkpointing is on (it disables the KV cache that prefix sharing needs)."""
    model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a peft wrapper: its model's
    name = "is_activation_checkpointing" if hasattr(type(model), "is_activation_checkpointing") else "is_gradient_checkpointing"
    return bool(getattr(model, name, False))


def _shared_prefix_length(input_ids: torch.Tensor, positions: torch.Tensor | None) -> int:
    """Columns that every row shares and whose outputs nobody scores."""
    if positions is None or input_ids.shape[0] < 2:
        return 0
    same = (input_ids == input_ids[:1]).all(dim=0)
    common = int(same.long().cumprod(0).sum())
    first_scored = int(positions.long().argmax(dim=1).min()) if positions.any() else 0
    return min(common, first_scored)


def shared_prefix_columns(model, input_ids: torch.Tensor, positions: torch.Tensor | None) -> int:
    """The columns `get_response_log_probs(share_prefix=True)` runs once, from row 0: those every row shares and
    nobody scores, when there are at least MIN_SHARED_PREFIX of them, the model has a plain head and its KV cache
    is on (not under gradient checkpointing); else 0."""
    if _head_parts(model) is None or _checkpointing(model):
        return 0
    offset = _shared_prefix_length(input_ids, positions)
    return offset if offset >= MIN_SHARED_PREFIX else 0


def _decoder_hidden(model, decoder, input_ids: torch.Tensor, offset: int) -> torch.Tensor:
    """Last hidden states of columns offset.. of every row; columns :offset run once, from row 0."""
    if offset == 0:
        return decoder(input_ids=input_ids).last_hidden_state
    keyword = cache_keyword(model)
    cache = _prefix_cache(model, decoder, input_ids, offset, input_ids.shape[0])
    position_ids = torch.arange(offset, input_ids.shape[1], device=input_ids.device).expand(input_ids.shape[0], -1)
    return decoder(input_ids=input_ids[:, offset:], position_ids=position_ids, use_cache=True,
                   **{keyword: cache}).last_hidden_state


def _prefix_cache(model, decoder, input_ids: torch.Tensor, offset: int, rows: int):
    """The KV cache of row 0's first `offset` columns, repeated for `rows` rows."""
    from transformers import DynamicCache

    cache = DynamicCache()
    decoder(input_ids=input_ids[:1, :offset], use_cache=True, **{cache_keyword(model): cache})
    cache.batch_repeat_interleave(rows)
    return cache


def _packed_hidden(model, decoder, input_ids: torch.Tensor, packing: Packing) -> torch.Tensor:
    """Last hidden states at the scored positions, the rows run in `packing`'s layout after its shared prefix."""
    device = input_ids.device
    packed = packing.input_ids.to(device, non_blocking=True)
    extra = {"use_cache": False}
    if packing.prefix:
        extra = {"use_cache": True,
                 cache_keyword(model): _prefix_cache(model, decoder, input_ids, packing.prefix, packed.shape[0])}
    hidden = decoder(input_ids=packed, position_ids=packing.position_ids.to(device, non_blocking=True),
                     attention_mask=attention_mask_for(model, packing.mask.to(device, non_blocking=True)),
                     **extra).last_hidden_state
    return hidden.reshape(-1, hidden.shape[-1])[packing.scored.to(device, non_blocking=True)]


def get_response_log_probs(
    model,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    return_token_entropy: bool = False,
    *,
    positions: torch.Tensor | None = None,
    share_prefix: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    temperature: float = 1.0,
    teacher=None,
    kl_direction: str = "reverse",
    vocab: int | None = None,
    entropy_grad: bool = False,
    pack: bool = False,
) -> dict[str, torch.Tensor]:
    """Per-token log p(label | prefix), (batch, length), and optionally the per-token entropy.

    `temperature`: score the distribution softmax(logits / T) that rollouts sampled at temperature T came
    from, so that importance ratios, KL terms and the policy gradient refer to the sampling distribution.

    `positions` (batch, length) bool, optional: only these positions are scored (the rest are 0), which
    skips the vocabulary projection of prompt tokens. `share_prefix`: run the rows' common prefix once
    (needs `positions`; not with gradient checkpointing, which disables the KV cache). The entropy is for
    logging and carries no gradient, unless `entropy_grad` (an entropy bonus in the loss).

    `teacher` (a frozen model with the same vocabulary): also "teacher_kl", the exact KL between the model's
    p(. | prefix) at temperature T and the teacher's at 1, over the whole vocabulary at every scored position,
    differentiable in the model's parameters: `kl_direction` "reverse" KL(model || teacher) or "forward"
    KL(teacher || model) -- on-policy distillation with distill_kl=reverse / forward.

    `vocab`: score the distribution over the first `vocab` token ids only: a teacher whose embedding matrix
    is padded past the student's is scored over the ids the student has.

    `pack` (needs `positions`): no FLOP on padding -- each row ends at its last scored position, and the rows run
    packed into a few sequences with a mask that keeps them apart (rlvr.algorithms.packing; with `share_prefix`,
    rows with the same prompt write it once per sequence). Same values and gradients, to float rounding; used
    where the padded rows would cost more, with an attention that takes a 4-D mask (SDPA, eager).
    """
    if input_ids.shape != labels.shape:
        raise ValueError(f"input_ids has shape {tuple(input_ids.shape)} but labels has {tuple(labels.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0; got {temperature!r} (greedy rollouts have no distribution to score)")
    device = input_device(model)  # batches are built on the CPU; the model may live on a GPU
    input_ids, labels = input_ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
    positions = positions.to(device, non_blocking=True) if positions is not None else None
    parts = _head_parts(model)
    offset = shared_prefix_columns(model, input_ids, positions) if share_prefix else 0
    packing = None
    if pack and parts is not None and positions is not None and input_ids.shape[0] > 1 and packable(
            model, input_ids.shape[1]):
        packing = pack_rows(input_ids, positions, offset, attention_weight(model), share=share_prefix)
    flat_labels = labels.reshape(-1)
    select = positions.reshape(-1).nonzero().squeeze(-1) if positions is not None else None
    hidden = _scored_states(model, parts, input_ids, positions, offset, packing)  # offset is 0 without a plain head
    head = parts[1] if parts is not None else None
    width = head.weight.shape[0] if head is not None else hidden.shape[-1]  # of the logits
    if select is not None:
        flat_labels = flat_labels[select]

    teacher_scores = _TeacherScores(teacher, input_ids, positions, offset, packing) if teacher is not None else None
    # the teacher's log-softmax is (positions, V) float32: with a teacher, half the chunk for each side
    rows = max(1, chunk_elements // width // (2 if teacher is not None else 1))
    lp_chunks, ent_chunks, kl_chunks = [], [], []
    for start in range(0, hidden.shape[0], rows):
        h, y = hidden[start : start + rows], flat_labels[start : start + rows]
        t_lp = teacher_scores.log_probs(start, start + h.shape[0], h.device) if teacher is not None else None
        if parts is not None and torch.is_grad_enabled() and h.requires_grad and hidden.shape[0] > rows:
            # recompute this chunk's logits in backward instead of keeping them alive (one chunk alone is kept: no
            # more than a chunk either way, and its head matmul runs once instead of twice)
            lp, ent, kl = checkpoint(_head_scores, head, h, y, return_token_entropy, temperature, t_lp,
                                     kl_direction, vocab, entropy_grad, use_reentrant=False)
        elif parts is not None:
            lp, ent, kl = _head_scores(head, h, y, return_token_entropy, temperature, t_lp, kl_direction, vocab,
                                       entropy_grad)
        else:
            lp, ent, kl = _scores(h, y, return_token_entropy, temperature, t_lp, kl_direction, vocab, entropy_grad)
        lp_chunks.append(lp)
        if ent is not None:
            ent_chunks.append(ent)
        if kl is not None:
            kl_chunks.append(kl)

    def unflatten(chunks):
        values = torch.cat(chunks) if chunks else hidden.new_zeros(0, dtype=torch.float32)
        if select is not None:
            values = values.new_zeros(labels.numel()).index_copy(0, select, values)
        return values.view(labels.shape)

    out = {"log_probs": unflatten(lp_chunks)}
    if return_token_entropy:
        entropy = unflatten(ent_chunks)
        out["token_entropy"] = entropy if entropy_grad else entropy.detach()
    if teacher is not None:
        out["teacher_kl"] = unflatten(kl_chunks)
    return out


def sft_microbatch_train_step(
    policy_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    gradient_accumulation_steps: int,
    normalize_constant: float = 1.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Negative log-likelihood of the response tokens: summed per sequence, divided by normalize_constant,
    averaged over sequences, divided by gradient_accumulation_steps. Calls backward; returns that loss."""
    if gradient_accumulation_steps < 1:
        raise ValueError(f"gradient_accumulation_steps must be >= 1; got {gradient_accumulation_steps}")
    response_mask = response_mask.to(policy_log_probs.device)
    per_sequence = -masked_normalize(policy_log_probs, response_mask, dim=-1, normalize_constant=normalize_constant)
    loss = per_sequence.mean() / gradient_accumulation_steps
    loss.backward()
    tokens = response_mask.sum()
    nll = -(policy_log_probs.detach() * response_mask).sum() / tokens.clamp(min=1)
    return loss.detach(), {"response_tokens": tokens, "nll_per_token": nll}

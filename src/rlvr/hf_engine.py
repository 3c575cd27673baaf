"""The transformers rollout engine (`HFEngine`), an implementation of rlvr.rollout's interface.

It runs a transformers model with its own decode loop instead of `model.generate`, because RL rollouts
have a shape generate does not exploit:
  - G samples share one prompt: the prompt is prefilled once and its KV cache repeated G times;
  - most rows stop early at "</answer>": finished rows leave the batch instead of decoding padding;
  - each row draws its random numbers from its own counter-based stream keyed by (seed, prompt, sample
    index), so a rollout reproduces whatever else was in the batch (up to float rounding of the batch).
Prompts are grouped by length to keep padding low. The engine may hold its own copy of the weights (for
example in bfloat16, where this CPU's matmuls are about twice as fast); `sync_weights(policy)` copies the
trained policy in before each rollout phase, which is also the contract a vLLM backend would implement.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import time

import numpy as np
import torch
import torch.nn.functional as F

from rlvr import decode_llama
from rlvr.devices import input_device
from rlvr.models import cache_keyword
from rlvr.rollout import Completion, SamplingParams


# ----------------------------------------------------------------------------------------------------
# Counter-based random numbers: uniform u(row, step) from a 64-bit key, independent of the batch.

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def row_key(seed: int, prompt: str, sample_index: int) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{sample_index}\x00{prompt}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def uniforms(keys: np.ndarray, step: int) -> torch.Tensor:
    """One U[0, 1) draw per row for decode step `step`."""
    with np.errstate(over="ignore"):
        bits = _splitmix64(keys ^ _splitmix64(np.full_like(keys, step)))
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)


# ----------------------------------------------------------------------------------------------------
# Sampling one token per row.


_BLOCK = 256  # vocabulary entries per block of the two-level inverse-CDF search


def sample_tokens(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float, probs: torch.Tensor | None = None
) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row: (R, V) logits, (R,) uniforms -> (R,) token ids.
    `probs`, when the caller already has softmax(logits / temperature), saves computing it again."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if probs is None:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
    order = None
    if top_p < 1.0:
        probs, order = probs.sort(dim=-1, descending=True)
        before = probs.cumsum(dim=-1) - probs
        probs = probs.masked_fill(before >= top_p, 0.0)  # the first token always stays
    tokens = _inverse_cdf(probs, u)
    return order.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) if order is not None else tokens


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The first token whose cumulative probability (in float64) exceeds u x the total, found in two levels
    -- the block, then the token inside it -- so no (R, V) float64 CDF is ever built: at R = 64 that
    allocation alone (25 MB, freshly paged in at every decode step) cost more than the search."""
    rows, vocab = probs.shape
    pad = (-vocab) % _BLOCK
    blocks = F.pad(probs, (0, pad)).view(rows, -1, _BLOCK) if pad else probs.view(rows, -1, _BLOCK)
    block_cdf = blocks.sum(-1, dtype=torch.float64).cumsum(-1)  # (R, V / BLOCK)
    target = (u.to(torch.float64) * block_cdf[:, -1]).unsqueeze(-1)
    block = torch.searchsorted(block_cdf, target, right=True).clamp(max=block_cdf.shape[1] - 1)  # (R, 1)
    below = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)), torch.zeros_like(target))
    inside = blocks.gather(1, block.unsqueeze(-1).expand(rows, 1, _BLOCK)).squeeze(1)  # (R, BLOCK)
    cdf = inside.double().cumsum(-1) + below
    index = block * _BLOCK + torch.searchsorted(cdf, target, right=True).clamp(max=_BLOCK - 1)
    index = index.clamp(max=vocab - 1)
    # never land on a zero-probability token through rounding at the top of the CDF (no host sync to ask
    # whether that happened: the where costs less than the sync)
    index = torch.where(probs.gather(-1, index) > 0, index, probs.argmax(-1, keepdim=True))
    return index.squeeze(-1)


def stop_candidates(tokenizer, stop: tuple[str, ...], vocab_size: int) -> np.ndarray:
    """(vocab_size,) bool: the ids whose text can complete a stop string. A stop string first appears in a row's
    text with the token that writes its last character, so the decode loop decodes a row's tail only when the
    new token is one of these: its text alone holds the last character of some stop string, or part of a
    character (a byte-level piece decodes to U+FFFD), or it is an id the tokenizer does not know. A stop string
    ending in whitespace (which tokenizers may drop from a token decoded alone) makes every id a candidate."""
    if any(s[-1].isspace() for s in stop):
        return np.ones(vocab_size, dtype=bool)
    last = {s[-1] for s in stop} | {"\ufffd"}
    known = min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(known)])
    table = np.ones(vocab_size, dtype=bool)
    table[:known] = [any(c in text for c in last) for text in texts]
    return table


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (as in transformers and vLLM): seen tokens' logits divided (or, if < 0, multiplied)."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


# ----------------------------------------------------------------------------------------------------
# The transformers backend.


class _PreallocatedLayer:
    """A KV-cache layer that writes into a preallocated buffer instead of concatenating.

    transformers' DynamicLayer grows by torch.cat, copying the whole cache at every decode step; on this CPU
    that copy took 75% of a decode step at batch 32. Here each step writes one column and returns views.
    """

    reserve = 0  # columns to allocate at the first update (prompt + max new tokens)

    def lazy_initialization(self, key_states, value_states):
        self.device = key_states.device
        self._length = 0
        self._k = self._v = None
        self.is_initialized = True

    def _views(self):
        self.keys = self._k[:, :, : self._length]
        self.values = self._v[:, :, : self._length]

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b, h, q, d = key_states.shape
        need = self._length + q
        if self._k is None or need > self._k.shape[2]:
            capacity = max(need, self.reserve, 2 * (self._k.shape[2] if self._k is not None else 0))
            k = key_states.new_empty((b, h, capacity, d))
            v = value_states.new_empty((b, h, capacity, d))
            if self._k is not None:
                k[:, :, : self._length] = self._k[:, :, : self._length]
                v[:, :, : self._length] = self._v[:, :, : self._length]
            self._k, self._v = k, v
        self._k[:, :, self._length : need] = key_states
        self._v[:, :, self._length : need] = value_states
        self._length = need
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._length if self.is_initialized else 0

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._k = self._k.repeat_interleave(repeats, dim=0)
        self._v = self._v.repeat_interleave(repeats, dim=0)
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]
        self._views()


def preallocated_cache(reserve: int):
    """A DynamicCache whose layers write into buffers of `reserve` columns (grown by doubling if needed)."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    layer = type("PreallocatedLayer", (_PreallocatedLayer, DynamicLayer), {"reserve": reserve})
    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layer_class_to_replicate=layer)
    return cache


def _empty_copy(model, dtype: torch.dtype, device: torch.device):
    """A copy of the policy's architecture (without any LoRA wrapper) allocated directly in `dtype` on `device`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device("meta"):
            clone = type(base)(base.config)
    finally:
        torch.set_default_dtype(previous)
    clone = clone.to_empty(device=device)
    # parameters in `dtype`; buffers keep the dtype the architecture gives them (RoPE's inv_freq is fp32, as in
    # a policy loaded in bf16): rounding inv_freq to bf16 turns the rotary angle by 0.36 rad at position 256
    for param in clone.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    clone.tie_weights()  # to_empty unties shared tensors such as a tied lm_head
    clone.generation_config = copy.deepcopy(base.generation_config)
    return clone.eval()


def _merged_tensors(policy):
    """(name, tensor) of every parameter and buffer as a plain model would name it; LoRA deltas merged."""
    if not hasattr(policy, "get_base_model"):
        yield from policy.named_parameters()
        yield from policy.named_buffers()
        return
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    for name, value in list(base.named_parameters()) + list(base.named_buffers()):
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            owner_name, _, leaf = name.partition(".base_layer.")
            owner = base.get_submodule(owner_name)
            if isinstance(owner, LoraLayer) and leaf == "weight" and not owner.merged:
                value = value + sum(owner.get_delta_weight(a) for a in owner.active_adapters)
            name = f"{owner_name}.{leaf}"
        yield name, value


@torch.no_grad()
def engine_weights(policy, dtype: str | None = None, device="cpu") -> dict[str, torch.Tensor]:
    """The policy's weights as an engine takes them (plain names, LoRA merged), on `device` (the CPU for Ray's
    object store; the policy's own device for a torch.distributed broadcast), parameters in `dtype` and buffers
    in their own, for a rollout engine in another process. Casting here rounds exactly as `copy_` into the
    engine's copy would."""
    target = getattr(torch, dtype) if dtype else None
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    buffers = {name for name, _ in base.named_buffers()}  # kept in their own dtype, as the engine's copy keeps them
    return {name: value.detach().to(device=device, dtype=value.dtype if name in buffers else target or value.dtype)
            .contiguous() for name, value in _merged_tensors(policy)}


@dataclasses.dataclass
class _Rows:
    """The rows being decoded; finished rows are dropped from every field together."""

    index: torch.Tensor  # (R,) position in the chunk's completions (on the CPU)
    keys: np.ndarray  # (R,) uint64 random-stream keys
    attention: torch.Tensor  # (R, S) attention mask, grows one column per step (on the model's device)
    seen: torch.Tensor | None  # (R, V) tokens seen so far, for the repetition penalty (on the model's device)

    def select(self, keep: torch.Tensor, on_device: torch.Tensor) -> None:
        """Keep rows `keep` (a CPU index; `on_device`, the same on the model's device)."""
        self.index = self.index[keep]
        self.keys = self.keys[keep.numpy()]
        self.attention = self.attention[on_device]
        if self.seen is not None:
            self.seen = self.seen[on_device]


class HFEngine:
    """Batched sampling from a transformers causal LM (CPU or GPU)."""

    def __init__(self, model, tokenizer, batch_size: int = 64, dtype: str | None = None, compact_fraction: float = 0.25,
                 fast_decode: bool = True, device=None):
        """`dtype` or `device` different from the model's makes a private copy in that dtype on that device
        (synced by sync_weights, device to device); a LoRA policy gets a plain copy with the adapter merged in,
        a policy split over several devices a whole copy on `device` (default: the policy's input device).
        `compact_fraction`: finished rows leave the batch once they are this share of it. `fast_decode`: decode
        Llama-architecture models on the CPU with rlvr.decode_llama (fused weights, shared-prefix attention)
        instead of the transformers forward."""
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.compact_fraction = compact_fraction
        self.model = model
        policy_dtype = next(model.parameters()).dtype
        target = torch.device(device) if device is not None else input_device(model)
        if target.type == "cuda" and target.index is None:  # "cuda" means the current device, as parameters say
            target = torch.device("cuda", torch.cuda.current_device())
        on_target = {p.device for p in model.parameters()} == {target}
        if (dtype is not None and getattr(torch, dtype) != policy_dtype) or not on_target:
            self.model = _empty_copy(model, getattr(torch, dtype) if dtype else policy_dtype, target)
            self.sync_weights(model)
        self._cache_kw = cache_keyword(self.model)
        self.fast_decode = fast_decode and decode_llama.supports(self.model)
        eos = self.model.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        # an end-of-document token ends a response too (SmolLM2-Instruct ends turns with <|im_end|> but
        # sometimes writes <|endoftext|>, which would otherwise repeat until max_new_tokens)
        eos += [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
        unk = tokenizer.unk_token_id if tokenizer.unk_token != "<|endoftext|>" else None
        self.eos_ids = sorted({int(e) for e in eos if e is not None and e != unk})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.stats = {"generated_tokens": 0, "seconds": 0.0}
        self._stop_tables: dict = {}  # (stop strings, vocabulary size) -> stop_candidates

    def sync_weights(self, policy: torch.nn.Module) -> None:
        if self.model is not policy:
            self.load_weights(_merged_tensors(policy))

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The engine model's parameters and buffers by plain name: what `load_weights` writes into."""
        return {**dict(self.model.named_parameters()), **dict(self.model.named_buffers())}

    @torch.no_grad()
    def load_weights(self, tensors) -> None:
        """Copy (name, tensor) pairs -- a plain model's names, e.g. `engine_weights(policy)` sent from a learner in
        another process -- into the engine's model, casting to its dtype."""
        targets = self.named_tensors()
        for name, value in (tensors.items() if isinstance(tensors, dict) else tensors):
            if name not in targets:
                raise KeyError(f"sync_weights: the engine's model has no tensor {name!r}")
            targets[name].copy_(value)

    def generate(self, prompts: list[str], sampling: SamplingParams, progress=None) -> list[Completion]:
        was_training = self.model.training
        self.model.eval()  # a shared policy comes back in the mode it came in
        try:
            return self._generate(prompts, sampling, progress)
        finally:
            self.model.train(was_training)

    @torch.inference_mode()
    def _generate(self, prompts: list[str], sampling: SamplingParams, progress=None) -> list[Completion]:
        start = time.perf_counter()
        encoded = [self.tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
        if any(len(ids) == 0 for ids in encoded):
            raise ValueError("generate() got an empty prompt")
        # longest first, so each chunk holds prompts of similar length (less padding)
        order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
        per_chunk = max(1, self.batch_size // sampling.n)
        results: list[Completion | None] = [None] * (len(prompts) * sampling.n)
        # the fused weights are built once per call, from the weights sync_weights last copied in
        decoder = decode_llama.LlamaDecoder(self.model) if self.fast_decode else None
        for c in range(0, len(order), per_chunk):
            chunk = order[c : c + per_chunk]
            for comp in self._generate_chunk([encoded[i] for i in chunk], [prompts[i] for i in chunk], sampling,
                                             decoder, progress):
                comp.prompt_index = chunk[comp.prompt_index]
                results[comp.prompt_index * sampling.n + comp.sample_index] = comp
        self.stats["seconds"] += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _forward(self, input_ids, attention, cache, logits_to_keep=1):
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
            use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :].float()

    def _generate_chunk(self, encoded: list[list[int]], prompts: list[str], sampling: SamplingParams,
                        decoder: decode_llama.LlamaDecoder | None = None, progress=None) -> list[Completion]:
        """One batch of prompts x n samples; `progress(k)` is told as rows finish (a bar moves per completion)."""
        device = input_device(self.model)
        n, width = sampling.n, max(len(ids) for ids in encoded)
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):  # left padding
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            attention[i, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        # the fast decoder keeps a shared prompt's cache once and the rows' new tokens apart (n > 1)
        cache = preallocated_cache(width if decoder and n > 1 else width + sampling.max_new_tokens)
        logits = self._forward(input_ids, attention, cache)
        state = positions = None
        if decoder is not None:  # the prompt's cache stays shared by its samples (shared-prefix attention)
            state = decoder.start(cache, attention, n, sampling.max_new_tokens)
            positions = attention.sum(-1).repeat_interleave(n)  # where each row's first new token goes
        if n > 1:  # the samples of one prompt share its prefill
            if state is None:
                cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, dim=0)
            attention = attention.repeat_interleave(n, dim=0)
            input_ids = input_ids.repeat_interleave(n, dim=0)
        total = len(encoded) * n
        seen = None
        if sampling.repetition_penalty != 1.0:
            seen = torch.zeros((total, logits.shape[-1]), dtype=torch.bool, device=device)
            seen.scatter_(1, input_ids, attention.bool())
        keys = np.array([row_key(sampling.seed, prompts[r // n], r % n) for r in range(total)], dtype=np.uint64)
        rows = _Rows(torch.arange(total), keys, attention, seen)
        # every row's tokens (and their log-probs / entropies) land in host buffers, one column per step
        tokens = np.zeros((total, sampling.max_new_tokens), dtype=np.int64)
        logprobs = np.zeros((total, sampling.max_new_tokens)) if sampling.logprobs else None
        entropies = np.zeros((total, sampling.max_new_tokens)) if sampling.entropy else None
        length = np.zeros(total, dtype=np.int64)
        # the distribution a sampled token is scored under: the model's at the sampling temperature (T=1
        # for greedy), before top-p, penalties or min_new_tokens, which the learner cannot reproduce
        scale = sampling.temperature if sampling.temperature > 0 else 1.0
        finish: list[str | None] = [None] * total
        eos = torch.tensor(self.eos_ids, device=device)
        vocab = logits.shape[-1]  # the model's rows, which may outnumber the tokenizer's ids
        is_eos = np.zeros(vocab, dtype=bool)
        is_eos[[e for e in self.eos_ids if e < vocab]] = True
        max_stop = max((len(s) for s in sampling.stop), default=0)
        may_stop = None
        if max_stop:
            if (sampling.stop, vocab) not in self._stop_tables:
                self._stop_tables[sampling.stop, vocab] = stop_candidates(self.tokenizer, sampling.stop, vocab)
            may_stop = self._stop_tables[sampling.stop, vocab]
        active = np.ones(total, dtype=bool)  # per row of `rows`: still generating

        for step in range(sampling.max_new_tokens):
            scores = apply_repetition_penalty(logits, rows.seen, sampling.repetition_penalty) if rows.seen is not None else logits
            if step < sampling.min_new_tokens:
                scores = scores.index_fill(-1, eos, float("-inf"))
            # one softmax serves the sampler, the log-probs and the entropy; it is the sampled distribution
            # unless penalties or a minimum length reshaped `scores`, and the sampler computes it the same way
            # itself, so the tokens do not depend on whether log-probs or entropies are asked for
            sampled = scores is logits and sampling.temperature > 0
            probs = None
            if sampled or sampling.logprobs or sampling.entropy:
                probs = torch.softmax(logits / scale if scale != 1.0 else logits, dim=-1)
            next_tokens = sample_tokens(scores, uniforms(rows.keys, step).to(device), sampling.temperature,
                                        sampling.top_p, probs=probs if sampled else None)
            if rows.seen is not None:
                rows.seen.scatter_(1, next_tokens.unsqueeze(-1), True)
            # the step's one device -> host transfer: tokens, log-probs and entropies as float64 columns (ids
            # below 2**53 and float32 values are exact in float64)
            columns = [next_tokens.double()]
            if sampling.logprobs:
                columns.append(probs.gather(-1, next_tokens.unsqueeze(-1)).squeeze(-1).log().double())
            if sampling.entropy:
                columns.append(torch.special.entr(probs).sum(-1).double())
            host = torch.stack(columns, -1).cpu().numpy()
            live = active.nonzero()[0]  # positions in `rows` still generating
            ids = rows.index.numpy()[live]
            new = host[live, 0].astype(np.int64)
            tokens[ids, step] = new
            if logprobs is not None:
                logprobs[ids, step] = host[live, 1]
            if entropies is not None:
                entropies[ids, step] = host[live, -1]
            length[ids] = step + 1
            stopped = is_eos[new] if step >= sampling.min_new_tokens else np.zeros(len(live), dtype=bool)
            if may_stop is not None and step + 1 >= sampling.min_new_tokens:
                # a stop string first appears with the token that writes its last character: only rows whose new
                # token can do that decode their tail (a stop string spans at most max_stop tokens)
                for k in (may_stop[new] & ~stopped).nonzero()[0]:
                    tail = self.tokenizer.decode(tokens[ids[k], max(0, step - max_stop - 1) : step + 1].tolist())
                    stopped[k] = any(s in tail for s in sampling.stop)
            for k in stopped.nonzero()[0]:
                finish[ids[k]] = "stop"
            if step + 1 >= sampling.max_new_tokens:
                for row in ids[~stopped]:
                    finish[row] = "length"
                stopped[:] = True
            active[live[stopped]] = False
            if progress is not None and stopped.any():
                progress(int(stopped.sum()))
            if not active.any():
                break
            done = int((~active).sum())
            if done and done >= self.compact_fraction * len(active):
                keep = torch.from_numpy(active.nonzero()[0])
                keep_device = keep.to(device, non_blocking=True)
                if state is not None:
                    state.select(keep)
                    positions = positions[keep]
                else:
                    cache.batch_select_indices(keep_device)
                rows.select(keep, keep_device)
                next_tokens = next_tokens[keep_device]
                active = np.ones(len(keep), dtype=bool)
            if state is not None:
                logits = decoder.step(next_tokens, positions + step, state)
            else:
                rows.attention = torch.cat([rows.attention, rows.attention.new_ones((len(active), 1))], dim=-1)
                logits = self._forward(next_tokens.unsqueeze(-1), rows.attention, cache)

        completions = []
        for row in range(total):
            ids = tokens[row, : length[row]].tolist()
            text_ids = ids[:-1] if ids and ids[-1] in self.eos_ids and finish[row] == "stop" else ids
            text = self.tokenizer.decode(text_ids)
            if finish[row] == "stop" and sampling.stop:
                cut = [text.find(s) + len(s) for s in sampling.stop if s in text]
                text = text[: min(cut)] if cut else text
            self.stats["generated_tokens"] += len(ids)
            completions.append(
                Completion(row // n, row % n, text, ids, finish[row] or "length",
                           logprobs[row, : length[row]].tolist() if logprobs is not None else None,
                           entropies[row, : length[row]].tolist() if entropies is not None else None)
            )
        return completions

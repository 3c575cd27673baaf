"""The transformers rollout engine (`HFEngine`), an implementation of rlvr.engines.base's interface.

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

import dataclasses
import threading
import time

import numpy as np
import torch

from rlvr.core.devices import engine_dtype, input_device
from rlvr.core.models import cache_keyword
from rlvr.engines import decode_llama, int8
from rlvr.engines.base import Completion, SamplingParams
from rlvr.engines.kv_cache import MIN_SHARED_PROMPT, PrefixCache, common_prefix, fill_cache, preallocated_cache, row_kv
from rlvr.engines.sampling import apply_repetition_penalty, row_key, sample_tokens, stop_candidates, uniforms
from rlvr.engines.weights import empty_copy, merged_tensors

# ----------------------------------------------------------------------------------------------------
# The transformers backend.

__all__ = ["HFEngine", "MIN_SHARED_PROMPT"]


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
                 fast_decode: bool = True, device=None, prefix_cache_mib: int = 2048, share_prompt_prefix: bool = True):
        """`dtype` or `device` different from the model's makes a private copy in that dtype on that device
        (synced by sync_weights, device to device); `dtype="int8"` (CPU): an fp32 copy (a plain fp32 model
        itself) and its int8 quantization (rlvr.engines.int8); a LoRA policy gets a plain copy with the adapter
        merged in, a policy split over several devices a whole copy on `device` (default: its input device).
        `compact_fraction`: finished rows leave the batch once they are this share of it. `fast_decode`: decode
        Llama-architecture models on the CPU with rlvr.engines.decode_llama (fused weights, shared-prefix attention)
        instead of the transformers forward. `prefix_cache_mib`: memory for the KV of completions generated with
        `SamplingParams.keep_cache` (kv_cache.PrefixCache), which a later prompt that continues one of them reuses
        instead of prefilling it again (0: none). `share_prompt_prefix`: the ids every prompt of a call starts with
        (an instruction all prompts share: ~90 of r1_zero's ~130) are prefilled once, not once per prompt; the
        same completions and log-probs as prefilling each prompt whole up to float rounding, not exactly (other
        matmul and attention shapes round differently: 1 of 32 default-model fp32 samples differed, issue 63)."""
        # one caller at a time decodes or changes the weights (a server's batch steps beside a trainer's syncs);
        # weights_version counts the syncs, so a continuous batch knows to rebuild its fused weights
        self.lock, self.weights_version = threading.RLock(), 0
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.compact_fraction = compact_fraction
        self.model = model
        self.prefix_cache = PrefixCache(prefix_cache_mib * 2**20) if prefix_cache_mib else None
        self.share_prompt_prefix = share_prompt_prefix
        policy_dtype = next(model.parameters()).dtype
        target = torch.device(device) if device is not None else input_device(model)
        if target.type == "cuda" and target.index is None:  # "cuda" means the current device, as parameters say
            target = torch.device("cuda", torch.cuda.current_device())
        on_target = {p.device for p in model.parameters()} == {target}
        self.int8, self._int8_decoder = dtype == "int8", None
        if self.int8:  # rlvr.engines.int8: `weights` (fp32) take what sync_weights sends, `model` runs it in int8
            engine_dtype("int8", target)  # a CPU that multiplies int8 matrices, or a clear error
            plain = policy_dtype == torch.float32 and on_target and not hasattr(model, "get_base_model")
            self.model = empty_copy(model, torch.float32, target) if not plain else model
            self.weights = self.model  # quantized by load_weights
            self.load_weights(merged_tensors(model))
        elif (dtype is not None and getattr(torch, dtype) != policy_dtype) or not on_target:
            self.model = self.weights = empty_copy(model, getattr(torch, dtype) if dtype else policy_dtype, target)
            self.sync_weights(model)
        else:
            self.weights = model
        self._cache_kw = cache_keyword(self.model)
        self.fast_decode = fast_decode and decode_llama.supports(self.weights)
        eos = self.model.generation_config.eos_token_id
        eos = list(eos) if isinstance(eos, (list, tuple)) else [eos]
        # an end-of-document token ends a response too (SmolLM2-Instruct ends turns with <|im_end|> but
        # sometimes writes <|endoftext|>, which would otherwise repeat until max_new_tokens)
        eos += [tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|endoftext|>")]
        unk = tokenizer.unk_token_id if tokenizer.unk_token != "<|endoftext|>" else None
        self.eos_ids = sorted({int(e) for e in eos if e is not None and e != unk})
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        # cached_tokens: prompt ids a kept completion's KV covered; shared_prompt_tokens: ids the prompts' shared
        # beginning covered (prefilled once per call, counted once per row it saved)
        self.stats = {"generated_tokens": 0, "seconds": 0.0, "prefill_tokens": 0, "cached_tokens": 0,
                      "shared_prompt_tokens": 0}
        self._stop_tables: dict = {}  # (stop strings, vocabulary size) -> stop_candidates

    def sync_weights(self, policy: torch.nn.Module) -> None:
        with self.lock:
            self.clear_cache()  # a shared policy may have changed in place since the KV was computed
            self.weights_version += 1
            if self.model is not policy:
                self.load_weights(merged_tensors(policy))

    def continuous_batch(self, max_rows: int | None = None, max_prefill_tokens: int = 8192,
                         max_kv_bytes: int | None = None):
        """A decode batch that requests join and leave between steps (rlvr.engines.continuous; vLLM's add_request /
        step / abort_request), for a server; `max_rows` defaults to batch_size."""
        from rlvr.engines.continuous import ContinuousBatch

        return ContinuousBatch(self, max_rows or self.batch_size, max_prefill_tokens, max_kv_bytes)

    def stop_table(self, stop: tuple[str, ...], vocab: int) -> np.ndarray:
        """sampling.stop_candidates for these stop strings, computed once per engine."""
        if (stop, vocab) not in self._stop_tables:
            self._stop_tables[stop, vocab] = stop_candidates(self.tokenizer, stop, vocab)
        return self._stop_tables[stop, vocab]

    def clear_cache(self) -> None:
        """Drop every kept KV (the weights changed, or the episodes that would continue them are over)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def named_tensors(self) -> dict[str, torch.Tensor]:
        """The engine model's parameters and buffers by plain name: what `load_weights` writes into (an int8
        engine: its fp32 copy, quantized after each load)."""
        return {**dict(self.weights.named_parameters()), **dict(self.weights.named_buffers())}

    @torch.no_grad()
    def load_weights(self, tensors) -> None:
        """Copy (name, tensor) pairs -- a plain model's names, e.g. `engine_weights(policy)` sent from a learner in
        another process -- into the engine's model, casting to its dtype."""
        with self.lock:
            self.clear_cache()
            self.weights_version += 1
            targets = self.named_tensors()
            for name, value in (tensors.items() if isinstance(tensors, dict) else tensors):
                if name not in targets:
                    raise KeyError(f"sync_weights: the engine's model has no tensor {name!r}")
                if targets[name] is not value:  # an int8 engine quantizing a plain fp32 policy holds its tensors
                    targets[name].copy_(value)
            if self.int8:
                self.model, self._int8_decoder = int8.requantized(self.model, self.weights), None

    def generate(self, prompts: list[str] | list[list[int]], sampling: SamplingParams, progress=None,
                 keys: list[str] | None = None) -> list[Completion]:
        with self.lock:
            was_training = self.model.training
            self.model.eval()  # a shared policy comes back in the mode it came in
            try:
                return self._generate(prompts, sampling, progress, keys)
            finally:
                self.model.train(was_training)

    @torch.inference_mode()
    def _generate(self, prompts, sampling: SamplingParams, progress=None, keys=None) -> list[Completion]:
        start = time.perf_counter()
        encoded = [list(p) if not isinstance(p, str) else self.tokenizer(p, add_special_tokens=False).input_ids
                   for p in prompts]
        if any(len(ids) == 0 for ids in encoded):
            raise ValueError("generate() got an empty prompt")
        if keys is not None and len(keys) != len(prompts):
            raise ValueError(f"generate() got {len(keys)} keys for {len(prompts)} prompts")
        # what keys each row's random stream: the prompt's text unless told (token-id prompts: their ids)
        keys = keys or [p if isinstance(p, str) else ",".join(map(str, p)) for p in prompts]
        # the prompts that continue a kept completion prefill only what follows it; each entry is used once
        cached: list[tuple[int, torch.Tensor] | None] = [None] * len(prompts)
        if self.prefix_cache is not None and len(self.prefix_cache):
            used = set()
            for i, ids in enumerate(encoded):
                columns, kv, key = self.prefix_cache.lookup(ids)
                if kv is not None:
                    cached[i] = (columns, kv, "cached_tokens")
                    used.add(key)
            self.prefix_cache.discard(used)
        if self.share_prompt_prefix:
            cached = self._shared_prompt_prefix(encoded, cached)
        # most ids to prefill first, so each chunk holds prompts of similar length (less padding)
        order = sorted(range(len(prompts)), key=lambda i: -(len(encoded[i]) - (cached[i][0] if cached[i] else 0)))
        per_chunk = max(1, self.batch_size // sampling.n)
        results: list[Completion | None] = [None] * (len(prompts) * sampling.n)
        # the fused weights: from the weights sync_weights last copied in (_decoder)
        decoder = self._decoder() if self.fast_decode else None
        for c in range(0, len(order), per_chunk):
            chunk = order[c : c + per_chunk]
            for comp in self._generate_chunk([encoded[i] for i in chunk], [keys[i] for i in chunk], sampling,
                                             decoder, progress, [cached[i] for i in chunk]):
                comp.prompt_index = chunk[comp.prompt_index]
                results[comp.prompt_index * sampling.n + comp.sample_index] = comp
        self.stats["seconds"] += time.perf_counter() - start
        return results  # type: ignore[return-value]

    def _shared_prompt_prefix(self, encoded: list[list[int]], cached: list) -> list:
        """`cached` with the prompts' common beginning for every prompt without a kept KV: (columns, its KV,
        "shared_prompt_tokens"), the KV computed here once. Unchanged when fewer than two prompts share at least
        MIN_SHARED_PROMPT ids (all but each prompt's last id, which must be fed to give its first new token). The
        KV computed for one row of `common` ids rounds differently from the same ids inside the padded batch, so
        what follows agrees with the unshared prefill up to float rounding (a sampled token can flip)."""
        fresh = [encoded[i] for i, c in enumerate(cached) if c is None]
        common = common_prefix(fresh)
        if not common:
            return cached
        ids = torch.tensor([fresh[0][:common]], device=input_device(self.model))
        cache = preallocated_cache(common)
        self._forward(ids, torch.ones_like(ids), cache)
        kv = torch.stack([torch.stack((layer.keys[0], layer.values[0])) for layer in cache.layers])
        return [c if c is not None else (common, kv, "shared_prompt_tokens") for c in cached]

    def _decoder(self) -> decode_llama.LlamaDecoder:
        if not self.int8:  # fused from the weights as they are now (a shared policy changes in place)
            return decode_llama.LlamaDecoder(self.model)
        if self._int8_decoder is None:  # an int8 engine's weights change only in load_weights
            self._int8_decoder = decode_llama.LlamaDecoder(self.model)
        return self._int8_decoder

    def _forward(self, input_ids, attention, cache, logits_to_keep=1):
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)[:, -input_ids.shape[1] :]
        out = self.model(
            input_ids=input_ids, attention_mask=attention, position_ids=position_ids,
            use_cache=True, logits_to_keep=logits_to_keep, **{self._cache_kw: cache},
        )
        return out.logits[:, -1, :].float()

    def _generate_chunk(self, encoded: list[list[int]], keys: list[str], sampling: SamplingParams,
                        decoder: decode_llama.LlamaDecoder | None = None, progress=None,
                        cached: list | None = None) -> list[Completion]:
        """One batch of prompts x n samples (`keys`: what seeds each prompt's rows); `progress(k)` is told as rows
        finish (a bar moves per completion); `cached[i]`: (columns, KV, the stat its columns count in) known for prompt
        i's first ids."""
        device = input_device(self.model)
        n, width = sampling.n, max(len(ids) for ids in encoded)
        cached = cached or [None] * len(encoded)
        # every row is right-aligned: the last `fed` columns are fed to the model, the `width - fed` before them
        # come from the kept KV (a row's kept part is what it has there; what it does not have is fed)
        fed = max(len(ids) - (c[0] if c else 0) for ids, c in zip(encoded, cached))
        reused = [max(0, len(ids) - fed) for ids in encoded]
        self.stats["prefill_tokens"] += sum(len(ids) - r for ids, r in zip(encoded, reused))
        for c, r in zip(cached, reused):
            if c is not None:
                self.stats[c[2]] += r
        input_ids = torch.full((len(encoded), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(encoded), width), dtype=torch.long)
        for i, ids in enumerate(encoded):  # left padding
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            attention[i, width - len(ids) :] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        # the fast decoder keeps a shared prompt's cache once and the rows' new tokens apart (n > 1)
        cache = preallocated_cache(width if decoder and n > 1 else width + sampling.max_new_tokens)
        if width > fed:
            fill_cache(cache, [c[1] if r else None for c, r in zip(cached, reused)], reused, width - fed, device)
        logits = self._forward(input_ids[:, width - fed :], attention, cache)
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
        keys = np.array([row_key(sampling.seed, keys[r // n], r % n) for r in range(total)], dtype=np.uint64)
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
        may_stop = self.stop_table(sampling.stop, vocab) if max_stop else None
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
                                        sampling.top_p, probs if sampled else None, sampling.top_k, sampling.min_p)
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
            if sampling.keep_cache and self.prefix_cache is not None:
                # a row that ended at a stop string may be continued (an episode's next turn): keep its KV, which
                # covers the prompt and every new id but this step's, not yet fed to the model
                for k in (stopped & ~is_eos[new]).nonzero()[0]:
                    if finish[ids[k]] == "stop":
                        row = int(ids[k])
                        self.prefix_cache.put(encoded[row // n] + tokens[row, :step].tolist(),
                                              row_kv(int(live[k]), state, cache, rows.attention))
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

"""Continuous batching (iteration-level scheduling) for `HFEngine`: a decode batch that sequences join and leave
between decode steps, for a server whose requests arrive while others decode (rlvr.serve).

The step-level interface is vLLM's LLMEngine's (add_request / step / abort_request / has_unfinished_requests), so
an engine backed by vLLM would hand the server its own engine's methods:

    batch = engine.continuous_batch(max_rows=64)
    batch.add_request("a", prompt_ids, SamplingParams(n=2, seed=3), top_logprobs=2)
    while batch.has_unfinished_requests():
        for out in batch.step(): ...        # one StepOutput per live row: its new id, log-prob, finish reason

Reproducibility: a row's random stream is keyed as `HFEngine.generate` keys it (seed, the prompt's key, the sample
index) and drawn at the row's own step, so a request samples what generate samples for it whether it ran alone
or joined other rows at any step -- up to float rounding: the batch's shape (its rows, the columns attended)
changes how matmuls and attention round, which flips a token only where the row's uniform draw falls within that
rounding of a boundary between two tokens' cumulative probabilities.

Layout: each row's KV is left-aligned in per-layer buffers (rows, kv heads, columns, head dim), live rows first;
a row writes its new token at its own column and attention masks the columns past it. New requests are prefilled
together (the transformers forward, left-padded, as generate prefills) and their KV copied into the rows after the
live ones; a finished row's place is taken by the last live row (one row copied, not the batch). Buffers grow by
doubling and are freed when the batch empties. Llama-architecture models on the CPU decode with
rlvr.engines.decode_llama; other models with their transformers forward through `RowCache`, whose layers write
each row at its own column (rlvr.engines.row_store), and a 4D mask.
"""

from __future__ import annotations

import collections
import dataclasses

import numpy as np
import torch

from rlvr.core.devices import input_device
from rlvr.core.models import cache_keyword
from rlvr.engines import decode_llama
from rlvr.engines.base import SamplingParams
from rlvr.engines.kv_cache import common_prefix, fill_cache, preallocated_cache
from rlvr.engines.row_store import RowStore, row_cache
from rlvr.engines.sampling import apply_repetition_penalty, row_key, sample_rows, uniforms


@dataclasses.dataclass
class StepOutput:
    """One live row's new token after a step."""

    request_id: str
    sample_index: int
    token_id: int
    logprob: float | None  # under softmax(logits / temperature) (1 when greedy), as Completion.logprobs
    top_logprobs: list[tuple[int, float]] | None  # the likeliest ids of that distribution, best first
    finish_reason: str | None  # "stop" or "length" when this token ended the row; None while it goes on
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it (None: an end token)


@dataclasses.dataclass
class _Request:
    request_id: str
    prompt: list[int]
    sampling: SamplingParams
    key: str
    top_logprobs: int
    stop_ids: frozenset[int]  # the request's own stop token ids
    ends: frozenset[int]  # ids that end a row: the engine's end tokens unless ignored, and stop_ids


@dataclasses.dataclass
class _Row:
    request: _Request
    sample_index: int
    key: int  # the row's random-stream key
    length: int  # ids in the KV: the prompt, then every sampled id but the newest
    tokens: list[int] = dataclasses.field(default_factory=list)
    aborted: bool = False


class ContinuousBatch:
    """A decode batch of up to `max_rows` rows that requests join and leave between steps (see the module)."""

    def __init__(self, engine, max_rows: int = 64, max_prefill_tokens: int = 8192, max_kv_bytes: int | None = None):
        """`engine`: an HFEngine. `max_prefill_tokens`: at most this many (padded) prompt ids are prefilled in one
        step (at least one request), so that joining requests hold the running rows up for one short prefill.
        `max_kv_bytes`: rows are admitted while every row's KV, at the most columns any row may reach (its prompt
        + max_new_tokens), fits (the buffers are rows x the longest row); a request that alone would not fit is
        refused by add_request."""
        self.engine, self.max_rows, self.max_prefill_tokens = engine, max_rows, max_prefill_tokens
        self.max_kv_bytes = max_kv_bytes
        cfg = engine.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.token_bytes = (cfg.num_hidden_layers * 2 * heads * dim
                            * engine.model.get_input_embeddings().weight.element_size())
        self.waiting: collections.deque[_Request] = collections.deque()
        self.rows: list[_Row] = []
        self.logits: torch.Tensor | None = None  # (rows, V): each live row's next-token logits
        self.seen: torch.Tensor | None = None  # (rows, V) ids seen, once some row asks for a repetition penalty
        self.store: RowStore | None = None
        self.at = torch.zeros(0, dtype=torch.long)  # (rows,) the column each row writes its next id at
        self._decoder, self._version = None, None

    # ------------------------------------------------------------------------------------------------
    # vLLM's LLMEngine interface

    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, key: str | None = None,
                    top_logprobs: int = 0, stop_token_ids=(), ignore_eos: bool = False) -> None:
        """Queue `sampling.n` rows for `prompt_ids`; they join the batch at a coming step. `key` keys the rows'
        random streams (default: the ids joined by commas, as generate keys token-id prompts)."""
        if not prompt_ids:
            raise ValueError("add_request got an empty prompt")
        if sampling.n > self.max_rows:
            raise ValueError(f"n={sampling.n} is more rows than the batch holds (max_rows={self.max_rows})")
        need = self.kv_bytes(len(prompt_ids), sampling)
        if self.max_kv_bytes and need > self.max_kv_bytes:
            raise ValueError(f"{sampling.n} row(s) of {len(prompt_ids)} prompt + {sampling.max_new_tokens} new ids "
                             f"need {need / 2**20:.0f} MiB of KV cache, more than the batch's "
                             f"{self.max_kv_bytes / 2**20:.0f} MiB (ask for fewer max_tokens or choices)")
        if any(r.request_id == request_id for r in self.waiting) or any(r.request.request_id == request_id
                                                                        for r in self.rows):
            raise ValueError(f"request {request_id!r} is already in the batch")
        stops = frozenset(int(t) for t in stop_token_ids)
        ends = stops | (frozenset() if ignore_eos else frozenset(self.engine.eos_ids))
        self.waiting.append(_Request(request_id, list(prompt_ids), sampling,
                                     key if key is not None else ",".join(map(str, prompt_ids)), top_logprobs,
                                     stops, ends))

    def abort_request(self, request_id: str) -> None:
        """Drop a request: waiting, it never starts; running, its rows leave at the next step (no more outputs)."""
        self.waiting = collections.deque(r for r in self.waiting if r.request_id != request_id)
        for row in self.rows:
            if row.request.request_id == request_id:
                row.aborted = True

    def kv_bytes(self, prompt_tokens: int, sampling: SamplingParams) -> int:
        """The KV a request's rows may reach (its prompt + max_new_tokens columns each)."""
        return sampling.n * (prompt_tokens + sampling.max_new_tokens) * self.token_bytes

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.rows)

    def step(self) -> list[StepOutput]:
        """Admit waiting requests that fit, sample one token for every live row, decode the rows that go on."""
        with self.engine.lock, torch.inference_mode():
            model = self.engine.model
            was_training = model.training
            if was_training:  # a shared policy comes back in the mode it came in (eval(): 0.3 ms a step here)
                model.eval()
            try:
                return self._step()
            finally:
                if was_training:
                    model.train()

    # ------------------------------------------------------------------------------------------------

    def _step(self) -> list[StepOutput]:
        if self._version != self.engine.weights_version:  # fused weights are copies: rebuilt after each sync
            fast = self.engine.fast_decode
            self._decoder = decode_llama.LlamaDecoder(self.engine.model) if fast else None
            self._version = self.engine.weights_version
        self._retire([i for i, row in enumerate(self.rows) if row.aborted])
        fresh = self._admit()
        if fresh is not None:
            self.logits = fresh if self.logits is None else torch.cat([self.logits, fresh])
        if not self.rows:
            return []
        tokens, logprobs, top = self._sample()
        outputs, finished = [], []
        for i, row in enumerate(self.rows):
            out = self._advance(row, int(tokens[i]), logprobs, top, i)
            outputs.append(out)
            if out.finish_reason is not None:
                finished.append(i)
        self.engine.stats["generated_tokens"] += len(outputs)
        self.logits = None  # consumed
        order = self._retire(finished)
        if self.rows:
            self.logits = self._decode(torch.as_tensor(tokens[order]).to(self.at.device))
        else:
            self.logits, self.seen = None, None
            self.store.release()
        return outputs

    def _admit(self) -> torch.Tensor | None:
        """Prefill the waiting requests that fit (rows and prefill budget), add their rows; their logits."""
        taken: list[_Request] = []
        rows = len(self.rows)
        while self.waiting and rows + self.waiting[0].sampling.n <= self.max_rows:
            new = self.waiting[0]
            width = max([len(r.prompt) for r in taken] + [len(new.prompt)])
            if taken and width * (len(taken) + 1) > self.max_prefill_tokens:
                break
            most = max(self._most_columns(), *(len(r.prompt) + r.sampling.max_new_tokens for r in taken + [new]))
            if self.max_kv_bytes and (rows + new.sampling.n) * most * self.token_bytes > self.max_kv_bytes and rows:
                break  # it waits for rows to finish
            taken.append(self.waiting.popleft())
            rows += taken[-1].sampling.n
        if not taken:
            return None
        device = input_device(self.engine.model)
        width = max(len(r.prompt) for r in taken)
        out, cache = self._prefill([r.prompt for r in taken], device)
        if self.store is None or not self.store.k:
            sample = cache.layers[0].keys
            self.store = RowStore(len(cache.layers), sample.shape[1], sample.shape[3], sample.dtype, device,
                                  self.max_rows, self.max_kv_bytes)
        live = len(self.rows)
        self.store.ensure(rows, width + 1, live, max(self._most_columns(), *(len(r.prompt) + r.sampling.max_new_tokens
                                                                              for r in taken)))
        at = [row.length for row in self.rows]
        for i, r in enumerate(taken):
            start, n = len(self.rows), r.sampling.n
            for layer, (k, v) in enumerate(zip(self.store.k, self.store.v)):
                k[start:start + n, :, :len(r.prompt)] = cache.layers[layer].keys[i, :, width - len(r.prompt):]
                v[start:start + n, :, :len(r.prompt)] = cache.layers[layer].values[i, :, width - len(r.prompt):]
            seed = r.sampling.seed
            self.rows += [_Row(r, s, row_key(seed, r.key, s), len(r.prompt)) for s in range(n)]
            at += [len(r.prompt)] * n
        self.at = torch.tensor(at, device=device)
        counts = torch.tensor([r.sampling.n for r in taken], device=device)
        logits = out.repeat_interleave(counts, dim=0)
        if self.seen is not None or any(r.sampling.repetition_penalty != 1.0 for r in taken):
            self._track_seen(live, logits.shape[-1])
        return logits

    def _prefill(self, prompts: list[list[int]], device) -> tuple[torch.Tensor, object]:
        """(last-position logits (P, V) in float32, the cache holding each prompt right-aligned) for the prompts
        left-padded, as generate prefills them: their shared beginning, when they have one, once (kv_cache.
        common_prefix; the same up to float rounding as prefilling each whole)."""
        model, width = self.engine.model, max(map(len, prompts))
        keyword = cache_keyword(model)
        common = common_prefix(prompts)
        fed = width - common  # columns fed to the model; the shared ids before them come from its one-row KV
        reused = [max(0, len(p) - fed) for p in prompts]
        ids = torch.full((len(prompts), width), self.engine.pad_id, dtype=torch.long)
        attention = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = 1
        ids, attention = ids.to(device), attention.to(device)
        cache = preallocated_cache(width)
        if common:
            shared, first = preallocated_cache(common), torch.tensor([prompts[0][:common]], device=device)
            ones = torch.ones_like(first)  # the call generate makes for its shared prefix
            model(input_ids=first, attention_mask=ones, position_ids=(ones.cumsum(-1) - 1), use_cache=True,
                  logits_to_keep=1, **{keyword: shared})
            kv = torch.stack([torch.stack((layer.keys[0], layer.values[0])) for layer in shared.layers])
            fill_cache(cache, [kv if r else None for r in reused], reused, common, device)
            self.engine.stats["shared_prompt_tokens"] += sum(reused)
        self.engine.stats["prefill_tokens"] += sum(len(p) - r for p, r in zip(prompts, reused))
        out = model(input_ids=ids[:, width - fed:], attention_mask=attention,
                    position_ids=(attention.cumsum(-1) - 1).clamp(min=0)[:, width - fed:], use_cache=True,
                    logits_to_keep=1, **{keyword: cache})
        return out.logits[:, -1, :].float(), cache

    def _most_columns(self) -> int:
        """The most columns a live row may reach: its prompt + max_new_tokens."""
        return max((len(r.request.prompt) + r.request.sampling.max_new_tokens for r in self.rows), default=0)

    def _track_seen(self, old: int, vocab: int) -> None:
        """The ids each row has seen (prompt and sampled), for the repetition penalty; from row `old` on, or for
        every row when this is the first request that asked for the penalty."""
        if self.seen is None:
            self.seen, old = torch.zeros((0, vocab), dtype=torch.bool, device=self.at.device), 0
        grown = torch.zeros((len(self.rows), vocab), dtype=torch.bool, device=self.at.device)
        grown[:old] = self.seen[:old]
        for i in range(old, len(self.rows)):
            row = self.rows[i]
            grown[i, torch.tensor(row.request.prompt + row.tokens, device=self.at.device)] = True
        self.seen = grown

    def _sample(self):
        """Each live row's token, and (on the host) log-probs and the top log-probs when some row asks for them."""
        device, rows = self.logits.device, self.rows

        def param(name, dtype=torch.float32):
            return torch.tensor([getattr(r.request.sampling, name) for r in rows], dtype=dtype, device=device)

        temperature, logits = param("temperature"), self.logits
        scale = torch.where(temperature > 0, temperature, 1.0).unsqueeze(-1)
        probs = torch.softmax(logits / scale, dim=-1)
        scores = logits
        if self.seen is not None:
            scores = apply_repetition_penalty(scores, self.seen, param("repetition_penalty").unsqueeze(-1))
        early = [i for i, r in enumerate(rows) if len(r.tokens) < r.request.sampling.min_new_tokens]
        for i in early:  # no end before min_new_tokens
            scores = scores.clone() if scores is logits else scores
            scores[i, [t for t in rows[i].request.ends if t < scores.shape[-1]]] = float("-inf")
        steps = np.array([len(r.tokens) for r in rows], dtype=np.uint64)
        keys = np.array([r.key for r in rows], dtype=np.uint64)
        tokens = sample_rows(scores, uniforms(keys, steps).to(device), temperature, param("top_p"),
                             param("top_k", torch.long), param("min_p"), probs if scores is logits else None)
        want = max(r.request.top_logprobs for r in rows)
        columns = [tokens.double()]
        if want or any(r.request.sampling.logprobs for r in rows):
            columns.append(probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).log().double())
        if want:
            values, ids = probs.topk(want, dim=-1)
            columns += [values.log().double(), ids.double()]
        host = torch.cat([c.reshape(len(rows), -1) for c in columns], dim=-1).cpu().numpy()
        logprobs = host[:, 1] if host.shape[1] > 1 else None
        top = (host[:, 2:2 + want], host[:, 2 + want:].astype(np.int64)) if want else None
        if self.seen is not None:
            self.seen[torch.arange(len(rows), device=device), tokens] = True
        return host[:, 0].astype(np.int64), logprobs, top

    def _advance(self, row: _Row, token: int, logprobs, top, i: int) -> StepOutput:
        """Append `token` to `row`; whether (and why) it ends there."""
        request, sampling = row.request, row.request.sampling
        row.tokens.append(token)
        step, finish, reason = len(row.tokens) - 1, None, None
        if step >= sampling.min_new_tokens and token in request.ends:
            finish, reason = "stop", token if token in request.stop_ids else None
        if finish is None and sampling.stop and step + 1 >= sampling.min_new_tokens:
            if self.engine.stop_table(sampling.stop, self.logits.shape[-1])[token]:
                longest = max(len(s) for s in sampling.stop)
                tail = self.engine.tokenizer.decode(row.tokens[max(0, step - longest - 1):])
                hits = [(tail.find(s), s) for s in sampling.stop if s in tail]
                if hits:
                    finish, reason = "stop", min(hits)[1]
        if finish is None and len(row.tokens) >= sampling.max_new_tokens:
            finish = "length"
        wants = request.top_logprobs
        return StepOutput(request.request_id, row.sample_index, token,
                          float(logprobs[i]) if logprobs is not None and (sampling.logprobs or wants) else None,
                          [(int(t), float(v)) for t, v in zip(top[1][i, :wants], top[0][i, :wants])] if wants else None,
                          finish, reason)

    def _retire(self, finished: list[int]) -> list[int]:
        """Drop rows `finished`: each hole below the new row count takes one of the last live rows. Returns the
        old index of each row that stays, in its new order."""
        if not finished:
            return list(range(len(self.rows)))
        gone, total = set(finished), len(self.rows)
        remaining = total - len(gone)
        holes = [i for i in sorted(gone) if i < remaining]
        sources = [i for i in range(remaining, total) if i not in gone]
        order = list(range(total))
        for hole, source in zip(holes, sources):
            self.store.move(source, hole)
            order[hole] = source
            self.rows[hole] = self.rows[source]
        del self.rows[remaining:]
        index = torch.tensor(order[:remaining], dtype=torch.long, device=self.at.device)
        self.at = self.at[index]
        if self.logits is not None and len(self.logits) == total:
            self.logits = self.logits[index]
        if self.seen is not None:
            self.seen = self.seen[index]
        return order[:remaining]

    def _decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed each live row its newest id (at its own column); the next logits (rows, V) in float32."""
        rows, at = len(self.rows), self.at
        width = int(at.max()) + 1
        self.store.ensure(rows, width, rows, self._most_columns())
        attend = torch.arange(width, device=at.device) <= at.unsqueeze(-1)
        dtype = self.store.dtype
        if self._decoder is not None:
            bias = torch.zeros(attend.shape, dtype=dtype).masked_fill(~attend, float("-inf"))[:, None, None, :]
            state = decode_llama.DecodeState(None, None, bias, [k[:rows] for k in self.store.k],
                                             [v[:rows] for v in self.store.v], torch.arange(rows), 1, width, at)
            logits = self._decoder.step(tokens, at, state)
        else:
            mask = torch.zeros(attend.shape, dtype=dtype, device=at.device)
            mask = mask.masked_fill(~attend, torch.finfo(dtype).min)[:, None, None, :]
            cache = row_cache(self.store, at)
            model = self.engine.model
            out = model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=at.unsqueeze(-1),
                        use_cache=True, logits_to_keep=1, **{cache_keyword(model): cache})
            logits = out.logits[:, -1, :].float()
        self.at = at + 1
        for row in self.rows:
            row.length += 1
        return logits

"""KV caches of the engine: one that writes into preallocated buffers (transformers' DynamicLayer grows by
torch.cat, copying the whole cache at every decode step: 75% of a decode step at batch 32 on this CPU; here each
step writes one column and returns views), and `PrefixCache`, the KV of finished rows kept for a later call that
continues them (a multi-turn episode's next turn).
"""

from __future__ import annotations

import torch

# Fewer shared ids than this are prefilled with each prompt: not worth a forward pass of their own.
MIN_SHARED_PROMPT = 16


def common_prefix(prompts: list[list[int]]) -> int:
    """How many ids all `prompts` start with -- at most each one's length minus one (its last id must be fed to
    give its first new token); 0 when fewer than two prompts or fewer than MIN_SHARED_PROMPT ids are shared."""
    if len(prompts) < 2:
        return 0
    first, common = prompts[0], min(len(p) for p in prompts) - 1
    for ids in prompts[1:]:
        common = next((k for k in range(common) if ids[k] != first[k]), common)
    return common if common >= MIN_SHARED_PROMPT else 0


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


class PrefixCache:
    """The KV of sequences an engine finished, kept for a later call whose prompt continues one of them (a
    multi-turn episode's next turn: its history, the observation after it): that call prefills only the new ids.
    vLLM's automatic prefix caching plays this part for a vLLM engine.

    An entry is a finished row's KV, (layers, 2, kv heads, tokens, head dim), keyed by the ids it covers (the
    prompt and every sampled id but the last, which was never fed to the model). Entries are used once, oldest
    dropped first beyond `max_bytes`, and all dropped when the weights change (the KV was computed with the old
    ones)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: dict[tuple[int, ...], torch.Tensor] = {}  # insertion order = age
        self.bytes = self.peak_bytes = 0

    def __len__(self) -> int:
        return len(self.entries)

    def put(self, ids: list[int], kv: torch.Tensor) -> None:
        size = self._size(kv)
        if size > self.max_bytes:
            return
        key = tuple(ids)
        if key in self.entries:
            self.bytes -= self._size(self.entries.pop(key))
        self.entries[key] = kv
        self.bytes += size
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        while self.bytes > self.max_bytes:
            self.bytes -= self._size(self.entries.pop(next(iter(self.entries))))

    def lookup(self, ids: list[int]) -> tuple[int, torch.Tensor | None, tuple | None]:
        """(columns usable, the entry, its key) for the longest entry that `ids` starts with; at most len(ids) - 1
        columns, since the prompt's last id must be fed to give the first new token's logits."""
        best = None
        for key in self.entries:
            if len(best or ()) < len(key) <= len(ids) and tuple(ids[: len(key)]) == key:
                best = key
        if best is None:
            return 0, None, None
        return min(len(best), len(ids) - 1), self.entries[best], best

    def discard(self, keys) -> None:
        for key in keys:
            if key in self.entries:
                self.bytes -= self._size(self.entries.pop(key))

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0  # peak_bytes stays: the most this cache has held

    @staticmethod
    def _size(kv: torch.Tensor) -> int:
        return kv.numel() * kv.element_size()


def row_kv(row: int, state, cache, attention: torch.Tensor) -> torch.Tensor:
    """Live row `row`'s KV without its padding, (layers, 2, kv heads, tokens, head dim): from the fast decoder's
    state (its prompt's shared prefix, then its own tokens) or from the transformers cache."""
    if state is None:
        real = attention[row].bool()
        pairs = [(layer.keys[row][:, real], layer.values[row][:, real]) for layer in cache.layers]
    elif state.prefix_k is None:
        real = state.bias[row, 0, 0, : state.length] == 0
        pairs = [(k[row, :, : state.length][:, real], v[row, :, : state.length][:, real])
                 for k, v in zip(state.suffix_k, state.suffix_v)]
    else:
        prompt, t = int(state.slot[row]) // state.samples, state.length
        real = state.bias[prompt, 0, 0] == 0
        pairs = [(torch.cat([pk[prompt][:, real], sk[row, :, :t]], 1),
                  torch.cat([pv[prompt][:, real], sv[row, :, :t]], 1))
                 for pk, pv, sk, sv in zip(state.prefix_k, state.prefix_v, state.suffix_k, state.suffix_v)]
    return torch.stack([torch.stack(pair) for pair in pairs])


def fill_cache(cache, kept: list, reused: list[int], columns: int, device) -> None:
    """Write the kept KV into `cache`'s first `columns` columns, each row's `reused[i]` ids right-aligned there
    (the columns before them are left padding)."""
    sample = next(kv for kv in kept if kv is not None)
    layers, _, heads, _, dim = sample.shape
    past = torch.zeros((layers, 2, len(kept), heads, columns, dim), dtype=sample.dtype, device=device)
    for i, (kv, r) in enumerate(zip(kept, reused)):
        if r:
            past[:, :, i, :, columns - r :] = kv[:, :, :, :r]
    for layer in range(layers):
        cache.update(past[layer, 0], past[layer, 1], layer)

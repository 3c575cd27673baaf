"""A continuous batch's KV (rlvr.engines.continuous): per-layer buffers in which each row's ids are left-aligned,
grown by doubling, a finished row replaced by moving one row; and a transformers cache over them whose layers write
each row's new key at the row's own column (for models decoded by their transformers forward)."""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


class RowStore:
    """Per-layer K and V buffers (rows, kv heads, columns, head dim) of a continuous batch, grown by doubling."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device, max_rows: int,
                 max_bytes: int | None = None):
        """`max_bytes`: growth stays within it where the rows asked for allow (the batch admits rows that fit)."""
        self.shape = (layers, kv_heads, head_dim)
        self.dtype, self.device, self.max_rows, self.max_bytes = dtype, device, max_rows, max_bytes
        self.token_bytes = layers * 2 * kv_heads * head_dim * torch.empty((), dtype=dtype).element_size()
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []

    @property
    def rows(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    @property
    def columns(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def ensure(self, rows: int, columns: int, live: int, most_columns: int | None = None) -> None:
        """Room for `rows` rows of `columns` columns; the first `live` rows are kept. Growth doubles (columns up to
        `most_columns`, the most any row may reach; rows up to max_rows), within max_bytes."""
        if rows <= self.rows and columns <= self.columns:
            return
        layers, heads, dim = self.shape
        new_columns = self.columns if columns <= self.columns else max(
            columns, min(max(2 * self.columns, 64), most_columns or columns))
        new_rows = self.rows if rows <= self.rows else max(rows, min(2 * self.rows, self.max_rows))
        if self.max_bytes:
            new_rows = max(rows, min(new_rows, self.max_bytes // (new_columns * self.token_bytes)))
        # zeros, not empty: a masked column's weight is 0, but 0 x a NaN left in uninitialised memory is NaN
        shape = (new_rows, heads, new_columns, dim)
        k = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(layers)]
        v = [torch.zeros_like(t) for t in k]
        for old, new in zip(self.k + self.v, k + v):
            new[:live, :, : old.shape[2]] = old[:live]
        self.k, self.v = k, v

    def move(self, source: int, target: int) -> None:
        for buffer in self.k + self.v:
            buffer[target] = buffer[source]

    def release(self) -> None:
        self.k, self.v = [], []


class _RowLayer(DynamicLayer):
    """A transformers cache layer over a RowStore's buffers: each row's new key at its own column `at[row]`."""

    def __init__(self, store: RowStore, index: int, at: torch.Tensor):
        super().__init__()
        self.store, self.index, self.at, self.is_initialized = store, index, at, True

    def lazy_initialization(self, key_states, value_states):  # the buffers exist already
        pass

    def update(self, key_states, value_states, *args, **kwargs):
        store, at = self.store, self.at
        rows, width = len(at), int(at.max()) + 1
        index = torch.arange(rows, device=at.device)
        store.k[self.index][index, :, at] = key_states[:, :, 0]
        store.v[self.index][index, :, at] = value_states[:, :, 0]
        self.keys, self.values = store.k[self.index][:rows, :, :width], store.v[self.index][:rows, :, :width]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return int(self.at.max())

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return int(self.at.max()) + query_length, 0


def row_cache(store: RowStore, at: torch.Tensor):
    """A transformers cache over `store` for one decode step, live row r writing its new key at column at[r]."""
    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layers=[_RowLayer(store, i, at) for i in range(len(store.k))])
    return cache

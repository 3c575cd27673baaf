"""Padding-free scoring and training (issue 67): a microbatch's rows laid out in a few packed sequences, so that
the decoder spends no FLOP on padding and runs each prompt once per sequence, however many rows share it.

A microbatch arrives as (rows, width), right-padded to its longest row. `pack_rows` lays it out anew:

  - the columns every row shares and nobody scores (`prefix`: a GRPO group's prompt, the r1_zero instructions)
    stay a prefix that runs once; its KV cache serves every packed sequence (`get_response_log_probs`'s
    `share_prefix`, unchanged);
  - each row is cut at its last scored token; its own prompt (the columns after the shared prefix and before its
    first scored token: a question of one group among several) is written once per packed sequence for all the
    rows there that share it, and its response follows;
  - the packed sequences ("bins", one length, filled first-fit) carry a 4-D attention mask that lets each token
    see the shared prefix, its own prompt and its own response, causally, at the position ids it had in its padded
    row: what each token attends to is what it attended to in the padded batch, so log-probs and gradients are the
    padded pass's, to float rounding (tests/test_packing.py).

transformers passes a 4-D mask through unchanged; this works with its SDPA (and rlvr's fp32 variant) and eager
attention, on the CPU (on CUDA, not measured, the padded rows run as before). torch 2.13 has no varlen kernel with
a CPU backward (`varlen_attn` needs CUDA's flash attention; flex attention refuses backward on the CPU), and
transformers' own packing through position ids builds the same dense mask without a way to share a prompt, so the
mask is dense and a bin of L tokens pays attention over L x (prefix + L) pairs whatever the mask hides. The bin
length is therefore chosen by a cost that counts both the token slots (the matmuls, norms, activations) and the
attention pairs, weighted by `attention_weight`; when no packing beats the padded rows by that count (rows of
equal length and distinct prompts), `pack_rows` returns None and the padded pass runs.
"""

from __future__ import annotations

import dataclasses

import torch

# What one attention pair (a query and a key, forward and backward) costs in torch's CPU SDPA against what its
# FLOPs predict next to a layer's matmuls: 1.0-2.0 for SmolLM2's shapes, masked or causal (the causal kernel skips
# nothing at these lengths: its key blocks are longer than the rows), at one thread on a Zen 4 EPYC, two runs on a
# busy machine (bench/attention_cost.py, issue 67)
ATTENTION_EFFICIENCY = 1.5
# Bin lengths tried, as multiples of the longest row (its own prompt + response), besides multiples of the largest
# prompt group and everything in one bin.
_CAPACITIES = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0)


def row_widths(response_mask: torch.Tensor) -> torch.Tensor:
    """Columns each row needs: up to and including its last response label."""
    positions = torch.arange(1, response_mask.shape[1] + 1)
    return (response_mask.long() * positions).max(dim=1).values.clamp(min=1)


def microbatches(rows: list[int], input_ids: torch.Tensor, response_mask: torch.Tensor, size: int) -> list[list[int]]:
    """Rows ordered by prompt, then longest first, cut into chunks of `size`: rows of one group land
    together (their prompt can run once) and little padding is left after trimming."""
    starts = response_mask.long().argmax(dim=1)
    widths = row_widths(response_mask)
    key = {r: (tuple(input_ids[r, : int(starts[r])].tolist()), -int(widths[r])) for r in rows}
    ordered = sorted(rows, key=key.__getitem__)
    return [ordered[i : i + size] for i in range(0, len(ordered), size)]


@dataclasses.dataclass
class Packing:
    """A microbatch laid out in `R` packed sequences of length `L` after a shared prefix of `prefix` columns."""

    input_ids: torch.Tensor  # (R, L)
    position_ids: torch.Tensor  # (R, L): each token's column in its padded row
    mask: torch.Tensor  # (R, 1, L, prefix + L) bool: True where a token may attend (keys: the prefix, then the bin)
    scored: torch.Tensor  # (S,): index into the R * L packed tokens of each scored position, in the padded batch's
    # row-major order (`positions.reshape(-1).nonzero()`)
    prefix: int
    cost: float  # the packed layout's cost, and the padded rows' (in token slots; see `attention_weight`)
    padded_cost: float


def attention_weight(model) -> float:
    """One attention pair's cost in units of one token's pass through a layer's weights: forward FLOPs per key of
    one query (QK and AV over every head) over a token's FLOPs through the layer's matmuls, times
    ATTENTION_EFFICIENCY: 5e-4 for SmolLM2-135M (a row of 400 tokens spends about as much on attention as 200 more
    tokens would on the weights)."""
    config = _config(model)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    per_token = 2 * (2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + 3 * hidden * intermediate)
    return ATTENTION_EFFICIENCY * 4 * heads * head_dim / per_token


def _first_fit(rows: list[tuple], capacity: int) -> list[list[tuple]]:
    """Rows (row, prompt key, prompt length, response length) into bins of at most `capacity` tokens: each in the
    first bin holding its prompt that it fits in (there it costs only its response), else the first bin it fits in
    with its prompt, else a new one."""
    bins, sizes, prompts = [], [], []
    for row in rows:
        _, key, q, length = row
        order = sorted(range(len(bins)), key=lambda i: key not in prompts[i])  # bins with its prompt first
        for i in order:
            need = length + (0 if key in prompts[i] else q)
            if sizes[i] + need <= capacity:
                break
        else:
            i = len(bins)
            bins.append([])
            sizes.append(0)
            prompts.append(set())
            need = length + q
        bins[i].append(row)
        sizes[i] += need
        prompts[i].add(key)
    return bins


def _bin_length(bin_rows) -> int:
    return sum(length for *_, length in bin_rows) + sum(dict((key, q) for _, key, q, _ in bin_rows).values())


def pack_rows(input_ids: torch.Tensor, positions: torch.Tensor, prefix: int, weight: float,
              share: bool = True) -> Packing | None:
    """The packed layout of a (rows, width) microbatch whose first `prefix` columns run once as a shared KV cache
    (0: none), with `positions` (rows, width) the scored positions (labels); None when the padded rows cost no more
    (`weight`: `attention_weight` of the model). `share`: rows with the same own prompt write it once per bin
    (else each row its own). Built on the CPU."""
    ids, scored = input_ids.cpu(), positions.cpu().bool()
    width = ids.shape[1]
    has = scored.any(dim=1)
    first = scored.long().argmax(dim=1)
    last = width - 1 - scored.flip(1).long().argmax(dim=1)
    id_rows = ids.tolist()
    rows = []
    for b in range(ids.shape[0]):
        if has[b]:
            own = tuple(id_rows[b][prefix : int(first[b])])
            rows.append((b, own if share else (b, own), len(own), int(last[b] - first[b]) + 1))
    if not rows:
        return None
    # a group's rows together (first-fit then keeps their prompt in one bin), longest first
    rows.sort(key=lambda r: (r[1], -r[3]))
    suffix = width - prefix
    # the padded pass: every row at full width, each query against the prefix and its row
    padded_cost = ids.shape[0] * suffix * (1 + weight * (prefix + suffix))
    longest = max(q + length for _, _, q, length in rows)
    total = _bin_length(rows)
    groups = {}
    for row in rows:
        groups.setdefault(row[1], []).append(row)
    group = max(_bin_length(g) for g in groups.values())  # a whole group (its prompt once) in one bin, or k of them
    capacities = {int(longest * factor) for factor in _CAPACITIES} | {group * k for k in range(1, 5)} | {total}
    best = None
    for capacity in sorted(c for c in capacities if longest <= c <= total):
        bins = _first_fit(rows, capacity)
        length = max(_bin_length(b) for b in bins)
        cost = len(bins) * length * (1 + weight * (prefix + length))
        if best is None or cost < best[0]:
            best = (cost, bins, length)
    cost, bins, length = best
    if cost >= padded_cost:
        return None
    return _layout(ids, scored, first, bins, length, prefix, cost, padded_cost)


def _layout(ids, scored, first, bins, length: int, prefix: int, cost: float, padded_cost: float) -> Packing:
    count = len(bins)
    packed = torch.zeros((count, length), dtype=ids.dtype)
    position_ids = torch.zeros((count, length), dtype=torch.long)
    mask = torch.zeros((count, 1, length, prefix + length), dtype=torch.bool)
    tril = torch.ones((length, length), dtype=torch.bool).tril()
    starts = {}  # row -> (bin, its response's first slot)
    for r, bin_rows in enumerate(bins):
        at, prompt_at = 0, {}
        for b, key, q, size in bin_rows:
            start = int(first[b])
            if key not in prompt_at:  # the row's own prompt, written once in this bin
                packed[r, at : at + q] = ids[b, prefix:start]
                position_ids[r, at : at + q] = torch.arange(prefix, start)
                mask[r, 0, at : at + q, prefix + at : prefix + at + q] = tril[:q, :q]
                prompt_at[key] = at
                at += q
            p = prompt_at[key]
            packed[r, at : at + size] = ids[b, start : start + size]
            position_ids[r, at : at + size] = torch.arange(start, start + size)
            mask[r, 0, at : at + size, prefix + p : prefix + p + q] = True
            mask[r, 0, at : at + size, prefix + at : prefix + at + size] = tril[:size, :size]
            starts[b] = (r, at)
            at += size
        mask[r, 0, :at, :prefix] = True  # every token sees the shared prefix
        pads = torch.arange(at, length)
        mask[r, 0, pads, prefix + pads] = True  # padding sees itself (a row with no key would be NaN)
    index = []
    for b in range(ids.shape[0]):
        if b in starts:
            r, at = starts[b]
            cols = scored[b].nonzero().squeeze(-1)
            index.append(r * length + at + cols - int(first[b]))
    return Packing(packed, position_ids, mask, torch.cat(index), prefix, cost, padded_cost)


def _config(model):
    return getattr(model.get_base_model() if hasattr(model, "get_base_model") else model, "config", None)


def _implementation(model) -> str | None:
    return getattr(_config(model), "_attn_implementation", None)


def packable(model, width: int) -> bool:
    """Whether the model is on the CPU (where the cost model was measured; on CUDA the padded rows keep the flash
    kernels, which take no custom mask), its attention takes a custom 4-D mask (transformers' SDPA, rlvr's fp32
    SDPA, eager; not flash or flex attention), and no sliding window is shorter than the rows (a custom mask
    replaces the model's own, window included; a row shorter than the window never reaches past it)."""
    from rlvr.core.devices import input_device
    from rlvr.core.models import TRAINING_ATTENTION

    window = getattr(_config(model), "sliding_window", None)
    return (input_device(model).type == "cpu" and _implementation(model) in ("sdpa", "eager", TRAINING_ATTENTION)
            and not (window and width > window))


def attention_mask_for(model, mask: torch.Tensor) -> torch.Tensor:
    """The packed mask in the form the model's attention takes: bool for SDPA, additive for eager."""
    if _implementation(model) != "eager":
        return mask
    dtype = next(model.parameters()).dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)

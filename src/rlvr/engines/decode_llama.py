"""rlvr's own decode step for Llama-architecture models (SmolLM2, Llama, Mistral without sliding window),
used by `HFEngine` after the transformers prefill; other architectures take the transformers forward.

Why a forward of our own: at decode each layer's work is a few small matmuls, and the general transformers
forward adds per-step mask construction, cache bookkeeping and dozens of small ops per layer, which on a
CPU cost about as much as the matmuls (bench/decode_profile.py). Here a layer is: RMSNorm, one fused QKV
matmul, rope, attention, o_proj, RMSNorm, one fused gate/up matmul, down_proj; the arithmetic is the
transformers model's (same norms, rope from the model's own rotary module, same dtypes).

With one sample per prompt the rows' caches are single buffers, the prompt then the new tokens, read by one
attention call with the left padding masked. With G > 1 samples, shared-prefix (cascade) attention: the G
samples of a prompt share its KV cache, which is kept once,
(P, kv heads, Lp, d), instead of repeated G times; each row's own tokens live in a suffix cache (R, kv heads,
t, d). Attention runs over the two parts separately -- the prefix with all G x (heads per kv head) queries of
a prompt batched together, so its keys are read once -- and the two results are merged with their
log-sum-exps, which is exact: a softmax over [prefix, suffix] keys is the two partial softmaxes weighted by
their shares of the total mass.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from rlvr.engines import int8

_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def supports(model) -> bool:
    """Whether `model` is a plain Llama-architecture causal LM this decoder reproduces exactly."""
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in ("llama", "mistral"):
        return False
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False) or getattr(cfg, "sliding_window", None):
        return False
    if getattr(cfg, "hidden_act", "silu") != "silu" or getattr(cfg, "pretraining_tp", 1) != 1:
        return False
    inner = getattr(model, "model", None)
    return (next(model.parameters()).device.type == "cpu" and inner is not None
            and hasattr(inner, "rotary_emb") and hasattr(model, "lm_head"))


@dataclasses.dataclass
class DecodeState:
    """The KV caches of one decode. With one sample per prompt (`prefix_k` None), `suffix_k` holds each row's
    prompt and new tokens and `bias` masks its left padding; with G > 1, each prompt's cache once in
    `prefix_k` (masked by `bias`) and each row's new tokens in `suffix_k`."""

    prefix_k: list[torch.Tensor] | None  # per layer (P, kv heads, Lp, d)
    prefix_v: list[torch.Tensor] | None
    bias: torch.Tensor  # (P or R, 1, 1, columns): 0 where there is a token, -inf on the left padding
    suffix_k: list[torch.Tensor]  # per layer (R0, kv heads, columns, d); rows [0, R) are live
    suffix_v: list[torch.Tensor]
    slot: torch.Tensor  # (R,) each live row's index among the P * n rows it started as
    samples: int  # n: rows per prompt at the start
    length: int = 0  # columns of suffix_k written so far
    # a continuous batch (rlvr.engines.continuous): rows of different lengths, each writing its new token at its own
    # column (R,), left-aligned, `bias` masking the columns past each row's token; `length` is the columns attended
    rows_at: torch.Tensor | None = None

    def select(self, keep: torch.Tensor) -> None:
        """Keep only these rows (finished rows leave the batch); the shared prefixes stay as they are."""
        self.suffix_k = [k.index_select(0, keep) for k in self.suffix_k]
        self.suffix_v = [v.index_select(0, keep) for v in self.suffix_v]
        self.slot = self.slot[keep]
        if self.prefix_k is None:
            self.bias = self.bias.index_select(0, keep)


class LlamaDecoder:
    """The decode step for one model, with its QKV and gate/up weights fused (built per generate call, so it
    always sees the weights `sync_weights` last copied in)."""

    def __init__(self, model):
        """`model`: a Llama-architecture model with dense or int8 (rlvr.engines.int8) linears."""
        inner, cfg = model.model, model.config
        self.model, self.inner = model, inner
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.group = self.heads // self.kv_heads
        self.scale = self.head_dim ** -0.5
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append((
                layer.input_layernorm,
                _fused(attn.q_proj, attn.k_proj, attn.v_proj),
                _fused(attn.o_proj),
                layer.post_attention_layernorm,
                _fused(mlp.gate_proj, mlp.up_proj),
                _fused(mlp.down_proj),
            ))
        self.lm_head = model.lm_head

    def start(self, cache, prefix_mask: torch.Tensor, samples: int, max_new_tokens: int) -> DecodeState:
        """The decode state after a transformers prefill of P prompts into `cache` (rlvr's preallocated
        cache, not repeated per sample; with samples == 1 it must have room for max_new_tokens more
        columns); `prefix_mask` (P, Lp) marks the prompts' real tokens."""
        prompts, width = prefix_mask.shape
        dtype = cache.layers[0]._k.dtype
        if samples == 1:  # the prefill's own buffers, the new tokens written after the prompt
            columns = width + max_new_tokens
            mask = torch.cat([prefix_mask.bool(), prefix_mask.new_ones((prompts, max_new_tokens)).bool()], dim=1)
            bias = torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, float("-inf"))
            if cache.layers[0]._k.shape[2] < columns:
                raise ValueError(f"the prefill cache has {cache.layers[0]._k.shape[2]} columns; {columns} are needed")
            return DecodeState(None, None, bias[:, None, None, :], [layer._k for layer in cache.layers],
                               [layer._v for layer in cache.layers], torch.arange(prompts), 1, length=width)
        prefix_k = [layer._k[:, :, :width] for layer in cache.layers]
        prefix_v = [layer._v[:, :, :width] for layer in cache.layers]
        shape = (prompts * samples, self.kv_heads, max_new_tokens, self.head_dim)
        bias = torch.zeros(prefix_mask.shape, dtype=dtype).masked_fill(~prefix_mask.bool(), float("-inf"))
        return DecodeState(prefix_k, prefix_v, bias[:, None, None, :],
                           [torch.empty(shape, dtype=dtype) for _ in prefix_k],
                           [torch.empty(shape, dtype=dtype) for _ in prefix_k],
                           torch.arange(prompts * samples), samples)

    def _attention(self, q: torch.Tensor, layer: int, state: DecodeState) -> torch.Tensor:
        """(R, heads, d) queries at the newest position -> (R, heads * d), over prefix and suffix keys."""
        rows, n, kv, g, d = q.shape[0], state.samples, self.kv_heads, self.group, self.head_dim
        q = q.view(rows, kv, g, d)  # query head h reads kv head h // g, as transformers' repeat_kv
        t = state.length
        if state.prefix_k is None:
            out, _ = _flash(q, state.suffix_k[layer][:, :, :t], state.suffix_v[layer][:, :, :t], 0.0, False,
                            attn_mask=state.bias[..., :t], scale=self.scale)
            return out.reshape(rows, kv * g * d)
        o_s, lse_s = _flash(q, state.suffix_k[layer][:, :, :t], state.suffix_v[layer][:, :, :t], 0.0, False,
                            scale=self.scale)
        prompts = state.prefix_k[layer].shape[0]
        slots = q.new_zeros((prompts * n, kv, g, d)).index_copy_(0, state.slot, q)
        grouped = slots.view(prompts, n, kv, g, d).transpose(1, 2).reshape(prompts, kv, n * g, d)
        o_p, lse_p = _flash(grouped, state.prefix_k[layer], state.prefix_v[layer], 0.0, False,
                            attn_mask=state.bias, scale=self.scale)
        o_p = o_p.view(prompts, kv, n, g, d).transpose(1, 2).reshape(prompts * n, kv, g, d)[state.slot]
        lse_p = lse_p.view(prompts, kv, n, g).transpose(1, 2).reshape(prompts * n, kv, g)[state.slot]
        top = torch.maximum(lse_p, lse_s)
        w_p, w_s = (lse_p - top).exp().unsqueeze(-1), (lse_s - top).exp().unsqueeze(-1)
        out = (o_p.float() * w_p + o_s.float() * w_s) / (w_p + w_s)
        return out.to(q.dtype).reshape(rows, kv * g * d)

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor, positions: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """Logits (R, V) in float32 for one new token per live row at `positions` (R,)."""
        h = self.inner.embed_tokens(tokens)  # (R, H)
        cos, sin = self.inner.rotary_emb(h.unsqueeze(1), positions.unsqueeze(1))  # (R, 1, d)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        t = state.length
        rows = torch.arange(len(tokens), device=tokens.device) if state.rows_at is not None else None
        for index, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj) in enumerate(self.layers):
            qkv = qkv_proj(norm_in(h))
            q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
            q = _rope(q.view(-1, self.heads, self.head_dim), cos, sin)
            k = _rope(k.view(-1, self.kv_heads, self.head_dim), cos, sin)
            if rows is not None:
                state.suffix_k[index][rows, :, state.rows_at] = k
                state.suffix_v[index][rows, :, state.rows_at] = v.view(-1, self.kv_heads, self.head_dim)
            else:
                state.suffix_k[index][:, :, t] = k
                state.suffix_v[index][:, :, t] = v.view(-1, self.kv_heads, self.head_dim)
                if index == 0:
                    state.length = t + 1  # the new token attends to itself
            h = h + o_proj(self._attention(q, index, state))
            gate, up = gate_up_proj(norm_post(h)).chunk(2, dim=-1)
            h = h + down_proj(F.silu(gate) * up)
        return self.lm_head(self.inner.norm(h)).float()


def _fused(*linears):
    """One matmul computing `linears`' outputs side by side (their weights stacked by output row)."""
    if all(isinstance(m, int8.Int8Linear) for m in linears):
        return int8.fused(linears)
    weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
    return lambda x: F.linear(x, weight)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb for (R, heads, d) with (R, 1, d) cos/sin."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

"""int8 weights for the rollout and evaluation engine (issue 59; `generation_dtype=int8`, opt-in).

For CPUs without native bf16, which run bf16 matmuls emulated, tens of times slower than fp32, so that their
engine falls back to fp32. Here every linear layer, the LM head included, holds its weight in int8
with one scale per output row (symmetric: the row's largest |w| / 127), and each input row is quantized the
same way on the fly; torch's integer matmul (`torch._int_mm`, oneDNN's s8 GEMM, the kernel torchao's int8
dynamic quantization uses) multiplies them exactly in int32, and the two scales turn the result back into
floats. At decode's shapes that ran 3x the fp32 matmul with AVX-512 VNNI, 1.3x under an AVX2 limit; the engine
1.30-1.48x fp32's tokens/s at 128 new tokens, 1.00-1.12x under the AVX2 limit, and no faster on the arithmetic
recipe's short answers (bench/rollout.py --int8; docs/experiment_log.md, 2026-12-06 night). So nothing chooses
it for the user yet.

Why per row and not torch.ao's dynamic quantization (one activation scale for the whole batch): a row's
result here depends on that row only (integer products are exact, the scales are per row), so what a
completion samples does not change with what else is in its batch or with prompt padding, as in the fp32
engine; with one scale per batch it did (a test caught it). Embeddings, norms and attention stay fp32.

Sampling from int8 weights is not sampling from the fp32 policy: the trainer's rollout correction
(rollout_correction.*) weights each token by pi_old / mu, so a run refuses int8 without it.
"""

from __future__ import annotations

import copy

import torch


class Int8Linear(torch.nn.Module):
    """y = x W^T (no bias) with W in int8 per output row and x quantized per row when called."""

    def __init__(self, weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *, qweight=None,
                 scale=None):
        super().__init__()
        if weight is not None:
            qweight, scale = quantize_rows(weight)
        self.register_buffer("qweight", qweight)  # (out, in) int8
        self.register_buffer("scale", scale)  # (out,) float32
        self.bias = bias  # kept as it is (the model's own tensor, fp32)
        self.in_features, self.out_features = qweight.shape[1], qweight.shape[0]

    def set_weight(self, weight: torch.Tensor) -> None:
        self.qweight, self.scale = quantize_rows(weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).float()
        q, s = quantize_rows(rows)
        out = torch._int_mm(q, self.qweight.t()).float() * s[:, None] * self.scale
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per row"


@torch.no_grad()
def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 values, float32 scale per row): x ~ values * scale[:, None], |values| <= 127."""
    x = x.detach().float()
    scale = x.abs().amax(dim=1).clamp(min=1e-12) / 127.0
    return (x / scale[:, None]).round_().clamp_(-127, 127).to(torch.int8), scale


def quantized_copy(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each nn.Linear replaced by an Int8Linear of its weight; every other parameter and buffer
    (embeddings, norms, rotary tables) is shared with `model`, not copied, so `requantized` after `model`'s
    weights change brings the copy up to date."""
    shared = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    clone = copy.deepcopy(model, memo=shared)
    for name, module in list(clone.named_modules()):
        if type(module) is torch.nn.Linear:
            parent, _, child = name.rpartition(".")
            setattr(clone.get_submodule(parent) if parent else clone, child, Int8Linear(module.weight, module.bias))
    return clone.eval()


def requantized(clone: torch.nn.Module, model: torch.nn.Module) -> torch.nn.Module:
    """`clone` (made by quantized_copy(model)) with `model`'s linear weights quantized again; a new
    quantized_copy when `clone` is `model` itself (nothing quantized yet)."""
    if clone is model:
        return quantized_copy(model)
    for name, module in clone.named_modules():
        if isinstance(module, Int8Linear):
            module.set_weight(model.get_submodule(name).weight)
    return clone


def fused(linears) -> Int8Linear:
    """One Int8Linear whose output is `linears`' outputs side by side (the decoder's fused q/k/v and gate/up):
    their int8 rows and scales stacked, so each part computes exactly what its own layer computes."""
    if len(linears) == 1:
        return linears[0]
    if any(m.bias is not None for m in linears):
        raise TypeError("int8.fused takes linears without a bias (the decoder's Llama projections)")
    return Int8Linear(qweight=torch.cat([m.qweight for m in linears]), scale=torch.cat([m.scale for m in linears]))

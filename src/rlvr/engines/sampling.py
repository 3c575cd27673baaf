"""Sampling one token per row, reproducibly: each row draws its uniforms from its own counter-based stream
keyed by (seed, prompt, sample index), so a rollout does not depend on what else is in the batch; inverse-CDF
sampling with top-p, top-k and min-p (one setting for the batch, `sample_tokens`, or one per row, `sample_rows`,
which draw the same token for a row with the same setting); the repetition penalty; which token ids can complete
a stop string.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
import torch.nn.functional as F

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


def uniforms(keys: np.ndarray, step: int | np.ndarray) -> torch.Tensor:
    """One U[0, 1) draw per row for decode step `step` (one step for every row, or each row's own: a row that joined
    a running batch later draws at its own step, rlvr.engines.continuous)."""
    steps = np.full_like(keys, step) if np.ndim(step) == 0 else np.asarray(step).astype(np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix64(keys ^ _splitmix64(steps))
    return torch.from_numpy((bits >> np.uint64(11)).astype(np.float64) * 2.0**-53)


_BLOCK = 256  # vocabulary entries per block of the two-level inverse-CDF search


def sample_tokens(
    logits: torch.Tensor, u: torch.Tensor, temperature: float, top_p: float, probs: torch.Tensor | None = None,
    top_k: int = 0, min_p: float = 0.0,
) -> torch.Tensor:
    """Inverse-CDF sampling with one uniform per row: (R, V) logits, (R,) uniforms -> (R,) token ids.
    `probs`, when the caller already has softmax(logits / temperature), saves computing it again. Without top-p,
    top-k or min-p the search runs over the vocabulary in id order; with any of them, over the probabilities sorted
    (`truncated`)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    if probs is None:
        probs = torch.softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0 and not top_k and not min_p:
        return _inverse_cdf(probs, u)
    probs, order = truncated(probs, top_p, top_k, min_p)
    return order.gather(-1, _inverse_cdf(probs, u).unsqueeze(-1)).squeeze(-1)


def truncated(probs: torch.Tensor, top_p, top_k=0, min_p=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(probabilities sorted high to low with the cut tail zeroed, the sort order). Scalars, or (R, 1) tensors
    for one setting per row. top-k keeps the k likeliest ids (0: all), min-p those at least min_p x the likeliest,
    then top-p the likeliest whose mass before them is under top_p of what is left (renormalised only when top-k
    or min-p cut something, so that top-p alone rounds as it always has); the likeliest id always stays."""
    probs, order = probs.sort(dim=-1, descending=True)
    cut = None
    if torch.is_tensor(top_k) or top_k:
        ranks = torch.arange(probs.shape[-1], device=probs.device)
        cut = (ranks >= top_k) & (torch.as_tensor(top_k, device=probs.device) > 0)
    if torch.is_tensor(min_p) or min_p:
        low = probs < probs[..., :1] * min_p
        cut = low if cut is None else cut | low
    before = probs.cumsum(dim=-1) - probs
    if cut is not None:
        probs = probs.masked_fill(cut, 0.0)
        kept = probs.sum(dim=-1, keepdim=True)
        renormalise = cut.any(dim=-1, keepdim=True)
        before = torch.where(renormalise, (probs.cumsum(dim=-1) - probs) / kept, before)
    return probs.masked_fill(before >= top_p, 0.0), order


def sample_rows(scores: torch.Tensor, u: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                top_k: torch.Tensor, min_p: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """`sample_tokens` with a setting per row ((R,) tensors): a row draws the token `sample_tokens` draws for it
    with its own setting (greedy rows the argmax; rows without top-p/top-k/min-p in id order; the rest sorted).
    `probs`: softmax(scores / temperature) with 1 for greedy rows, when the caller has it."""
    greedy = temperature == 0
    if probs is None:
        probs = torch.softmax(scores.float() / torch.where(greedy, 1.0, temperature).unsqueeze(-1), dim=-1)
    tokens = scores.argmax(dim=-1)
    cut = ~greedy & ((top_p < 1.0) | (top_k > 0) | (min_p > 0))
    plain = (~greedy & ~cut).nonzero().squeeze(-1)
    if len(plain):
        tokens[plain] = _inverse_cdf(probs[plain], u[plain])
    rows = cut.nonzero().squeeze(-1)
    if len(rows):
        kept, order = truncated(probs[rows], top_p[rows].unsqueeze(-1), top_k[rows].unsqueeze(-1),
                                min_p[rows].unsqueeze(-1))
        tokens[rows] = order.gather(-1, _inverse_cdf(kept, u[rows]).unsqueeze(-1)).squeeze(-1)
    return tokens


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


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty) -> torch.Tensor:
    """CTRL's penalty (as in transformers and vLLM): seen tokens' logits divided (or, if < 0, multiplied). `penalty`:
    one for the batch, or an (R, 1) tensor, one per row (a row with 1 keeps its logits exactly)."""
    if not torch.is_tensor(penalty) and penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)

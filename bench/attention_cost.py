"""What an attention pair costs on this CPU next to a token's pass through a layer's weights (issue 67): the number
behind rlvr.algorithms.packing.ATTENTION_EFFICIENCY, which decides how long a packed sequence may grow.

    .venv/bin/python bench/attention_cost.py [--threads 1] [--smoke]

A layer's matmuls (q, k, v, o and the gated MLP, SmolLM2-135M's shapes; forward and backward) on 1,024 tokens, then
torch's SDPA forward and backward on the shapes packing and padding produce (rows x queries x (prefix + keys), with
a 4-D bool mask or causal), each the best of 5 after a warm-up. "efficiency" is the measured time per pair over
what the FLOP ratio predicts from the matmuls' time per token: 1.0 means an attention pair costs exactly its FLOPs'
share.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine, set_threads  # noqa: E402

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, INTERMEDIATE = 9, 3, 64, 576, 1536
SHAPES = [  # (rows, queries, prefix keys, masked)
    (8, 60, 126, True),  # a GRPO group's 8 responses after its prompt's KV cache (padding's layout)
    (1, 400, 126, True),  # the same group packed in one sequence
    (1, 800, 126, True),
    (8, 170, 0, False),  # 8 padded rows, causal (no mask)
    (8, 170, 0, True),  # the same with a mask
    (1, 1000, 0, True),
    (2, 500, 90, True),
]


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="small shapes, 1 repeat (numbers meaningless)")
    parser.add_argument("--json")
    args = parser.parse_args()
    set_threads(args.threads)
    import torch

    tokens, shapes = (64, [(2, 16, 8, True), (2, 16, 0, False)]) if args.smoke else (1024, SHAPES)
    repeats = 1 if args.smoke else args.repeats
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, HIDDEN, requires_grad=True, generator=g)
    widths = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, HIDDEN, INTERMEDIATE, INTERMEDIATE)
    weights = [torch.randn(HIDDEN, n, generator=g).mul_(0.02).requires_grad_() for n in widths]
    down = torch.randn(INTERMEDIATE, HIDDEN, generator=g).mul_(0.02).requires_grad_()

    def layer():
        q, k, v, o, gate, up = (x @ w for w in weights)
        out = q.sum() + k.sum() + v.sum() + o.sum() + ((torch.nn.functional.silu(gate) * up) @ down).sum()
        out.backward()

    per_token = best(layer, repeats) / tokens
    flops_token = 2 * (2 * HIDDEN * HEADS * HEAD_DIM + 2 * HIDDEN * KV_HEADS * HEAD_DIM + 3 * HIDDEN * INTERMEDIATE)
    predicted = per_token * 4 * HEADS * HEAD_DIM / flops_token  # seconds per pair if attention ran at the matmuls' rate
    print(f"machine: {machine()}")
    print(f"layer matmuls, forward + backward: {per_token * 1e6:.1f} us a token; an attention pair at that rate: "
          f"{predicted * 1e9:.1f} ns")
    rows = []
    for count, queries, prefix, masked in shapes:
        q = torch.randn(count, HEADS, queries, HEAD_DIM, requires_grad=True, generator=g)
        k = torch.randn(count, HEADS, prefix + queries, HEAD_DIM, requires_grad=True, generator=g)
        v = torch.randn(count, HEADS, prefix + queries, HEAD_DIM, requires_grad=True, generator=g)
        mask = torch.ones(count, 1, queries, prefix + queries, dtype=torch.bool).tril(prefix) if masked else None

        def attend():
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                   is_causal=not masked and prefix == 0)
            out.sum().backward()

        seconds = best(attend, repeats)
        pair = seconds / (count * queries * (prefix + queries))
        rows.append({"rows": count, "queries": queries, "prefix": prefix, "masked": masked, "seconds": seconds,
                     "ns_per_pair": pair * 1e9, "efficiency": pair / predicted})
        kind = "mask" if masked else "causal"
        print(f"rows {count}, queries {queries}, prefix {prefix}, {kind}: {seconds * 1e3:.1f} ms, "
              f"{pair * 1e9:.1f} ns a pair, efficiency {pair / predicted:.2f}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "us_per_token": per_token * 1e6, "shapes": rows},
                                              indent=2))


if __name__ == "__main__":
    main()

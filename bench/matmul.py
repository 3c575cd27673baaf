"""This CPU's matmul rate, the FLOP floor of a GRPO step, and the training phase's share of that rate
(issue 8, deliverables 3 and 4: "close to this machine's arithmetic limit").

    .venv/bin/python bench/matmul.py                               # matmul rates, fp32 and bf16
    .venv/bin/python bench/matmul.py --generated 1024 --trained 3500   # + the floor of such a step
    .venv/bin/python bench/matmul.py --train [--batch 8 --seq 256]     # + achieved rate of the training phase

1. Matmul rate. Every linear map of SmolLM2-135M (shapes read from its config: q/o 576x576, k/v 576x192,
   gate/up 576x1536, down 1536x576 in each of 30 layers, the tied head 576x49152) is timed as the three GEMMs
   of training at M tokens (--m, default 2048 = 8 x 256): forward y = x W^T, input gradient dy W, weight
   gradient dy^T x; in fp32 and in bf16 (bf16 inputs, what autocast runs). The "train-mix rate" of a dtype
   is total FLOPs / total time with every shape weighted by how often one token meets it (30 per layer shape,
   1 head), i.e. the rate a perfectly efficient fp32 or bf16 training step would run at. The "decode rate"
   is the forward GEMMs alone at --decode-m rows (the batch a rollout decodes, default 64).
2. Floor (with --generated G --trained T): FLOPs = 2 * params * G + 6 * params * T, with params the
   parameters every token multiplies by (all of them here: the embedding is tied to the head, so the head
   matmul is counted once and the lookup is free). floor = FLOPs / train-mix rate, per dtype, plus a
   tighter variant that charges the 2 * params * G of generation at the decode rate. Attention scores
   (~4 * layers * context * hidden per token, a few % at these lengths), the softmax over the vocabulary,
   the optimizer and all non-matmul work are left out: a real step cannot beat this floor.
   What to pass: G = tokens generated per step; T = every position the training forward/backward runs
   through (prompt + response of each trained rollout: the backward goes through the prompt too) --
   bench/grpo_step.py prints both ("gen tokens/step" and "trained positions").
3. Training phase (--train): forward + backward of `rlvr.algorithms.policy.get_response_log_probs` (scoring every
   position, as a microbatch of the GRPO update does) on --batch x --seq random tokens, fp32 and under
   `rlvr.algorithms.policy.autocast("bf16")`; achieved GFLOP/s = 6 * params * tokens / time, and its fraction of the
   train-mix rate of the dtype it runs in (the issue's target: >= 50 %). The head's recomputation under
   activation checkpointing is real work that this "model FLOPs" count leaves out.

Run on an otherwise idle machine with --threads at most the idle cores; numbers are medians of --repeats.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, machine, median, set_threads  # noqa: E402

DTYPES = ("float32", "bfloat16")


def model_shapes():
    """(name, in_features, out_features, times each token meets it) for every linear map, and the config."""
    from transformers import AutoConfig

    from rlvr.core.models import DEFAULT_MODEL, resolve_model_path

    c = AutoConfig.from_pretrained(resolve_model_path(DEFAULT_MODEL))
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = c.num_key_value_heads * head_dim
    h, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    shapes = [("q_proj", h, c.num_attention_heads * head_dim, L), ("k_proj", h, kv, L), ("v_proj", h, kv, L),
              ("o_proj", c.num_attention_heads * head_dim, h, L), ("gate_proj", h, f, L), ("up_proj", h, f, L),
              ("down_proj", f, h, L), ("lm_head", h, c.vocab_size, 1)]
    return shapes, c


def time_call(fn, repeats: int) -> float:
    """Median seconds of fn() over `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return median(times)


def gemm_rates(k: int, n: int, m: int, dtype, repeats: int, kinds=("fwd", "dgrad", "wgrad")) -> dict[str, float]:
    """Seconds of each training GEMM of a k->n linear map at m tokens: {kind: seconds}."""
    import torch
    import torch.nn.functional as F

    x = torch.randn(m, k, dtype=dtype)
    w = torch.randn(n, k, dtype=dtype)
    dy = torch.randn(m, n, dtype=dtype)
    calls = {"fwd": lambda: F.linear(x, w), "dgrad": lambda: dy @ w, "wgrad": lambda: dy.t() @ x}
    with torch.no_grad():
        return {kind: time_call(calls[kind], repeats) for kind in kinds}


def measure_rates(shapes, m: int, decode_m: int, repeats: int) -> dict:
    """Per shape and dtype GFLOP/s, and the train-mix and decode rates of each dtype."""
    import torch

    out = {}
    for dtype_name in DTYPES:
        dtype = getattr(torch, dtype_name)
        rows, train_flops, train_time, dec_flops, dec_time = [], 0.0, 0.0, 0.0, 0.0
        for name, k, n, count in shapes:
            secs = gemm_rates(k, n, m, dtype, repeats)
            dec = gemm_rates(k, n, decode_m, dtype, repeats, kinds=("fwd",))["fwd"]
            flops = 2.0 * m * k * n
            rows.append({"name": name, "k": k, "n": n, **{f"{kind}_gflops": flops / s / 1e9 for kind, s in secs.items()},
                         "decode_fwd_gflops": 2.0 * decode_m * k * n / dec / 1e9})
            train_flops += count * 3 * flops
            train_time += count * sum(secs.values())
            dec_flops += count * 2.0 * decode_m * k * n
            dec_time += count * dec
        out[dtype_name] = {"shapes": rows, "train_mix_gflops": train_flops / train_time / 1e9,
                           "decode_gflops": dec_flops / dec_time / 1e9}
    return out


def measure_training(params: int, batch: int, seq: int, repeats: int, vocab: int) -> dict:
    """Achieved GFLOP/s of forward + backward of get_response_log_probs, fp32 and bf16 autocast."""
    import torch

    from rlvr.algorithms.policy import autocast, get_response_log_probs
    from rlvr.core.models import load_model

    model, _ = load_model()
    model.train()
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=torch.Generator().manual_seed(0))
    input_ids, labels = ids[:, :-1], ids[:, 1:]
    out = {}
    for precision in ("fp32", "bf16"):
        def step():
            with autocast(precision):
                lp = get_response_log_probs(model, input_ids, labels, return_token_entropy=True)["log_probs"]
            lp.float().mean().backward()
            model.zero_grad(set_to_none=True)

        seconds = time_call(step, repeats)
        flops = 6.0 * params * batch * seq
        out[precision] = {"seconds": seconds, "tokens": batch * seq, "achieved_gflops": flops / seconds / 1e9}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=2048, help="tokens per training GEMM (rows of x)")
    parser.add_argument("--decode-m", type=int, default=64, help="rows of a decode-step GEMM")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--generated", type=int, help="tokens generated in one step (for the floor)")
    parser.add_argument("--trained", type=int, help="positions trained in one step, prompt + response (for the floor)")
    parser.add_argument("--train", action="store_true", help="measure the training phase's achieved rate")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny: M=128, decode M=8, 1 repeat, train 2 x 32")
    args = parser.parse_args()
    if args.smoke:
        args.m, args.decode_m, args.repeats, args.batch, args.seq = 128, 8, 1, 2, 32
    if (args.generated is None) != (args.trained is None):
        parser.error("--generated and --trained go together")

    set_threads(args.threads)
    shapes, config = model_shapes()
    from rlvr.core.models import load_model

    model, _ = load_model()
    params = sum(p.numel() for p in model.parameters())  # tied embedding/head counted once
    del model
    info = machine()
    print(f"machine: {info}")
    print(f"model: {params / 1e6:.1f}M parameters, hidden {config.hidden_size}, intermediate "
          f"{config.intermediate_size}, vocab {config.vocab_size}, {config.num_hidden_layers} layers; "
          f"M = {args.m} tokens, decode M = {args.decode_m}, {args.threads} threads")

    rates = measure_rates(shapes, args.m, args.decode_m, args.repeats)
    print(f"\nGFLOP/s per GEMM at M={args.m} (decode: forward at M={args.decode_m})")
    print(f"{'dtype':9s} {'linear':10s} {'K x N':>12s} {'fwd':>8s} {'dgrad':>8s} {'wgrad':>8s} {'decode':>8s}")
    for dtype_name, r in rates.items():
        for s in r["shapes"]:
            print(f"{dtype_name:9s} {s['name']:10s} {s['k']:>5d} x {s['n']:<5d} {s['fwd_gflops']:8.1f} "
                  f"{s['dgrad_gflops']:8.1f} {s['wgrad_gflops']:8.1f} {s['decode_fwd_gflops']:8.1f}")
    for dtype_name, r in rates.items():
        print(f"{dtype_name}: train-mix rate {r['train_mix_gflops']:.1f} GFLOP/s, "
              f"decode rate {r['decode_gflops']:.1f} GFLOP/s")
    fp32, bf16 = rates["float32"]["train_mix_gflops"], rates["bfloat16"]["train_mix_gflops"]
    print(f"bf16 / fp32 train-mix rate: {bf16 / fp32:.2f}x")
    results = {"machine": info, "args": vars(args), "params": params, "rates": rates}

    if args.generated is not None:
        gen_flops, train_flops = 2.0 * params * args.generated, 6.0 * params * args.trained
        print(f"\nfloor of a step with {args.generated} generated tokens and {args.trained} trained positions: "
              f"{(gen_flops + train_flops) / 1e12:.3f} TFLOP (generation {gen_flops / 1e12:.3f}, training "
              f"{train_flops / 1e12:.3f})")
        floors = {}
        for dtype_name, r in rates.items():
            simple = (gen_flops + train_flops) / (r["train_mix_gflops"] * 1e9)
            tighter = gen_flops / (r["decode_gflops"] * 1e9) + train_flops / (r["train_mix_gflops"] * 1e9)
            floors[dtype_name] = {"floor_s": simple, "floor_decode_rate_s": tighter}
            print(f"{dtype_name}: floor {simple:.2f} s at the train-mix rate; {tighter:.2f} s with generation "
                  f"at the decode rate")
        results["floor"] = {"generated": args.generated, "trained": args.trained, "flops": gen_flops + train_flops,
                            **floors}

    if args.train:
        train = measure_training(params, args.batch, args.seq, args.repeats, config.vocab_size)
        print(f"\ntraining phase: forward + backward of get_response_log_probs on {args.batch} x {args.seq} tokens")
        for precision, dtype_name in (("fp32", "float32"), ("bf16", "bfloat16")):
            t = train[precision]
            t["fraction_of_matmul_rate"] = t["achieved_gflops"] / rates[dtype_name]["train_mix_gflops"]
            print(f"{precision}: {t['seconds']:.2f} s, achieved {t['achieved_gflops']:.1f} GFLOP/s = "
                  f"{t['fraction_of_matmul_rate']:.0%} of the {dtype_name} train-mix rate")
        results["training"] = train

    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

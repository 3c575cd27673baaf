"""Where one decode step of the rollout engine spends its time (issue 20, deliverable 1).

    .venv/bin/python bench/decode_profile.py [--batches 16,64] [--dtypes bfloat16,float32] [--steps 12] [--path hf|fast]
                                             [--samples G]

For each batch size and dtype: the default model (SmolLM2-135M-Instruct) prefills B r1_zero GSM8K prompts
through `HFEngine`'s own path, then decodes --steps tokens under torch.profiler (after 3 warm-up steps). Every
profiled CPU op is put in one bucket, by the module it ran in (forward pre/post hooks push the module's
name as a profiler range, so the matmuls of q/k/v/o, the MLP and the lm_head are told apart) and by its own name (attention kernel, KV-cache writes, softmax/sampling, norms, ...). "python and
dispatch" is the step's wall time minus the profiled ops' self time: the interpreter, transformers' Python,
and the launch cost of every small op. The floor is 2 FLOPs per parameter per row over the measured bf16 or
fp32 matmul rate of this CPU at this shape (timed here, in the same run) -- the issue's floor; that rate is
timed on one weight small enough to stay in cache, so it ignores memory traffic. The roofline below it does
not: the step's own matmuls timed alone with all the model's weights streamed from memory, plus every row's KV
cache read once at the measured copy bandwidth.

--path hf (default) profiles the transformers forward the engine used before rlvr.engines.decode_llama; --path fast
profiles rlvr's own decode step (its matmuls are not in modules, so they land in "other matmuls"). Each row
attends to a prompt of ~150-200 tokens plus what it generated, as in an r1_zero rollout (1 sample per prompt:
no shared prefix to exploit; `--samples G` decodes B / G prompts x G on the fast path, as an RL rollout batch).

Output: a table per (batch, dtype): bucket, ms per step, share; then the step's wall time, its floor and
the ratio. The profiler and the module hooks inflate the profiled times (the unprofiled step time is printed).
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, set_threads  # noqa: E402

BUCKETS = [  # (bucket, predicate on (module path, op name)); the first that matches wins
    ("lm_head matmul", lambda m, op: "lm_head" in m and _is_mm(op)),
    ("attention q/k/v/o matmuls", lambda m, op: any(p in m for p in ("q_proj", "k_proj", "v_proj", "o_proj"))
     and _is_mm(op)),
    ("MLP matmuls", lambda m, op: "mlp" in m and _is_mm(op)),
    ("other matmuls", lambda m, op: _is_mm(op)),
    ("attention kernel (sdpa)", lambda m, op: "attention" in op or "sdpa" in op or "_flash" in op
     or "_scaled_dot" in op),
    ("KV-cache writes and copies", lambda m, op: op in ("aten::copy_", "aten::cat", "aten::index", "aten::slice_scatter",
                                                         "aten::index_select", "aten::repeat_interleave")),
    ("RMSNorm", lambda m, op: "norm" in m),
    ("rotary embedding", lambda m, op: "rotary" in m or "rope" in m),
    ("MLP activation/mul", lambda m, op: "mlp" in m),
    ("attention other (reshape, rope apply, mask)", lambda m, op: "self_attn" in m),
    ("sampling (softmax, cumsum, search, RNG)", lambda m, op: m == "<sampling>"),
    ("other ops", lambda m, op: True),
]


def _is_mm(op: str) -> bool:
    return op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::_addmm_activation",
                  "aten::mkldnn_linear", "aten::baddbmm")


def matmul_rate(dtype, rows: int, hidden: int, inter: int, threads: int) -> float:
    """GFLOP/s of this CPU on the decode step's dominant shapes (rows x hidden @ hidden x inter)."""
    import torch

    a = torch.randn(rows, hidden, dtype=dtype)
    b = torch.randn(hidden, inter, dtype=dtype)
    for _ in range(5):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        a @ b
        n += 1
    return 2 * rows * hidden * inter * n / (time.perf_counter() - start) / 1e9


def streamed_matmuls_ms(net, rows: int, repeats: int = 5) -> float:
    """One decode step's matmuls alone -- every layer's fused QKV, o_proj, fused gate/up and down_proj, then the
    lm_head, with the model's own weights at `rows` rows -- median ms. Unlike `matmul_rate`'s one hot shape,
    whose 1.7 MB weight stays in cache, this streams all the weights from memory as a real step does."""
    import torch
    import torch.nn.functional as F

    from rlvr.engines.decode_llama import LlamaDecoder

    weights = [w for layer in LlamaDecoder(net).layers for w in (layer[1], layer[2], layer[4], layer[5])]
    weights.append(net.lm_head.weight)
    inputs = {w.shape[1]: torch.randn(rows, w.shape[1], dtype=w.dtype) for w in weights}
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            for w in weights:
                F.linear(inputs[w.shape[1]], w)
            times.append(time.perf_counter() - start)
    return 1000 * sorted(times[1:])[repeats // 2]


def copy_bandwidth_gbs(megabytes: int = 512) -> float:
    """Memory bandwidth (GB/s, bytes read + written) of one tensor copy far larger than the caches."""
    import torch

    src = torch.empty(megabytes * 2**20, dtype=torch.uint8).fill_(1)
    dst = torch.empty_like(src)
    dst.copy_(src)
    start = time.perf_counter()
    for _ in range(5):
        dst.copy_(src)
    return 2 * 5 * src.numel() / (time.perf_counter() - start) / 1e9


def profile_case(model_path: str, batch: int, dtype_name: str, steps: int, threads: int, path: str = "hf",
                 samples: int = 1) -> dict:
    import torch

    from rlvr.core.models import load_model
    from rlvr.engines.decode_llama import LlamaDecoder
    from rlvr.engines.hf import HFEngine
    from rlvr.engines.kv_cache import preallocated_cache
    from rlvr.engines.sampling import sample_tokens, uniforms

    set_threads(threads)
    model, tokenizer = load_model(model_path)
    engine = HFEngine(model, tokenizer, batch_size=batch, dtype=dtype_name)
    net = engine.model
    if batch % samples or (samples > 1 and path != "fast"):
        raise SystemExit(f"--samples {samples}: the batch ({batch}) must be a multiple of it, on --path fast")
    prompts = gsm8k_prompts(batch // samples)[0]  # each prompt's samples share its prefill and its KV prefix
    encoded = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    width = max(map(len, encoded))
    ids = torch.full((len(encoded), width), engine.pad_id, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    for i, e in enumerate(encoded):
        ids[i, width - len(e):] = torch.tensor(e)
        attention[i, width - len(e):] = 1

    import numpy as np

    keys = np.arange(batch, dtype=np.uint64) * np.uint64(7919)

    decoder = LlamaDecoder(net) if path == "fast" else None

    def decode(steps_: int, on_step=None) -> list[float]:
        """Prefill, then decode steps_ tokens; wall seconds of each step after 3 warm-up steps."""
        walls, attention_now = [], attention
        cache = preallocated_cache(width if samples > 1 else width + steps_ + 8)
        logits = engine._forward(ids, attention_now, cache).repeat_interleave(samples, dim=0)
        if decoder is not None:
            state = decoder.start(cache, attention, samples, steps_ + 8)
            positions = attention.sum(-1).repeat_interleave(samples)
        for step in range(steps_):
            profiler = on_step(step) if on_step else None
            t0 = time.perf_counter()
            with torch.profiler.record_function("<m><sampling>"):
                tokens = sample_tokens(logits, uniforms(keys, step), 1.0, 1.0)
            if decoder is not None:
                logits = decoder.step(tokens, positions + step, state)
            else:
                attention_now = torch.cat([attention_now, attention_now.new_ones((batch, 1))], dim=-1)
                logits = engine._forward(tokens.unsqueeze(-1), attention_now, cache)
            if step >= 3:
                walls.append(time.perf_counter() - t0)
            if profiler is not None:
                profiler.__exit__(None, None, None)
                _bucket(profiler, ops)
        return walls

    ops = collections.Counter()
    with torch.inference_mode():
        plain = decode(3 + steps)  # no hooks, no profiler: the real step time
    plain_ms = 1000 * sorted(plain)[len(plain) // 2]

    open_ranges = []
    for name, module in net.named_modules():
        if name:
            def enter(m, a, name=name):
                r = torch.profiler.record_function(f"<m>{name}")
                r.__enter__()
                open_ranges.append(r)

            module.register_forward_pre_hook(enter)
            module.register_forward_hook(lambda m, a, o: open_ranges.pop().__exit__(None, None, None))

    def start_profiler(step):
        if step < 3:
            return None
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
        return prof

    with torch.inference_mode():
        walls = decode(3 + steps, start_profiler)
    wall_ms = 1000 * sum(walls) / len(walls)
    per_step = {k: v / len(walls) / 1000 for k, v in ops.items()}  # us -> ms per step
    params = sum(p.numel() for p in net.parameters())  # the tied lm_head counts once: it runs once per row
    cfg = net.config
    rate = matmul_rate(getattr(torch, dtype_name), batch, cfg.hidden_size, cfg.intermediate_size, threads)
    floor_ms = 2 * params * batch / (rate * 1e9) * 1000
    # the roofline: the step's matmuls alone (weights streamed), plus reading every row's KV cache once at the
    # copy bandwidth (each row attends to its prompt plus the tokens so far: about width + steps / 2 columns)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    # with samples > 1 a prompt's prefix is read once for its samples (shared-prefix attention)
    columns = len(encoded) * width + batch * (3 + steps / 2) if samples > 1 else batch * (width + 3 + steps / 2)
    kv_bytes = (2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * columns
                * torch.finfo(getattr(torch, dtype_name)).bits / 8)
    matmuls_ms, bandwidth = streamed_matmuls_ms(net, batch), copy_bandwidth_gbs()
    return {"batch": batch, "samples": samples, "dtype": dtype_name, "wall_ms": wall_ms, "plain_ms": plain_ms, "buckets": per_step,
            "floor_ms": floor_ms, "rate_gflops": rate, "matmuls_ms": matmuls_ms, "kv_gb": kv_bytes / 1e9,
            "bandwidth_gbs": bandwidth, "roofline_ms": matmuls_ms + kv_bytes / 1e9 / bandwidth * 1000}


def _bucket(prof, ops: collections.Counter) -> None:
    """Self CPU time of every op of one profiled step into BUCKETS, by the innermost module range above it."""
    for e in prof.events():
        if e.name.startswith("<m>") or e.name.startswith("ProfilerStep"):
            continue
        parent, module = e.cpu_parent, ""
        while parent is not None:
            if parent.name.startswith("<m>"):
                module = parent.name[3:]
                break
            parent = parent.cpu_parent
        for bucket, test in BUCKETS:
            if test(module.lower(), e.name):
                ops[bucket] += e.self_cpu_time_total
                break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="16,64")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--path", choices=("hf", "fast"), default="hf", help="transformers forward or rlvr's decode step")
    parser.add_argument("--samples", type=int, default=1, help="rows per prompt (--path fast): B / samples prompts, "
                        "as an RL rollout batch (GSM8K recipe: 16)")
    args = parser.parse_args()
    print(machine())
    for batch in map(int, args.batches.split(",")):
        for dtype in args.dtypes.split(","):
            r = profile_case(args.model, batch, dtype, args.steps, args.threads, args.path, args.samples)
            print(f"\n--- {args.path} path, batch {batch} ({batch // args.samples} prompts x {args.samples}), {dtype}: {r['plain_ms']:.1f} ms per decode step ({r['wall_ms']:.1f} under the "
                  f"profiler), floor {r['floor_ms']:.1f} ms at {r['rate_gflops']:.0f} GFLOP/s -> "
                  f"{r['plain_ms'] / r['floor_ms']:.1f}x the floor")
            print(f"    roofline {r['roofline_ms']:.1f} ms = the step's matmuls alone, weights streamed "
                  f"{r['matmuls_ms']:.1f} ms + KV reads {r['kv_gb']:.2f} GB at {r['bandwidth_gbs']:.1f} GB/s -> "
                  f"{r['plain_ms'] / r['roofline_ms']:.2f}x the roofline")
            profiled = sum(r["buckets"].values())
            rows = sorted(r["buckets"].items(), key=lambda kv: -kv[1])
            rows.append(("python and dispatch (profiled wall - ops)", r["wall_ms"] - profiled))
            for name, ms in rows:
                print(f"  {name:46s} {ms:8.1f} ms  {ms / r['wall_ms']:6.1%}")


if __name__ == "__main__":
    main()

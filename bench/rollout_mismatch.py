"""The rollout-vs-trainer mismatch on a real model (issue 36 item 2): the bf16 engine's sampling log-probs
against the learner's, with the engine's RoPE `inv_freq` kept in fp32 (rlvr today) and rounded to bf16 (the
engine before issue 36 item 1); with `--variants int8,fp32` the int8 engine's (issue 59) and the fp32
engine's (the floor).

    .venv/bin/python bench/rollout_mismatch.py --model runs/sft_arithmetic/final     # 64 rollouts, <= 256 tokens

One rollout batch of the arithmetic task (r1_zero prompts, `--questions` x `--group` samples, temperature 1,
step-1 sampling of seed 0) per engine variant, made and scored by rlvr's own loop stages (`collect_rollouts`,
`score_rollouts`: the sampled ids, EOS included), then scored by the policy in fp32 and under bf16 autocast
(the default training precision). Printed per variant and precision, over all response tokens: the k3
estimate of KL(engine || trainer), mean and max |log-ratio|, the fraction of tokens whose ratio leaves
[0.5, 2], and what `token_tis` (cap 2) would weight: mean weight and the fraction of tokens it caps; and the
same by position bucket. Both variants sample with the same seed, so their rollouts differ only where the
rounding changed a sampled token.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, machine, set_threads  # noqa: E402


def mismatch(rollout_lp: torch.Tensor, trainer_lp: torch.Tensor, mask: torch.Tensor, bucket: int) -> dict:
    from rlvr.algorithms.losses import rollout_correction_weights

    weights, meta = rollout_correction_weights(trainer_lp, rollout_lp, mask, "token_tis", cap=2.0)
    known = mask & ~torch.isnan(rollout_lp)
    d = (trainer_lp - rollout_lp)[known]
    out = {"tokens": int(known.sum()), "k3": float(meta["mismatch_k3"]) / max(int(known.sum()), 1),
           "mean_abs": float(d.abs().mean()), "max_abs": float(d.abs().max()),
           "outside_band": int(meta["outside_band"]) / max(int(known.sum()), 1),
           "tis_weight_mean": float(weights[mask].mean()), "tis_capped": int(meta["capped"]) / max(int(mask.sum()), 1)}
    # by position in the response: the rounding error of a bf16 inv_freq grows with the position
    position = known.long().cumsum(dim=1) - 1
    buckets = []
    for lo in range(0, int(position.max()) + 1, bucket):
        sel = known & (position >= lo) & (position < lo + bucket)
        if sel.any():
            ds = (trainer_lp - rollout_lp)[sel]
            buckets.append({"from": lo, "to": lo + bucket, "tokens": int(sel.sum()), "mean_abs": float(ds.abs().mean()),
                            "k3": float((torch.exp(ds) - 1 - ds).mean())})
    out["buckets"] = buckets
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/sft_arithmetic/final")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--bucket", type=int, default=64)
    parser.add_argument("--variants", default="inv_freq_fp32,inv_freq_bf16",
                        help="engines, comma-separated: inv_freq_fp32 (the bf16 engine), inv_freq_bf16 (the bf16 "
                        "engine before issue 36), int8 (rlvr.engines.int8, issue 59), fp32 (the floor: batch and "
                        "kernel rounding only)")
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--json")
    args = parser.parse_args()
    set_threads(args.threads)

    from rlvr.algorithms.update import score_log_probs
    from rlvr.config import TrainConfig, load_config
    from rlvr.core.models import load_model
    from rlvr.engines.hf import HFEngine
    from rlvr.tasks.datasets import load_split
    from rlvr.tasks.prompts import get_prompt
    from rlvr.tasks.records import DataOrder
    from rlvr import stages
    from rlvr.tasks.reward_base import score_batch

    cfg = load_config(TrainConfig, overrides=dict(model=args.model, dataset="arithmetic", prompt="r1_zero",
                                                  rollout_batch_size=args.questions * args.group,
                                                  group_size=args.group, max_new_tokens=args.max_new_tokens,
                                                  generation_dtype="bfloat16", out="/tmp/rollout-mismatch"))
    model, tokenizer = load_model(cfg.model, dtype="float32")
    model.eval()
    train = load_split(cfg, "train")
    prompt = get_prompt(cfg.prompt)
    reward_fn = stages.build_reward_fn(cfg, prompt.reward)
    results = {"machine": machine(), "args": vars(args), "variants": {}}
    for variant in args.variants.split(","):
        dtype = {"int8": "int8", "fp32": "float32"}.get(variant, "bfloat16")
        engine = HFEngine(model, tokenizer, batch_size=64, dtype=dtype)
        engine.sync_weights(model)
        if variant == "inv_freq_bf16":  # the engine before issue 36 item 1: its buffers rounded to bf16
            sync = engine.sync_weights

            def rounded_sync(policy, sync=sync, engine=engine):
                sync(policy)
                for name, buf in engine.model.named_buffers():
                    if buf.is_floating_point():
                        buf.copy_(buf.to(torch.bfloat16).float())

            engine.sync_weights = rounded_sync
        start = time.perf_counter()
        rollouts = stages.collect_rollouts(engine, model, train, DataOrder(len(train), f"grpo-{cfg.seed}"), prompt, tokenizer, cfg, 1)
        generate_s = time.perf_counter() - start
        batch = stages.score_rollouts(rollouts, reward_fn, cfg.estimator, cfg, tokenizer).batch
        row = {"generate_s": generate_s, "mean_tokens": float(batch.response_mask.sum(1).float().mean()),
               "reward": sum(s["reward"] for s in score_batch(reward_fn, rollouts.responses, rollouts.truths)[0])
               / len(rollouts.completions)}
        print(f"{variant:14s} generated {int(batch.response_mask.sum())} tokens in {generate_s:.1f} s, reward "
              f"{row['reward']:.3f}", flush=True)
        for precision in ("fp32", "bf16"):
            lp = score_log_probs(model, batch.input_ids, batch.labels, batch.response_mask, 8, precision)
            row[precision] = mismatch(batch.rollout_log_probs, lp, batch.response_mask, args.bucket)
            r = row[precision]
            print(f"{variant:14s} trainer {precision}: {r['tokens']} tokens, k3 KL {r['k3']:.2e}, mean |d| "
                  f"{r['mean_abs']:.4f}, max |d| {r['max_abs']:.3f}, outside [0.5, 2] {100 * r['outside_band']:.2f} %, "
                  f"token_tis weight {r['tis_weight_mean']:.4f} (capped {100 * r['tis_capped']:.2f} %); by position: "
                  + ", ".join(f"{b['from']}-{b['to']}: {b['mean_abs']:.4f}" for b in r["buckets"]), flush=True)
        results["variants"][variant] = row
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

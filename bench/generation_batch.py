"""How many rows to decode together: `generation_batch_size` against tokens/s (issue 20).

    .venv/bin/python bench/generation_batch.py [--model runs/sft_gsm8k/final] [--prompts 16] [--samples 16]
                                               [--sizes 64,256] [--repeats 2] [--smoke]

One HFEngine (bf16 copy, rlvr's decode step) generates the same P GSM8K train prompts x G samples (r1_zero,
T = 0.8, up to 256 new tokens, stop at `</answer>`: a round of the GSM8K recipe's dynamic sampling) once per
batch size, the sizes alternating in order and reversed between repeats so drift on a shared machine falls on
both; each repeat uses its own seed, the same for every size, so the sizes do nearly the same work (bf16
rounding differs with the batch shape, so the samples are not identical). Prints tokens/s per size (median
over repeats) and each size's speed relative to the first.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, median, set_threads  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="runs/sft_gsm8k/final",
                        help="a checkpoint (default: the GSM8K SFT model; the default model if it is missing)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--sizes", default="64,256", help="generation_batch_size values (rows decoded together)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--smoke", action="store_true", help="tiny: 2 prompts x 2 samples, sizes 2,4, 8 tokens")
    args = parser.parse_args()
    if args.smoke:
        args.prompts, args.samples, args.sizes, args.repeats, args.max_new_tokens = 2, 2, "2,4", 1, 8
    set_threads(args.threads)
    print(machine())

    from rlvr.core.models import load_model
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    model_path = args.model if Path(args.model).is_dir() else "SmolLM2-135M-Instruct"
    model, tokenizer = load_model(model_path)
    engine = HFEngine(model, tokenizer, dtype="bfloat16")
    prompts, _ = gsm8k_prompts(args.prompts, split="train")
    sizes = [int(s) for s in args.sizes.split(",")]
    rates: dict[int, list[float]] = {s: [] for s in sizes}
    for repeat in range(args.repeats):
        for size in sizes if repeat % 2 == 0 else sizes[::-1]:
            engine.batch_size = size
            sampling = SamplingParams(temperature=0.8, top_p=1.0, max_new_tokens=args.max_new_tokens,
                                      stop=("</answer>",), n=args.samples, seed=100 + repeat)
            start = time.perf_counter()
            tokens = sum(len(c.token_ids) for c in engine.generate(prompts, sampling))
            seconds = time.perf_counter() - start
            rates[size].append(tokens / seconds)
            print(f"repeat {repeat}, batch {size}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.1f} tokens/s",
                  flush=True)
    print(f"\n{model_path}, {args.prompts} prompts x {args.samples} samples, {args.threads} threads")
    for size in sizes:
        print(f"generation_batch_size {size:4d}: {median(rates[size]):7.1f} tokens/s  "
              f"({median(rates[size]) / median(rates[sizes[0]]):.2f}x batch {sizes[0]})")


if __name__ == "__main__":
    main()

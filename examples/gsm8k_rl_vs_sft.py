"""Issue 18's result: SFT vs SFT + GRPO on the full GSM8K test set (1,319 questions), 3 seeds, with intervals.

    .venv/bin/python examples/gsm8k_rl_vs_sft.py [--seeds 0 1 2] [--steps 30|120] [--only train|eval] [--sampled]

Every piece is an ordinary, resumable rlvr command, skipped when its output is complete, so the script can be
stopped and started again at any point (one piece at a time: 2 cores):
  1. the SFT checkpoint (configs/sft_gsm8k.yaml -> runs/sft_gsm8k/final), if missing;
  2. GRPO from it with configs/grpo_gsm8k_dynamic.yaml, one run per seed (runs/grpo_gsm8k_dynamic_s<seed>; with
     --steps other than the recipe's 30, runs/grpo_gsm8k_long_s<seed> -- seed 0's 120-step run continued the
     30-step one from its step-28 checkpoint, which the constant learning rate makes exact);
  3. `rlvr eval` of the SFT model and of each seed's final model on the test split: greedy, and with --sampled
     one sample per question at the recipe's temperature 0.8 (sampled pass@1), 256 new tokens, bf16 engine.
The table: each model's accuracy with its binomial 95 % interval over the 1,319 questions, and the seeds' mean
with a 95 % t-interval over seeds (n = number of finished seeds). Per run: about 70 min of training, about 13 min
per test evaluation on this 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from post_training_comparison import RLVR, sh  # noqa: E402  (the sibling example: one rlvr command, logged, timed)
from rlvr.runs import spread  # noqa: E402

SFT = Path("runs/sft_gsm8k/final")
RECIPE = "configs/grpo_gsm8k_dynamic.yaml"
EVAL = ["dataset=gsm8k", "prompt=r1_zero", "split=test", "max_new_tokens=256", "dtype=bfloat16",
        "examples_per_category=0"]
MODES = {"greedy": ["samples=1", "temperature=0"], "sampled": ["samples=1", "temperature=0.8"]}


def run_dir(seed: int, steps: int) -> Path:
    return Path(f"runs/grpo_gsm8k_dynamic_s{seed}" if steps == 30 else f"runs/grpo_gsm8k_long_s{seed}")


def train(seed: int, steps: int) -> Path:
    run = run_dir(seed, steps)
    if not (run / "final" / "DONE").is_file():
        resume = ["resume=true"] if (run / "metrics.jsonl").is_file() else []
        seconds = sh(RLVR + ["train", "--config", RECIPE, f"seed={seed}", f"steps={steps}", f"out={run}", *resume],
                     run.parent / f"{run.name}.log")
        print(f"trained seed {seed} in {seconds / 60:.1f} min", flush=True)
    return run / "final"


def evaluate(model: Path, name: str, mode: str, seed: int = 0) -> dict:
    out = Path("runs/eval/gsm8k_test") / f"{name}-{mode}"
    if not (out / "summary.json").is_file():
        seconds = sh(RLVR + ["eval", f"model={model}", f"out={out}", f"seed={seed}", *EVAL, *MODES[mode]],
                     out.parent / f"{out.name}.log")
        print(f"evaluated {name} ({mode}) in {seconds / 60:.1f} min", flush=True)
    return json.loads((out / "summary.json").read_text())


def binomial(p: float, n: int) -> float:
    return 1.96 * math.sqrt(p * (1 - p) / n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps per seed (the recipe's: 30)")
    parser.add_argument("--only", choices=("train", "eval"), default=None)
    parser.add_argument("--sampled", action="store_true", help="also the sampled pass@1 at T = 0.8")
    args = parser.parse_args()
    if not (SFT / "DONE").is_file():
        sh(RLVR + ["sft", "--config", "configs/sft_gsm8k.yaml", "resume=true"], Path("runs/sft_gsm8k.log"))
    finals = {seed: train(seed, args.steps) for seed in args.seeds} if args.only != "eval" else {
        seed: run_dir(seed, args.steps) / "final" for seed in args.seeds}
    name = "grpo_dynamic" if args.steps == 30 else f"grpo_dynamic_{args.steps}"
    if args.only == "train":
        return
    modes = ["greedy"] + (["sampled"] if args.sampled else [])
    for mode in modes:
        sft = evaluate(SFT, "sft", mode)
        n = sft["n"]
        print(f"\nGSM8K test, {mode} ({n} questions; GRPO {args.steps} steps; per model: accuracy +- binomial 95 % "
              "half width)")
        print(f"  SFT                 {sft['accuracy']:.4f} +- {binomial(sft['accuracy'], n):.4f}  "
              f"format {sft['format_rate']:.3f}")
        accs = []
        for seed, final in finals.items():
            if not (final / "DONE").is_file():
                print(f"  GRPO seed {seed}         (not trained yet: {final.parent})")
                continue
            s = evaluate(final, f"{name}_s{seed}", mode, seed)
            accs.append(s["accuracy"])
            print(f"  GRPO seed {seed}         {s['accuracy']:.4f} +- {binomial(s['accuracy'], n):.4f}  "
                  f"format {s['format_rate']:.3f}")
        if len(accs) > 1:
            st = spread(accs)
            print(f"  GRPO mean over seeds {st.mean:.4f} +- {st.half_width:.4f} (95 % t-interval, n = {st.n}); "
                  f"relative to SFT x{st.mean / max(sft['accuracy'], 1e-9):.2f}")


if __name__ == "__main__":
    main()

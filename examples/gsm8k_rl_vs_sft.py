"""Issue 18's result: SFT vs SFT + GRPO on the full GSM8K test set (1,319 questions), 3 seeds, with intervals.

    .venv/bin/python examples/gsm8k_rl_vs_sft.py [--seeds 0 1 2] [--steps 30|120] [--only train|eval] [--sampled]

Every piece is an ordinary, resumable rlvr command, skipped when its output is complete, so the script can be
stopped and started again at any point (one piece at a time: 2 cores):
  1. the SFT checkpoint (configs/sft_gsm8k.yaml -> runs/sft_gsm8k/final), if missing;
  2. GRPO from it with configs/grpo_gsm8k_dynamic.yaml, one run per seed (runs/grpo_gsm8k_dynamic_s<seed>; with
     --steps other than the recipe's 30, runs/grpo_gsm8k_long_s<seed>);
  3. `rlvr eval` of the SFT model and of each seed's final model on the test split: greedy, and with --sampled
     one sample per question at the recipe's temperature 0.8 (sampled pass@1), 256 new tokens, bf16 engine.

runs/ does not outlive a session's machine, so each finished seed is kept in results/gsm8k_rl_vs_sft/<run>/: the
GRPO run's record (logs, config, DONE, RECORD.json naming its SFT start model by sha256; no weights) and test/,
the test summaries of that seed's SFT start model and final model. A seed whose record is complete is not run
again; a later session rebuilds the SFT checkpoint only for the seeds still missing. Since an SFT checkpoint
rebuilt on another machine rounds differently, each seed is compared with its own start model (a paired
difference). The table: each model's accuracy with its binomial 95 % interval over the 1,319 questions, and over
seeds the mean with a 95 % t-interval (n = number of recorded seeds). Per seed: about 70 min of training and
about 7-9 min per test evaluation on this 2-core CPU, plus 30 min for the SFT once per session.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from post_training_comparison import RLVR, sh  # noqa: E402  (the sibling example: one rlvr command, logged, timed)
from rlvr.config import TrainConfig, load_config  # noqa: E402
from rlvr.core import checkpoint as ckpt  # noqa: E402
from rlvr.experiments.stats import spread  # noqa: E402
from rlvr.experiments.sweep_records import record_run  # noqa: E402

SFT = Path("runs/sft_gsm8k/final")
RECIPE = "configs/grpo_gsm8k_dynamic.yaml"
RECORD = Path("results/gsm8k_rl_vs_sft")
EVAL = ["dataset=gsm8k", "prompt=r1_zero", "split=test", "max_new_tokens=256", "dtype=bfloat16",
        "examples_per_category=0"]
MODES = {"greedy": ["samples=1", "temperature=0"], "sampled": ["samples=1", "temperature=0.8"]}


def run_dir(seed: int, steps: int) -> Path:
    return Path(f"runs/grpo_gsm8k_dynamic_s{seed}" if steps == 30 else f"runs/grpo_gsm8k_long_s{seed}")


def record_dir(seed: int, steps: int) -> Path:
    return RECORD / run_dir(seed, steps).name


def recorded(seed: int, steps: int, modes: list[str]) -> bool:
    """The seed's GRPO run and every test summary asked for are kept."""
    kept = record_dir(seed, steps)
    return ckpt.is_finished(kept) and all((kept / "test" / f"{model}-{mode}.json").is_file()
                                          for model in ("sft", "grpo") for mode in modes)


def build_sft() -> None:
    if not (SFT / "DONE").is_file():
        sh(RLVR + ["sft", "--config", "configs/sft_gsm8k.yaml", "resume=true"], Path("runs/sft_gsm8k.log"))


def train(seed: int, steps: int) -> Path:
    run = run_dir(seed, steps)
    if not (run / "final" / "DONE").is_file():
        resume = ["resume=true"] if (run / "metrics.jsonl").is_file() else []
        seconds = sh(RLVR + ["train", "--config", RECIPE, f"seed={seed}", f"steps={steps}", f"out={run}", *resume],
                     run.parent / f"{run.name}.log")
        print(f"trained seed {seed} in {seconds / 60:.1f} min", flush=True)
    return run / "final"


def evaluate(model: Path, name: str, mode: str, seed: int = 0) -> Path:
    out = Path("runs/eval/gsm8k_test") / f"{name}-{mode}"
    if not (out / "summary.json").is_file():
        seconds = sh(RLVR + ["eval", f"model={model}", f"out={out}", f"seed={seed}", *EVAL, *MODES[mode]],
                     out.parent / f"{out.name}.log")
        print(f"evaluated {name} ({mode}) in {seconds / 60:.1f} min", flush=True)
    return out / "summary.json"


def keep(seed: int, steps: int, modes: list[str], name: str) -> None:
    """Record the seed's finished run and the test summaries of its start model and its final model."""
    run = run_dir(seed, steps)
    kept = record_run(run, record_dir(seed, steps), load_config(TrainConfig, run / "config.yaml"))
    (kept / "test").mkdir()
    for mode in modes:
        shutil.copy2(evaluate(SFT, "sft", mode), kept / "test" / f"sft-{mode}.json")
        shutil.copy2(evaluate(run / "final", f"{name}_s{seed}", mode, seed), kept / "test" / f"grpo-{mode}.json")
    print(f"kept seed {seed} in {kept}", flush=True)


def binomial(p: float, n: int) -> float:
    return 1.96 * math.sqrt(p * (1 - p) / n)


def table(seeds: list[int], steps: int, mode: str) -> None:
    print(f"\nGSM8K test, {mode} (GRPO {steps} steps; per model: accuracy +- binomial 95 % half width over the "
          "questions)")
    sft_accs, grpo_accs = [], []
    for seed in seeds:
        kept = record_dir(seed, steps) / "test"
        if not (kept / f"grpo-{mode}.json").is_file():
            print(f"  seed {seed}: not recorded yet ({kept.parent})")
            continue
        sft, grpo = (json.loads((kept / f"{m}-{mode}.json").read_text()) for m in ("sft", "grpo"))
        start = json.loads((kept.parent / "RECORD.json").read_text()).get("start_model_sha256") or "?"
        sft_accs.append(sft["accuracy"])
        grpo_accs.append(grpo["accuracy"])
        print(f"  seed {seed} (SFT {start[:12]}): SFT {sft['accuracy']:.4f} +- {binomial(sft['accuracy'], sft['n']):.4f}"
              f" -> GRPO {grpo['accuracy']:.4f} +- {binomial(grpo['accuracy'], grpo['n']):.4f}  "
              f"(format {sft['format_rate']:.3f} -> {grpo['format_rate']:.3f})")
    if len(grpo_accs) > 1:
        diff, sft_s, grpo_s = (spread([g - s for g, s in zip(grpo_accs, sft_accs)]), spread(sft_accs),
                               spread(grpo_accs))
        print(f"  over {diff.n} seeds (95 % t-interval): SFT {sft_s.mean:.4f} +- {sft_s.half_width:.4f}, GRPO "
              f"{grpo_s.mean:.4f} +- {grpo_s.half_width:.4f}, GRPO - SFT {diff.mean:+.4f} +- {diff.half_width:.4f} "
              f"(x{grpo_s.mean / max(sft_s.mean, 1e-9):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=30, help="GRPO steps per seed (the recipe's: 30)")
    parser.add_argument("--only", choices=("train", "eval"), default=None,
                        help="train: only the runs; eval: only evaluate and record runs already trained")
    parser.add_argument("--sampled", action="store_true", help="also the sampled pass@1 at T = 0.8")
    args = parser.parse_args()
    modes = ["greedy"] + (["sampled"] if args.sampled else [])
    name = "grpo_dynamic" if args.steps == 30 else f"grpo_dynamic_{args.steps}"
    for seed in args.seeds:
        if recorded(seed, args.steps, modes):
            continue
        build_sft()
        if args.only != "eval":
            train(seed, args.steps)
        if args.only != "train" and ckpt.finished_model(run_dir(seed, args.steps)) is not None:
            keep(seed, args.steps, modes, name)
    for mode in modes:
        table(args.seeds, args.steps, mode)


if __name__ == "__main__":
    main()

"""Issue 17's measurements on arithmetic, 3 seeds, every number from the same validation questions.

    .venv/bin/python examples/post_training_comparison.py [--seeds 0 1 2] [--steps 10] [--out runs/post_training]

Needs the arithmetic SFT checkpoint (`rlvr sft --config configs/sft_arithmetic.yaml`) as the teacher and as DPO's
start. Two comparisons, each at the same rollout budget (steps x 32 sampled answers):

  1. From the base model (which never writes the r1_zero format): on-policy distillation from the SFT teacher
     (`algorithm=opd`, the sampled-token estimator; `opd-full`: `distill_kl=reverse`, the exact reverse KL over
     the vocabulary at each visited state; `opd-forward`: `distill_kl=forward`, the forward KL there), SFT on
     the teacher's own samples (sequence-level distillation: the teacher answers the same number of training
     questions at temperature 1, the student imitates its well-formed answers), and
     GRPO on the verifier's reward.
  2. From the SFT checkpoint: DPO on right/wrong pairs of its own rollouts vs GRPO.

Each run is an ordinary rlvr run directory (resumable: a finished run is skipped); the final validation
(greedy, the first 100 arithmetic validation questions) and the wall time of each run go to
<out>/results.jsonl, and the table with mean +- std over seeds is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

RLVR = [sys.executable, "-m", "rlvr.cli"]
BASE = "SmolLM2-135M-Instruct"
TEACHER = "runs/sft_arithmetic/final"
COMMON = ["dataset=arithmetic", "prompt=r1_zero", "max_new_tokens=96", "eval_every=0", "eval_at_start=false",
          "eval_at_end=false", "tensorboard=false", "save_every=5"]
EVAL = ["dataset=arithmetic", "prompt=r1_zero", "split=validation", "limit=100", "max_new_tokens=96",
        "dtype=bfloat16"]


def sh(args: list[str], log: Path) -> float:
    """Run one rlvr command to completion (its output to `log`); returns its wall time in seconds."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("a") as f:
        f.write(f"\n$ {' '.join(args)}\n")
        f.flush()
        done = subprocess.run(args, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        raise SystemExit(f"failed ({done.returncode}): {' '.join(args)}; see {log}")
    return time.perf_counter() - start


def evaluate(model: str, out: Path) -> dict:
    if not (out / "summary.json").is_file():
        sh(RLVR + ["eval", f"model={model}", f"out={out}", *EVAL], out.parent / f"{out.name}.log")
    return json.loads((out / "summary.json").read_text())


def teacher_samples(root: Path, seed: int, n: int) -> Path:
    """The teacher's answers to n training questions at temperature 1, as an SFT JSONL of its well-formed ones."""
    path = root / f"teacher_samples_seed{seed}.jsonl"
    if path.is_file():
        return path
    out = root / f"teacher_samples_seed{seed}"
    sh(RLVR + ["eval", f"model={TEACHER}", "dataset=arithmetic", "prompt=r1_zero", "split=train", f"limit={n}",
               "samples=1", "temperature=1.0", f"seed={seed}", "max_new_tokens=96", "dtype=bfloat16", f"out={out}",
               "examples_per_category=0"], root / f"teacher_samples_seed{seed}.log")
    rows = []
    for line in (out / "results.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["sample_index"] != 0 or r["format_reward"] <= 0:  # one sample per question; r1_zero-shaped only
            continue
        reasoning, _, rest = r["response"].partition("</think>")
        answer = rest.split("<answer>")[-1].split("</answer>")[0].strip()
        if answer:
            rows.append({"question": r["question"], "answer": answer, "solution": reasoning.strip()})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="runs/post_training")
    parser.add_argument("--only", nargs="*", default=None, help="methods to run (default: all)")
    args = parser.parse_args()
    root = Path(args.out)
    rollouts = args.steps * 32
    results_path = root / "results.jsonl"
    root.mkdir(parents=True, exist_ok=True)
    done = {(r["method"], r["seed"]) for r in map(json.loads, results_path.read_text().splitlines())} \
        if results_path.is_file() else set()

    def opd(kl: str):
        """On-policy distillation of the base model from the teacher, its signal entering as `distill_kl=kl`."""
        return lambda s, d: [RLVR + ["train", f"model={BASE}", f"teacher={TEACHER}", "algorithm=opd", f"distill_kl={kl}",
                                     f"steps={args.steps}", "rollout_batch_size=32", "group_size=4",
                                     "learning_rate=5e-5", f"seed={s}", f"out={d}", *COMMON]]

    methods = {
        "opd (base <- teacher)": opd("sampled"),
        "opd-full (base <- teacher)": opd("reverse"),
        "opd-forward (base <- teacher)": opd("forward"),
        "sft on teacher samples (base)": None,  # below: sampling, then rlvr sft
        "grpo (base)": lambda s, d: [RLVR + ["train", f"model={BASE}", "algorithm=grpo", f"steps={args.steps}",
                                            "rollout_batch_size=32", "group_size=8", "learning_rate=1e-5", f"seed={s}",
                                            f"out={d}", *COMMON]],
        "dpo (sft)": lambda s, d: [RLVR + ["dpo", f"model={TEACHER}", f"steps={args.steps}", "questions_per_step=4",
                                          "group_size=8", "beta=0.1", "learning_rate=5e-6", f"seed={s}", f"out={d}",
                                          *COMMON]],
        "grpo (sft)": lambda s, d: [RLVR + ["train", f"model={TEACHER}", "algorithm=grpo", f"steps={args.steps}",
                                           "rollout_batch_size=32", "group_size=8", "learning_rate=1e-5", f"seed={s}",
                                           f"out={d}", *COMMON]],
    }
    for seed in args.seeds:
        for method, commands in methods.items():
            if (args.only and method.split(" ")[0] not in args.only) or (method, seed) in done:
                continue
            run = root / f"{method.split(' ')[0]}_{'base' if 'base' in method else 'sft'}_seed{seed}"
            seconds = 0.0
            if commands is None:  # SFT on the teacher's samples: the sampling counts toward the budget
                start = time.perf_counter()
                data = teacher_samples(root, seed, rollouts)
                seconds += time.perf_counter() - start
                argv = [RLVR + ["sft", f"model={BASE}", f"dataset={data}", "prompt=r1_zero", "solution_field=solution",
                                f"steps={rollouts // 16}", "batch_size=16", "learning_rate=1e-4", f"seed={seed}",
                                f"out={run}", "eval_every=0", "eval_at_start=false", "eval_at_end=false",
                                "tensorboard=false", "save_every=5"]]
            else:
                argv = commands(seed, run)
            for a in argv:
                if not (run / "final" / "DONE").is_file():
                    seconds += sh(a + (["resume=true"] if (run / "metrics.jsonl").is_file() else []), run.parent / f"{run.name}.log")
            final = evaluate(str(run / "final"), root / f"eval_{run.name}")
            row = {"method": method, "seed": seed, "seconds": round(seconds, 1), "accuracy": final["accuracy"],
                   "format_rate": final["format_rate"]}
            with results_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)

    for name, model in (("base model", BASE), ("teacher / SFT start", TEACHER)):
        s = evaluate(model, root / f"eval_{name.split(' ')[0]}")
        print(f"{name:32s} accuracy {s['accuracy']:.3f}  format {s['format_rate']:.3f}")
    rows = [json.loads(line) for line in results_path.read_text().splitlines()]
    for method in methods:
        got = [r for r in rows if r["method"] == method]
        if not got:
            continue
        acc, fmt, sec = ([r[k] for r in got] for k in ("accuracy", "format_rate", "seconds"))
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
        print(f"{method:32s} accuracy {statistics.mean(acc):.3f} +- {sd(acc):.3f}  format {statistics.mean(fmt):.3f} "
              f"+- {sd(fmt):.3f}  minutes {statistics.mean(sec) / 60:.1f}  (n={len(got)})")


if __name__ == "__main__":
    main()

"""Summarise runs/exp_s5 (examples/experiments/gsm8k_calculator_curriculum.sh): per GRPO run, validation accuracy
by step, groups with reward spread and right answers trained per step, step time split; per model, greedy accuracy
on the full test set with its 95 % binomial interval; and the paired differences the issues ask about (calculator
minus plain, GRPO minus its SFT, curriculum minus plain), each over the same 1,319 questions with the 95 % interval
of the mean per-question difference."""
import json
import math
import statistics
from pathlib import Path

from rlvr.core.tracking import read_jsonl
from rlvr.experiments.stats import spread

root = Path(__file__).resolve().parents[2] / "runs" / "exp_s5"  # run from anywhere in the repository
Z = 1.96

for run in ("grpo_plain", "grpo_curriculum", "grpo_calc"):
    path = root / run / "metrics.jsonl"
    if not path.exists():
        print(f"{run}: not run")
        continue
    m = read_jsonl(path)
    steps = [r for r in m if "train/reward" in r]
    val = {r["step"]: r["val/accuracy"] for r in m if "val/accuracy" in r}
    print(f"== {run}: {len(steps)} steps; validation (100 questions) " +
          ", ".join(f"step {k}: {v:.3f}" for k, v in sorted(val.items())))
    if not steps:
        continue
    with_spread = [1 - r["train/frac_groups_zero_std"] for r in steps]
    right = [r["train/answer_reward"] * 32 for r in steps]  # 32 rollouts a step
    halves = f" (steps 1-10: {statistics.mean(with_spread[:10]):.3f}, 11-: {statistics.mean(with_spread[10:]):.3f})" \
        if len(with_spread) > 10 else ""
    print(f"  groups with spread {statistics.mean(with_spread):.3f} a step{halves}")
    print(f"  right answers trained {statistics.mean(right):.2f} a step ({sum(right):.0f} in all), by step: "
          + " ".join(f"{x:.0f}" for x in right))
    if "curriculum/batch_seen_fraction" in steps[-1]:
        last = steps[-1]
        print("  curriculum at the end: " + ", ".join(f"{k.split('/')[1]} {last[k]:.2f}" for k in sorted(last)
                                                      if k.startswith("curriculum/")))
    times = {k: statistics.median(r.get(f"time/{k}", 0.0) for r in steps)
             for k in ("step", "generate", "env_tools", "score", "train")}
    print("  median step " + ", ".join(f"{k} {v:.1f} s" for k, v in times.items()))

tests = {}
for run in ("sft_plain", "sft_calc", "grpo_plain", "grpo_calc", "grpo_curriculum"):
    out = root / f"test_{run}"
    if not (out / "summary.json").exists():
        print(f"test_{run}: not run")
        continue
    s = json.loads((out / "summary.json").read_text())
    rows = read_jsonl(out / "results.jsonl")
    tests[run] = {r["question_index"]: float(r["reward"]) for r in rows}
    p, n = s["accuracy"], s["n"]
    print(f"test {run:16s} {p:.4f} +- {Z * math.sqrt(p * (1 - p) / n):.4f} ({round(p * n)} / {n} right), "
          f"format {s['format_rate']:.3f}, {s.get('seconds', 0) / 60:.1f} min")

for a, b in (("sft_calc", "sft_plain"), ("grpo_calc", "grpo_plain"), ("grpo_plain", "sft_plain"),
             ("grpo_calc", "sft_calc"), ("grpo_curriculum", "grpo_plain")):
    if a in tests and b in tests:
        d = [tests[a][q] - tests[b][q] for q in sorted(tests[a]) if q in tests[b]]
        s = spread(d)  # the t-interval of the mean per-question difference (t = 1.962 at 1,318 d.f.)
        print(f"{a} - {b}: {s.mean:+.4f} +- {s.half_width:.4f} (paired over {len(d)} questions; "
              f"{sum(x > 0 for x in d)} gained, {sum(x < 0 for x in d)} lost)")

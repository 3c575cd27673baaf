"""The numbers and the figure of examples/your_task/README.md, from the runs of run_seeds.sh (runs/your_task_largest/s*:
OUT=runs/your_task_largest bash examples/your_task/run_seeds.sh)
and, when present, the reasoning-gym runs (runs/rg: the prompting baseline and after GRPO, evaluated on the same
test questions). Usage: .venv/bin/python examples/your_task/summary.py [--runs runs] [--figure path.png]

Each seed's validation is greedy on the same 100 held-out rows at steps 0, 10 and 20; `val/accuracy` is the mean
total reward (largest + 0.1 x brief) and `val/format_rate` the first term's mean, the share answered right. Intervals: 95 % t over seeds (rlvr.experiments.stats.spread); for the reasoning-gym evaluations a paired
t-interval of the per-question difference.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rlvr.core.tracking import read_jsonl
from rlvr.experiments.stats import spread, t_quantile


def _fmt(values):
    s = spread(values)
    return f"{s.mean:.3f} +- {s.half_width:.3f}" if len(values) > 1 else f"{s.mean:.3f}"


def seeds(root: Path):
    runs = sorted(p for p in (root / "your_task_largest").glob("s*") if (p / "metrics.jsonl").is_file())
    rows = {p.name: read_jsonl(p / "metrics.jsonl") for p in runs}
    print(f"examples/your_task: {len(rows)} seeds ({', '.join(rows)})")
    for key, label in (("val/accuracy", "validation mean reward"), ("val/format_rate", "validation right")):
        start = [next(r[key] for r in m if r["step"] == 0 and key in r) for m in rows.values()]
        end = [max((r for r in m if key in r), key=lambda r: r["step"])[key] for m in rows.values()]
        diff = [b - a for a, b in zip(start, end)]
        print(f"  {label}: step 0 {_fmt(start)} -> end {_fmt(end)}; end - start {_fmt(diff)} "
              f"(per seed: {', '.join(f'{a:.2f}->{b:.2f}' for a, b in zip(start, end))})")
    first = [sum(r["train/reward"] for r in m if 1 <= r["step"] <= 3) / 3 for m in rows.values()]
    last = [sum(r["train/reward"] for r in m if r["step"] > 17 and "train/reward" in r) / 3 for m in rows.values()]
    print(f"  training reward (sampled, T=1): steps 1-3 {_fmt(first)} -> steps 18-20 {_fmt(last)}")
    return rows


def figure(rows: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name, m in rows.items():
        train = [(r["step"], r["train/reward"]) for r in m if "train/reward" in r]
        a.plot(*zip(*train), alpha=0.8, label=f"seed {name[1:]}")
        right = [(r["step"], r["train/reward/largest"]) for r in m if "train/reward/largest" in r]
        a.plot(*zip(*right), alpha=0.8, linestyle=":", color=a.lines[-1].get_color())
        val = [(r["step"], r["val/accuracy"]) for r in m if "val/accuracy" in r]
        b.plot(*zip(*val), marker="o", label=f"seed {name[1:]}: mean reward")
        val = [(r["step"], r["val/format_rate"]) for r in m if "val/format_rate" in r]
        b.plot(*zip(*val), marker="x", linestyle=":", color=b.lines[-1].get_color())
    a.set(title="training reward (solid: total; dotted: largest)", xlabel="step", ylabel="reward")
    b.set(title="validation, greedy, 100 rows (dotted: right)", xlabel="step")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"  wrote {path}")


def reasoning_gym(root: Path, name: str, what: str) -> None:
    base, after = root / name / "base" / "results.jsonl", root / name / "after" / "results.jsonl"
    if not (base.is_file() and after.is_file()):
        return
    a = {r["question_index"]: r for r in map(json.loads, base.open())}
    b = {r["question_index"]: r for r in map(json.loads, after.open())}
    common = sorted(set(a) & set(b))
    print(f"reasoning_gym:chain_sum, {what}, greedy, {len(common)} test questions, base model vs after 20 GRPO "
          "steps (seed 0)")
    for key, label in (("reward", "mean reward"), ("answer_reward", "right (score 1)"),
                       ("format_reward", "answer in <answer> tags")):
        x = [float(a[i][key]) for i in common]
        y = [float(b[i][key]) for i in common]
        d = [q - p for p, q in zip(x, y)]
        n = len(d)
        mean = sum(d) / n
        sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else math.nan
        half = t_quantile(n - 1) * sd / math.sqrt(n)
        print(f"  {label}: {sum(x) / n:.3f} -> {sum(y) / n:.3f}; paired difference {mean:+.3f} +- {half:.3f}"
              f"{' (includes 0)' if abs(mean) <= half else ''}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--figure", type=Path, default=Path("docs/images/your_task.png"))
    args = parser.parse_args()
    found = seeds(args.runs)
    if found:
        figure(found, args.figure)
    reasoning_gym(args.runs, "rg", "prompt=reasoning_gym, rewards {reasoning_gym: 1.0, format: 0.2}")
    reasoning_gym(args.runs, "rg2", "prompt=examples/reasoning_gym/prefill.txt, rewards {reasoning_gym: 1.0}")

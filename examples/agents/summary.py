"""The numbers of docs/agents.md ("Evidence that an agent learns") from the runs of run_seeds.sh: greedy accuracy
and tool-call success on the test split (100 rows no run trained or validated on) of the untrained model and of
each seed's final model, the paired difference per seed (the same questions before and after: a 95 % t-interval
of the per-question difference), the mean over seeds with a 95 % t-interval over seeds, by phrasing, and the
validation curve. Usage: .venv/bin/python examples/agents/summary.py [--runs runs/agents_multiply]

Accuracy is the agent's `answer_reward` (the last number of its answer is the product); tool-call success its
`format_reward` (the calculator was called and returned the product)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from rlvr.core.tracking import read_jsonl
from rlvr.experiments.stats import spread, t_quantile

PHRASINGS = {json.loads(line)["prompt"]: json.loads(line)["kind"]
             for line in (Path(__file__).with_name("multiply.jsonl")).open(encoding="utf-8")}
SIGNALS = (("answer_reward", "accuracy"), ("format_reward", "tool-call success"))


def records(path: Path) -> dict[str, dict]:
    return {r["question"]: r for r in map(json.loads, path.open(encoding="utf-8"))}


def paired(before: list[float], after: list[float]) -> tuple[float, float]:
    """Mean per-question difference and the half width of its 95 % t-interval."""
    d = [b - a for a, b in zip(before, after)]
    mean = sum(d) / len(d)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1)) if len(d) > 1 else math.nan
    return mean, t_quantile(len(d) - 1) * sd / math.sqrt(len(d)) if len(d) > 1 else math.nan


def main(root: Path) -> None:
    base_file = root / "test_base" / "results.jsonl"
    if not base_file.is_file():
        print(f"{base_file}: not there yet (bash examples/agents/run_seeds.sh)")
        return
    base = records(base_file)
    seeds = {p.name.removeprefix("test_"): records(p / "results.jsonl")
             for p in sorted(root.glob("test_s*")) if (p / "results.jsonl").is_file()}
    print(f"test split: {len(base)} questions, greedy; untrained model vs {len(seeds)} seeds after training")
    for key, label in SIGNALS:
        values = [float(r[key] or 0.0) for r in base.values()]
        print(f"\n{label}: untrained {sum(values) / len(values):.3f}")
        diffs, afters = [], []
        for name, after in seeds.items():
            common = sorted(set(base) & set(after))
            x = [float(base[q][key] or 0.0) for q in common]
            y = [float(after[q][key] or 0.0) for q in common]
            mean, half = paired(x, y)
            diffs.append(mean)
            afters.append(sum(y) / len(y))
            by = {}
            for q in common:
                by.setdefault(PHRASINGS.get(q, -1), []).append((float(base[q][key] or 0.0), float(after[q][key] or 0.0)))
            shown = ", ".join(f"{k}: {sum(a for a, _ in v) / len(v):.2f}->{sum(b for _, b in v) / len(v):.2f}"
                              for k, v in sorted(by.items()))
            print(f"  {name}: {sum(x) / len(x):.3f} -> {afters[-1]:.3f}; paired difference {mean:+.3f} +- {half:.3f} "
                  f"({len(common)} questions; by phrasing {shown})")
        if len(seeds) > 1:
            s, d = spread(afters), spread(diffs)
            print(f"  over {len(seeds)} seeds: after {s.mean:.3f} +- {s.half_width:.3f}; difference {d.mean:+.3f} +- "
                  f"{d.half_width:.3f} (95 % t over seeds)")
    for name in seeds:
        metrics = root / name / "metrics.jsonl"
        if metrics.is_file():
            val = [(r["step"], r["val/accuracy"], r.get("val/agent/tool_calls")) for r in read_jsonl(metrics)
                   if "val/accuracy" in r]
            print(f"\n{name} validation (100 rows, greedy): "
                  + ", ".join(f"step {s}: {a:.2f} (tool calls {t:.2f})" for s, a, t in val))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=Path, default=Path("runs/agents_multiply"))
    main(parser.parse_args().runs)

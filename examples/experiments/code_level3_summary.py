"""Summarise runs/exp_s4 (examples/experiments/code_level3_arms.sh): per arm, validation pass rate at step 0
and 10 (mean +- 95% t-interval over seeds), first-attempt pass rate (feedback arm), groups with spread and right
answers trained per step, step time split."""
import statistics
from pathlib import Path

from rlvr.core.tracking import read_jsonl
from rlvr.experiments.stats import spread

root = Path(__file__).resolve().parents[2] / "runs" / "exp_s4"  # run from anywhere in the repository


def ci(xs):
    if len(xs) < 2:
        return f"{xs[0]:.3f}" if xs else "-"
    s = spread(xs)
    return f"{s.mean:.3f} +- {s.half_width:.3f} (n={len(xs)}: {', '.join(f'{x:.3f}' for x in xs)})"


# Runs after single_s0 skip the step-0 validation (eval_at_start=false): greedy decoding of the same SFT model on
# the same fixed split gives the same number in every run. Their step 0 is the measured one of their arm's seed 0
# (feedback_s0 for the feedback arm's last attempt, single_s0 otherwise).
STEP0 = {}
val10_by = {}
for arm in ("single", "curriculum", "feedback"):
    runs = sorted(root.glob(f"{arm}_s[0-9]"))
    stats = {k: [] for k in ("val0", "val10", "first0", "first10", "spread", "right", "gen", "tools", "score",
                             "train", "step", "turns")}
    for run in runs:
        m = read_jsonl(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []
        val = {r["step"]: r for r in m if "val/accuracy" in r}
        steps = [r for r in m if "train/reward" in r]
        if 10 not in val:
            print(f"{run.name}: unfinished ({len(steps)} steps)")
            continue
        v0 = val.get(0) or STEP0.get(arm) or STEP0["single"]
        if 0 in val:
            STEP0.setdefault(arm, val[0])
        stats["val0"].append(v0["val/accuracy"]); stats["val10"].append(val[10]["val/accuracy"])
        val10_by[(arm, run.name[-1])] = val[10]["val/accuracy"]
        if "val/env/first_turn_reward" in val[10]:
            stats["first0"].append(v0.get("val/env/first_turn_reward", v0["val/accuracy"]))
            stats["first10"].append(val[10]["val/env/first_turn_reward"])
        stats["spread"].append(statistics.mean(1 - r["train/frac_groups_zero_std"] for r in steps))
        stats["right"].append(statistics.mean(r["train/answer_reward"] * 32 for r in steps))
        for k, key in (("gen", "time/generate"), ("tools", "time/env_tools"), ("score", "time/score"),
                       ("train", "time/train"), ("step", "time/step"), ("turns", "env/turns")):
            stats[k].append(statistics.median(r.get(key, 0.0) for r in steps))
    print(f"== {arm} ({len(stats['val10'])} seeds)")
    for k, xs in stats.items():
        if xs:
            print(f"  {k:7s} {ci(xs)}")

# Paired by seed (same seed = same first batches' questions where the arms agree): arm minus single.
for arm in ("curriculum", "feedback"):
    d = [val10_by[(arm, k)] - val10_by[("single", k)] for (a, k) in sorted(val10_by)
         if a == arm and ("single", k) in val10_by]
    if d:
        print(f"{arm} - single, val10, paired by seed: {ci(d)}")

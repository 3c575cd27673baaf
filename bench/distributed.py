"""Ray roles on the real model (issue 15): the orchestration overhead of synchronous mode, and sync vs async.

Runs `rlvr train` on the default model (SmolLM2-135M-Instruct, after its arithmetic SFT so that steps have
reward signal and train something: `rlvr sft --config configs/sft_arithmetic.yaml`) five ways, one after another, with the
same data, seed and work per step:

    local     the one-process loop (torch threads = all cores)
    sync      distributed.rollout_workers=1 distributed.learners=1 (each role all cores: they take turns)
    sync_bcast  as sync, the weights sent by a torch.distributed broadcast instead of Ray's object store
    sync2     distributed.rollout_workers=2 (one core each) distributed.learners=1
    async     as sync2 with async.max_staleness=1: the next batch generates while the learner trains

and prints each one's median step time (step 1, which warms up, left out), its phases, the learners' idle
fraction, and the ratios against `local` measured in the same run. Ray's start and the actors' loading are
not in the step times (they are a one-off of a few seconds).

    .venv/bin/python bench/distributed.py [--steps 5] [--json FILE] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, cores, machine

RLVR = str(Path(sys.executable).with_name("rlvr"))


def run(name: str, out: Path, steps: int, smoke: bool, extra: list[str], model: str) -> dict:
    base = [f"model={model}", "dataset=arithmetic", "prompt=r1_zero", f"steps={steps}",
            "rollout_batch_size=32", "group_size=8", "max_new_tokens=96", "microbatch_size=8", "eval_every=0",
            "eval_at_start=false", "eval_at_end=false", "log_rollouts_every=0", "save_every=0", "tensorboard=false",
            "learning_rate=1e-5", f"out={out / name}"]
    if smoke:
        base += ["rollout_batch_size=8", "group_size=4", "max_new_tokens=8", "microbatch_size=4"]
    start = time.perf_counter()
    subprocess.run([RLVR, "train", *base, *extra], check=True, cwd=ROOT)
    wall = time.perf_counter() - start
    rows = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("step", 0) >= 2 and "time/step" in r]
    med = lambda key: statistics.median(r.get(key, 0.0) for r in rows)  # noqa: E731
    # an async step's own phases overlap the next batch's generation: its wall time is the gap between log lines
    stamps = [r["time"] for r in rows]
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"name": name, "extra": extra, "wall_s": round(wall, 1),
            "step_s": round(statistics.median(gaps) if gaps else med("time/step"), 2),
            "generate_s": round(med("time/generate"), 2), "train_s": round(med("time/train"), 2),
            "sync_weights_s": round(med("time/sync_weights"), 3),
            "learner_idle_fraction": round(rows[-1].get("time/learner_idle_fraction", float("nan")), 3),
            "max_staleness_seen": max((r.get("async/staleness", 0) for r in rows), default=0),
            "dropped": rows[-1].get("async/dropped_batches", 0) if rows else 0,
            "reward": [round(r["train/reward"], 3) for r in rows]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--only", nargs="*", help="local sync sync_bcast sync2 async")
    # the base model earns no reward on arithmetic (nothing would be trained); its SFT checkpoint earns ~0.6
    parser.add_argument("--model", default="runs/sft_arithmetic/final" if (ROOT / "runs/sft_arithmetic/final").is_dir()
                        else "SmolLM2-135M-Instruct", help="default: the arithmetic SFT checkpoint when it exists")
    args = parser.parse_args()
    n = cores()
    ways = {
        "local": [],
        "sync": ["distributed.rollout_workers=1", f"distributed.rollout_num_cpus={n}", f"distributed.learner_num_cpus={n}"],
        "sync_bcast": ["distributed.rollout_workers=1", f"distributed.rollout_num_cpus={n}",
                       f"distributed.learner_num_cpus={n}", "distributed.weight_sync=broadcast"],
        "sync2": ["distributed.rollout_workers=2", "distributed.rollout_num_cpus=1", f"distributed.learner_num_cpus={n}"],
        "async": ["distributed.rollout_workers=2", "distributed.rollout_num_cpus=1", "distributed.learner_num_cpus=1",
                  "async.max_staleness=1"],
    }
    out = Path(tempfile.mkdtemp(prefix="rlvr-dist-bench-"))
    results = []
    try:
        for name in args.only or ways:
            results.append(run(name, out, args.steps, args.smoke, ways[name], args.model))
            print(json.dumps(results[-1]), flush=True)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    local = next((r for r in results if r["name"] == "local"), None)
    print(f"\n{'way':<10} {'step s':>7} {'vs local':>9} {'generate':>9} {'train':>7} {'sync w':>7} {'idle':>6}")
    for r in results:
        ratio = f"{r['step_s'] / local['step_s']:.3f}" if local else "-"
        print(f"{r['name']:<10} {r['step_s']:>7.2f} {ratio:>9} {r['generate_s']:>9.2f} {r['train_s']:>7.2f} "
              f"{r['sync_weights_s']:>7.3f} {r['learner_idle_fraction']:>6.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine(), "results": results}, indent=2))


if __name__ == "__main__":
    main()

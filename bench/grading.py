"""Grading throughput and worst-case latency of the r1_zero reward (issue 3).

    .venv/bin/python bench/grading.py [--n 2000] [--seed 0]

1. Throughput: `score_batch(r1_zero_reward_fn, ...)` on a batch of synthetic r1_zero outputs built from
   GSM8K test answers (the mix is printed), in responses per second, warm pool, median of 3 passes.
2. Worst-case latency: each adversarial response graded alone at the default 1 s limit, then all of
   them in one batch.
3. Agreement: the table of tests/test_grading_cases.py (hedged answers, restated computations, tags,
   Unicode digits, scientific notation, mixed numbers, CJK units and magnitudes, units, LaTeX) through
   all three reward functions, as right x/N, rewritten x/N and wrong-rejected x/N per category.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rlvr.tasks.rewards import configure_grading, r1_zero_reward_fn, score_batch  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "src" / "rlvr" / "data" / "gsm8k" / "test.jsonl"
CASES = Path(__file__).resolve().parents[1] / "tests" / "test_grading_cases.py"

# (kind, share of the batch, how the answer block is written); `g` is the gold integer.
MIX = [
    ("right, plain", 0.50, lambda g, rng: f"<answer> {g} </answer>"),
    ("wrong, plain", 0.20, lambda g, rng: f"<answer> {g + rng.choice([-10, -1, 1, 2, 100])} </answer>"),
    ("right, formatted ($1,000 / units / \\boxed)", 0.10, lambda g, rng: "<answer> " + rng.choice(
        [f"${g:,}", f"{g} dollars", f"\\boxed{{{g}}}", f"{g}.00", f"**{g}**"]) + " </answer>"),
    ("\\frac, x = or other LaTeX", 0.08, lambda g, rng: "<answer> " + rng.choice(
        [f"\\frac{{{2 * g}}}{{2}}", f"\\frac{{{g + 1}}}{{1}}", f"x = {g}", f"\\dfrac{{{3 * g}}}{{3}}"]) + " </answer>"),
    ("missing or truncated tags", 0.12, lambda g, rng: rng.choice(
        [f"The answer is {g}.", f"<answer> {g}", "so the total is", f"\\boxed{{{g}}}"])),
]
CALCULATOR = re.compile(r"<<[^<>]*>>")

ADVERSARIAL = {
    "9**9**9**9": "9**9**9**9",
    "\\frac{9^{9^{9^{9}}}}{1}": "\\frac{9^{9^{9^{9}}}}{1}",
    "9^{9^{9^{9}}}": "9^{9^{9^{9}}}",
    "10^{10^{10}}": "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}": "2^{2^{2^{2^{2^{2}}}}}",
    "1999 x's": "x" * 1999,
    "900 nested ()": "(" * 900 + "1" + ")" * 900,
    "900 nested {}": "{" * 900 + "1" + "}" * 900,
    "20k nested {} (too long)": "{" * 10_000 + "1" + "}" * 10_000,
    "96k-char answer block (too long)": " think" * 16_000 + "\\frac{1}{2}",
    "binary junk": bytes(range(256)).decode("latin-1") * 8,
}


def synthetic_batch(n: int, seed: int) -> tuple[list[str], list[str], dict[str, int]]:
    rng = random.Random(seed)
    rows = [json.loads(line) for line in DATA.open()]
    kinds = rng.choices(range(len(MIX)), weights=[share for _, share, _ in MIX], k=n)
    responses, golds, counts = [], [], dict.fromkeys([kind for kind, _, _ in MIX], 0)
    for k in kinds:
        row = rng.choice(rows)
        solution, gold = row["answer"].rsplit("####", 1)
        gold = gold.strip().replace(",", "")
        kind, _, write = MIX[k]
        think = CALCULATOR.sub("", solution).strip()
        responses.append(f" {think} </think> " + write(int(gold), rng))
        golds.append(gold)
        counts[kind] += 1
    return responses, golds, counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    configure_grading()  # the defaults: 1 s limit, os.cpu_count() workers
    print(f"grading workers: {os.cpu_count()} (os.cpu_count()), time limit 1.0 s")

    start = time.perf_counter()
    r1_zero_reward_fn(" </think> <answer> \\sqrt{0.25} </answer>", "0.5")  # \\frac is exact, in-process
    print(f"pool start-up (first slow-path grading): {time.perf_counter() - start:.2f} s")

    responses, golds, mix = synthetic_batch(args.n, args.seed)
    print(f"\nbatch of {args.n} synthetic r1_zero responses from GSM8K test answers:")
    for kind, count in mix.items():
        print(f"  {count:5d}  {kind}")
    passes = []
    for _ in range(3):
        start = time.perf_counter()
        scores, meta = score_batch(r1_zero_reward_fn, responses, golds)
        passes.append(time.perf_counter() - start)
    seconds = statistics.median(passes)
    throughput = args.n / seconds
    mean_reward = sum(s["reward"] for s in scores) / len(scores)
    print(
        f"throughput: {throughput:,.0f} responses/s ({seconds * 1000:.0f} ms per batch, median of 3); "
        f"mean reward {mean_reward:.3f}; fast path {meta['grading/fast_path']}, slow path "
        f"{meta['grading/slow_path']} distinct, timeouts {meta['grading/timeouts']}, errors {meta['grading/errors']}"
    )

    print("\nadversarial answers, each graded alone (r1_zero_reward_fn), default 1 s limit:")
    latencies = {}
    for name, answer in ADVERSARIAL.items():
        response = answer if name == "binary junk" else f" x </think> <answer> {answer} </answer>"
        start = time.perf_counter()
        reward = r1_zero_reward_fn(response, "72")["reward"]
        latencies[name] = time.perf_counter() - start
        print(f"  {latencies[name]:6.2f} s  reward {reward:.0f}  {name}")
    worst_name = max(latencies, key=latencies.get)
    batch = [f" x </think> <answer> {a} </answer>" for a in ADVERSARIAL.values()]
    start = time.perf_counter()
    _, meta = score_batch(r1_zero_reward_fn, batch, ["72"] * len(batch))
    batch_s = time.perf_counter() - start
    print(
        f"  all {len(batch)} in one batch: {batch_s:.2f} s "
        f"(timeouts {meta['grading/timeouts']}, errors {meta['grading/errors']}, too long {meta['grading/too_long']})"
    )

    agreement = table_agreement()

    print(
        f"\nSUMMARY: {throughput:,.0f} responses/s on {args.n} typical r1_zero outputs; worst-case latency "
        f"{latencies[worst_name]:.2f} s ({worst_name}) at the 1 s limit; {len(batch)} adversarial in one batch "
        f"{batch_s:.2f} s on {os.cpu_count()} workers; agreement table {agreement}"
    )


def table_agreement() -> str:
    """Print the agreement counts of the test table per category; return the totals in one line."""
    try:
        spec = importlib.util.spec_from_file_location("test_grading_cases", CASES)
        table = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(table)
    except Exception as error:  # pytest missing, or the tests not shipped
        print(f"\nagreement table: not available ({error})")
        return "not available"
    counts = table.agreement()
    print("\nagreement with the table of tests/test_grading_cases.py (every case through all three reward fns):")
    print(table.format_agreement(counts))
    kinds = ("right", "rewritten", "wrong")
    totals = {k: [sum(c[k][i] for c in counts.values() if k in c) for i in (0, 1)] for k in kinds}
    return ", ".join(f"{k} {a}/{n}" for k, (a, n) in totals.items())


if __name__ == "__main__":  # the grading workers' forkserver imports this file
    main()

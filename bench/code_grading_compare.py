"""Grading throughput on the generated code task, this checkout beside another revision, in one run (issue 64).

    .venv/bin/python bench/code_grading_compare.py --before 9cf4a2f [--level 3] [--n 64] [--repeats 5]
    .venv/bin/python bench/code_grading_compare.py --before 9cf4a2f --smoke          # 8 programs, 1 pass each

The batch is what a code GRPO step grades at `--level` (default 3): for each validation question a program,
distinct (sampled programs are), in eight kinds: the reference solution; the reference written with the
standard library's idioms (`collections.Counter`, `defaultdict`) where the family counts or groups into a dict,
else the reference again; another question's solution (wrong); a syntax error; a program that raises; an
infinite loop's cousin that computes for ~0.2 s then answers; a wrong type; one that prints. Each revision grades
it in a subprocess of its own, in turns (before, after, before, after, ...), so that both see the same machine
state; each pass is timed in its subprocess (grading only, the sandbox already probed). The summary: the
median seconds per pass of each, programs a second, the ratio after / before, and how many programs each scored
1 (the idioms score 0 before issue 64).

`--before REV` is any revision of this repository (`git archive REV src`): its grader, its sandbox.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNTING = re.compile(r"counts\[(\w+)\] = counts\.get\(\1, 0\) \+ 1")


def idiomatic(source: str) -> str:
    """The reference written with the standard library's idioms where it counts (Counter) or groups
    (defaultdict) into a dict: what a Python programmer writes, and a dict subclass to the tests."""
    if COUNTING.search(source) and "counts = {}" in source:
        source = source.replace("counts = {}", "counts = __import__('collections').Counter()")
        return COUNTING.sub(r"counts[\1] += 1", source)
    if "groups = {}" in source:
        return source.replace("groups = {}", "groups = __import__('collections').defaultdict(list)")
    return source


def batch(n: int, level: int) -> tuple[list[str], list[str]]:
    sys.path.insert(0, str(ROOT / "src"))
    from rlvr.tasks.code import CodeSpec, code_task

    examples = code_task("validation", n=n, spec=CodeSpec(level))
    programs = []
    for i, ex in enumerate(examples):
        kind = i % 8
        if kind == 0:
            program = ex.solution
        elif kind == 1:
            program = idiomatic(ex.solution)
        elif kind == 2:
            program = examples[(i + 1) % n].solution  # another question's function: wrong name or behaviour
        elif kind == 3:
            program = ex.solution.replace("return", "return (", 1)  # unbalanced: a syntax error
        elif kind == 4:
            program = ex.solution + "\nraise RuntimeError('boom')\n"
        elif kind == 5:
            program = "x = 0\nfor i in range(3_000_000):\n    x += i\n" + ex.solution  # ~0.2 s of work first
        elif kind == 6:
            program = "def f(*a):\n    return object()\n"
        else:
            program = "print('thinking')\n" + ex.solution
        programs.append(program + f"\n# {i}\n")  # distinct, as sampled programs are
    return programs, [ex.answer for ex in examples]


def worker(src: str, data: str, repeats: int) -> None:
    """In a subprocess: grade the batch `repeats` times with the grader under `src`; print JSON."""
    sys.path.insert(0, src)
    from rlvr.grading.code import grade_programs
    from rlvr.sandbox import configure, default_workers

    programs, truths = json.loads(Path(data).read_text())
    configure("bwrap")
    # outside the timing: the probe, and as many sandboxes at once as the pool runs (root's uids are then held,
    # as they are after a run's first step)
    warm = min(len(programs), default_workers())
    grade_programs(programs[:warm], truths[:warm])
    seconds, outcome = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        outcome = grade_programs(programs, truths)
        seconds.append(time.perf_counter() - start)
    right = sum(1 for ok, total in outcome if total and ok == total)
    print(json.dumps({"seconds": seconds, "right": right, "workers": default_workers()}))


def export(rev: str, where: Path) -> str:
    archive = where / "src.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src"], stdout=out, check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(where / rev)
    return str(where / rev / "src")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", help="the revision to compare with (git rev; required)")
    parser.add_argument("--level", type=int, default=3)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="passes of each, in turns")
    parser.add_argument("--smoke", action="store_true", help="8 programs, 1 pass each: that the bench runs")
    parser.add_argument("--worker", nargs=2, metavar=("SRC", "DATA"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker[0], args.worker[1], args.repeats)
    if not args.before:
        parser.error("--before REV is required")
    n, repeats = (8, 1) if args.smoke else (args.n, args.repeats)
    with tempfile.TemporaryDirectory(prefix="rlvr-grading-compare-") as tmp:
        where = Path(tmp)
        data = where / "batch.json"
        data.write_text(json.dumps(batch(n, args.level)))
        sources = {"before": export(args.before, where), "after": str(ROOT / "src")}
        runs: dict[str, list[float]] = {"before": [], "after": []}
        right = {}
        for _ in range(repeats):  # in turns: the same machine state for both
            for name, src in sources.items():
                done = subprocess.run([sys.executable, __file__, "--worker", src, str(data), "--repeats", "1"],
                                      capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": src})
                if done.returncode != 0:
                    sys.exit(f"{name} failed:\n{done.stderr[-3000:]}")
                report = json.loads(done.stdout.strip().splitlines()[-1])
                runs[name] += report["seconds"]
                right[name] = report["right"]
        print(f"level {args.level}, {n} distinct programs, {repeats} pass(es) each, in turns; {report['workers']} workers")
        print(f"{'':8s} {'median s':>9s} {'programs/s':>11s} {'scored 1':>9s}   passes")
        for name in ("before", "after"):
            median = statistics.median(runs[name])
            print(f"{name:8s} {median:9.3f} {n / median:11.1f} {right[name]:9d}   " +
                  " ".join(f"{s:.3f}" for s in runs[name]))
        ratio = statistics.median(runs["after"]) / statistics.median(runs["before"])
        print(f"SUMMARY: after / before = {ratio:.2f} (wall time of a pass; {args.before} vs this checkout)")


if __name__ == "__main__":
    main()

"""Sandboxed grading of a code rollout batch (issue 16): 64 typical programs, wall time.

    .venv/bin/python bench/code_grading.py [--n 64] [--repeats 3]

The batch is what a code GRPO step grades: programs for the generated task's validation questions, half
the reference solution, a quarter wrong (another question's solution), and the rest a syntax error, a
program that raises, or one that returns the wrong type. Every program is distinct (repeated programs
are graded once in training, which would flatter the numbers). Rows, each the median of --repeats passes
in this one run:

  sandboxed, parallel     run_programs as the reward uses it (bubblewrap: namespaces, seccomp, the judge)
  sandboxed, serial       the same, one program at a time: the reference for the parallel speed-up
  limits only, parallel   the same judge and program processes without bubblewrap: what the isolation costs
  in-process exec         no sandbox at all (unsafe; the floor: the programs' own work)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import common  # noqa: F401 (puts src/ on sys.path)
from rlvr.grading.code import grade_programs, parse_tests
from rlvr.sandbox import configure, default_workers, isolation, run_program
from rlvr.sandbox.records import SandboxLimits
from rlvr.tasks.code import code_task


def batch(n: int) -> tuple[list[str], list[str]]:
    examples = code_task("validation", n=n)
    programs = []
    for i, ex in enumerate(examples):
        kind = i % 8
        if kind < 4:
            program = ex.solution
        elif kind < 6:
            program = examples[(i + 1) % n].solution  # another question's function: wrong name or behaviour
        elif kind == 6:
            program = ex.solution.replace("return", "return (", 1)  # unbalanced: a syntax error
        else:
            program = ex.solution + "\nraise RuntimeError('boom')\n" if i % 16 == 7 else "def f(*a):\n    return object()\n"
        programs.append(program + f"\n# {i}\n")  # distinct, as sampled programs are
    return programs, [ex.answer for ex in examples]


def in_process(programs: list[str], truths: list[str]) -> int:
    passed = 0
    for program, truth in zip(programs, truths):
        namespace: dict = {}
        try:
            exec(program, namespace)
            for test in json.loads(truth)["tests"]:  # the generated task's asserts
                exec(test, namespace)
            passed += 1
        except Exception:
            pass
    return passed


def timed(fn, repeats: int) -> tuple[float, object]:
    seconds, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds), out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    programs, truths = batch(args.n)
    limits = SandboxLimits()
    configure("bwrap")
    print(f"isolation: {isolation()}; workers: {default_workers()}; {args.n} programs, "
          f"{sum(parse_tests(t).count for t in truths)} tests")
    rows = []
    t_par, outcome = timed(lambda: grade_programs(programs, truths, limits), args.repeats)
    passed = sum(ok == n for ok, n in outcome)
    rows.append(("sandboxed, parallel", t_par))
    t_ser, _ = timed(lambda: grade_programs(programs, truths, limits, workers=1), args.repeats)
    rows.append(("sandboxed, serial", t_ser))
    jobs = [parse_tests(t).job(p) for p, t in zip(programs, truths)]
    t_lim, _ = timed(lambda: _limits_parallel(jobs, limits), args.repeats)
    rows.append(("limits only, parallel", t_lim))
    t_exec, floor_passed = timed(lambda: in_process(programs, truths), args.repeats)
    rows.append(("in-process exec (unsafe)", t_exec))
    print(f"all tests passed: {passed}/{args.n} sandboxed, {floor_passed}/{args.n} in-process (expected "
          f"{sum(1 for i in range(args.n) if i % 8 < 4)})")
    print(f"{'':28s} {'seconds':>8s} {'ms/program':>10s}")
    for name, seconds in rows:
        print(f"{name:28s} {seconds:8.3f} {1000 * seconds / args.n:10.1f}")
    print(f"parallel / serial: {t_par / t_ser:.2f}; bwrap / limits only: {t_par / t_lim:.2f}; "
          f"target: 64 programs under 2 s -> {'met' if t_par < 2 and args.n >= 64 else 'NOT met'}")


def _limits_parallel(jobs, limits):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(default_workers()) as pool:
        return list(pool.map(lambda job: run_program(job, limits, mode="limits_only"), jobs))


if __name__ == "__main__":
    main()

"""Issue 19: docs/results.md from seed 004's four sweeps, one section per question of the assignment.

    .venv/bin/rlvr sweep --config sweeps/lr_sweep.yaml               # and on_policy_variants, off_policy_variants,
    .venv/bin/python examples/seed004_results.py                     # prompt_ablation: one at a time, resumable

It reads the sweeps' records (results/<sweep>/: every finished run's logs, committed with the code, so the page can
be rebuilt from a fresh checkout and a sweep longer than one machine's session accumulates there). For each sweep:
the figures (`rlvr plot --only`, into docs/results/<sweep>/, the command printed
under them), the HTML report (`rlvr report`, into docs/results/<sweep>/report.html), a table per group (final
greedy and sampled validation accuracy, mean with a 95 % t-interval over seeds, the seeds' standard deviation,
seconds per step, clip fraction), and the comparisons the question asks for: each pair's difference with its 95 %
two-sample t-interval, whether it is larger than the spread, and, where it is not, how many seeds per group the
measured variance says would resolve it. A sweep that has not run yet gets its command instead. Nothing here
is written by hand: rerun the script after any run and the page follows the runs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from rlvr.experiments.plots import LR_FIGURE, build_figures, save_figures  # noqa: E402
from rlvr.experiments.report import DIFFERENCE_METRICS, fmt_difference, fmt_spread, write_report  # noqa: E402
from rlvr.experiments.runs import Group, group_values, load_groups, summarize  # noqa: E402
from rlvr.experiments.stats import difference, questions_to_resolve
from rlvr.experiments.sweep_records import RECORD_INFO  # noqa: E402

METRICS = tuple(zip(DIFFERENCE_METRICS, ("greedy", "sampled")))  # final greedy and sampled validation accuracy


@dataclass(frozen=True)
class Section:
    sweep: str
    title: str
    problem: str  # seed 004's problem name
    figures: tuple[str, ...]
    # (what the pair answers, group A, group B): A - B; "sweep:label" takes a group from another sweep
    pairs: tuple[tuple[str, str, str], ...]


SECTIONS = (
    Section("lr_sweep", "Which learning rate?", "grpo_learning_rate", (LR_FIGURE, "val_reward", "val_sampled_reward"),
            (("3e-6 vs 1e-5", "learning_rate=3e-06", "learning_rate=1e-05"),
             ("3e-5 vs 1e-5", "learning_rate=3e-05", "learning_rate=1e-05"),
             ("1e-4 vs 1e-5", "learning_rate=0.0001", "learning_rate=1e-05"))),
    Section("on_policy_variants", "Normalisation, baseline, RFT and MaxRL against GRPO",
            "grpo_experiments_variants_on_policy", ("val_reward", "val_sampled_reward", "train_response_length"),
            (("sequence vs constant normalisation (grpo - grpo_constant)", "algorithm=grpo", "algorithm=grpo_constant"),
             ("token-mean vs constant normalisation (grpo_token - grpo_constant)", "algorithm=grpo_token",
              "algorithm=grpo_constant"),
             ("std normalisation on vs off (grpo_constant - dr_grpo)", "algorithm=grpo_constant", "algorithm=dr_grpo"),
             ("a baseline vs none (dr_grpo - rft)", "algorithm=dr_grpo", "algorithm=rft"),
             ("RFT vs GRPO", "algorithm=rft", "algorithm=grpo"),
             ("MaxRL vs GRPO", "algorithm=maxrl", "algorithm=grpo"))),
    Section("off_policy_variants", "Off-policy steps: naive vs no clip vs clip vs GSPO", "grpo_experiments_off_policy",
            ("val_reward", "val_sampled_reward", "clip_fraction"),
            (("naive vs clip", "algorithm=offpolicy_naive", "algorithm=offpolicy_clip"),
             ("no clip vs clip", "algorithm=offpolicy_noclip", "algorithm=offpolicy_clip"),
             ("GSPO vs clip", "algorithm=offpolicy_gspo", "algorithm=offpolicy_clip"),
             ("clip (4 steps a rollout) vs on-policy GRPO", "algorithm=offpolicy_clip",
              "on_policy_variants:algorithm=grpo"))),
    Section("prompt_ablation", "Which prompt?", "grpo_prompt_ablation",
            ("val_reward", "val_sampled_reward", "val_response_length"),
            (("question_only vs r1_zero", "prompt=question_only", "prompt=r1_zero"),
             ("r1_zero three-shot vs r1_zero", "prompt=r1_zero_three_shot", "prompt=r1_zero"))),
)


def answer(groups: list[Group], summary) -> list[str]:
    """The section's answer in one sentence per metric: the group with the highest mean final accuracy, the groups
    whose difference from it is within the spread (tied with it, as far as these seeds can tell) and those below
    it by more than the spread. Groups that never trained say so."""
    idle = {g.label for g in groups if never_trained(g.runs)}
    lines = []
    for metric, name in METRICS:
        values = {gs.group: xs for gs in summary.groups if (xs := group_values(summary, gs.group, metric))}
        if len(values) < 2:
            continue
        best = max(values, key=lambda label: statistics.fmean(values[label]))
        tied, below, single = [], [], []
        for label, xs in values.items():
            if label != best:
                d = difference(values[best], xs)
                (single if math.isnan(d.half_width) else below if d.resolved else tied).append(label)

        def named(labels):
            return ", ".join(f"{x} ({statistics.fmean(values[x]):.3f}{', never trained' if x in idle else ''})"
                             for x in labels)

        parts = [f"highest {named([best])}",
                 f"within the spread of it: {named(tied) if tied else 'none'}",
                 f"below it by more than the spread: {named(below) if below else 'none'}"]
        if single:
            parts.append(f"one run a side, no interval yet: {named(single)}")
        lines.append(f"\n**Answer, final {name} accuracy:** " + "; ".join(parts) + ".")
    if lines and len(start_models([r for g in groups for r in g.runs])) > 1:
        lines.append("\n(The groups began from different SFT checkpoints: the comparisons below also give each "
                     "run's gain over its own step 0.)")
    return lines


def never_trained(runs) -> bool:
    """True when no run trained a single update: at every step every group of rollouts shared one reward, so
    every advantage was 0 and rlvr pruned every rollout. Such runs end as their start model began."""
    counts = [v for r in runs for v in r.series("train/updates_trained").values()]
    return bool(counts) and not any(counts)


def never_trained_notes(groups: list[Group]) -> list[str]:
    """A sentence for each group that never trained: its final accuracy is its start's, not the method's."""
    lines = []
    for g in groups:
        if not never_trained(g.runs):
            continue
        steps = max(len(r.series("train/updates_trained")) for r in g.runs)
        rewards = [v for r in g.runs for v in r.series("train/reward").values()]
        tokens = [v for r in g.runs for v in r.series("rollout/mean_tokens").values()]
        lines.append(f"\n**{g.label} never trained:** in its {len(g.runs)} run(s), at each of {steps} steps, every "
                     f"group of rollouts got one reward (mean train reward {statistics.fmean(rewards):.3f}"
                     + (f", mean response {statistics.fmean(tokens):.1f} tokens" if tokens else "")
                     + "), so every advantage was 0 and no update was trained: "
                     + ("its final accuracy is its start model's (AdamW was handed zero gradients from the first "
                        "step, so its moments stayed 0 and the weights did not move)"
                        if not any(r.config.get("weight_decay") for r in g.runs) else
                        "only AdamW's weight decay moved the weights (AdamW was handed zero gradients from the first "
                        "step)")
                     + ", and a difference against it says how well the start model fits this setting, not what "
                     "the method learned.")
    return lines


def _median_step_seconds(group: Group) -> float | None:
    times = [t for run in group.runs for t in run.series("time/step").values()]
    return statistics.median(times) if times else None


def _mean_clip_fraction(group: Group) -> float | None:
    values = [v for run in group.runs for v in run.series("train/clip_fraction").values()]
    return sum(values) / len(values) if values else None


def section_markdown(section: Section, sweeps_root: Path, out_dir: Path, loaded: dict) -> str:
    root = sweeps_root / section.sweep
    head = f"## {section.title}\n\nSeed 004 problem `{section.problem}`; sweep `sweeps/{section.sweep}.yaml`.\n"
    if section.sweep not in loaded:
        return head + (f"\n**Not run yet.** `rlvr sweep --config sweeps/{section.sweep}.yaml`, then this script.\n")
    groups, summary, unfinished = loaded[section.sweep]
    figures_dir = out_dir / section.sweep
    figures = build_figures(groups)
    save_figures({k: v for k, v in figures.items() if k in section.figures}, figures_dir)
    page = write_report([root], figures_dir / "report.html", title=f"seed 004: {section.sweep}")  # every run
    lines = [head]  # image paths relative to the page, which sits next to out_dir
    lines += [f"![{name}]({out_dir.name}/{section.sweep}/{name}.png)" for name in section.figures if name in figures]
    drawn = ",".join(name for name in section.figures if name in figures)
    lines.append(f"\n`rlvr plot {root} --out {figures_dir} --only {drawn}` · report: [{section.sweep}/report.html]"
                 f"({out_dir.name}/{section.sweep}/report.html) (`rlvr report {root} --out {page}`)\n")
    lines.append("| group | runs (finished) | final greedy accuracy | std | final sampled accuracy | std | s / step | "
                 "clip fraction |")
    lines.append("|---|---|---|---|---|---|---|---|")
    several_cpus = len({cpu_name(r) for g in groups for r in g.runs}) > 1
    for g, gs in zip(groups, summary.groups):
        cells = [gs.group, f"{gs.n_runs} ({gs.n_finished})"]
        for metric, _ in METRICS:
            s = gs.stats[metric]
            cells += [fmt_spread(s), f"{s.std:.3f}" if s is not None and s.n > 1 else "-"]
        seconds, clip = _median_step_seconds(g), _mean_clip_fraction(g)
        # a step's time says more about the processor than the estimator when the groups ran on different ones
        where = f" ({', '.join(sorted({cpu_name(r) for r in g.runs}))})" if several_cpus else ""
        cells += [f"{seconds:.1f}{where}" if seconds is not None else "-", f"{clip:.3f}" if clip is not None else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    if unfinished:
        lines.append(f"\nNot counted yet (unfinished): {', '.join(unfinished)}.")
    lines += answer(groups, summary)
    lines += never_trained_notes(groups)
    lines.append(provenance(groups))
    lines.append("\nMean ± 95 % t-interval over seeds (t(0.975, n-1)·s/√n). Differences (A - B, 95 % two-sample "
                 "t-interval, pooled variance):\n")
    resolved, hidden = [], []
    for what, diffs in pair_differences(section, loaded):
        if isinstance(diffs, str):
            lines.append(f"- {what}: {diffs}")
            continue
        for name, (d, _) in diffs.items():
            (resolved if d.resolved else hidden).append(f"{what} ({name})")
        questions = next((r.config.get("eval_limit") for g in loaded[section.sweep][0] for r in g.runs), None)
        parts = [f"{name} {fmt_difference(d)}{questions_needed(d, acc, questions)}" for name, (d, acc) in diffs.items()]
        lines.append(f"- {what}: " + "; ".join(parts) if parts else f"- {what}: no validation logged yet")
    lines.append("\n**Larger than the spread:** " + (", ".join(resolved) if resolved else "none") + ". "
                 "**Within it:** " + (", ".join(hidden) if hidden else "none") + ".\n")
    return "\n".join(lines)


def pair_differences(section: Section, loaded: dict) -> list[tuple[str, dict | str]]:
    """Each pair the section asks for: (what, {"greedy": (Difference, mean accuracy), "sampled": ...}), or (what,
    why not measured yet)."""
    out = []
    for what, a, b in section.pairs:
        a_summary, a_label = _resolve(a, section.sweep, loaded)
        b_summary, b_label = _resolve(b, section.sweep, loaded)
        if a_summary is None or b_summary is None:
            out.append((what, f"not measured yet ({a if a_summary is None else b} has no finished runs)"))
            continue
        diffs, sizes = {}, set()
        for metric, name in METRICS:
            xa, xb = group_values(a_summary, a_label, metric), group_values(b_summary, b_label, metric)
            if xa and xb:
                # and the pair's mean accuracy, for questions_needed, whose estimate assumes as many seeds a side
                diffs[name] = difference(xa, xb), sum(xa + xb) / len(xa + xb) if len(xa) == len(xb) else None
                sizes.add((len(xa), len(xb)))
        if any(na != nb for na, nb in sizes):  # a side still short of seeds: its interval leans on the other's spread
            what = f"{what} (n = {' / '.join(f'{na} vs {nb}' for na, nb in sorted(sizes))})"
        runs_a, runs_b = _group_runs(a, section.sweep, loaded), _group_runs(b, section.sweep, loaded)
        if len(start_models(runs_a + runs_b)) > 1:
            # The two sides began from different SFT checkpoints (rebuilt in another session): each run's gain
            # over its own step-0 validation takes the start's accuracy out of the comparison.
            for key, name in GAIN_SERIES:
                ga = [g for r in runs_a if (g := gain(r, key)) is not None]
                gb = [g for r in runs_b if (g := gain(r, key)) is not None]
                if ga and gb:
                    diffs[name] = difference(ga, gb), None
        out.append((what, diffs))
    return out


GAIN_SERIES = (("val/accuracy", "greedy gain over step 0"), ("val_sampled/accuracy", "sampled gain over step 0"))


def gain(run, key: str) -> float | None:
    """A run's last validation minus its step-0 validation (None without both)."""
    series = run.series(key)
    if 0 not in series or len(series) < 2:
        return None
    return series[max(series)] - series[0]


def _group_runs(ref: str, sweep: str, loaded: dict) -> list:
    name, label = _split_ref(ref, sweep)
    groups = loaded[name][0] if name in loaded else []
    return [r for g in groups if g.label == label for r in g.runs]


def start_models(runs) -> set[str]:
    """The start models' sha256 that the runs' RECORD.json name (a run without one adds nothing)."""
    return {digest for run in runs if (digest := _record_info(run).get("start_model_sha256"))}


def cpu_name(run) -> str:
    """The processor a run's RECORD.json names, shortened ("Intel(R) Xeon(R) Processor" -> "Intel Xeon"), with
    ", fp32" where it had no native bf16 kernels (a bf16 config then runs in fp32)."""
    info = _record_info(run).get("machine", {})
    cpu = " ".join((info.get("cpu") or "unrecorded").replace("(R)", "").replace("(TM)", "")
                   .replace(" Processor", "").split())
    return f"{cpu}, fp32" if info.get("native_bf16") is False else cpu


def _record_info(run) -> dict:
    try:
        return json.loads((run.path / RECORD_INFO).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return {}


def questions_needed(d, accuracy: float, questions: int | None) -> str:
    """For an unresolved difference: whether more validation questions, at the same number of seeds, would
    resolve it (runs.questions_to_resolve: the seeds' variance beyond the binomial part stays)."""
    if d.resolved or not d.df or not questions or accuracy is None:  # None: a gain, or unequal seeds a side
        return ""
    runs = (d.df + 2) // 2
    q = questions_to_resolve(d.mean, d.variance, accuracy, questions, runs)
    if q is None:
        return f"; at {runs} seeds no number of validation questions would (the seeds differ by more than scoring noise)"
    return f"; at {runs} seeds, about {q:,} validation questions would (now {questions})"


def findings(loaded: dict) -> list[str]:
    """The page's first table (and the README's): every comparison in one line, with its verdict."""
    any_mixed = any_idle = False
    lines = ["Final validation accuracy, A - B, mean over seeds with the 95 % two-sample t-interval; **bold** where "
             "the interval excludes 0 (larger than the spread between seeds).", "",
             "| question | A - B, greedy | A - B, sampled (T = 1) |", "|---|---|---|"]
    for section in SECTIONS:
        for (_, a, b), (what, diffs) in zip(section.pairs, pair_differences(section, loaded)):
            if isinstance(diffs, str):
                lines.append(f"| {what} | not measured yet | |")
                continue
            cells = []
            for name, gain_name in zip(("greedy", "sampled"), (n for _, n in GAIN_SERIES)):
                cell = " / ".join(_cell(diffs[n][0]) for n in (name, gain_name) if n in diffs)
                cells.append(cell or "-")
            mixed = any(n in diffs for _, n in GAIN_SERIES)
            any_mixed |= mixed
            idle = any(never_trained(_group_runs(ref, section.sweep, loaded)) for ref in (a, b))
            any_idle |= idle
            marks = (" †" if mixed else "") + (" ‡" if idle else "")
            lines.append(f"| {what}{marks} | " + " | ".join(cells) + " |")
    lines.append("")
    if any_mixed:
        lines += ["† The two sides started from different SFT checkpoints (the same recipe rebuilt on another "
                  "machine): the second number compares each run's gain over its own step-0 validation.", ""]
    if any_idle:
        lines += ["‡ One side never trained (no reward spread in any group at any step, so no update): the "
                  "difference compares its start model with the other side's result.", ""]
    return lines


def _cell(d) -> str:
    text = f"{d.mean:+.3f} ± {d.half_width:.3f}" if d.df else f"{d.mean:+.3f} (1 run a side)"
    return f"**{text}**" if d.resolved else text


def provenance(groups: list[Group]) -> str:
    """Where the runs were made (each record's RECORD.json): the processors, whose speeds differ, and the start
    models, since an SFT checkpoint rebuilt in another session rounds differently (its step-0 validation shows
    by how much)."""
    machines, starts = Counter(), {}
    for g in groups:
        for run in g.runs:
            info = _record_info(run)
            machines[info.get("machine", {}).get("cpu", "unrecorded")] += 1
            digest = (info.get("start_model_sha256") or "unrecorded")[:12]
            count, step0 = starts.setdefault(digest, [0, {}])
            starts[digest][0] = count + 1
            step0.setdefault(g.label, run.series("val/accuracy").get(0))  # greedy: the same for every seed

    def accuracy(step0: dict) -> str:  # one number, or one per group where the groups' prompts (say) differ
        fmt = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        if len(set(step0.values())) == 1:
            return fmt(next(iter(step0.values())))
        return ", ".join(f"{label} {fmt(v)}" for label, v in step0.items())

    where = ", ".join(f"{n} on {cpu}" for cpu, n in machines.most_common())
    start = "; ".join(f"{digest} ({n} run{'s' * (n != 1)}, step-0 greedy accuracy {accuracy(step0)})"
                      for digest, (n, step0) in starts.items())
    return f"\nRuns: {where}. Start model (sha256 of the weights): {start}."


RESUME_SLACK_S = 60.0  # a step's checkpoint and logging, beyond its logged generate/train/validate seconds


def wall_minutes(run) -> float | None:
    """A run's wall time from its log: first to last logged step, plus step 0's validation when it was computed
    (not read from the cache); model loading (seconds) is not logged and not counted. A step logged much later
    than its own work explains (a pause, or a resume in a later session: the gap, the reload and the steps
    redone after the checkpoint) counts as its logged work, so the column says what a run costs."""
    rows = [r for r in run.metrics if isinstance(r.get("time"), (int, float))]
    if not rows:
        return None
    first = rows[0]
    total = 0.0 if first.get("time/validate_cached") else (first.get("val/seconds", 0.0)
                                                            + first.get("val_sampled/seconds", 0.0))
    for before, row in zip(rows, rows[1:]):
        elapsed = row["time"] - before["time"]
        if "time/step" in row:
            elapsed = min(elapsed, row["time/step"] + row.get("time/validate", 0.0) + RESUME_SLACK_S)
        total += elapsed
    return total / 60


def run_times(loaded: dict) -> list[str]:
    """The appendix: every finished run with its wall time and median seconds per step."""
    lines = ["## Every run and its wall time", "",
             "From each run's metrics.jsonl (first to last step, plus step 0's validation when it was computed).", "",
             "| sweep | run | wall time (min) | median s / step | final greedy | final sampled |", "|---|---|---|---|---|---|"]
    for sweep, (groups, summary, _) in loaded.items():
        finals = {r.path: r for r in summary.runs}
        for run in (r for g in groups for r in g.runs):
            minutes, steps = wall_minutes(run), list(run.series("time/step").values())
            final = finals[str(run.path)]
            cells = [sweep, run.name, "-" if minutes is None else f"{minutes:.1f}",
                     f"{statistics.median(steps):.1f}" if steps else "-"]
            cells += ["-" if v is None else f"{v:.3f}" for v in (final.final_val_accuracy,
                                                                 final.final_val_sampled_accuracy)]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def _split_ref(ref: str, sweep: str) -> tuple[str, str]:
    """A pair's group reference -> (sweep, group label); "sweep:label" names a group of another sweep."""
    name, _, label = ref.rpartition(":") if ":" in ref else (sweep, "", ref)
    return name, label


def _resolve(ref: str, sweep: str, loaded: dict):
    name, label = _split_ref(ref, sweep)
    if name not in loaded:
        return None, label
    summary = loaded[name][1]  # finished runs only
    return (summary, label) if any(g.group == label for g in summary.groups) else (None, label)


def load_sweeps(sweeps_root: Path) -> dict:
    """sweep -> (groups, summary, unfinished runs left out): only finished runs count, since an unfinished run's
    last validation is not its final one."""
    loaded = {}
    for section in SECTIONS:
        root = sweeps_root / section.sweep
        if root.is_dir() and any(root.glob("*/metrics.jsonl")):
            groups = load_groups([root])
            unfinished = [r.name for g in groups for r in g.runs if not r.finished]
            for g in groups:
                g.runs = [r for r in g.runs if r.finished]
            groups = [g for g in groups if g.runs]
            if groups:
                loaded[section.sweep] = (groups, summarize(groups), unfinished)
    return loaded


def write_results(sweeps_root: Path = Path("results"), out: Path = Path("docs/results.md"),
                  readme: Path | None = None) -> Path:
    out_dir = out.parent / "results"
    loaded = load_sweeps(sweeps_root)
    body = [
        "# Seed 004's experiments: which estimator wins, with its spread",
        "",
        "Arithmetic task, from the arithmetic SFT checkpoint (configs/grpo_arithmetic.yaml: 64 rollouts = 8 "
        "questions x 8 a step, 20 steps, greedy and sampled validation on 300 held-out questions), 3 seeds per "
        "configuration. Written by `examples/seed004_results.py` from the runs under "
        f"`{sweeps_root}`; the wall time of every run is in the last section.",
        "",
    ]
    body += ["## What we found", "", *findings(loaded)]
    body += [section_markdown(s, sweeps_root, out_dir, loaded) for s in SECTIONS]
    body += run_times(loaded)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(body), encoding="utf-8")
    if readme is not None:
        update_readme(readme, findings(loaded))
    return out


README_BLOCK = ("<!-- seed004-findings: written by examples/seed004_results.py -->", "<!-- /seed004-findings -->")


def update_readme(readme: Path, table: list[str]) -> bool:
    """Replace what lies between the README's two markers with the findings table; False when it has no markers."""
    text = readme.read_text(encoding="utf-8")
    start, end = README_BLOCK
    if start not in text or end not in text:
        return False
    head, rest = text.split(start, 1)
    tail = rest.split(end, 1)[1]
    readme.write_text(head + start + "\n" + "\n".join(table) + end + tail, encoding="utf-8")
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweeps", type=Path, default=Path("results"),
                        help="where the sweeps' runs are: their records (default) or runs/sweeps")
    parser.add_argument("--out", type=Path, default=Path("docs/results.md"))
    parser.add_argument("--readme", type=Path, default=Path("README.md"),
                        help="whose findings block (between its seed004-findings markers) gets the table")
    args = parser.parse_args(argv)
    print(f"wrote {write_results(args.sweeps, args.out, args.readme)}")


if __name__ == "__main__":
    main()

"""Run directories as `rlvr plot`, `rlvr report` and `rlvr summary` read them: a run directory (config.yaml,
metrics.jsonl), runs grouped by configuration, their summaries with the statistics of rlvr.experiments.stats, and
the summary CSV/JSON. The sweep runner (rlvr.experiments.sweep) builds on this module.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlvr.config import ConfigError, TrainConfig, load_config
from rlvr.core import checkpoint as ckpt
from rlvr.core.tracking import read_jsonl
from rlvr.experiments.stats import Difference, Spread, difference, spread

# Not a difference between configurations: the seed is what a group averages over; out and resume are bookkeeping.
NOT_CONFIG = ("seed", "out", "resume")


# ----------------------------------------------------------------------------------------------------
# Statistics: pure functions of numbers.


def metric_series(metrics: list[dict], key: str) -> dict[int, float]:
    """step -> value of one metric (finite numbers only; a step logged twice keeps its last value)."""
    out = {}
    for row in metrics:
        value = row.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[int(row["step"])] = float(value)
    return out


def per_step_spread(series: Sequence[dict[int, float]]) -> list[tuple[int, Spread]]:
    """The spread across runs at every step some run logged; n counts the runs that have that step."""
    steps = sorted(set().union(*series)) if series else []
    return [(s, spread([run[s] for run in series if s in run])) for s in steps]


# ----------------------------------------------------------------------------------------------------
# Runs and groups.


@dataclass
class Run:
    """One run directory, loaded: its config.yaml, metrics.jsonl and (when asked) rollouts.jsonl."""

    path: Path
    config: dict
    metrics: list[dict]
    rollouts: list[dict] = field(default_factory=list)
    finished: bool = False
    name: str = ""  # display name: the path below the runs' common parent

    def series(self, key: str) -> dict[int, float]:
        return metric_series(self.metrics, key)

    def minutes(self) -> dict[int, float]:
        """step -> training minutes up to and including it (step 0: 0), from each step's logged time (RL:
        time/step, SFT and DPO: time/step_seconds; validation is not counted); empty when no step logged one."""
        seconds = self.series("time/step") or self.series("time/step_seconds")
        if not seconds:
            return {}
        out, total = {0: 0.0}, 0.0
        for step in sorted(set(seconds) | set(self.series("val/accuracy"))):
            total += seconds.get(step, 0.0)
            out[step] = total / 60
        return out


@dataclass
class Group:
    """Runs that share a configuration (they differ only in seed): `key` holds every field that differs
    between the loaded runs, `label` the few that tell the groups apart."""

    key: tuple[tuple[str, Any], ...]
    label: str
    runs: list[Run]
    shown: tuple[str, ...] = ()  # the fields in the label

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.key)


def freeze(value: Any) -> Any:
    """A config value that can be hashed and compared: dicts and lists as their sorted JSON."""
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value


_MISSING = "<missing>"


def differing_fields(configs: Sequence[dict], exclude: Sequence[str] = NOT_CONFIG) -> list[str]:
    """Config fields whose value is not the same in every config that has the field (in the order of the first
    config). A field only some configs hold (added to TrainConfig after older runs were made) differs only
    when the configs that hold it disagree."""
    names: list[str] = []
    for c in configs:
        names += [k for k in c if k not in names]
    return [k for k in names if k not in exclude and len({freeze(c[k]) for c in configs if k in c}) > 1]


def label_fields(configs: Sequence[dict], fields: Sequence[str]) -> list[str]:
    """The smallest set of `fields` that still tells the configs apart, dropping preset-derived fields first:
    with algorithm in [grpo, dr_grpo] the differing loss_normalization adds nothing to the label."""

    def n_groups(names):
        return len({tuple(freeze(c.get(k, _MISSING)) for k in names) for c in configs})

    keep, target = list(fields), n_groups(fields)
    # fields the algorithm sets (every EstimatorSpec choice) go first, since `algorithm` says it all
    from rlvr.algorithms.spec import CHOICES as derived

    order = [f for f in fields if f in derived] + [f for f in reversed(fields) if f not in derived]
    for name in order:
        trial = [f for f in keep if f != name]
        if trial and n_groups(trial) == target:
            keep = trial
    return keep


def fmt_value(value: Any) -> str:
    """1e-05 -> "1e-05", 0.5 -> "0.5", True -> "true", None -> "none", {a: 1} -> "{a: 1}"."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    if value is None:
        return "none"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {fmt_value(v)}" for k, v in value.items()) + "}"
    return str(value)


def _sort_key(value: Any):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, str(freeze(value)))


def group_runs(runs: Sequence[Run]) -> list[Group]:
    """Group runs by every config field that differs between them except seed, out and resume; groups are
    sorted by their values (numbers numerically), runs inside a group by seed."""
    configs = [r.config for r in runs]
    fields = differing_fields(configs)
    shown = label_fields(configs, fields)
    groups: dict[tuple, Group] = {}
    for run in runs:
        key = tuple((k, run.config.get(k)) for k in fields)
        frozen = tuple(freeze(v) for _, v in key)
        if frozen not in groups:
            label = ", ".join(f"{k}={fmt_value(run.config.get(k))}" for k in shown) or "all runs"
            groups[frozen] = Group(key, label, [], tuple(shown))
        groups[frozen].runs.append(run)
    ordered = sorted(groups.values(), key=lambda g: [_sort_key(v) for _, v in g.key])
    for g in ordered:
        g.runs.sort(key=lambda r: (_sort_key(r.config.get("seed")), r.name))
    return ordered


# ----------------------------------------------------------------------------------------------------
# Summary: one function computes it for `rlvr summary`, `rlvr report` and `rlvr plot`.

SUMMARY_METRICS = ("final_val_accuracy", "best_val_accuracy", "final_val_format_rate", "final_val_sampled_accuracy")


@dataclass
class RunSummary:
    run: str
    path: str
    group: str
    seed: Any
    steps_done: int
    steps_planned: int | None
    finished: bool
    final_val_step: int | None
    final_val_accuracy: float | None
    best_val_accuracy: float | None
    best_val_step: int | None
    final_val_format_rate: float | None
    final_val_sampled_accuracy: float | None = None  # the sampled validation's (eval_sampled_samples), if logged


@dataclass
class GroupSummary:
    group: str
    values: dict
    n_runs: int
    n_finished: int
    seeds: list
    stats: dict[str, Spread | None]  # SUMMARY_METRICS -> spread over the runs that have the number


@dataclass
class GroupDifference:
    """One group against the baseline group: a Difference per summary number both have."""

    group: str
    baseline: str
    stats: dict[str, Difference | None]


@dataclass
class Summary:
    runs: list[RunSummary]
    groups: list[GroupSummary]
    differences: list[GroupDifference] = field(default_factory=list)  # with summarize(..., baseline=)


def summarize_run(run: Run, group: str) -> RunSummary:
    """Final = val/accuracy at the last validation step; best = its maximum over the run; the sampled
    validation's accuracy (val_sampled/accuracy) at its last step."""
    acc = run.series("val/accuracy")
    fmt = run.series("val/format_rate")
    sampled = run.series("val_sampled/accuracy")
    steps = [int(r["step"]) for r in run.metrics if "step" in r]
    last = max(acc) if acc else None
    best_step = max(acc, key=lambda s: (acc[s], -s)) if acc else None
    return RunSummary(
        run=run.name or run.path.name, path=str(run.path), group=group, seed=run.config.get("seed"),
        steps_done=max(steps, default=0), steps_planned=run.config.get("steps"), finished=run.finished,
        final_val_step=last, final_val_accuracy=acc.get(last) if acc else None,
        best_val_accuracy=acc[best_step] if acc else None, best_val_step=best_step,
        final_val_format_rate=fmt.get(last) if acc else None,
        final_val_sampled_accuracy=sampled[max(sampled)] if sampled else None,
    )


def summarize(groups: Sequence[Group], baseline: str | None = None) -> Summary:
    """Per run and per group; with `baseline` (a group's label), every other group's difference from it."""
    runs, out = [], []
    for g in groups:
        rs = [summarize_run(r, g.label) for r in g.runs]
        runs += rs
        stats = {}
        for metric in SUMMARY_METRICS:
            values = [getattr(r, metric) for r in rs if getattr(r, metric) is not None]
            stats[metric] = spread(values) if values else None
        out.append(GroupSummary(g.label, {k: v for k, v in g.key}, len(rs), sum(r.finished for r in rs),
                                [r.seed for r in rs], stats))
    summary = Summary(runs, out)
    if baseline is not None:
        summary.differences = compare_to(summary, baseline)
    return summary


def group_values(summary: Summary, group: str, metric: str) -> list[float]:
    """One summary number (a SUMMARY_METRICS name) of every run of a group that has it."""
    return [getattr(r, metric) for r in summary.runs if r.group == group and getattr(r, metric) is not None]


def compare_to(summary: Summary, baseline: str) -> list[GroupDifference]:
    labels = [g.group for g in summary.groups]
    if baseline not in labels:
        raise ValueError(f"no group is labelled {baseline!r}; the groups are: {', '.join(map(repr, labels))}")
    out = []
    for g in labels:
        if g == baseline:
            continue
        stats = {}
        for m in SUMMARY_METRICS:
            xs, base = group_values(summary, g, m), group_values(summary, baseline, m)
            stats[m] = difference(xs, base) if xs and base else None
        out.append(GroupDifference(g, baseline, stats))
    return out


def summary_rows(summary: Summary) -> list[dict]:
    """CSV rows: one per run (kind=run), then one per group (kind=group) with mean, std, 95% half width,
    min and max of each summary number (the run columns hold the group mean), then one per group compared with
    the baseline (kind=difference)."""
    rows = []
    for r in summary.runs:
        rows.append({"kind": "run", **asdict(r)})
    for g in summary.groups:
        row = {"kind": "group", "group": g.group, "n": g.n_runs, "n_finished": g.n_finished,
               "seed": " ".join(map(str, g.seeds))}
        for metric, s in g.stats.items():
            d = s.to_dict() if s is not None else {}
            row[metric] = d.get("mean")
            for part in ("std", "half_width", "min", "max"):
                row[f"{metric}_{'ci95' if part == 'half_width' else part}"] = d.get(part)
        rows.append(row)
    for d in summary.differences:  # kind=difference: the group's mean minus the baseline's, with its interval
        row = {"kind": "difference", "group": d.group, "baseline": d.baseline}
        for metric, x in d.stats.items():
            x = x.to_dict() if x is not None else {}
            row[metric], row[f"{metric}_ci95"] = x.get("mean"), x.get("half_width")
            row[f"{metric}_resolved"], row[f"{metric}_runs_to_resolve"] = x.get("resolved"), x.get("runs_to_resolve")
        rows.append(row)
    return rows


def write_summary(summary: Summary, csv_path: str | Path) -> tuple[Path, Path]:
    """Write summary.csv and summary.json (next to it)."""
    csv_path = Path(csv_path)
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    rows = summary_rows(summary)
    columns: list[str] = []
    for row in rows:
        columns += [k for k in row if k not in columns]
    with csv_path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if row.get(k) is None else row.get(k)) for k in columns})
    json_path = csv_path.with_suffix(".json")
    data = {
        "runs": [asdict(r) for r in summary.runs],
        "groups": [{**{k: v for k, v in asdict(g).items() if k != "stats"},
                    "stats": {m: (s.to_dict() if s else None) for m, s in g.stats.items()}} for g in summary.groups],
        "differences": [{"group": d.group, "baseline": d.baseline,
                         "stats": {m: (x.to_dict() if x else None) for m, x in d.stats.items()}}
                        for d in summary.differences],
    }
    json_path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
    return csv_path, json_path


# ----------------------------------------------------------------------------------------------------
# Loading run directories (file I/O).


def find_run_dirs(paths: Sequence[str | Path]) -> list[Path]:
    """Run directories (holding metrics.jsonl) among `paths`; a directory without one stands for the run
    directories below it (a sweep root)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise FileNotFoundError(f"{p} is not a directory")
        if (p / "metrics.jsonl").is_file():
            candidates = [p]
        else:
            below = sorted(m.parent for m in p.rglob("metrics.jsonl"))
            candidates = [c for c in below if not any(other in c.parents for other in below)]  # not nested
            if not candidates:
                raise FileNotFoundError(f"{p} holds no run (no metrics.jsonl in it or below it)")
        found += [c for c in candidates if c.resolve() not in {f.resolve() for f in found}]
    return found


def read_run_config(run_dir: Path) -> dict:
    """config.yaml through TrainConfig (so preset fields are resolved); a config TrainConfig no longer
    accepts (an older run, an SFT run) is read as plain YAML."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return {}
    try:
        return load_config(TrainConfig, path).model_dump(mode="json")
    except (ConfigError, ValueError):
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def load_run(run_dir: str | Path, rollouts: bool = False) -> Run:
    run_dir = Path(run_dir)
    logged = run_dir / "rollouts.jsonl"
    return Run(path=run_dir, config=read_run_config(run_dir), metrics=read_jsonl(run_dir / "metrics.jsonl"),
               rollouts=read_jsonl(logged) if rollouts and logged.is_file() else [],
               finished=ckpt.is_finished(run_dir))


def load_runs(paths: Sequence[str | Path], rollouts: bool = False) -> list[Run]:
    dirs = find_run_dirs(paths)
    runs = [load_run(d, rollouts) for d in dirs]
    absolute = [d.resolve() for d in dirs]
    root = Path(os.path.commonpath(absolute)) if len(absolute) > 1 else absolute[0].parent
    for run, path in zip(runs, absolute):
        run.name = str(path.relative_to(root)) if path != root else path.name
    return runs


def load_groups(paths: Sequence[str | Path], rollouts: bool = False) -> list[Group]:
    return group_runs(load_runs(paths, rollouts))

"""Sweeps of `rlvr train` (or, with `command: dpo`, `rlvr dpo`) runs: the sweep file, its grid, the plan, and the runs as child processes, N at a
time, stopped cleanly on Ctrl-C. Reading the finished runs back (summaries, plots, reports) is rlvr.experiments.runs.

A sweep file (sweeps/*.yaml):

    name: on_policy_variants               # default: the file's stem
    out: runs/sweeps/on_policy_variants    # default: runs/sweeps/<name>
    parallel: 1                            # runs at a time, each a `rlvr train` subprocess
    base:                                  # a train config path, or TrainConfig fields with an optional
      config: configs/grpo_arithmetic.yaml #   `config:` path whose fields come first
      steps: 20
    grid:                                  # field -> values; every combination is one run
      algorithm: [grpo, dr_grpo]
      seed: [0, 1, 2]

Each grid point runs in <out>/<field=value,...>, named from the grid fields with more than one value
(`algorithm=dr_grpo,seed=1`). Every point's TrainConfig is validated before any run starts. A run's status:

    new       nothing logged yet: train from the start
    resume    a checkpoint exists, no final/DONE: continue with resume=true
    restart   logs but no checkpoint (stopped before its first save): the old logs are renamed to
              <name>.interrupted-<time> and the run starts from the beginning
    done      final/DONE exists: skipped
    reuse     new, but a finished run with the same config exists under one of the file's `reuse` directories
              (another sweep): its logs are copied and its final model linked instead of training again
    recorded  new, but the sweep's `record` directory keeps this run, finished, with the same config: its logs are
              restored into the run directory (with DONE, without the weights) instead of training again
    running   another sweep process holds the run's lock: skipped
    changed   the directory holds a run of a different config: the sweep refuses to start

so a sweep can be stopped (Ctrl-C) and started again at any time. A failed run is reported and the others go on.

`record: results/<name>` keeps every finished run's logs (config.yaml, metrics.jsonl, rollouts.jsonl, final/DONE
as DONE, and RECORD.json: the machine and the start model's sha256; no weights, no checkpoints) in a directory
committed with the code: runs/ is scratch space a fresh machine does not have, so a sweep that takes longer than
one session's machine accumulates in its record, and `rlvr summary / plot / report` read the record like any run
directory.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from rlvr.config import BaseConfig, ConfigError, DPOConfig, TrainConfig, load_config, parse_overrides
from rlvr.core import checkpoint as ckpt
from rlvr.experiments.runs import fmt_value, freeze

# the command each run of a sweep is, and the config class its fields belong to
COMMANDS = {"train": TrainConfig, "dpo": DPOConfig}


class SweepConfig(BaseConfig):
    """A sweep file. Command-line overrides may also set any TrainConfig field for every run (steps=5)."""

    name: str | None = Field(None, description="default: the sweep file's stem")
    command: str = Field("train", description="what each run is: train (rlvr train) | dpo (rlvr dpo)")
    base: str | dict[str, Any] = Field({}, description="train config path or TrainConfig fields")
    grid: dict[str, list[Any]] = Field({}, description="field -> list of values")
    out: str | None = Field(None, description="root directory of the runs (default runs/sweeps/<name>)")
    parallel: int = Field(1, ge=1, description="runs at a time")
    dry_run: bool = Field(False, description="print the plan and exit")
    report: bool = Field(True, description="write summary.csv/json and report.html into out when the sweep ends")
    baseline: str | None = Field(None, description="the group the summary and report compare every other group "
                                 "with, as its label reads: algorithm=grpo, learning_rate=1e-05")
    reuse: list[str] = Field([], description="other sweeps' out directories: a finished run there whose config "
                             "equals a new run's (out aside) is reused instead of trained again (its logs copied, "
                             "its final model linked)")
    prune_checkpoints: bool = Field(True, description="delete a run's checkpoints/ once it finished (final/ stays)")
    record: str | None = Field(None, description="a directory (committed with the code) that keeps each finished "
                               "run's logs without its weights; a run kept there with the same config is restored "
                               "from it instead of trained again")


@dataclass
class Sweep:
    source: Path
    name: str
    out: Path
    parallel: int
    dry_run: bool
    report: bool
    prune_checkpoints: bool
    base_path: Path | None
    base_fields: dict[str, Any]
    grid: dict[str, list[Any]]
    command: str = "train"
    baseline: str | None = None
    reuse: tuple[Path, ...] = ()
    record: Path | None = None

    @property
    def config_class(self):
        return COMMANDS[self.command]


@dataclass
class PlannedRun:
    name: str
    path: Path
    values: dict[str, Any]
    config: BaseConfig  # the run's TrainConfig (or DPOConfig for command: dpo)
    status: str = "new"
    detail: str = ""
    command: str = "train"
    source: Path | None = None  # status reuse / recorded: the finished run (or its record) with this config


def expand_grid(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """{"a": [1, 2], "b": ["x"]} -> [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}] (the last field varies fastest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


_UNSAFE = re.compile(r"[^A-Za-z0-9._+\-]+")


def run_name(values: dict[str, Any], grid: dict[str, list[Any]]) -> str:
    """The directory name of a grid point: the fields with more than one value, as field=value joined by
    commas ("algorithm=dr_grpo,seed=1"); characters unsafe in a path become "_"."""
    varying = [k for k in grid if len(grid[k]) > 1] or list(grid)
    if not varying:
        return "run"
    return ",".join(f"{k}={_UNSAFE.sub('_', fmt_value(values[k]))}" for k in varying)


def _resolve_base_path(raw: str, sweep_file: Path) -> Path:
    for candidate in (Path(raw), sweep_file.parent / raw, sweep_file.parent.parent / raw):
        if candidate.is_file():
            return candidate
    raise ConfigError(f"{sweep_file}: base config {raw!r} not found (looked in the current directory and next "
                      f"to the sweep file)")


def load_sweep(path: str | Path, overrides: list[str] | dict | None = None) -> Sweep:
    """Read a sweep file; overrides set sweep fields (parallel=2, dry_run=true) or, for any other key that is
    a TrainConfig field, that field in every run (steps=5)."""
    path = Path(path)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    sweep_keys = {k: v for k, v in extra.items() if k in SweepConfig.model_fields}
    train_keys = {k: v for k, v in extra.items() if k not in SweepConfig.model_fields}
    cfg = load_config(SweepConfig, path, sweep_keys)
    if cfg.command not in COMMANDS:
        raise ConfigError(f"{path}: field 'command': {cfg.command!r} is not one of {', '.join(COMMANDS)}")
    fields = COMMANDS[cfg.command].model_fields
    bad = [k for k in train_keys if k not in fields or k == "resume"]
    if bad:
        raise ConfigError(f"command line: unknown field(s) {', '.join(map(repr, bad))}; valid: the sweep fields "
                          f"{', '.join(SweepConfig.model_fields)} or any `rlvr {cfg.command}` field except resume")
    base = {"config": cfg.base} if isinstance(cfg.base, str) else dict(cfg.base)
    raw_path = base.pop("config", None)
    base_path = _resolve_base_path(str(raw_path), path) if raw_path else None
    for where, keys in (("base", base), ("grid", cfg.grid)):
        unknown = [k for k in keys if k not in fields]
        if unknown:
            raise ConfigError(f"{path}: {where}: unknown field(s) {', '.join(map(repr, unknown))}; valid fields: "
                              f"{', '.join(fields)}")
    for k, values in cfg.grid.items():
        if k in ("out", "resume"):
            raise ConfigError(f"{path}: grid: field {k!r} cannot be swept (the sweep sets it for each run)")
        if not values:
            raise ConfigError(f"{path}: grid: field {k!r} has no values")
        if k in train_keys:
            raise ConfigError(f"command line: field {k!r} is swept by {path}'s grid; change the grid instead")
    if cfg.baseline is not None:
        field_name, _, value = cfg.baseline.partition("=")
        if not value or field_name not in cfg.grid or field_name == "seed":
            raise ConfigError(f"{path}: field 'baseline': {cfg.baseline!r} is not <grid field>=<value> of a grid "
                              f"field other than seed ({', '.join(k for k in cfg.grid if k != 'seed') or 'none'})")
        if value not in [fmt_value(v) for v in cfg.grid[field_name]]:
            raise ConfigError(f"{path}: field 'baseline': {value!r} is not one of {field_name}'s grid values "
                              f"({', '.join(fmt_value(v) for v in cfg.grid[field_name])})")
    name = cfg.name or path.stem
    return Sweep(source=path, name=name, out=Path(cfg.out or f"runs/sweeps/{name}"), parallel=cfg.parallel,
                 dry_run=cfg.dry_run, report=cfg.report, prune_checkpoints=cfg.prune_checkpoints,
                 base_path=base_path, base_fields={**base, **train_keys}, grid=cfg.grid, command=cfg.command,
                 baseline=cfg.baseline, reuse=tuple(Path(p) for p in cfg.reuse),
                 record=Path(cfg.record) if cfg.record else None)


def _check_names(cfg: BaseConfig) -> None:
    """What TrainConfig leaves to run time but costs nothing to check now: the prompt and the dataset."""
    from rlvr.tasks.task import load_task

    try:
        task = load_task(cfg)
    except ValueError as err:
        raise ConfigError(f"field 'prompt': {err}") from None
    try:
        task.split("validation", 1)
    except (ValueError, FileNotFoundError) as err:
        raise ConfigError(f"field 'dataset': {err}") from None


def build_configs(sweep: Sweep) -> list[PlannedRun]:
    """Every grid point's TrainConfig, validated; errors name the sweep file, the run and the field."""
    points = expand_grid(sweep.grid)
    runs, seen, checked = [], {}, set()
    for values in points:
        name = run_name(values, sweep.grid)
        if name in seen:
            raise ConfigError(f"{sweep.source}: grid points {seen[name]} and {values} both map to directory {name!r}")
        seen[name] = values
        path = sweep.out / name
        try:
            cfg = load_config(sweep.config_class, sweep.base_path,
                              {**sweep.base_fields, **values, "out": str(path), "resume": False})
            if (cfg.prompt, cfg.dataset) not in checked:
                _check_names(cfg)
                checked.add((cfg.prompt, cfg.dataset))
        except ConfigError as err:
            raise ConfigError(f"{sweep.source}: run {name}: {err}") from None
        runs.append(PlannedRun(name, path, values, cfg, command=sweep.command))
    return runs


LOCK = ".sweep.lock"


def _pid_alive(pid: int) -> bool:
    """Whether `pid` is a live `rlvr` process (a stale lock's pid may since belong to something else)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    cmdline = Path(f"/proc/{pid}/cmdline")
    try:
        return b"rlvr" in cmdline.read_bytes() if cmdline.parent.is_dir() else True
    except OSError:
        return True


def _saved_config(run_dir: Path) -> dict:
    """A run directory's config.yaml, without the bookkeeping fields (out, resume) two runs of one config differ in."""
    values = yaml.safe_load((run_dir / "config.yaml").read_text(encoding="utf-8")) or {}
    return {k: v for k, v in values.items() if k not in ("out", "resume")}


def _planned_config(cfg: BaseConfig) -> dict:
    """The same for a planned run, its fields spelled as config.yaml spells them (async, not async_)."""
    return {k: v for k, v in cfg.model_dump(mode="json", by_alias=True).items() if k not in ("out", "resume")}


def _config_changes(run_dir: Path, cfg: BaseConfig) -> list[str]:
    if not (run_dir / "config.yaml").is_file():
        return []
    old, new = _saved_config(run_dir), _planned_config(cfg)
    return [f"{k}: {fmt_value(old[k])} in the run dir, {fmt_value(new[k])} in the sweep"
            for k in new if k in old and freeze(old[k]) != freeze(new[k])]


def run_status(run_dir: Path, cfg: BaseConfig) -> tuple[str, str]:
    """(status, detail) of one planned run from what its directory holds; see the module docstring."""
    lock = run_dir / LOCK
    if lock.is_file():
        try:
            pid = int(json.loads(lock.read_text(encoding="utf-8"))["pid"])
        except (ValueError, KeyError, TypeError):
            pid = -1
        if pid > 0 and _pid_alive(pid):
            return "running", f"pid {pid}"
    done = ckpt.is_finished(run_dir)
    checkpoint = ckpt.latest_checkpoint(run_dir)
    if done or checkpoint is not None:
        changes = _config_changes(run_dir, cfg)
        if changes:
            return "changed", "; ".join(changes)
    if done:
        return "done", ""
    if checkpoint is not None:
        return "resume", f"from {checkpoint.name}"
    if (run_dir / "metrics.jsonl").is_file() or (run_dir / "rollouts.jsonl").is_file():
        return "restart", "logs but no checkpoint: start again"
    return "new", ""


def plan_sweep(sweep: Sweep) -> list[PlannedRun]:
    runs = build_configs(sweep)
    for r in runs:
        r.status, r.detail = run_status(r.path, r.config)
        if r.status == "new" and sweep.record is not None:
            kept = sweep.record / r.name
            if ckpt.is_finished(kept) and (kept / "config.yaml").is_file():
                if same_config(kept, r.config):
                    r.status, r.source, r.detail = "recorded", kept, f"kept in {kept}"
                else:
                    r.detail = f"{kept} keeps another config: replaced when this run finishes"
        if r.status == "new" and sweep.reuse:
            r.source = reusable_run(r, sweep.reuse)
            if r.source is not None:
                r.status, r.detail = "reuse", f"the finished run {r.source}"
    return runs


def same_config(run_dir: Path, cfg: BaseConfig) -> bool:
    """run_dir's config.yaml has exactly cfg's fields and values (out and resume aside): the same computation.
    A field the saved config lacks (added to rlvr after that run) counts as its default, which by rlvr's rule
    for new fields is what the run did."""
    saved, planned = _saved_config(run_dir), _planned_config(cfg)
    defaults = type(cfg).model_construct().model_dump(mode="json", by_alias=True)
    saved = {**{k: defaults[k] for k in planned if k not in saved and k in defaults}, **saved}
    return {k: freeze(v) for k, v in saved.items()} == {k: freeze(v) for k, v in planned.items()}


def reusable_run(run: PlannedRun, roots: Sequence[Path]) -> Path | None:
    """A finished run (or a record of one) under one of `roots` with the planned run's config: its result is
    this run's."""
    for root in roots:
        for path in sorted(root.glob("*/config.yaml")):
            source = path.parent
            if source.resolve() == run.path.resolve() or not ckpt.is_finished(source):
                continue
            if same_config(source, run.config):
                return source
    return None


def format_plan(sweep: Sweep, plan: Sequence[PlannedRun]) -> str:
    counts = {s: sum(r.status == s for r in plan) for s in dict.fromkeys(r.status for r in plan)}
    width = max((len(str(r.path)) for r in plan), default=0)
    lines = [f"sweep {sweep.name} ({sweep.source}): {len(plan)} runs in {sweep.out}, {sweep.parallel} at a time"]
    lines += [f"  {r.status:<8} {str(r.path):<{width}}  {r.detail}".rstrip() for r in plan]
    lines.append("  " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)

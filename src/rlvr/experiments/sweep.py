"""Running a sweep: its planned runs (rlvr.experiments.sweep_plan, where the sweep file's format and the runs'
statuses are described) as `rlvr train` / `rlvr dpo` child processes, N at a time, each finished run kept in the
sweep's record (rlvr.experiments.sweep_records), stopped cleanly on Ctrl-C or SIGTERM (the next start resumes).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlvr.config import ConfigError
from rlvr.core import checkpoint as ckpt
from rlvr.core.tracking import read_jsonl
from rlvr.experiments.runs import metric_series
from rlvr.experiments.sweep_plan import LOCK, PlannedRun, Sweep
from rlvr.experiments.sweep_records import keep_record, restore_record, reuse_run

# ----------------------------------------------------------------------------------------------------
# Sweeps: the file, the grid, the plan.


# ----------------------------------------------------------------------------------------------------
# Sweeps: running (subprocesses).


@dataclass
class RunOutcome:
    name: str
    path: Path
    status: str  # the planned status
    result: str  # done | skipped | failed | interrupted | reused
    returncode: int | None = None
    seconds: float = 0.0
    val_accuracy: float | None = None


@dataclass
class _Active:
    run: PlannedRun
    proc: subprocess.Popen
    log: Any
    start: float
    index: int


def child_env(parallel: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `rlvr train` subprocess: the cores shared between the runs at a time (or one
    thread when this process runs torch on one), unbuffered output for the log file."""
    env = dict(os.environ if base is None else base)
    if "OMP_NUM_THREADS" not in env:
        threads = max(1, (os.cpu_count() or 1) // parallel)
        if "torch" in sys.modules and sys.modules["torch"].get_num_threads() == 1:
            threads = 1
        if parallel > 1 or threads == 1:
            env["OMP_NUM_THREADS"] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _prepare(run: PlannedRun) -> Path:
    """Write the run's launch config (run.yaml); for a restart, rename the old logs to <name>.interrupted-<time>."""
    run.path.mkdir(parents=True, exist_ok=True)
    if run.status == "restart":
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for name in ("metrics.jsonl", "rollouts.jsonl", "metrics.discarded.jsonl", "rollouts.discarded.jsonl", "tb"):
            if (run.path / name).exists():
                os.replace(run.path / name, run.path / f"{name}.interrupted-{stamp}")
    cfg = run.config.model_copy(update={"resume": run.status == "resume"})
    launch = run.path / "run.yaml"
    cfg.save(launch)
    return launch


def _progress(run: PlannedRun) -> str:
    try:
        rows = read_jsonl(run.path / "metrics.jsonl")
    except (FileNotFoundError, ValueError):
        return "starting"
    if not rows:
        return "starting"
    acc = metric_series(rows, "val/accuracy")
    last = f", val/accuracy {acc[max(acc)]:.3f} at step {max(acc)}" if acc else ""
    return f"step {rows[-1]['step']}/{run.config.steps}{last}"


def _final_accuracy(run_dir: Path) -> float | None:
    done = ckpt.done_file(run_dir)
    if done is None:
        return None
    try:
        value = json.loads(done.read_text(encoding="utf-8")).get("val/accuracy")
    except ValueError:
        return None
    return value if isinstance(value, (int, float)) else None


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return ""


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C stops a run even when this process was started with SIGINT ignored
    (a background job), since the sweep relays it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(run: PlannedRun, index: int, total: int, env: dict, echo: Callable[[str], None]) -> _Active:
    launch = _prepare(run)
    log_path = run.path / "train.log"
    log = log_path.open("a", encoding="utf-8")
    log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} sweep: {run.status} ===\n")
    log.flush()
    proc = subprocess.Popen([sys.executable, "-m", "rlvr.cli", run.command, "--config", str(launch)],
                            stdout=log, stderr=subprocess.STDOUT, env=env, stdin=subprocess.DEVNULL,
                            preexec_fn=_default_sigint if os.name == "posix" else None)
    (run.path / LOCK).write_text(json.dumps({"pid": proc.pid, "sweep_pid": os.getpid()}), encoding="utf-8")
    echo(f"[{index}/{total}] start {run.name} ({run.status}); log: {log_path}")
    return _Active(run, proc, log, time.monotonic(), index)


def _finish(a: _Active, total: int, echo: Callable[[str], None], prune: bool) -> RunOutcome:
    a.log.close()
    (a.run.path / LOCK).unlink(missing_ok=True)
    seconds = time.monotonic() - a.start
    code = a.proc.returncode
    ok = code == 0 and ckpt.finished_model(a.run.path) is not None
    outcome = RunOutcome(a.run.name, a.run.path, a.run.status, "done" if ok else "failed", code, seconds,
                         _final_accuracy(a.run.path))
    if ok and prune:
        shutil.rmtree(a.run.path / "checkpoints", ignore_errors=True)  # final/ holds the model
    if ok:
        acc = "" if outcome.val_accuracy is None else f": val/accuracy {outcome.val_accuracy:.3f}"
        echo(f"[{a.index}/{total}] done  {a.run.name} in {seconds / 60:.1f} min{acc}")
    else:
        echo(f"[{a.index}/{total}] FAILED {a.run.name} (exit {code}) after {seconds / 60:.1f} min; "
             f"end of {a.run.path / 'train.log'}:\n{_tail(a.run.path / 'train.log')}")
    return outcome


def _stop_all(active: list[_Active], echo: Callable[[str], None]) -> list[RunOutcome]:
    """Ctrl-C: the children got the same SIGINT from the terminal (sent again here in case they did not); give
    them time to stop, then SIGTERM, then SIGKILL. Checkpoints are written atomically, so any of these is safe."""
    for a in active:
        if a.proc.poll() is None:
            a.proc.send_signal(signal.SIGINT)
    outcomes = []
    for a in active:
        for escalate in (a.proc.terminate, a.proc.kill, None):
            try:
                a.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                if escalate is not None:
                    escalate()
        a.log.close()
        (a.run.path / LOCK).unlink(missing_ok=True)
        outcomes.append(RunOutcome(a.run.name, a.run.path, a.run.status, "interrupted", a.proc.returncode,
                                   time.monotonic() - a.start))
        echo(f"stopped {a.run.name}")
    return outcomes


def _sigterm_as_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def run_sweep(sweep: Sweep, plan: Sequence[PlannedRun], echo: Callable[[str], None] = print,
              env: dict[str, str] | None = None, poll_seconds: float = 1.0,
              progress_seconds: float = 120.0) -> list[RunOutcome]:
    """Run the planned runs that are not done, `sweep.parallel` at a time, each as `python -m rlvr.cli train
    --config <run>/run.yaml` with its output in <run>/train.log. A failed run does not stop the others.
    KeyboardInterrupt stops the running children and propagates; starting the sweep again continues."""
    changed = [r for r in plan if r.status == "changed"]
    if changed:
        raise ConfigError(f"{sweep.source}: these run directories hold runs of another config; delete them or "
                          "choose another out:\n" + "\n".join(f"  {r.path}: {r.detail}" for r in changed))
    todo = [r for r in plan if r.status in ("new", "resume", "restart")]
    outcomes = [RunOutcome(r.name, r.path, r.status, "skipped") for r in plan
                if r not in todo and r.status not in ("reuse", "recorded")]
    for o in outcomes:
        echo(f"skip {o.name} ({o.status})")
    for r in plan:
        if r.status in ("reuse", "recorded"):
            (reuse_run if r.status == "reuse" else restore_record)(r)
            outcomes.append(RunOutcome(r.name, r.path, r.status, "reused" if r.status == "reuse" else "restored",
                                       val_accuracy=_final_accuracy(r.path)))
            echo(f"{'reuse' if r.status == 'reuse' else 'restore'} {r.name}: {r.detail}")

    def record(run: PlannedRun) -> None:
        if sweep.record is not None and (kept := keep_record(run, sweep.record)) is not None:
            echo(f"kept the record of {run.name} in {kept}")

    for r in plan:
        if r.status in ("done", "reuse"):  # finished before this sweep's record was kept (or in another sweep)
            record(r)
    env = child_env(sweep.parallel, env)
    pending, active = list(enumerate(todo, start=1)), []
    last_progress = time.monotonic()
    previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)  # `kill` stops the children too
    try:
        while pending or active:
            while pending and len(active) < sweep.parallel:
                index, run = pending.pop(0)
                active.append(_start(run, index, len(todo), env, echo))
            time.sleep(poll_seconds)
            for a in [a for a in active if a.proc.poll() is not None]:
                active.remove(a)
                outcomes.append(_finish(a, len(todo), echo, sweep.prune_checkpoints))
                record(a.run)
            if active and time.monotonic() - last_progress >= progress_seconds:
                last_progress = time.monotonic()
                for a in active:
                    echo(f"    {a.run.name}: {_progress(a.run)} ({(time.monotonic() - a.start) / 60:.1f} min)")
    except KeyboardInterrupt:
        _stop_all(active, echo)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    return outcomes


def format_outcomes(outcomes: Sequence[RunOutcome]) -> str:
    lines = []
    for o in outcomes:
        acc = "" if o.val_accuracy is None else f"val/accuracy {o.val_accuracy:.3f}"
        took = f"{o.seconds / 60:.1f} min" if o.seconds else ""
        lines.append(f"  {o.result:<8} {o.name:<40} {took:>9}  {acc}".rstrip())
    failed = sum(o.result == "failed" for o in outcomes)
    reused = sum(o.result == "reused" for o in outcomes)
    restored = sum(o.result == "restored" for o in outcomes)
    lines.append(f"  {len(outcomes)} runs: {sum(o.result == 'done' for o in outcomes)} ran, "
                 f"{sum(o.result == 'skipped' for o in outcomes)} skipped, {failed} failed"
                 + (f", {reused} reused" if reused else "") + (f", {restored} restored from the record" if restored else ""))
    return "\n".join(lines)

"""Run records: metrics to a local JSONL file first (always), then to TensorBoard and Weights & Biases when
on. Plots and reports read the JSONL, so any run can be re-plotted later without a dashboard.

Each line of metrics.jsonl is {"step": int, "time": unix seconds, "<name>": number, ...}; names use "/"
to group ("train/reward", "val/accuracy"). Lines are appended and flushed at once, so a crash loses at most
the line being written. A resumed run first moves the lines logged after its checkpoint to
metrics.discarded.jsonl, so the file holds exactly one history.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any


def _jsonable(value: Any):
    if hasattr(value, "item") and getattr(value, "numel", lambda: 1)() == 1:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


def read_jsonl(path: str | Path) -> list[dict]:
    """Rows of a JSONL file; a torn last line (a crash mid-write) is skipped, any other bad line fails."""
    path = Path(path)
    rows = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines):
                break
            raise ValueError(f"{path}:{i}: not valid JSON") from None
    return rows


def truncate_after(path: Path, step: int) -> int:
    """Keep the rows with step <= `step`; move the others to <name>.discarded.jsonl. Returns how many moved."""
    if not path.is_file():
        return 0
    rows = read_jsonl(path)
    keep = [r for r in rows if r.get("step", 0) <= step]
    later = [r for r in rows if r.get("step", 0) > step]
    if later:
        with path.with_suffix(".discarded.jsonl").open("a", encoding="utf-8") as f:
            for r in later:
                f.write(json.dumps(r) + "\n")
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")
    tmp.replace(path)
    return len(later)


class MetricsLogger:
    """Appends metrics to run_dir/metrics.jsonl and mirrors scalars to TensorBoard / W&B."""

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, wandb_project: str | None = None,
                 config: dict | None = None, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None:
            truncate_after(self.path, resume_step)
            truncate_after(self.run_dir / "rollouts.jsonl", resume_step)
        elif self.path.exists():
            raise FileExistsError(f"{self.path} exists; resume the run (--resume) or choose another output directory")
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=(resume_step + 1) if resume_step else None)
        self._wandb = None
        if wandb_project:
            import wandb  # optional dependency: pip install rlvr[wandb]

            self._wandb = wandb.init(project=wandb_project, dir=str(self.run_dir), config=config,
                                     name=self.run_dir.name, resume="allow")

    def log(self, step: int, metrics: dict[str, Any]) -> dict:
        row = {"step": int(step), "time": round(time.time(), 3)}
        row.update({k: _jsonable(v) for k, v in metrics.items()})
        self._file.write(json.dumps(row) + "\n")
        self._file.flush()
        scalars = {k: v for k, v in row.items() if k not in ("step", "time") and isinstance(v, (int, float))}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        return row

    def log_rows(self, name: str, step: int, rows: list[dict]) -> None:
        """Append records (e.g. rollouts) to run_dir/<name>.jsonl, each tagged with the step."""
        with (self.run_dir / f"{name}.jsonl").open("a", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({"step": int(step), **r}, ensure_ascii=False) + "\n")

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()

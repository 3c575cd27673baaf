"""A sweep's record (`record: results/<name>`, see rlvr.experiments.sweep_plan): every finished run's logs kept in
a directory committed with the code, restored instead of training again, and runs reused from other sweeps.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from rlvr.config import BaseConfig
from rlvr.core import checkpoint as ckpt
from rlvr.experiments.sweep_plan import PlannedRun, same_config

# what a record keeps of a run: its logs (the rollouts, for the report's samples) and config; the DONE summary
# is added from final/DONE. Discarded and interrupted logs of resumed runs are not results.
RECORD_LOGS = ("metrics.jsonl", "rollouts.jsonl")


def _copy_logs(source: Path, target: Path, cfg: BaseConfig) -> None:
    """target gets source's logs, cfg as its config.yaml and source's DONE summary as target/DONE (no weights)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in RECORD_LOGS:
        if (source / name).is_file():
            shutil.copy2(source / name, target / name)
    cfg.save(target / "config.yaml")
    done = ckpt.done_file(source)
    if done is not None:
        shutil.copy2(done, target / ckpt.RECORD_DONE)
    if (source / RECORD_INFO).is_file():  # where the run was made travels with its logs
        shutil.copy2(source / RECORD_INFO, target / RECORD_INFO)


def reuse_run(run: PlannedRun) -> None:
    """Make run.path the reused run: its config (with this out), copies of its logs, a link to its final model
    (or, for a record, its DONE), and REUSED naming the source."""
    source = run.source
    run.path.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and item.suffix == ".jsonl":
            shutil.copy2(item, run.path / item.name)
    run.config.save(run.path / "config.yaml")
    if ckpt.finished_model(source) is not None:
        (run.path / "final").symlink_to((source / "final").resolve(), target_is_directory=True)
    else:
        shutil.copy2(ckpt.done_file(source), run.path / ckpt.RECORD_DONE)
    if (source / RECORD_INFO).is_file():
        shutil.copy2(source / RECORD_INFO, run.path / RECORD_INFO)
    (run.path / "REUSED").write_text(json.dumps({"source": str(source)}) + "\n", encoding="utf-8")


def restore_record(run: PlannedRun) -> None:
    """Status recorded: the run directory gets the record's logs and DONE (the run is finished, its weights were
    not kept)."""
    _copy_logs(run.source, run.path, run.config)


def keep_record(run: PlannedRun, record: Path) -> Path | None:
    """Copy a finished run's logs and DONE into record/<name> (config.yaml with the run's own out), unless the
    record already keeps this run with the same config; returns the record written, if any."""
    if not ckpt.is_finished(run.path):
        return None
    kept = record / run.name
    if ckpt.is_finished(kept) and (kept / "config.yaml").is_file() and same_config(kept, run.config):
        return None
    return record_run(run.path, kept, run.config)


def record_run(run_dir: Path, kept: Path, cfg: BaseConfig) -> Path:
    """Write the record of the finished run in run_dir to `kept` (replacing what is there), all at once: its logs,
    cfg as config.yaml, DONE and RECORD.json."""
    if kept.exists():
        shutil.rmtree(kept)  # another config's record: this finished run replaces it
    tmp = kept.parent / f".{kept.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    _copy_logs(run_dir, tmp, cfg)
    if not (tmp / RECORD_INFO).is_file():  # trained here (a restored or reused run brought where it was trained)
        # its times per step are this machine's, and a start model rebuilt on another machine (an SFT checkpoint
        # in runs/) rounds differently: both are kept, so records from several sessions can be told apart
        provenance = {"machine": machine(), "start_model_sha256": ckpt.model_digest(Path(cfg.model)),
                      "kept": time.strftime("%Y-%m-%d %H:%M:%S")}
        (tmp / RECORD_INFO).write_text(json.dumps(provenance, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, kept)
    return kept


RECORD_INFO = "RECORD.json"


def machine() -> dict:
    """The processor, its cores, torch's version and whether the CPU has native bf16 kernels (without them a bf16
    run computes in fp32, devices.native_dtype): what a record's wall times and numbers depend on."""
    import torch

    from rlvr.core.devices import cpu_has_native

    return {"cpu": ckpt.cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__,
            "native_bf16": cpu_has_native("bfloat16")}

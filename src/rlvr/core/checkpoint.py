"""Checkpoints, written atomically, and everything a resumed run needs to log the same numbers.

    run_dir/checkpoints/step_000010/   model (save_pretrained, safetensors) + tokenizer + trainer_state.pt
    run_dir/checkpoints/latest         the name of the newest complete checkpoint
    run_dir/final/                     the finished model; its DONE file marks a run that completed
    run_dir/DONE                       instead of final/: a kept record of a finished run, its logs without the
                                       weights (rlvr.experiments.sweep's `record` directory, committed with the code)

Each checkpoint is written to a temporary directory and renamed into place, and `latest` is replaced
atomically, so a crash at any moment leaves the previous checkpoint intact. trainer_state.pt holds the
optimizer, the scheduler, the step, the data order and the RNG states (python, numpy, torch).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import random
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # LoRA dropout on a GPU draws from these
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available() and torch.cuda.device_count() == len(state["cuda"]):
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def save_model_dir(target: Path, model, tokenizer, extra: dict | None = None) -> Path:
    """save_pretrained into `target` atomically (temporary sibling directory, then rename)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if extra is not None:
            torch.save(extra, tmp / STATE_FILE)
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, state: dict, keep: int = 2) -> Path:
    """Write checkpoints/step_<step>, point `latest` at it, keep the newest `keep` checkpoints."""
    root = Path(run_dir) / "checkpoints"
    target = save_model_dir(root / f"step_{step:06d}", model, tokenizer, extra={**state, "step": step})
    _write_text_atomic(root / "latest", target.name)
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return target


def latest_checkpoint(run_dir: Path) -> Path | None:
    root = Path(run_dir) / "checkpoints"
    pointer = root / "latest"
    if not pointer.is_file():
        return None
    path = root / pointer.read_text(encoding="utf-8").strip()
    return path if (path / STATE_FILE).is_file() else None


def load_state(checkpoint: Path) -> dict:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)


def load_weights_into(model, checkpoint: Path) -> None:
    """Copy a checkpoint's weights into an already-built model (full model or LoRA adapter)."""
    from safetensors.torch import load_file

    checkpoint = Path(checkpoint)
    adapter = checkpoint / "adapter_model.safetensors"
    if adapter.is_file():
        from peft import set_peft_model_state_dict

        set_peft_model_state_dict(model, load_file(str(adapter)))
        return
    files = sorted(checkpoint.glob("model*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{checkpoint} holds no model*.safetensors")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if "lm_head" in k and getattr(model.config, "tie_word_embeddings", False)}
    if set(missing) - tied or unexpected:
        raise ValueError(f"{checkpoint}: weights do not match the model (missing {sorted(set(missing) - tied)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]})")


def save_final(run_dir: Path, model, tokenizer, summary: dict) -> Path:
    """The finished model (LoRA merged into the weights), marked complete by its DONE file."""
    if hasattr(model, "merge_and_unload"):
        model = model.merge_and_unload()
    target = save_model_dir(Path(run_dir) / "final", model, tokenizer)
    _write_text_atomic(target / "DONE", json.dumps(summary, indent=2) + "\n")
    return target


def finished_model(run_dir: Path) -> Path | None:
    final = Path(run_dir) / "final"
    return final if (final / "DONE").is_file() else None


RECORD_DONE = "DONE"


def done_file(run_dir: Path) -> Path | None:
    """The DONE summary of a finished run: final/DONE, or for a record (logs kept, weights not) run_dir/DONE."""
    for path in (Path(run_dir) / "final" / "DONE", Path(run_dir) / RECORD_DONE):
        if path.is_file():
            return path
    return None


def is_finished(run_dir: Path) -> bool:
    """The run completed, whether its weights are here (final/) or only its record (summaries and plots need no
    weights)."""
    return done_file(run_dir) is not None


def model_digest(model_dir: Path) -> str | None:
    """sha256 of a model directory's weight files (None for a hub name or a GGUF): which start model a run had."""
    files = sorted(Path(model_dir).glob("*.safetensors")) if Path(model_dir).is_dir() else []
    if not files:
        return None
    digest = hashlib.sha256()
    for f in files:
        with f.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def cpu_name() -> str:
    """The processor's model name (bf16 and float results, and speeds, differ between processors)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return cpu

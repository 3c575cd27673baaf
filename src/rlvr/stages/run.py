"""The plumbing of a run, shared by every loop (rl, sft, dpo, the distributed driver and its learners): the run
directory, loading the policy (and resuming it), frozen models, the optimizer and schedule, the engines,
resume, and Ctrl-C / SIGTERM."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

import torch

from rlvr.config import TrainingFields
from rlvr.core import checkpoint as ckpt
from rlvr.core import interrupts
from rlvr.core.devices import Placement, engine_dtype, native_dtype, resolve_placement
from rlvr.core.models import load_model, prepare_for_training
from rlvr.engines.hf import HFEngine
from rlvr.tasks.records import DataOrder

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------


def build_optimizer(model, cfg: TrainingFields, total_steps: int):
    """AdamW over the trainable parameters, with a warmup then constant or cosine schedule."""
    from transformers import get_constant_schedule_with_warmup, get_cosine_with_min_lr_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    # fused: one kernel per parameter instead of foreach's lists of parameter-sized temporaries (peak memory)
    optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay, fused=True)
    if cfg.lr_schedule == "cosine":
        scheduler = get_cosine_with_min_lr_schedule_with_warmup(
            optimizer, cfg.warmup_steps, total_steps, min_lr_rate=cfg.min_lr_ratio)
    else:
        scheduler = get_constant_schedule_with_warmup(optimizer, cfg.warmup_steps)
    return optimizer, scheduler


def placement(cfg: TrainingFields) -> Placement:
    """Every role's device (rlvr.core.devices), checked against this machine before any model is loaded."""
    where = resolve_placement(cfg.device, cfg.placement)
    log.info("devices: %s", where.describe())
    return where


def native_precision(cfg: TrainingFields, where: Placement) -> TrainingFields:
    """`cfg` as this machine runs it: `precision` bf16 becomes fp32 and `generation_dtype` float32 where the
    policy's or the engines' device has no native kernels for them (devices.native_dtype; int8 engines run as
    asked, on the CPU: devices.engine_dtype). Applied after
    config.yaml is written, so a run records what was asked and the log says what ran; a sweep's record of the
    same run still matches its plan."""
    update = {}
    if cfg.precision == "bf16" and native_dtype("bfloat16", where.main) != "bfloat16":
        update["precision"] = "fp32"
    engines = {where.rollout, where.eval}
    if any(engine_dtype(cfg.generation_dtype, d) != cfg.generation_dtype for d in engines):
        update["generation_dtype"] = "float32"
    return cfg.model_copy(update=update) if update else cfg


def load_policy(cfg: TrainingFields, run_dir: Path, devices=None):
    """The trainable model and tokenizer on `devices` (one, or several to split its layers over; default the
    CPU), from the last checkpoint when resuming. Returns (model, tokenizer, trainer state or None)."""
    resume_from = ckpt.latest_checkpoint(run_dir) if cfg.resume else None
    if cfg.resume and resume_from is None:  # the first run of a resumable job: nothing to warn about
        log.info("resume: no checkpoint in %s yet; starting from the beginning", run_dir)
    model, tokenizer = load_model(cfg.model, device=list(devices) if devices else "cpu")
    model = prepare_for_training(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout,
                                 gradient_checkpointing=cfg.gradient_checkpointing)
    state = None
    if resume_from is not None:
        ckpt.load_weights_into(model, resume_from)
        state = ckpt.load_state(resume_from)
        log.info("resuming from %s (step %d)", resume_from, state["step"])
    return model, tokenizer, state


def frozen_dtype(precision: str, device) -> str:
    """The dtype a frozen model is kept in: bf16 on a GPU when the policy's forward runs in bf16 autocast anyway
    (half the memory; autocast already rounds the weights of every matmul to bf16), fp32 otherwise (on the CPU
    host memory is not the constraint, and fp32 keeps the CPU's published numbers)."""
    import torch

    return "bfloat16" if precision == "bf16" and torch.device(device).type == "cuda" else "float32"


def load_frozen(name: str, device="cpu", dtype: str = "float32"):
    """A model that only scores (a KL reference, a distillation teacher, DPO's reference): eval mode, no
    gradients, in `dtype` (frozen_dtype), loaded straight onto `device`. Returns (model, tokenizer)."""
    model, tokenizer = load_model(name, dtype=dtype, device=device)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tokenizer


def build_engines(model, tokenizer, cfg: TrainingFields, where: Placement, rollout: bool = True):
    """(rollout engine, validation engine): each a weight copy in `generation_dtype` on its role's device
    (refreshed from the policy by sync_weights, device to device); one engine serves both when their devices
    agree. `rollout=False` (SFT): (None, validation engine)."""
    make = lambda device: HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size,  # noqa: E731
                                   dtype=cfg.generation_dtype, device=device,
                                   prefix_cache_mib=cfg.env_cache_mib)
    engine = make(where.rollout) if rollout else None
    if engine is not None and where.eval == where.rollout:
        return engine, engine
    return engine, make(where.eval)


def check_out(cfg: TrainingFields) -> Path:
    """The run directory `out` can be a run's: no file in its way, no other run in it unless resumed. Cheap:
    loops call it before the slower checks (a model converted, every prompt tokenized)."""
    run_dir = Path(cfg.out)
    blocked = next((p for p in (run_dir, *run_dir.parents) if p.exists() and not p.is_dir()), None)
    if blocked is not None:
        raise FileExistsError(f"out={cfg.out}: {blocked} is a file, not a directory; choose another out=")
    if (run_dir / "metrics.jsonl").exists() and not cfg.resume and ckpt.finished_model(run_dir) is None:
        raise FileExistsError(f"{run_dir} already holds a run; pass resume=true to continue it or choose another out")
    return run_dir


def start_run(cfg: TrainingFields) -> Path:
    if cfg.grades_code:  # a sandbox that cannot isolate programs stops the run here, before anything is written
        cfg.sandbox.apply()
    run_dir = check_out(cfg)
    from rlvr.core.models import resolve_model_path

    resolve_model_path(cfg.model)  # a model that is not there stops the run before its directory is made
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = run_dir / "config.yaml"
    # a resume keeps the record of the run it continues (load_config refused any other settings); only raised
    # steps are written into it
    if not (cfg.resume and saved.is_file()) or getattr(cfg, "steps", None) != _saved_steps(saved):
        cfg.save(saved)
    return run_dir


def _saved_steps(path: Path):
    import yaml

    try:
        return (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("steps")
    except (OSError, yaml.YAMLError):
        return None


def restore(state: dict | None, optimizer, scheduler, order: DataOrder) -> tuple[int, DataOrder]:
    """Put a checkpoint's optimizer, schedule, RNG state and data position back; returns (step, order)."""
    if state is None:
        return 0, order
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    ckpt.set_rng_state(state["rng"])
    return state["step"], DataOrder(order.n, order.key, state["epoch"], state["position"])


def trainer_state(optimizer, scheduler, order: DataOrder, **extra) -> dict:
    """What a checkpoint holds besides the weights, so that a resumed run logs the same numbers."""
    return {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": ckpt.rng_state(),
            **order.state(), **extra}


def finished_state(state: dict) -> dict:
    """`trainer_state` as it stands, kept apart from what the next step changes: the step's optimizer update
    changes the optimizer's tensors in place, but a snapshot is only saved when the step failed before it."""
    import copy

    return {k: (v if k == "optimizer" else copy.deepcopy(v)) for k, v in state.items()}


def save_finished(run_dir: Path, step: int, model, tokenizer, state: dict, cfg: TrainingFields) -> Path | None:
    """The checkpoint of finished step `step` (None for step 0: nothing was trained), written unless the
    periodic checkpoint already holds it."""
    if step < 1:
        return None
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is not None and latest.name == f"step_{step:06d}":
        return latest
    return ckpt.save_checkpoint(run_dir, step, model, tokenizer, state, keep=cfg.keep_checkpoints)


def open_logger(run_dir: Path, cfg: TrainingFields, state: dict | None):
    """The run's metrics logger; a resumed run first drops what was logged after its checkpoint (or
    everything, when it is resumed without one)."""
    from rlvr.core.tracking import MetricsLogger

    resume_step = state["step"] if state is not None else (-1 if cfg.resume else None)
    return MetricsLogger(run_dir, cfg.tensorboard, cfg.wandb_project, cfg.model_dump(), resume_step=resume_step)


def fmt_metrics(metrics: dict) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())


# ----------------------------------------------------------------------------------------------------
# Ctrl-C and SIGTERM: stop at a step boundary, save, say how to go on.


class RunInterrupted(Exception):
    """A run stopped by SIGINT or SIGTERM after a whole step; the message says what was saved and the command
    that continues it. The CLI prints it as one line and exits 130."""


class RunFailed(RuntimeError):
    """A step that raised (a reward function's error, one that did not return in reward_timeout, ...): the last
    finished step is saved, and the message says what happened and the command that continues the run. The CLI
    prints it as one line and exits 1."""


class StopRequests:
    """While active, SIGINT and SIGTERM ask the loop to stop after the step in flight (which then finishes, so no
    half-applied update is ever saved); a second signal stops at once (KeyboardInterrupt). Only the main thread
    can install handlers: elsewhere (a Ray actor's thread) this does nothing and the signals keep their meaning."""

    def __init__(self, unit: str = "step"):
        self.requested: int | None = None
        self.unit = unit  # what finishes before the stop, as the message names it ("block" for `rlvr eval`)
        self._previous: dict = {}

    def __enter__(self):
        import signal
        import threading

        interrupts.clear_stop()
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) is not signal.SIG_IGN:  # a backgrounded job that ignores SIGINT keeps doing so
                    self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        import signal
        import sys

        if self.requested is not None:
            self.__exit__()
            raise KeyboardInterrupt
        self.requested = signum
        interrupts.request_stop()  # user code running in the step (a reward function) hears it too
        print(f"\n{signal.Signals(signum).name}: stopping after the {self.unit} in flight (again to stop at once)",
              file=sys.stderr, flush=True)

    def __exit__(self, *exc):
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        interrupts.clear_stop()
        return False

    @contextlib.contextmanager
    def step(self, cfg: TrainingFields, run_dir: Path, step: int, command: str, save_last, close=()):
        """A step's body, guarded: when it raises (not a second Ctrl-C, which stops at once), `save_last()`
        saves the last finished step (it returns the checkpoint's path, or None when step 1 has nothing before
        it), `close` is called (loggers, progress bars: the message starts on a line of its own), and the error
        becomes RunFailed, or RunInterrupted when it was user code given up on because a stop was asked for,
        saying what was saved and the command that continues the run."""
        try:
            yield
        except KeyboardInterrupt:
            raise
        except Exception as err:  # noqa: BLE001 -- whatever it was, the finished steps are kept
            path = save_last()
            for done in close:
                done()
            saved = f"saved checkpoint {path}" if path else "nothing to save before it"
            go_on = f"{command} out={run_dir} resume=true"
            if isinstance(err, interrupts.CallAbandoned):
                raise RunInterrupted(f"interrupted during step {step} of {cfg.steps}: {err}; {saved}. Continue "
                                     f"with: {go_on}") from err
            what = str(err) if isinstance(err, ValueError) else f"{type(err).__name__}: {err}"
            raise RunFailed(f"step {step} of {cfg.steps} failed: {what}. The steps before it are kept ({saved}); "
                            f"fix the cause and continue with: {go_on}") from err

    def after_step(self, cfg: TrainingFields, run_dir: Path, step: int, command: str, save, close=()) -> None:
        """The end of a step in every loop: the periodic checkpoint (`save()` writes one and returns its path),
        then, when a stop was asked for, this step saved (once), `close` called (loggers, progress bars) and
        RunInterrupted raised. The last step is left to the loop: it writes the final model."""
        saved = bool(cfg.save_every and step % cfg.save_every == 0 and step < cfg.steps)
        path = save() if saved else None
        if self.requested is None or step >= cfg.steps:
            return
        path = path or save()
        for done in close:
            done()
        raise RunInterrupted(f"interrupted after step {step} of {cfg.steps}; saved checkpoint {path}. Continue "
                             f"with: {command} out={run_dir} resume=true")


def finish_run(run_dir: Path, model, tokenizer, step: int, metrics: dict, logger, what: str) -> dict:
    """The end of the SFT and DPO loops: the summary (steps and the last validation), the final model with its
    DONE marker, the log closed, one line; returns the summary with the final model's path."""
    summary = {"steps": step, **{k: v for k, v in metrics.items() if k.startswith("val/")}}
    final = ckpt.save_final(run_dir, model, tokenizer, summary)
    logger.close()
    log.info("%s finished: %s; model in %s", what, fmt_metrics(summary), final)
    return {**summary, "final": str(final)}


"""The `rlvr` command line. Each command reads one typed config: `--config FILE` plus overrides given as
`key=value`, `--key value` or `--key=value` (run `rlvr <command> --help` for the fields)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from rlvr.config import ConfigError, EvalConfig, SFTConfig, TrainConfig, fields_help, load_config

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
ConfigOption = typer.Option(None, "--config", "-c", help="YAML config file (configs/*.yaml)")


@app.callback()
def _root() -> None:
    """rlvr: reinforcement learning from verifiable rewards (GRPO family) on GSM8K."""


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _config(cls, path, ctx: typer.Context):
    try:
        return load_config(cls, path, ctx.args)
    except ConfigError as err:
        _fail(str(err))


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", datefmt="%H:%M:%S")
    for noisy in ("httpx", "urllib3", "filelock"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def run_eval(cfg: EvalConfig) -> dict:
    """Evaluate a model with one prompt on one split; write results.jsonl and summary.json; print the table."""
    from tqdm import tqdm

    from rlvr.data import load_dataset
    from rlvr.evaluate import evaluate, print_summary, write_results
    from rlvr.models import load_model
    from rlvr.prompts import get_prompt
    from rlvr.rollout import HFEngine, SamplingParams

    prompt = get_prompt(cfg.prompt)
    examples = load_dataset(cfg.dataset, cfg.split, limit=cfg.limit)
    out = Path(cfg.out or f"runs/eval/{Path(cfg.model).name}-{cfg.prompt}-{cfg.split}")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.yaml")
    model, tokenizer = load_model(cfg.model)
    engine = HFEngine(model, tokenizer, batch_size=cfg.batch_size, dtype=cfg.dtype)
    sampling = SamplingParams(
        temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
        repetition_penalty=cfg.repetition_penalty, stop=prompt.stop, n=cfg.samples, seed=cfg.seed,
    )
    with tqdm(total=len(examples) * cfg.samples, unit="completion", desc=f"eval {cfg.prompt}") as bar:
        result = evaluate(engine, examples, prompt, sampling, tokenizer=tokenizer, progress=bar.update)
    result.summary.update(model=cfg.model, prompt=cfg.prompt, dataset=cfg.dataset, split=cfg.split)
    write_results(out, result)
    print_summary(result, title=f"{cfg.model} · {cfg.prompt} · {cfg.dataset}/{cfg.split}",
                  examples_per_category=cfg.examples_per_category)
    typer.echo(f"wrote {out}/results.jsonl and {out}/summary.json")
    return result.summary


@app.command("eval", context_settings=_EXTRA, help="Evaluate a model on GSM8K or another task.\n\n" + fields_help(EvalConfig))
def eval_command(ctx: typer.Context, config: Path = ConfigOption):
    _setup_logging()
    cfg = _config(EvalConfig, config, ctx)
    try:
        run_eval(cfg)
    except (ValueError, FileNotFoundError) as err:
        _fail(str(err))


@app.command("sft", context_settings=_EXTRA,
             help="Supervised fine-tuning on r1_zero-format worked solutions.\n\n" + fields_help(SFTConfig))
def sft_command(ctx: typer.Context, config: Path = ConfigOption):
    _setup_logging()
    cfg = _config(SFTConfig, config, ctx)
    from rlvr.sft import train_sft

    try:
        train_sft(cfg)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        _fail(str(err))


@app.command("train", context_settings=_EXTRA,
             help="RL training (GRPO and every preset of `rlvr algorithms`).\n\n" + fields_help(TrainConfig))
def train_command(ctx: typer.Context, config: Path = ConfigOption):
    _setup_logging()
    cfg = _config(TrainConfig, config, ctx)
    from rlvr.train import train_grpo

    try:
        train_grpo(cfg)
    except (ValueError, FileNotFoundError, FileExistsError) as err:
        _fail(str(err))


@app.command("algorithms")
def algorithms_command():
    """List the named policy-gradient algorithms and the choices each one makes."""
    from rich.console import Console
    from rich.table import Table

    from rlvr.estimators import PRESETS

    table = Table(title="algorithms (presets of independent choices)")
    for col in ("name", "baseline", "normaliser", "weighting", "clip", "aggregation", "steps/rollout", "summary"):
        table.add_column(col)
    for name, p in PRESETS.items():
        clip = "" if p.cliprange is None and p.cliprange_high is None else f"{p.cliprange}/{p.cliprange_high or p.cliprange}"
        table.add_row(name, p.baseline, p.advantage_normalizer, p.importance_reweighting_method, clip,
                      p.loss_normalization, str(p.steps_per_rollout), p.summary)
    Console().print(table)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""The `rlvr` command line. Each command reads one typed config: `--config FILE` plus overrides given as
`key=value`, `--key value` or `--key=value` (run `rlvr <command> --help` for the fields)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import typer

from rlvr.config import ConfigError, DemoConfig, DPOConfig, EvalConfig, SFTConfig, TrainConfig, fields_help, load_config
from rlvr.serve.config import load_serve_config, serve_help

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
_EXTRA = {"allow_extra_args": True, "ignore_unknown_options": True}
ConfigOption = typer.Option(None, "--config", "-c", help="YAML config file (configs/*.yaml)")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"rlvr {version('rlvr')}")
        raise typer.Exit()


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="show the Python traceback of an error (or RLVR_DEBUG=1)"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="print rlvr's version"),
) -> None:
    """rlvr: reinforcement learning from verifiable rewards (GRPO family) on GSM8K."""
    if debug:
        import os

        os.environ["RLVR_DEBUG"] = "1"


def _debug() -> bool:
    import os

    return os.environ.get("RLVR_DEBUG", "") not in ("", "0")


def _fail(message: str) -> None:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(2)


def _os_error(err: OSError) -> str:
    """[Errno 20] Not a directory: 'x/y' -> "x/y: not a directory"."""
    if err.filename is not None and err.strerror:
        return f"{err.filename}: {err.strerror[0].lower() + err.strerror[1:]}"
    return str(err)


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


def _run(cls, config: Path | None, ctx: typer.Context, module: str, function: str) -> None:
    """Validate the config, then import and run the command's function; expected errors exit 2."""
    _setup_logging()
    cfg = _config(cls, config, ctx)
    from importlib import import_module

    from rlvr.sandbox import SandboxUnavailable
    from rlvr.stages.run import RunFailed, RunInterrupted

    try:
        getattr(import_module(module), function)(cfg)
    except RunInterrupted as stopped:
        typer.secho(str(stopped), fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130)
    except RunFailed as failed:  # a step raised: the steps before it are saved, the message says how to go on
        if _debug():
            raise
        typer.secho(f"error: {failed}", fg=typer.colors.RED, err=True)
        raise typer.Exit(1)
    except KeyboardInterrupt:  # a second Ctrl-C: stopped inside a step, which is not saved
        typer.secho(f"interrupted inside a step; the last checkpoint in {getattr(cfg, 'out', '.')} (if any) is kept. "
                    f"Continue with the same command and resume=true", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130)
    except (ValueError, SandboxUnavailable) as err:
        if _debug():
            raise
        _fail(str(err))
    except OSError as err:  # a path that is not there, not a directory, not writable: the user's to fix
        if _debug():
            raise
        _fail(_os_error(err) if err.errno is not None else str(err))
    except Exception as err:  # noqa: BLE001 -- a bug of rlvr's: one line, and the way to see more
        if _debug():
            raise
        _fail(f"{type(err).__name__}: {err} (this is a bug in rlvr, or a case it does not handle; "
              "`rlvr --debug ...` or RLVR_DEBUG=1 shows the traceback)")


@app.command("eval", context_settings=_EXTRA, help="Evaluate a model on GSM8K or another task.\n\n" + fields_help(EvalConfig))
def eval_command(ctx: typer.Context, config: Path = ConfigOption):
    _run(EvalConfig, config, ctx, "rlvr.stages.evaluation", "run_eval")


@app.command("sft", context_settings=_EXTRA,
             help="Supervised fine-tuning on r1_zero-format worked solutions.\n\n" + fields_help(SFTConfig))
def sft_command(ctx: typer.Context, config: Path = ConfigOption):
    _run(SFTConfig, config, ctx, "rlvr.training.sft", "train_sft")


@app.command("train", context_settings=_EXTRA,
             help="RL training (GRPO and every preset of `rlvr algorithms`).\n\n" + fields_help(TrainConfig))
def train_command(ctx: typer.Context, config: Path = ConfigOption):
    _run(TrainConfig, config, ctx, "rlvr.training.rl", "train_grpo")


@app.command("dpo", context_settings=_EXTRA,
             help="DPO on preference pairs from graded rollouts or a JSONL.\n\n" + fields_help(DPOConfig))
def dpo_command(ctx: typer.Context, config: Path = ConfigOption):
    _run(DPOConfig, config, ctx, "rlvr.training.dpo", "train_dpo")


@app.command("check-task", context_settings=_EXTRA,
             help="Check a task before training: rows per split, two rendered prompts, prompt lengths, and every "
                  "reward on each row's reference answer and on an empty completion (does the reward vary at "
                  "all?). Takes `rlvr train`'s config; loads the tokenizer, no model.\n\n" + fields_help(TrainConfig))
def check_task_command(ctx: typer.Context, config: Path = ConfigOption,
                       rows: int = typer.Option(16, "--rows", help="train rows whose rewards are checked")):
    _setup_logging()
    cfg = _config(TrainConfig, config, ctx)
    from rlvr.core.models import load_tokenizer
    from rlvr.stages.check import check_task
    from rlvr.tasks.task import load_task

    from rlvr.stages.check import model_context

    try:
        task = load_task(cfg)
        tokenizer = load_tokenizer(cfg.model)
        report = check_task(task, tokenizer=tokenizer, n=rows, context=model_context(cfg.model),
                            max_new_tokens=max(cfg.max_new_tokens, cfg.eval_max_new_tokens), score=not cfg.agentic)
    except ValueError as err:
        if _debug():
            raise
        _fail(str(err))
    typer.echo("rows: " + ", ".join(f"{split} {count}" for split, count in report.rows.items()))
    for error in dict.fromkeys(report.errors.values()):  # one error of several splits, said once
        splits = [split for split, e in report.errors.items() if e == error]
        typer.secho(f"error ({', '.join(splits)}): {error}", fg=typer.colors.RED)
    for k, prompt in enumerate(report.prompts):
        typer.echo(f"--- prompt {k + 1} ---\n{prompt}")
    if report.prompt_tokens:
        typer.echo(f"prompt tokens: mean {report.prompt_tokens['mean']:.0f}, max {report.prompt_tokens['max']}")
    low, high = report.reward_range
    if cfg.agentic:  # nothing scored: say why rather than a range of nothing
        typer.echo("rewards not checked: an agent's episodes are scored on their conversations (docs/agents.md)")
    else:
        typer.echo(f"reward over {len(report.reference)} reference and {len(report.empty)} empty completions: "
                   f"min {low:g}, max {high:g}")
    if report.reference:
        mean = sum(float(s["reward"]) for s in report.reference) / len(report.reference)
        typer.echo(f"reference answers: mean reward {mean:g}")
    terms = sorted({k for s in report.reference + report.empty for k in s if k.startswith("reward/")})
    for term in terms:
        ref = [s[term] for s in report.reference if term in s]
        emp = [s[term] for s in report.empty if term in s]
        typer.echo(f"  {term}: reference {sum(ref) / max(len(ref), 1):g}, empty {sum(emp) / max(len(emp), 1):g}")
    for warning in report.warnings:
        typer.secho(f"warning: {warning}", fg=typer.colors.YELLOW)
    typer.echo("ok" if not report.warnings and not report.errors else
               f"{len(report.warnings)} warning(s), {len(report.errors)} split(s) that did not load")


@app.command("serve", context_settings=_EXTRA, help=serve_help(), options_metavar="[RUN_DIR | MODEL] [KEY=VALUE ...]")
def serve_command(ctx: typer.Context, config: Path = ConfigOption):
    _setup_logging()
    try:
        cfg = load_serve_config(config, ctx.args)
    except ConfigError as err:
        _fail(str(err))
    from rlvr.serve.server import serve

    try:
        serve(cfg)
    except (ValueError, OSError) as err:
        if _debug():
            raise
        _fail(_os_error(err) if isinstance(err, OSError) and err.filename is not None else str(err))


@app.command("demo", context_settings=_EXTRA,
             help="The whole pipeline on the default model: baseline, SFT, GRPO, before/after.\n\n" + fields_help(DemoConfig))
def demo_command(ctx: typer.Context, config: Path = ConfigOption):
    _run(DemoConfig, config, ctx, "rlvr.experiments.demo", "run_demo")


@app.command("algorithms")
def algorithms_command(wide: bool = typer.Option(False, "--wide", help="also each preset's summary (a wide "
                                                                     "terminal shows it anyway)")):
    """List the named policy-gradient algorithms and the choices each one makes."""
    from rich.console import Console
    from rich.table import Table

    from rlvr.algorithms.spec import PRESETS

    console = Console()
    wide = wide or console.width >= 160
    table = Table(title="algorithms (presets of independent choices)", box=None, pad_edge=False, header_style="bold underline",
                  padding=(0, 1, 0, 0))
    # whole at 80 columns: short headers, no borders; the name (what a user types) is never cut
    columns = ("name", "baseline", "normaliser", "weighting", "clip", "aggregation", "steps/rollout",
               "advantage from") if wide else ("name", "base", "norm", "weight", "clip", "agg", "k", "signal")
    for col in columns + (("summary",) if wide else ()):
        table.add_column(col, no_wrap=col != "summary")
    for name, p in PRESETS.items():
        clip = "" if p.cliprange is None else f"{p.cliprange:g}" + (f"/{p.cliprange_high:g}" if p.cliprange_high else "")
        table.add_row(name, p.baseline, p.advantage_normalizer, p.importance_reweighting_method, clip,
                      p.loss_normalization, str(p.steps_per_rollout), p.reward_signal, *((p.summary,) if wide else ()))
    console.print(table)
    if not wide:
        console.print("base: baseline, norm: advantage normaliser, weight: importance weighting, agg: loss "
                      "aggregation, k: optimizer steps per rollout batch, signal: the reward the advantage uses; "
                      "--wide adds each preset's summary")


# ----------------------------------------------------------------------------------------------------
# Experiments: sweeps of runs, and plots, reports and summaries drawn from run directories.

RunDirs = typer.Argument(..., help="run directories, or directories holding runs below them (sweep roots)")
BandOption = typer.Option("ci", "--band", help="ci: mean ± 95% t-interval, t(0.975, n-1)·s/√n across n seeds | minmax: min to max")
BaselineOption = typer.Option(None, "--baseline", help="a group's label (as the summary table prints it): show every "
                              "other group's difference from it, with its 95% two-sample t-interval")


def _band(band: str) -> str:
    if band not in ("ci", "minmax"):
        _fail(f"--band {band!r}: expected ci or minmax")
    return band


def _sweep_help() -> str:
    from rlvr.experiments.sweep_plan import SweepConfig

    return ("A grid of `rlvr train` runs (seeds x config fields) from a sweep file; restartable.\n\n"
            "Runs one at a time or `parallel` at a time, each in <out>/<field=value,...>; finished runs are "
            "skipped and interrupted ones resumed, so a "
            "stopped sweep continues when started again. Overrides set sweep fields or, for any `rlvr train` "
            "field, that field in every run (steps=5).\n\n" + fields_help(SweepConfig))


@app.command("sweep", context_settings=_EXTRA, help=_sweep_help())
def sweep_command(ctx: typer.Context,
                  config: Path = typer.Option(..., "--config", "-c", help="sweep file (sweeps/*.yaml)")):
    from rlvr.experiments.sweep import format_outcomes, run_sweep
    from rlvr.experiments.sweep_plan import format_plan, load_sweep, plan_sweep

    try:
        sweep = load_sweep(config, ctx.args)
        plan = plan_sweep(sweep)
    except ConfigError as err:
        _fail(str(err))
    typer.echo(format_plan(sweep, plan))
    if sweep.dry_run:
        if any(r.status == "changed" for r in plan):
            _fail("some run directories hold runs of another config (status changed)")
        return
    try:
        outcomes = run_sweep(sweep, plan, echo=typer.echo)
    except ConfigError as err:
        _fail(str(err))
    except KeyboardInterrupt:
        typer.secho("sweep interrupted; run the same command again to continue it", fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(130) from None
    typer.echo(format_outcomes(outcomes))
    logged = [r.path for r in plan if (r.path / "metrics.jsonl").is_file()]
    if sweep.report and logged:
        from rlvr.experiments.report import write_report
        from rlvr.experiments.runs import load_groups, summarize, write_summary

        try:
            groups = load_groups(logged)
            baseline = sweep.baseline
            if baseline is not None and baseline not in [g.label for g in groups]:  # e.g. its runs not started yet
                typer.secho(f"no group {baseline!r} among the logged runs yet: no differences", fg=typer.colors.YELLOW,
                            err=True)
                baseline = None
            csv_path, _ = write_summary(summarize(groups, baseline=baseline), sweep.out / "summary.csv")
            page = write_report(logged, sweep.out / "report.html", title=f"sweep {sweep.name}", baseline=baseline)
            typer.echo(f"wrote {csv_path} (and .json) and {page}")
        except (ValueError, OSError) as err:
            typer.secho(f"could not write the summary and report: {err}", fg=typer.colors.YELLOW, err=True)
    if any(o.result == "failed" for o in outcomes):
        raise typer.Exit(1)


@app.command("plot")
def plot_command(runs: list[Path] = RunDirs, out: Path = typer.Option(Path("plots"), "--out", "-o", help="directory"),
                 band: str = BandOption,
                 only: str = typer.Option(None, "--only", help="comma-separated figure names to write (default: every "
                                          "figure the runs have data for), e.g. val_reward,final_val_accuracy_vs_lr")):
    """Figures (PNG and SVG) per metric with the spread across seeds, and final accuracy vs learning rate.

    Runs are grouped by configuration (seed aside): each group's mean, a 95% band (or min/max), single runs faint."""
    from rlvr.experiments.plots import FIGURE_NAMES, build_figures, save_figures
    from rlvr.experiments.runs import load_groups

    wanted = [n.strip() for n in only.split(",") if n.strip()] if only is not None else None
    if wanted is not None and (unknown := [n for n in wanted if n not in FIGURE_NAMES]):
        _fail(f"--only: no figure named {', '.join(map(repr, unknown))}; the figures are: {', '.join(FIGURE_NAMES)}")
    try:
        groups = load_groups(runs)
    except (FileNotFoundError, ValueError) as err:
        _fail(str(err))
    figures = build_figures(groups, _band(band))
    if wanted is not None:
        if missing := [n for n in wanted if n not in figures]:  # a known figure these runs have no data for
            _fail(f"--only: these runs have no data for {', '.join(missing)}; they have: {', '.join(figures)}")
        figures = {n: figures[n] for n in wanted}
    written = save_figures(figures, out)
    typer.echo(f"{sum(len(g.runs) for g in groups)} runs in {len(groups)} groups: wrote {len(written)} files to {out}")


@app.command("report")
def report_command(runs: list[Path] = RunDirs, out: Path = typer.Option(Path("report.html"), "--out", "-o"),
                   band: str = BandOption, rollouts: int = typer.Option(2, help="sample rollouts per step shown"),
                   title: str = typer.Option(None, help="page title"), baseline: str = BaselineOption):
    """A self-contained HTML page: configs, final numbers with their spread, plots, early and late rollouts."""
    from rlvr.experiments.report import write_report

    try:
        page = write_report(runs, out, _band(band), rollouts, title, baseline=baseline)
    except (FileNotFoundError, ValueError) as err:
        _fail(str(err))
    typer.echo(f"wrote {page}")


@app.command("summary")
def summary_command(runs: list[Path] = RunDirs, out: Path = typer.Option(Path("summary.csv"), "--out", "-o"),
                    baseline: str = BaselineOption):
    """Final and best validation numbers per run and per group, as CSV and JSON.

    Per group: mean, sample std, 95% t-interval half width (t(0.975, n-1)·s/√n), min, max and n; the JSON is
    written next to the CSV. With --baseline: each group's difference from that group, its 95% two-sample
    t-interval, whether it is larger than the spread, and the runs per group that would resolve it."""
    from rich.console import Console
    from rich.table import Table

    from rlvr.experiments.report import DIFFERENCE_METRICS, fmt_difference, fmt_spread
    from rlvr.experiments.runs import SUMMARY_METRICS, load_groups, summarize, write_summary

    try:
        summary = summarize(load_groups(runs), baseline=baseline)
    except (FileNotFoundError, ValueError) as err:
        _fail(str(err))
    csv_path, json_path = write_summary(summary, out)
    table = Table(title="validation numbers per group (mean ± 95% t-interval, n = runs)")
    for col in ("group", "n (finished)", "final accuracy", "best accuracy", "final format rate",
                "final sampled accuracy"):
        table.add_column(col)
    for g in summary.groups:
        table.add_row(g.group, f"{g.n_runs} ({g.n_finished})", *(fmt_spread(g.stats[m]) for m in SUMMARY_METRICS))
    Console().print(table)
    if summary.differences:
        table = Table(title=f"difference from {baseline} (mean ± 95% two-sample t-interval; resolved: the "
                            "interval excludes 0; runs per group that would resolve it at this variance)")
        for col in ("group", "final accuracy", "final sampled accuracy"):
            table.add_column(col)
        for d in summary.differences:
            table.add_row(d.group, *(fmt_difference(d.stats[m]) for m in DIFFERENCE_METRICS))
        Console().print(table)
    typer.echo(f"wrote {csv_path} and {json_path}")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

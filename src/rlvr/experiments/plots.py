"""Figures drawn from run directories' metrics.jsonl (so any run can be re-plotted later): one figure per
metric, runs grouped by configuration, each group a mean line with a shaded band (95% t-interval
mean ± t·s/√n with t = t(0.975, n-1), or min/max) and its single runs drawn faint; the final validation accuracy against
the learning rate when it varies; and validation accuracy against training minutes when steps logged their time. Matplotlib's object API with the Agg canvas: no pyplot, no global state.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from rlvr.experiments.runs import Group, fmt_value, per_step_spread, summarize_run
from rlvr.experiments.stats import Band, metric_bounds, spread


@dataclass(frozen=True)
class MetricFigure:
    name: str  # file name
    title: str
    panels: tuple[tuple[str, str], ...]  # (metrics.jsonl key, y label): one panel each


FIGURES = (
    MetricFigure("loss", "Loss", (("train/loss", "loss"),)),
    MetricFigure("grad_norm", "Gradient norm (before clipping)", (("train/grad_norm", "grad norm"),)),
    MetricFigure("token_entropy", "Token entropy of the rollouts", (("train/token_entropy", "entropy (nats)"),)),
    MetricFigure("train_reward", "Train reward",
                 (("train/reward", "reward"), ("train/format_reward", "format reward"))),
    MetricFigure("val_reward", "Validation reward",
                 (("val/accuracy", "accuracy (reward)"), ("val/format_rate", "format reward"))),
    MetricFigure("val_sampled_reward", "Sampled validation (eval_sampled_samples)",
                 (("val_sampled/accuracy", "sampled accuracy (pass@1)"), ("val_sampled/format_rate", "format reward"))),
    MetricFigure("val_response_length", "Validation mean response length",
                 (("val/mean_response_tokens", "tokens"),)),
    MetricFigure("train_response_length", "Rollout mean response length", (("rollout/mean_tokens", "tokens"),)),
    MetricFigure("clip_fraction", "Clip fraction", (("train/clip_fraction", "fraction of tokens clipped"),)),
    MetricFigure("kl", "KL to the reference model", (("train/kl", "KL"),)),
)
TERMS_FIGURE = "reward_terms"  # a panel per term of `rewards=` (train/reward/<name>), for the runs that log them
LR_FIGURE = "final_val_accuracy_vs_lr"
MINUTES_FIGURE = "val_accuracy_vs_minutes"
FIGURE_NAMES = tuple(spec.name for spec in FIGURES) + (TERMS_FIGURE, LR_FIGURE, MINUTES_FIGURE)  # every figure build_figures can draw
BAND_NAMES = {"ci": "mean ± 95% t-interval (t·s/√n, n = runs)", "minmax": "mean, min–max"}


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _has(groups: Sequence[Group], key: str) -> bool:
    return any(run.series(key) for g in groups for run in g.runs)


def _draw_panel(ax, groups: Sequence[Group], key: str, band: Band, colors) -> None:
    sparse = key.startswith("val/")  # validation steps are few: mark them
    for g, color in zip(groups, colors):
        series = [s for s in (run.series(key) for run in g.runs) if s]
        if not series:
            continue
        for s in series:
            steps = sorted(s)
            ax.plot(steps, [s[x] for x in steps], color=color, alpha=0.25, linewidth=0.8)
        stats = per_step_spread(series)
        steps = [x for x, _ in stats]
        ax.plot(steps, [st.mean for _, st in stats], color=color, linewidth=2, marker="o" if sparse else None,
                markersize=3, label=f"{g.label} (n={len(series)})")
        lo, hi = zip(*(st.band(band, metric_bounds(key)) for _, st in stats))
        ax.fill_between(steps, lo, hi, color=color, alpha=0.2, linewidth=0)
    ax.set_xlabel("step")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)


def metric_figure(groups: Sequence[Group], spec: MetricFigure, band: Band = "ci") -> Figure | None:
    """One figure (a panel per metric of `spec`); None when no run logged any of its metrics."""
    panels = [(k, label) for k, label in spec.panels if _has(groups, k)]
    if not panels:
        return None
    fig = Figure(figsize=(6.4 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    colors = _colors(len(groups))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (key, label) in zip(axes, panels):
        _draw_panel(ax, groups, key, band, colors)
        ax.set_ylabel(label)
        ax.set_title(key, fontsize=9)
    axes[0].legend(fontsize=8, loc="best")
    fig.suptitle(f"{spec.title} — {BAND_NAMES[band]}, single runs faint")
    return fig


def lr_figure(groups: Sequence[Group], band: Band = "ci") -> Figure | None:
    """Final validation accuracy against the learning rate (log x), one line per setting of the other
    differing fields, error bars from the same interval; None unless learning_rate varies."""
    if len({g.values.get("learning_rate") for g in groups} - {None}) < 2:
        return None
    lines: dict[str, list] = {}
    for g in groups:
        rest = ", ".join(f"{k}={fmt_value(g.values[k])}" for k in g.shown if k != "learning_rate")
        rest = rest or "final validation accuracy"
        finals = [s.final_val_accuracy for s in (summarize_run(r, g.label) for r in g.runs)
                  if s.final_val_accuracy is not None]
        if finals and g.values.get("learning_rate"):
            lines.setdefault(rest, []).append((g.values["learning_rate"], spread(finals), finals))
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for (label, points), color in zip(lines.items(), _colors(len(lines))):
        points.sort(key=lambda p: p[0])
        xs = [p[0] for p in points]
        means = [p[1].mean for p in points]
        lo = [p[1].mean - p[1].band(band, (0.0, 1.0))[0] for p in points]  # accuracies
        hi = [p[1].band(band, (0.0, 1.0))[1] - p[1].mean for p in points]
        ax.errorbar(xs, means, yerr=[lo, hi], color=color, marker="o", capsize=4, linewidth=1.5, label=label)
        for x, _, finals in points:
            ax.scatter([x] * len(finals), finals, color=color, alpha=0.3, s=12)
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final validation accuracy (reward)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.suptitle(f"Final validation accuracy vs learning rate\n{BAND_NAMES[band]}", fontsize=10)
    return fig


def minutes_figure(groups: Sequence[Group], band: Band = "ci") -> Figure | None:
    """Validation accuracy against training minutes (what a fixed compute budget buys): each run faint at its
    own minutes, each group's mean at the mean minutes of that step across its runs, the band over the same
    runs; None unless some run logged both step times and validation."""
    fig = Figure(figsize=(6.4, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    drawn = False
    for g, color in zip(groups, _colors(len(groups))):
        curves = []
        for run in g.runs:
            acc, minutes = run.series("val/accuracy"), run.minutes()
            curve = {s: (minutes[s], acc[s]) for s in acc if s in minutes}
            if curve:
                curves.append(curve)
                ax.plot(*zip(*(curve[s] for s in sorted(curve))), color=color, alpha=0.25, linewidth=0.8)
        if not curves:
            continue
        drawn = True
        steps = sorted(set().union(*curves))
        xs = [sum(c[s][0] for c in curves if s in c) / sum(s in c for c in curves) for s in steps]
        stats = [spread([c[s][1] for c in curves if s in c]) for s in steps]
        ax.plot(xs, [st.mean for st in stats], color=color, linewidth=2, marker="o", markersize=3,
                label=f"{g.label} (n={len(curves)})")
        lo, hi = zip(*(st.band(band, (0.0, 1.0)) for st in stats))  # accuracy over minutes
        ax.fill_between(xs, lo, hi, color=color, alpha=0.2, linewidth=0)
    if not drawn:
        return None
    ax.set_xlabel("training minutes (validation not counted)")
    ax.set_ylabel("validation accuracy (reward)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"Validation accuracy per training minute\n{BAND_NAMES[band]}", fontsize=10)
    return fig


def build_figures(groups: Sequence[Group], band: Band = "ci") -> dict[str, Figure]:
    """name -> figure for every metric some run has, plus the learning-rate and per-minute figures when
    they apply."""
    figures = {spec.name: metric_figure(groups, spec, band) for spec in FIGURES}
    terms = sorted({k for g in groups for run in g.runs for row in run.metrics for k in row
                    if k.startswith("train/reward/") and not k.endswith("_std")})
    if terms:
        figures[TERMS_FIGURE] = metric_figure(groups, MetricFigure(
            TERMS_FIGURE, "Each reward term, unweighted", tuple((k, k.rpartition("/")[2]) for k in terms)), band)
    figures[LR_FIGURE] = lr_figure(groups, band)
    figures[MINUTES_FIGURE] = minutes_figure(groups, band)
    return {name: fig for name, fig in figures.items() if fig is not None}


def png_bytes(fig: Figure, dpi: int = 110) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def save_figures(figures: dict[str, Figure], out_dir: str | Path, dpi: int = 110) -> list[Path]:
    """Write <name>.png and <name>.svg for each figure; returns the paths written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, fig in figures.items():
        for ext in ("png", "svg"):
            path = out_dir / f"{name}.{ext}"
            fig.savefig(path, format=ext, dpi=dpi)
            written.append(path)
    return written

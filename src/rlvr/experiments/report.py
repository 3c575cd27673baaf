"""`rlvr report`: one static, self-contained HTML page for a set of runs (the figures are embedded as base64
PNGs, so the file can be mailed or opened anywhere): the configurations (the fields that differ between runs
per group, the shared ones folded away), the final numbers with their spread across seeds, the plots, and
sample rollouts from the first and the last logged step side by side. Every text from a run is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import math
import time
from collections.abc import Sequence
from pathlib import Path

from rlvr.experiments.runs import (
    NOT_CONFIG,
    SUMMARY_METRICS,
    Group,
    Summary,
    differing_fields,
    fmt_value,
    load_groups,
    summarize,
)
from rlvr.experiments.stats import Band, Difference, Spread

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1300px; color: #222; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } th.key, td.key { background: #fff4c2; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
.samples { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.sample { border: 1px solid #ddd; border-radius: 4px; padding: .4em .6em; margin-bottom: .6em; font-size: .85em; }
.sample pre { white-space: pre-wrap; word-break: break-word; max-height: 22em; overflow: auto; background: #f8f8f8;
  padding: .4em; margin: .3em 0; }
.good { color: #176f2c; } .bad { color: #a11; } .muted { color: #777; }
"""

METRIC_TITLES = {"final_val_accuracy": "final val accuracy", "best_val_accuracy": "best val accuracy",
                 "final_val_format_rate": "final val format rate",
                 "final_val_sampled_accuracy": "final sampled val accuracy"}


def esc(value) -> str:
    return html.escape(value if isinstance(value, str) else fmt_value(value), quote=True)


def fmt_spread(s: Spread | None, digits: int = 3, bounds: tuple[float, float] | None = (0.0, 1.0)) -> str:
    """"0.400 ± 0.226 (df 2)" (mean ± 95% t-interval half width, its degrees of freedom), "0.400 (n=1)" for a
    single run, "–" for none. An interval that leaves the metric's `bounds` (accuracies: [0, 1]; 2 seeds give
    t(0.975, 1) = 12.7) is shown as the range it covers inside them: "0.650 [0.210, 1.000] (df 1)"."""
    if s is None:
        return "–"
    if math.isnan(s.half_width):
        return f"{s.mean:.{digits}f} (n=1)"
    df = f"(df {s.n - 1})"
    if bounds is not None and (s.mean - s.half_width < bounds[0] or s.mean + s.half_width > bounds[1]):
        lo, hi = s.band("ci", bounds)
        return f"{s.mean:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}] {df}"
    return f"{s.mean:.{digits}f} ± {s.half_width:.{digits}f} {df}"


# the numbers a comparison between groups is about (the best accuracy of a run is biased upward by picking)
DIFFERENCE_METRICS = ("final_val_accuracy", "final_val_sampled_accuracy")


def fmt_difference(d: Difference | None, digits: int = 3) -> str:
    """'+0.100 ± 0.227, within the spread (9 runs per group would resolve it)'."""
    if d is None:
        return "-"
    if math.isnan(d.half_width):
        return f"{d.mean:+.{digits}f} (one run a side: no interval)"
    verdict = "larger than the spread" if d.resolved else "within the spread"
    need = f" ({d.runs_to_resolve} runs per group would resolve it)" if not d.resolved and d.runs_to_resolve else ""
    return f"{d.mean:+.{digits}f} ± {d.half_width:.{digits}f}, {verdict}{need}"


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None else f"{x:.{digits}f}"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], key_columns: Sequence[int] = ()) -> str:
    """An HTML table from already-escaped cells; `key_columns` are highlighted."""
    th = "".join(f'<th{" class=key" if i in key_columns else ""}>{h}</th>' for i, h in enumerate(header))
    body = "".join("<tr>" + "".join(f'<td{" class=key" if i in key_columns else ""}>{c}</td>'
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def config_section(groups: Sequence[Group]) -> str:
    runs = [r for g in groups for r in g.runs]
    differ = differing_fields([r.config for r in runs])
    shown = set(groups[0].shown) if groups else set()
    header = ["group", "seeds", "runs (finished)"] + [esc(f) for f in differ]
    rows = [[esc(g.label), esc(", ".join(fmt_value(r.config.get("seed")) for r in g.runs)),
             f"{len(g.runs)} ({sum(r.finished for r in g.runs)})"] + [esc(g.values.get(f)) for f in differ]
            for g in groups]
    keys = [3 + i for i, f in enumerate(differ) if f in shown]
    parts = ["<h2>Configurations</h2>",
             "<p>Runs are grouped by every config field that differs between them (seed and out aside); "
             "highlighted columns name the groups, the others follow from them.</p>", _table(header, rows, keys)]
    common = [k for k in (runs[0].config if runs else {}) if k not in differ and k not in NOT_CONFIG]
    if common:
        shared = _table(["field", "value"], [[esc(k), esc(runs[0].config.get(k))] for k in common])
        parts.append(f"<details><summary>Fields shared by every run ({len(common)})</summary>{shared}</details>")
    return "\n".join(parts)


def numbers_section(summary: Summary) -> str:
    header = ["group", "n (finished)"]
    for m in SUMMARY_METRICS:
        header += [f"{METRIC_TITLES[m]}<br><span class=muted>mean ± 95% t-interval</span>", "min", "max"]
    rows = []
    for g in summary.groups:
        row = [esc(g.group), f"{g.n_runs} ({g.n_finished})"]
        for m in SUMMARY_METRICS:
            s = g.stats[m]
            row += [fmt_spread(s), _num(s.min if s else None), _num(s.max if s else None)]
        rows.append(row)
    run_rows = [[esc(r.run), esc(r.group), esc(r.seed), f"{r.steps_done}/{esc(r.steps_planned)}",
                 "yes" if r.finished else "<span class=bad>no</span>",
                 f"{_num(r.final_val_accuracy)} <span class=muted>(step {esc(r.final_val_step)})</span>",
                 f"{_num(r.best_val_accuracy)} <span class=muted>(step {esc(r.best_val_step)})</span>",
                 _num(r.final_val_format_rate), _num(r.final_val_sampled_accuracy)] for r in summary.runs]
    return "\n".join([
        "<h2>Final numbers</h2>",
        "<p>Final = at the last validation step; best = the highest validation accuracy of the run. "
        "95% t-interval half width = t(0.975, n-1)·s/√n with s the sample standard deviation over the group's n "
        "runs (t = 12.71 for n = 2, 4.30 for n = 3, 2.26 for n = 10).</p>",
        _table(header, rows),
        "<details open><summary>Every run</summary>",
        _table(["run", "group", "seed", "steps", "finished", "final val accuracy", "best val accuracy",
                "final val format rate", "final sampled val accuracy"], run_rows),
        "</details>",
    ])


def differences_section(summary: Summary) -> str:
    if not summary.differences:
        return ""
    rows = [[esc(d.group)] + [esc(fmt_difference(d.stats[m])) for m in DIFFERENCE_METRICS] for d in summary.differences]
    return "\n".join([
        f"<h2>Differences from {esc(summary.differences[0].baseline)}</h2>",
        "<p>Each group's mean minus the baseline's, ± the 95% two-sample t-interval (pooled variance, "
        "df = n₁ + n₂ − 2). Larger than the spread: the interval excludes 0. Otherwise, the runs per group "
        "that the same run-to-run variance would need to resolve a difference this large.</p>",
        _table(["group"] + [METRIC_TITLES[m] for m in DIFFERENCE_METRICS], rows),
    ])


def figures_section(pngs: dict[str, bytes]) -> str:
    parts = ["<h2>Plots</h2>"]
    for name, data in pngs.items():
        b64 = base64.b64encode(data).decode("ascii")
        parts.append(f'<figure><img alt="{esc(name)}" src="data:image/png;base64,{b64}">'
                     f"<figcaption>{esc(name)}</figcaption></figure>")
    return "\n".join(parts)


def sample_rollouts(rows: Sequence[dict], per_step: int = 2) -> list[tuple[int, list[dict]]]:
    """The first logged step and the last one, each with its first `per_step` rollouts of distinct questions."""
    if not rows:
        return []
    steps = sorted({int(r["step"]) for r in rows})
    picked = []
    for step in dict.fromkeys([steps[0], steps[-1]]):
        seen, chosen = set(), []
        for r in rows:
            if int(r["step"]) == step and r.get("question") not in seen and len(chosen) < per_step:
                seen.add(r.get("question"))
                chosen.append(r)
        picked.append((step, chosen))
    return picked


def _sample_html(r: dict) -> str:
    reward = r.get("reward")
    cls = "good" if isinstance(reward, (int, float)) and reward > 0 else "bad"
    return (f'<div class=sample><b>question</b><pre>{esc(str(r.get("question", "")))}</pre>'
            f'<b>response</b><pre>{esc(str(r.get("response", "")))}</pre>'
            f'<span class={cls}>reward {esc(reward)}</span> · format {esc(r.get("format_reward"))} · '
            f'answer {esc(r.get("answer_reward"))} · truth {esc(str(r.get("ground_truth", "")))} · '
            f'advantage {_num(r.get("advantage"), 2)} · {esc(r.get("tokens"))} tokens, {esc(r.get("finish_reason"))}'
            "</div>")


def rollouts_section(groups: Sequence[Group], per_step: int = 2) -> str:
    parts = ["<h2>Sample rollouts</h2>",
             "<p>From the first and the last logged step of each run (rollouts.jsonl), side by side.</p>"]
    first = True
    for g in groups:
        for run in g.runs:
            picked = sample_rollouts(run.rollouts, per_step)
            if not picked:
                continue
            columns = "".join(f"<div><h4>step {step}</h4>{''.join(map(_sample_html, rows))}</div>"
                              for step, rows in picked)
            parts.append(f"<details{' open' if first else ''}><summary>{esc(run.name)} "
                         f"<span class=muted>({esc(g.label)})</span></summary><div class=samples>{columns}</div>"
                         "</details>")
            first = False
    if first:
        parts.append("<p class=muted>No run logged rollouts.</p>")
    return "\n".join(parts)


def render_report(groups: Sequence[Group], summary: Summary, pngs: dict[str, bytes], title: str = "rlvr report",
                  band: Band = "ci", rollouts_per_step: int = 2) -> str:
    """The whole page as a string; pure (no file I/O), given the loaded runs and the figures' PNG bytes."""
    n_runs = sum(len(g.runs) for g in groups)
    band_text = "mean ± 95% t-interval (t(0.975, n-1)·s/√n)" if band == "ci" else "mean with min–max"
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f"<p class=muted>{n_runs} runs in {len(groups)} groups · bands: {band_text} · written "
        f"{esc(time.strftime('%Y-%m-%d %H:%M'))}</p>",
        config_section(groups), numbers_section(summary), differences_section(summary), figures_section(pngs),
        rollouts_section(groups, rollouts_per_step),
        "</body></html>",
    ])


def write_report(paths: Sequence[str | Path], out: str | Path, band: Band = "ci", rollouts_per_step: int = 2,
                 title: str | None = None, baseline: str | None = None) -> Path:
    """Load the runs under `paths`, draw the figures and write the page to `out` (with `baseline`, a group's
    label: every other group's difference from it)."""
    from rlvr.experiments.plots import build_figures, png_bytes

    groups = load_groups(paths, rollouts=True)
    pngs = {name: png_bytes(fig) for name, fig in build_figures(groups, band).items()}
    page = render_report(groups, summarize(groups, baseline=baseline), pngs, title or f"rlvr report: {', '.join(map(str, paths))}",
                         band, rollouts_per_step)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out

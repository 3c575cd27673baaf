"""Experiments: grouping runs and the spread across seeds (hand-computed), summary CSV/JSON, plots, the HTML
report, and sweeps (grid expansion, validation, dry-run statuses, one real sweep of two tiny runs)."""

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from rlvr.cli import app
from rlvr.config import ConfigError, TrainConfig
from rlvr.core.checkpoint import model_digest
from rlvr.core.tracking import read_jsonl
from rlvr.experiments.plots import FIGURES, MINUTES_FIGURE, build_figures, lr_figure, minutes_figure
from rlvr.experiments.report import fmt_difference, fmt_spread, sample_rollouts
from rlvr.experiments.runs import (
    differing_fields,
    group_runs,
    label_fields,
    load_groups,
    load_runs,
    metric_series,
    per_step_spread,
    summarize,
    write_summary,
)
from rlvr.experiments.stats import difference, metric_bounds, runs_to_resolve, spread
from rlvr.experiments.sweep import _prepare, run_sweep
from rlvr.experiments.sweep_plan import LOCK, expand_grid, load_sweep, plan_sweep, run_name, run_status
from rlvr.experiments.sweep_records import restore_record

# ----------------------------------------------------------------------------------------------------
# Synthetic run directories: 2 algorithms x 3 seeds, validation at steps 0, 2, 4.

VAL = {  # (algorithm, seed) -> val/accuracy at steps 0, 2, 4 (dr_grpo seed 2 stopped after step 2)
    ("grpo", 0): [0.1, 0.3, 0.5],
    ("grpo", 1): [0.2, 0.4, 0.6],
    ("grpo", 2): [0.3, 0.8, 0.7],
    ("dr_grpo", 0): [0.1, 0.2, 0.2],
    ("dr_grpo", 1): [0.1, 0.3, 0.4],
    ("dr_grpo", 2): [0.1, 0.3],
}
SCRIPT = "<script>alert('x')</script> & <answer> 7 </answer>"


def write_run(path, algorithm="grpo", seed=0, val=(0.1, 0.2, 0.3), finished=True, kl=False, **cfg):
    path.mkdir(parents=True)
    TrainConfig(algorithm=algorithm, seed=seed, out=str(path), steps=4, tensorboard=False, **cfg).save(
        path / "config.yaml")
    rows = []
    last = 2 * (len(val) - 1)
    for step in range(last + 1):
        row = {"step": step, "time": 1000.0 + step}
        if step > 0:  # step 0 holds only validation metrics, as in `rlvr train`
            row.update({"train/loss": 0.1 * step + seed, "train/grad_norm": 1.0 + step, "train/token_entropy": 2.0,
                        "train/reward": 0.1 * step, "train/format_reward": 0.5, "rollout/mean_tokens": 30.0 + seed})
            if kl:
                row["train/kl"] = 0.01 * step
        if step % 2 == 0:
            row.update({"val/accuracy": val[step // 2], "val/format_rate": 0.9 - 0.1 * (step // 2),
                        "val/mean_response_tokens": 40.0 + step})
        rows.append(row)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    rollouts = [{"step": step, "question": f"q{step}-{i // 2}", "ground_truth": "7",
                 "response": SCRIPT if (step, i) == (last - 1, 0) else f"response {step}-{i}",
                 "reward": float(i % 2), "format_reward": 1.0, "answer_reward": float(i % 2), "advantage": 0.5,
                 "tokens": 12, "finish_reason": "stop", "sample_index": i % 2}
                for step in (1, last - 1) for i in range(4)]
    (path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rollouts))
    if finished:
        (path / "final").mkdir()
        (path / "final" / "DONE").write_text(json.dumps({"val/accuracy": val[-1]}))
    return path


@pytest.fixture
def sweep_root(tmp_path):
    root = tmp_path / "sweep"
    for (algorithm, seed), val in VAL.items():
        write_run(root / f"algorithm={algorithm},seed={seed}", algorithm, seed, val,
                  finished=len(val) == 3, kl=algorithm == "dr_grpo" and seed == 0)
    return root


T975 = {2: 12.7062, 3: 4.3027, 10: 2.2622}  # t(0.975, n - 1) from a printed table, by n


def half_width(values):
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return T975[n] * s / math.sqrt(n)


# ----------------------------------------------------------------------------------------------------
# Statistics and grouping.


def test_t_quantile_matches_the_printed_table_and_interpolates_between():
    from rlvr.experiments.stats import t_quantile

    assert t_quantile(1) == pytest.approx(12.706, abs=1e-3)  # n = 2: 6.5x the normal 1.96
    assert t_quantile(2) == pytest.approx(4.303, abs=1e-3)  # n = 3
    assert t_quantile(9) == pytest.approx(2.262, abs=1e-3)  # n = 10
    assert t_quantile(35) == pytest.approx(2.0301, abs=2e-4)  # between the table's 30 and 40
    assert t_quantile(1000) == pytest.approx(1.9623, abs=2e-4)  # between 120 and the normal limit
    with pytest.raises(ValueError):
        t_quantile(0)


def test_spread_is_the_95_percent_t_interval():
    s = spread([0.5, 0.6, 0.7])
    # mean 0.6; s^2 = (0.01 + 0 + 0.01) / (3 - 1) = 0.01, s = 0.1; half width = 4.3027 * 0.1 / sqrt(3) = 0.248417
    assert s.mean == pytest.approx(0.6) and s.std == pytest.approx(0.1)
    assert s.half_width == pytest.approx(0.248417, abs=1e-5)
    assert s.band("ci") == pytest.approx((0.6 - 0.248417, 0.6 + 0.248417), abs=1e-5)
    assert s.band("minmax") == (0.5, 0.7) and s.n == 3
    # ten runs 0.0, 0.1, ..., 0.9: mean 0.45, s = 0.302765, half width 2.2622 * 0.302765 / sqrt(10) = 0.216585
    ten = spread([i / 10 for i in range(10)])
    assert ten.half_width == pytest.approx(0.216585, abs=1e-5)
    one = spread([0.4])  # a single run has no spread: no band, not a zero-width lie in the tables
    assert math.isnan(one.std) and math.isnan(one.half_width) and one.band() == (0.4, 0.4)
    assert fmt_spread(one) == "0.400 (n=1)" and fmt_spread(s) == "0.600 ± 0.248 (df 2)"
    # two seeds, 0.6 and 0.9: mean 0.75 ± 12.706 * 0.212132 / sqrt(2) = 1.906, far outside [0, 1]: the band of an
    # accuracy is what of it lies inside [0, 1], and the table says so (issue 41 item 7)
    two = spread([0.6, 0.9])
    assert two.half_width == pytest.approx(1.9059, abs=1e-3)
    assert two.band("ci", (0.0, 1.0)) == (0.0, 1.0) and two.band("ci")[0] < -1
    assert fmt_spread(two) == "0.750 [0.000, 1.000] (df 1)"
    assert metric_bounds("val/accuracy") == metric_bounds("train/pass@4") == (0.0, 1.0)
    assert metric_bounds("train/loss") is None and metric_bounds("rollout/mean_tokens") is None


def test_difference_of_two_groups_is_the_pooled_two_sample_t_interval():
    d = difference([0.6, 0.7, 0.8], [0.5, 0.6, 0.7])
    # delta 0.1; pooled s^2 = (0.02 + 0.02) / (3 + 3 - 2) = 0.01; half = t(4) 2.7764 * sqrt(0.01 * 2/3) = 0.226695
    assert d.mean == pytest.approx(0.1) and d.df == 4
    assert d.half_width == pytest.approx(0.226695, abs=1e-5) and not d.resolved
    # n per group: 2.1199 * sqrt(0.02 / 9) = 0.09993 < 0.1, but 2.1448 * sqrt(0.02 / 8) = 0.10724 > 0.1
    assert d.runs_to_resolve == 9 == runs_to_resolve(0.1, 0.01)
    assert fmt_difference(d) == "+0.100 ± 0.227, within the spread (9 runs per group would resolve it)"
    # s^2 = 1e-4: half = 2.7764 * sqrt(1e-4 * 2/3) = 0.0227; at 2 runs a side t(2) * sqrt(2e-4 / 2) = 0.043 < 0.4
    far = difference([0.9, 0.91, 0.92], [0.5, 0.51, 0.52])
    assert far.resolved and far.runs_to_resolve == 2 and fmt_difference(far) == "+0.400 ± 0.023, larger than the spread"
    # unequal sizes: 2 and 3 runs, s^2 = (0.005 + 0.02) / 3, half = t(3) 3.1824 * sqrt(s^2 * (1/2 + 1/3))
    uneven = difference([0.3, 0.4], [0.5, 0.6, 0.7])
    assert uneven.mean == pytest.approx(-0.25) and uneven.df == 3
    assert uneven.half_width == pytest.approx(3.1824 * math.sqrt(0.025 / 3 * 5 / 6), abs=1e-4)
    one = difference([0.4], [0.5])  # no run-to-run variance measured: no interval, no estimate of seeds
    assert math.isnan(one.half_width) and not one.resolved and one.runs_to_resolve is None
    assert difference([0.5, 0.6], [0.6, 0.5]).runs_to_resolve is None  # equal means: no n resolves 0


def test_questions_that_would_resolve_a_difference_leave_the_training_variance_alone():
    from rlvr.experiments.stats import questions_to_resolve

    # training variance 0.0025 - 0.7 * 0.3 / 300 = 0.0018; room = 0.01 * 3 / (2 * 2.7764^2) - 0.0018 = 1.459e-4
    assert questions_to_resolve(0.1, 0.0025, 0.7, 300, 3) == 1440
    # the seeds alone vary by more than any number of questions can remove: 2.7764 * sqrt(2 * 0.0049 / 3) > 0.1
    assert questions_to_resolve(0.1, 0.0049 + 0.0007, 0.7, 300, 3) is None
    assert questions_to_resolve(0.0, 0.0025, 0.7, 300, 3) is None
    d = difference([0.6, 0.7, 0.8], [0.5, 0.6, 0.7])
    assert d.variance == pytest.approx(0.01)


def test_per_step_spread_counts_only_the_runs_that_have_the_step():
    series = [{0: 0.1, 2: 0.2, 4: 0.2}, {0: 0.1, 2: 0.3, 4: 0.4}, {0: 0.1, 2: 0.3}]
    stats = dict(per_step_spread(series))
    assert list(stats) == [0, 2, 4]
    assert stats[0].mean == pytest.approx(0.1) and stats[0].half_width == pytest.approx(0.0)
    # step 2: (0.2 + 0.3 + 0.3) / 3 = 0.26667; s^2 = (0.0044444 + 0.0011111 + 0.0011111) / 2 = 0.0033333
    assert stats[2].mean == pytest.approx(0.8 / 3) and stats[2].std == pytest.approx(math.sqrt(0.01 / 3))
    assert stats[2].half_width == pytest.approx(4.3027 * math.sqrt(0.01 / 3) / math.sqrt(3))
    # step 4: two runs, 0.2 and 0.4: mean 0.3, s = sqrt(0.01 + 0.01) = 0.141421, half width 12.7062 * 0.141421 / sqrt(2)
    assert stats[4].n == 2 and stats[4].mean == pytest.approx(0.3)
    assert stats[4].half_width == pytest.approx(1.27062)


def test_metric_series_skips_missing_and_non_finite_values():
    rows = [{"step": 0, "val/accuracy": 0.5}, {"step": 1, "train/loss": 2.0}, {"step": 2, "val/accuracy": None},
            {"step": 3, "val/accuracy": float("nan")}, {"step": 4, "val/accuracy": 1}]
    assert metric_series(rows, "val/accuracy") == {0: 0.5, 4: 1.0}


def test_runs_are_grouped_by_the_fields_that_differ_except_seed(sweep_root):
    runs = load_runs([sweep_root])
    assert len(runs) == 6
    assert {r.name for r in runs} == {f"algorithm={a},seed={s}" for a, s in VAL}
    groups = group_runs(runs)
    assert [g.label for g in groups] == ["algorithm=dr_grpo", "algorithm=grpo"]
    assert [[r.config["seed"] for r in g.runs] for g in groups] == [[0, 1, 2], [0, 1, 2]]
    # the preset's choices differ too and stay in the key, but `algorithm` alone names the group
    assert set(dict(groups[0].key)) == {"algorithm", "advantage_normalizer", "loss_normalization",
                                        "normalization_constant"}
    assert groups[0].values["loss_normalization"] == "constant" and groups[1].values["advantage_normalizer"] == "std"
    assert [r.finished for r in groups[0].runs] == [True, True, False]
    # two fields that vary independently both name the groups
    configs = [{"learning_rate": lr, "prompt": p, "seed": s, "out": f"{lr}{p}{s}"}
               for lr in (1e-5, 3e-5) for p in ("a", "b") for s in (0, 1)]
    assert differing_fields(configs) == ["learning_rate", "prompt"]
    assert label_fields(configs, ["learning_rate", "prompt"]) == ["learning_rate", "prompt"]
    # a field that older runs lack (added to TrainConfig later) does not split them from newer ones by itself
    assert differing_fields([{"a": 1, "b": True, "seed": 0}, {"a": 1, "seed": 1}, {"a": 2, "b": True}]) == ["a"]


def test_summary_final_and_best_per_run_and_group_mean_and_interval(sweep_root, tmp_path):
    summary = summarize(load_groups([sweep_root]))
    by_run = {r.run: r for r in summary.runs}
    r = by_run["algorithm=grpo,seed=2"]
    assert (r.final_val_accuracy, r.final_val_step, r.best_val_accuracy, r.best_val_step) == (0.7, 4, 0.8, 2)
    assert r.final_val_format_rate == pytest.approx(0.7) and r.steps_done == 4 and r.finished
    r = by_run["algorithm=dr_grpo,seed=2"]  # stopped early: its last validation is step 2
    assert (r.final_val_accuracy, r.final_val_step, r.steps_done, r.finished) == (0.3, 2, 2, False)

    grpo, dr = {g.group: g for g in summary.groups}["algorithm=grpo"], summary.groups[0]
    # grpo final [0.5, 0.6, 0.7]: mean 0.6, s = 0.1, half width 4.3027 * 0.1 / sqrt(3) = 0.248417
    assert grpo.stats["final_val_accuracy"].mean == pytest.approx(0.6)
    assert grpo.stats["final_val_accuracy"].half_width == pytest.approx(4.3027 * 0.1 / math.sqrt(3))
    # grpo best [0.5, 0.6, 0.8]: mean 0.63333; deviations -0.13333, -0.03333, 0.16667 -> s^2 = 0.046667 / 2
    assert grpo.stats["best_val_accuracy"].mean == pytest.approx(1.9 / 3)
    assert grpo.stats["best_val_accuracy"].std == pytest.approx(math.sqrt(0.046666667 / 2))
    assert grpo.stats["best_val_accuracy"].half_width == pytest.approx(half_width([0.5, 0.6, 0.8]))
    assert grpo.stats["best_val_accuracy"].half_width == pytest.approx(0.379464, abs=1e-5)
    # dr_grpo final [0.2, 0.4, 0.3] (the last one from step 2): mean 0.3, s = 0.1
    assert dr.stats["final_val_accuracy"].mean == pytest.approx(0.3)
    assert dr.stats["final_val_accuracy"].half_width == pytest.approx(0.248417, abs=1e-5)
    assert (dr.n_runs, dr.n_finished, dr.seeds) == (3, 2, [0, 1, 2])

    csv_path, json_path = write_summary(summary, tmp_path / "out" / "summary.csv")
    assert json_path == tmp_path / "out" / "summary.json"
    rows = list(csv.DictReader(csv_path.open()))
    assert [r["kind"] for r in rows] == ["run"] * 6 + ["group"] * 2
    run_row = next(r for r in rows if r["run"] == "algorithm=grpo,seed=2")
    assert (run_row["final_val_accuracy"], run_row["best_val_accuracy"], run_row["seed"]) == ("0.7", "0.8", "2")
    assert run_row["group"] == "algorithm=grpo" and run_row["finished"] == "True"
    group_row = next(r for r in rows if r["kind"] == "group" and r["group"] == "algorithm=grpo")
    assert float(group_row["final_val_accuracy"]) == pytest.approx(0.6)
    assert float(group_row["final_val_accuracy_ci95"]) == pytest.approx(0.248417, abs=1e-5)
    assert float(group_row["final_val_accuracy_std"]) == pytest.approx(0.1)
    assert (group_row["final_val_accuracy_min"], group_row["final_val_accuracy_max"], group_row["n"]) == (
        "0.5", "0.7", "3")
    data = json.loads(json_path.read_text())
    assert len(data["runs"]) == 6
    stats = {g["group"]: g["stats"] for g in data["groups"]}
    assert stats["algorithm=dr_grpo"]["final_val_accuracy"]["mean"] == pytest.approx(0.3)
    assert stats["algorithm=grpo"]["best_val_accuracy"]["max"] == 0.8


# ----------------------------------------------------------------------------------------------------
# Plots, report and the commands.


def test_plot_command_writes_png_and_svg_for_the_metrics_present(sweep_root, tmp_path):
    out = tmp_path / "plots"
    result = CliRunner().invoke(app, ["plot", str(sweep_root), "--out", str(out)])
    assert result.exit_code == 0, result.output
    present = {"loss", "grad_norm", "token_entropy", "train_reward", "val_reward", "val_response_length",
               "train_response_length", "kl"}
    assert {p.name for p in out.iterdir()} == {f"{n}.{e}" for n in present for e in ("png", "svg")}
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (out / "kl.svg").read_text()[:1000]
    # no run logged a clip fraction or a sampled validation, and the learning rate is the same everywhere: no
    # such figures
    assert {f.name for f in FIGURES} - present == {"clip_fraction", "val_sampled_reward"}
    result = CliRunner().invoke(app, ["plot", str(sweep_root), "--out", str(out), "--band", "bogus"])
    assert result.exit_code == 2 and "ci or minmax" in result.output
    # --only writes just the figures named, in a fresh directory; a wrong or empty name is refused before drawing
    only = tmp_path / "only"
    result = CliRunner().invoke(app, ["plot", str(sweep_root), "--out", str(only), "--only", "val_reward, kl"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in only.iterdir()) == ["kl.png", "kl.svg", "val_reward.png", "val_reward.svg"]
    result = CliRunner().invoke(app, ["plot", str(sweep_root), "--out", str(only), "--only", "val_rewards"])
    assert result.exit_code == 2 and "no figure named 'val_rewards'" in result.output and "val_reward" in result.output
    result = CliRunner().invoke(app, ["plot", str(sweep_root), "--out", str(only), "--only", "clip_fraction"])
    assert result.exit_code == 2 and "no data for clip_fraction" in result.output


def test_figure_draws_group_means_and_bands(sweep_root):
    groups = load_groups([sweep_root])
    fig = build_figures(groups, "minmax")["val_reward"]
    ax = fig.axes[0]  # val/accuracy: per group 3 faint runs, then the mean line
    dr_mean = [line for line in ax.lines if line.get_label().startswith("algorithm=dr_grpo")][0]
    assert list(dr_mean.get_xdata()) == [0, 2, 4]
    assert list(dr_mean.get_ydata()) == pytest.approx([0.1, (0.2 + 0.3 + 0.3) / 3, 0.3])
    assert dr_mean.get_label() == "algorithm=dr_grpo (n=3)"
    assert len(fig.axes) == 2 and fig.axes[1].get_ylabel() == "format reward"


def test_accuracy_per_training_minute_averages_each_step_over_its_runs(tmp_path):
    # two RL seeds at 30 s and 60 s a step, one SFT run logging time/step_seconds of 90 s; validation at 0, 2, 4
    for name, seed, key, seconds, val in (("grpo", 0, "time/step", 30.0, (0.1, 0.3, 0.5)),
                                          ("grpo", 1, "time/step", 60.0, (0.2, 0.4, 0.6)),
                                          ("sft", 0, "time/step_seconds", 90.0, (0.0, 0.5, 0.9))):
        run = write_run(tmp_path / f"algorithm={name},seed={seed}", "grpo" if name == "grpo" else "dr_grpo", seed, val)
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            if row["step"] > 0:
                row[key] = seconds
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups = load_groups([tmp_path])
    grpo_runs = next(g for g in groups if g.label == "algorithm=grpo").runs
    assert sorted(r.minutes()[4] for r in grpo_runs) == [2.0, 4.0]
    assert max(grpo_runs, key=lambda r: r.minutes()[4]).minutes() == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}
    ax = minutes_figure(groups, "minmax").axes[0]
    means = {line.get_label(): line for line in ax.lines if not line.get_label().startswith("_")}
    grpo = means["algorithm=grpo (n=2)"]
    assert list(grpo.get_xdata()) == pytest.approx([0.0, (1.0 + 2.0) / 2, (2.0 + 4.0) / 2])
    assert list(grpo.get_ydata()) == pytest.approx([0.15, 0.35, 0.55])
    assert list(means["algorithm=dr_grpo (n=1)"].get_xdata()) == pytest.approx([0.0, 3.0, 6.0])
    assert MINUTES_FIGURE in build_figures(groups)


def test_no_minutes_figure_without_step_times(sweep_root):
    assert minutes_figure(load_groups([sweep_root])) is None


def test_final_accuracy_against_learning_rate(tmp_path):
    finals = {1e-5: [0.2, 0.4], 1e-4: [0.5, 0.7]}
    for lr, values in finals.items():
        for seed, final in enumerate(values):
            write_run(tmp_path / f"lr={lr},seed={seed}", seed=seed, val=(0.1, final), learning_rate=lr)
    groups = load_groups([tmp_path])
    assert [g.label for g in groups] == ["learning_rate=1e-05", "learning_rate=0.0001"]
    fig = lr_figure(groups)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert list(ax.lines[0].get_xdata()) == [1e-5, 1e-4]
    assert list(ax.lines[0].get_ydata()) == pytest.approx([0.3, 0.6])
    assert lr_figure(load_groups([tmp_path / "lr=1e-05,seed=0"])) is None
    out = tmp_path / "plots"
    assert CliRunner().invoke(app, ["plot", str(tmp_path), "--out", str(out)]).exit_code == 0
    assert (out / "final_val_accuracy_vs_lr.png").is_file() and (out / "final_val_accuracy_vs_lr.svg").is_file()


def test_report_is_one_self_contained_page_with_configs_numbers_plots_and_escaped_rollouts(sweep_root, tmp_path):
    out = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(sweep_root), "--out", str(out), "--title", "variants <&>"])
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "<title>variants &lt;&amp;&gt;</title>" in page
    # configs: the differing fields per group, and the shared ones
    for text in ("algorithm=grpo", "algorithm=dr_grpo", "loss_normalization", "constant", "advantage_normalizer",
                 "learning_rate", "1e-05"):
        assert text in page
    # numbers with their spread: grpo final 0.600 ± 0.113 [0.5, 0.7]; best 0.633 ± 0.173; dr_grpo 0.300 ± 0.113
    # (best: 0.633 ± 0.379 would pass 1, so the table shows the part of the interval inside [0, 1])
    assert "0.600 ± 0.248 (df 2)" in page and "0.633 [0.254, 1.000] (df 2)" in page and "0.300 ± 0.248" in page
    assert "<td>0.500</td><td>0.700</td>" in page
    # every figure embedded: no file next to the page is needed
    assert page.count('src="data:image/png;base64,') == 8
    assert not [p for p in tmp_path.iterdir() if p.suffix in (".png", ".svg")]
    # rollouts from the first and last logged step, escaped
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &lt;answer&gt; 7 &lt;/answer&gt;" in page
    assert "<script" not in page
    assert "<h4>step 1</h4>" in page and "<h4>step 3</h4>" in page


def test_sample_rollouts_take_the_first_and_last_step_with_distinct_questions():
    rows = [{"step": s, "question": f"q{i // 2}", "response": f"{s}-{i}"} for s in (1, 5, 9) for i in range(6)]
    picked = sample_rollouts(rows, per_step=2)
    assert [(step, [r["response"] for r in rs]) for step, rs in picked] == [(1, ["1-0", "1-2"]), (9, ["9-0", "9-2"])]
    assert sample_rollouts([]) == []


def test_summary_command_writes_csv_and_json(sweep_root, tmp_path):
    out = tmp_path / "s" / "summary.csv"
    result = CliRunner().invoke(app, ["summary", str(sweep_root / "algorithm=grpo,seed=0"),
                                      str(sweep_root / "algorithm=grpo,seed=1"), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(out.open()))
    # two runs of one config: one group "all runs", final [0.5, 0.6]: mean 0.55, s = 0.070711,
    # hw = 12.7062 * 0.070711 / sqrt(2) = 0.63531 (the normal 1.96 would claim 0.098)
    group = rows[-1]
    assert group["group"] == "all runs" and float(group["final_val_accuracy"]) == pytest.approx(0.55)
    assert float(group["final_val_accuracy_ci95"]) == pytest.approx(0.63531, abs=1e-5)
    assert (out.parent / "summary.json").is_file()
    result = CliRunner().invoke(app, ["summary", str(tmp_path / "s"), "--out", str(out)])
    assert result.exit_code == 2 and "holds no run" in result.output


def test_summary_and_report_compare_each_group_with_a_baseline(sweep_root, tmp_path):
    out = tmp_path / "summary.csv"
    result = CliRunner().invoke(app, ["summary", str(sweep_root), "--out", str(out), "--baseline", "algorithm=dr_grpo"])
    assert result.exit_code == 0, result.output
    # grpo final [0.5, 0.6, 0.7] - dr_grpo final [0.2, 0.4, 0.3]: 0.3 +- 2.7764 * sqrt(0.01 * 2/3) = 0.226695
    row = next(r for r in csv.DictReader(out.open()) if r["kind"] == "difference")
    assert (row["group"], row["baseline"], row["final_val_accuracy_resolved"]) == (
        "algorithm=grpo", "algorithm=dr_grpo", "True")
    assert float(row["final_val_accuracy"]) == pytest.approx(0.3)
    assert float(row["final_val_accuracy_ci95"]) == pytest.approx(0.226695, abs=1e-5)
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["differences"][0]["stats"]["final_val_accuracy"]["runs_to_resolve"] == 3
    assert "+0.300 ± 0.227" in result.output  # (rich wraps the verdict in a narrow terminal)
    page = tmp_path / "report.html"
    result = CliRunner().invoke(app, ["report", str(sweep_root), "--out", str(page), "--baseline", "algorithm=dr_grpo"])
    assert result.exit_code == 0, result.output
    assert "Differences from algorithm=dr_grpo" in page.read_text()
    assert "+0.300 ± 0.227, larger than the spread" in page.read_text()
    result = CliRunner().invoke(app, ["summary", str(sweep_root), "--out", str(out), "--baseline", "grpo"])
    assert result.exit_code == 2 and "'algorithm=grpo'" in result.output and "'algorithm=dr_grpo'" in result.output


# ----------------------------------------------------------------------------------------------------
# Sweeps.

BASE = {"dataset": "arithmetic:steps=1,max=9", "steps": 2, "rollout_batch_size": 4, "group_size": 2,
        "max_new_tokens": 4, "eval_limit": 1, "eval_max_new_tokens": 2, "tensorboard": False,
        "generation_dtype": "float32", "precision": "fp32", "log_rollouts_every": 1}


def write_sweep(path, grid, base=None, **top):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"base": base if base is not None else BASE, "grid": grid, **top}))
    return path


def test_grid_expands_into_run_configs_and_directory_names(tmp_path):
    assert expand_grid({"a": [1, 2], "b": ["x"]}) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    grid = {"learning_rate": [1e-5, 3e-5], "prompt": ["r1_zero"], "seed": [0, 1]}
    assert run_name({"learning_rate": 3e-5, "prompt": "r1_zero", "seed": 1}, grid) == "learning_rate=3e-05,seed=1"
    assert run_name({"dataset": "arithmetic:steps=1,max=9"}, {"dataset": ["x"]}) == "dataset=arithmetic_steps_1_max_9"
    assert run_name({}, {}) == "run"
    (tmp_path / "base.yaml").write_text(yaml.safe_dump({**BASE, "steps": 7, "learning_rate": 0.5}))
    sweep_file = write_sweep(tmp_path / "sweeps" / "lr.yaml", grid, base={"config": "../base.yaml", "group_size": 4},
                             out=str(tmp_path / "runs"))
    sweep = load_sweep(sweep_file, ["steps=3", "parallel=2"])
    assert (sweep.name, sweep.parallel, sweep.base_path) == ("lr", 2, tmp_path / "sweeps" / "../base.yaml")
    plan = plan_sweep(sweep)
    assert [r.name for r in plan] == ["learning_rate=1e-05,seed=0", "learning_rate=1e-05,seed=1",
                                      "learning_rate=3e-05,seed=0", "learning_rate=3e-05,seed=1"]
    assert [(r.config.learning_rate, r.config.seed) for r in plan] == [(1e-5, 0), (1e-5, 1), (3e-5, 0), (3e-5, 1)]
    # file < inline base < command line < grid; out is each run's directory
    assert {(r.config.steps, r.config.group_size, r.config.prompt, r.config.rollout_batch_size) for r in plan} == {
        (3, 4, "r1_zero", 4)}
    assert plan[3].config.out == str(tmp_path / "runs" / "learning_rate=3e-05,seed=1")
    assert {r.status for r in plan} == {"new"}


def test_sweep_checks_a_jsonl_dataset_with_its_own_field_names(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text("".join(f'{{"q": "question {i}?", "a": {i}}}\n' for i in range(20)))
    base = {**BASE, "dataset": str(data), "question_field": "q", "answer_field": "a", "prompt": "r1_zero"}
    plan = plan_sweep(load_sweep(write_sweep(tmp_path / "qa.yaml", {"seed": [0, 1]}, base=base)))
    assert [r.status for r in plan] == ["new", "new"]
    wrong = {**base, "question_field": "question"}
    with pytest.raises(ConfigError, match="field 'dataset'.*question"):
        plan_sweep(load_sweep(write_sweep(tmp_path / "wrong.yaml", {"seed": [0]}, base=wrong)))


def test_sweep_validation_names_the_file_and_the_field(tmp_path):
    bad_key = write_sweep(tmp_path / "a.yaml", {"lerning_rate": [1e-5]})
    with pytest.raises(ConfigError, match=r"a\.yaml: grid: unknown field\(s\) 'lerning_rate'"):
        load_sweep(bad_key)
    bad_value = write_sweep(tmp_path / "b.yaml", {"learning_rate": [1e-5, -1.0]})
    with pytest.raises(ConfigError, match=r"b\.yaml: run learning_rate=-1: .*field 'learning_rate'"):
        plan_sweep(load_sweep(bad_value))
    bad_prompt = write_sweep(tmp_path / "c.yaml", {"prompt": ["r1_zero", "r1_zro"]})
    with pytest.raises(ConfigError, match=r"c\.yaml: run prompt=r1_zro: .*field 'prompt': unknown prompt"):
        plan_sweep(load_sweep(bad_prompt))
    bad_base = write_sweep(tmp_path / "d.yaml", {"seed": [0]}, base={**BASE, "stepz": 3})
    with pytest.raises(ConfigError, match=r"d\.yaml: base: unknown field\(s\) 'stepz'"):
        load_sweep(bad_base)
    missing = write_sweep(tmp_path / "e.yaml", {"seed": [0]}, base="configs/nope.yaml")
    with pytest.raises(ConfigError, match=r"e\.yaml: base config 'configs/nope.yaml' not found"):
        load_sweep(missing)
    ok = write_sweep(tmp_path / "f.yaml", {"seed": [0, 1]})
    with pytest.raises(ConfigError, match="'seed' is swept by"):
        load_sweep(ok, ["seed=3"])
    with pytest.raises(ConfigError, match="unknown field"):
        load_sweep(ok, ["paralel=2"])
    result = CliRunner().invoke(app, ["sweep", "--config", str(bad_value), "dry_run=true"])
    assert result.exit_code == 2 and "b.yaml" in result.output and "learning_rate" in result.output
    for baseline, message in (("seed=0", "not <grid field>=<value>"), ("algorithm", "not <grid field>=<value>"),
                              ("learning_rate=3e-05", "'3e-05' is not one of learning_rate's grid values \\(1e-05, 2e-05\\)")):
        bad_baseline = write_sweep(tmp_path / "g.yaml", {"learning_rate": [1e-5, 2e-5], "seed": [0]}, baseline=baseline)
        with pytest.raises(ConfigError, match=rf"g\.yaml: field 'baseline': .*{message}"):
            load_sweep(bad_baseline)
    assert load_sweep(write_sweep(tmp_path / "h.yaml", {"learning_rate": [1e-5, 2e-5]}, baseline="learning_rate=1e-05")
                      ).baseline == "learning_rate=1e-05"


SHIPPED = {"quick_variants": 6, "lr_sweep": 12, "prompt_ablation": 9, "on_policy_variants": 18,
           "off_policy_variants": 12}
SWEEPS = Path(__file__).resolve().parent.parent / "sweeps"
SEED004 = ("lr_sweep", "prompt_ablation", "on_policy_variants", "off_policy_variants")


@pytest.mark.parametrize("name", list(SHIPPED))
def test_shipped_sweep_files_expand_into_valid_runs(name, tmp_path, monkeypatch):
    path = SWEEPS / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert path.read_text().startswith("#") and raw["base"]["config"] in ("configs/grpo_arithmetic.yaml",
                                                                          "configs/grpo_gsm8k.yaml")
    monkeypatch.chdir(SWEEPS.parent)
    if not Path(raw["base"]["config"]).is_file():  # the train config is not written yet: check the rest
        raw["base"].pop("config")
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
    # the sweeps it reuses from, looked for under tmp_path, so that runs in this checkout do not turn "new" to "reuse"
    reuse = json.dumps([str(tmp_path / p) for p in raw.get("reuse", [])])
    # and its record, for the same reason (the seed-004 sweeps keep theirs in results/<name>, committed)
    assert raw.get("record") in (None, f"results/{name}") and (raw.get("record") is not None) == (name in SEED004)
    plan = plan_sweep(load_sweep(path, [f"out={tmp_path / 'runs'}", f"reuse={reuse}", f"record={tmp_path / 'kept'}"]))
    assert len(plan) == SHIPPED[name] and {r.status for r in plan} == {"new"}
    assert sorted({r.config.seed for r in plan}) == sorted(raw["grid"]["seed"]) and len(raw["grid"]["seed"]) >= 2


def test_dry_run_reports_new_resume_restart_done_and_refuses_a_changed_run(tmp_path):
    sweep_file = write_sweep(tmp_path / "s.yaml", {"seed": [0, 1, 2, 3, 4]}, out=str(tmp_path / "runs"))
    plan = plan_sweep(load_sweep(sweep_file))
    done, resume, restart, new, running = plan
    for run in (done, resume, restart, running):
        run.path.mkdir(parents=True)
        run.config.save(run.path / "config.yaml")
        (run.path / "metrics.jsonl").write_text('{"step": 0, "val/accuracy": 0.0}\n')
    (done.path / "final").mkdir()
    (done.path / "final" / "DONE").write_text("{}")
    (resume.path / "checkpoints" / "step_000001").mkdir(parents=True)
    (resume.path / "checkpoints" / "step_000001" / "trainer_state.pt").write_bytes(b"x")
    (resume.path / "checkpoints" / "latest").write_text("step_000001")
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # rlvr train"])
    (running.path / LOCK).write_text(json.dumps({"pid": other.pid}))  # another sweep's live child
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        result = CliRunner().invoke(app, ["sweep", "--config", str(sweep_file), "dry_run=true"])
        new.path.mkdir()
        (new.path / LOCK).write_text(json.dumps({"pid": gone.pid}))  # a lock left by a killed sweep
        assert run_status(new.path, new.config) == ("new", "")
    finally:
        other.kill()
        other.wait()
    assert result.exit_code == 0, result.output
    statuses = {line.split()[1]: line.split()[0] for line in result.output.splitlines() if str(tmp_path) in line
                and "sweep" not in line}
    assert statuses == {str(done.path): "done", str(resume.path): "resume", str(restart.path): "restart",
                        str(new.path): "new", str(running.path): "running"}
    assert "1 done, 1 resume, 1 restart, 1 new, 1 running" in result.output
    assert not (new.path / "run.yaml").exists()  # a dry run writes nothing
    # what the runner does before launching `rlvr train --config <run>/run.yaml`
    by_name = {r.name: r for r in plan_sweep(load_sweep(sweep_file))}
    launch = _prepare(by_name[resume.name])
    assert yaml.safe_load(launch.read_text())["resume"] is True and (resume.path / "metrics.jsonl").is_file()
    launch = _prepare(by_name[restart.name])  # no checkpoint: the logs are kept aside, the run starts over
    assert yaml.safe_load(launch.read_text())["resume"] is False and not (restart.path / "metrics.jsonl").exists()
    assert len(list(restart.path.glob("metrics.jsonl.interrupted-*"))) == 1
    assert run_status(restart.path, restart.config) == ("new", "")
    # a finished run of another config is not silently taken for this one
    done.config.model_copy(update={"learning_rate": 3e-5}).save(done.path / "config.yaml")
    result = CliRunner().invoke(app, ["sweep", "--config", str(sweep_file), "dry_run=true"])
    assert result.exit_code == 2
    assert "changed" in result.output and "learning_rate: 3e-05 in the run dir, 1e-05 in the sweep" in result.output


def test_a_failed_run_is_reported_and_the_sweep_goes_on(tmp_path):
    (tmp_path / "empty_model").mkdir()
    sweep_file = write_sweep(tmp_path / "fail.yaml", {"seed": [0, 1]}, out=str(tmp_path / "runs"),
                             base={**BASE, "model": str(tmp_path / "empty_model")}, report=False)
    result = CliRunner().invoke(app, ["sweep", "--config", str(sweep_file)])
    assert result.exit_code == 1
    assert result.output.count("FAILED") == 2 and "0 ran, 0 skipped, 2 failed" in result.output
    assert not list((tmp_path / "runs").rglob(LOCK))


def test_sweep_runs_two_seeds_end_to_end_then_skips_them(tmp_path, model_dir):
    out = tmp_path / "runs"
    # a baseline whose group the summary cannot tell apart yet (one learning rate): a warning, no differences
    sweep_file = write_sweep(tmp_path / "sweeps" / "tiny.yaml", {"learning_rate": [1e-3], "seed": [0, 1]},
                             out=str(out), base={**BASE, "model": str(model_dir), "save_every": 1},
                             baseline="learning_rate=0.001")
    result = CliRunner().invoke(app, ["sweep", "--config", str(sweep_file)])
    assert result.exit_code == 0, result.output
    assert "no group 'learning_rate=0.001' among the logged runs yet" in result.output
    for seed in (0, 1):
        run = out / f"seed={seed}"
        assert (run / "final" / "DONE").is_file(), (run / "train.log").read_text()[-3000:]
        assert [r["step"] for r in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
        assert yaml.safe_load((run / "config.yaml").read_text())["seed"] == seed
        assert not (run / "checkpoints").exists()  # pruned once final/ holds the model
    assert "2 ran, 0 skipped, 0 failed" in result.output
    assert (out / "report.html").is_file() and (out / "summary.csv").is_file() and (out / "summary.json").is_file()
    stamp = (out / "seed=0" / "metrics.jsonl").stat().st_mtime_ns
    again = CliRunner().invoke(app, ["sweep", "--config", str(sweep_file)])
    assert again.exit_code == 0, again.output
    assert "skip seed=0 (done)" in again.output and "skip seed=1 (done)" in again.output
    assert "0 ran, 2 skipped, 0 failed" in again.output
    assert (out / "seed=0" / "metrics.jsonl").stat().st_mtime_ns == stamp

    # another sweep with the same runs reuses them (a third seed and another learning rate have no twin)
    other = tmp_path / "other"
    twin = write_sweep(tmp_path / "sweeps" / "twin.yaml", {"learning_rate": [1e-3, 1e-2], "seed": [0, 1, 2]},
                       out=str(other), base={**BASE, "model": str(model_dir), "save_every": 1}, reuse=[str(out)])
    plan = {r.name: r for r in plan_sweep(load_sweep(twin))}
    assert [n for n, r in plan.items() if r.status == "reuse"] == ["learning_rate=0.001,seed=0",
                                                                  "learning_rate=0.001,seed=1"]
    assert plan["learning_rate=0.001,seed=1"].source == out / "seed=1"
    assert plan["learning_rate=0.001,seed=2"].status == plan["learning_rate=0.01,seed=0"].status == "new"
    reused = [r for r in plan.values() if r.status == "reuse"]
    outcomes = run_sweep(load_sweep(twin), reused, echo=lambda line: None)
    assert [o.result for o in outcomes] == ["reused", "reused"]
    copy = other / "learning_rate=0.001,seed=1"
    assert (copy / "final").resolve() == (out / "seed=1" / "final").resolve() and (copy / "REUSED").is_file()
    assert read_jsonl(copy / "metrics.jsonl") == read_jsonl(out / "seed=1" / "metrics.jsonl")
    assert yaml.safe_load((copy / "config.yaml").read_text())["out"] == str(copy)
    assert run_status(copy, plan["learning_rate=0.001,seed=1"].config) == ("done", "")
    summary = summarize(load_groups([other]))
    assert [(r.seed, r.finished) for r in summary.runs] == [(0, True), (1, True)]


def _finish_fake(run, val):
    """What `rlvr train` leaves in a finished run directory (written by hand: the record logic needs no model)."""
    write_run(run.path, seed=run.config.seed, val=val)
    run.config.save(run.path / "config.yaml")  # the planned config, as `rlvr train` saves it
    (run.path / "final" / "model.safetensors").write_bytes(b"weights")


def test_the_start_model_digest_is_the_sha256_of_its_weight_files(tmp_path):
    import hashlib

    (tmp_path / "b.safetensors").write_bytes(b"second")
    (tmp_path / "a.safetensors").write_bytes(b"first")
    (tmp_path / "config.json").write_text("{}")
    assert model_digest(tmp_path) == hashlib.sha256(b"firstsecond").hexdigest()
    assert model_digest(tmp_path / "missing") is None and model_digest(Path("SmolLM2-135M-Instruct")) is None


def test_a_record_keeps_finished_runs_without_weights_and_a_fresh_machine_restores_them(tmp_path):
    out, record = tmp_path / "runs", tmp_path / "results" / "tiny"
    sweep_file = write_sweep(tmp_path / "tiny.yaml", {"learning_rate": [1e-5, 1e-4], "seed": [0, 1]}, out=str(out),
                             record=str(record), report=False)
    plan = plan_sweep(load_sweep(sweep_file))
    finals = {"learning_rate=1e-05,seed=0": 0.5, "learning_rate=1e-05,seed=1": 0.7, "learning_rate=0.0001,seed=0": 0.2}
    for run in plan:
        if run.name in finals:
            _finish_fake(run, (0.1, 0.3, finals[run.name]))
    plan = plan_sweep(load_sweep(sweep_file))
    assert [r.status for r in plan] == ["done", "done", "done", "new"]
    lines = []
    outcomes = run_sweep(load_sweep(sweep_file), [r for r in plan if r.status == "done"], echo=lines.append)
    assert [o.result for o in outcomes] == ["skipped"] * 3
    assert sum(line.startswith("kept the record of") for line in lines) == 3
    kept = record / "learning_rate=1e-05,seed=1"
    assert sorted(p.name for p in kept.iterdir()) == ["DONE", "RECORD.json", "config.yaml", "metrics.jsonl",
                                                      "rollouts.jsonl"]
    info = json.loads((kept / "RECORD.json").read_text())
    assert info["machine"]["cores"] == os.cpu_count() and info["start_model_sha256"] is None  # a hub name
    from rlvr.core.devices import cpu_has_native

    assert info["machine"]["native_bf16"] is cpu_has_native("bfloat16")  # False: its bf16 config ran in fp32
    assert json.loads((kept / "DONE").read_text()) == {"val/accuracy": 0.7}
    assert read_jsonl(kept / "metrics.jsonl") == read_jsonl(out / "learning_rate=1e-05,seed=1" / "metrics.jsonl")
    # a record that already keeps the run is not written again
    stamp = (kept / "metrics.jsonl").stat().st_mtime_ns
    run_sweep(load_sweep(sweep_file), [r for r in plan if r.status == "done"], echo=lines.append)
    assert (kept / "metrics.jsonl").stat().st_mtime_ns == stamp

    # a fresh machine: runs/ is gone, the record is in the checkout; nothing is trained again
    shutil.rmtree(out)
    plan = plan_sweep(load_sweep(sweep_file))
    assert [r.status for r in plan] == ["recorded", "recorded", "recorded", "new"]
    assert plan[0].source == record / plan[0].name
    outcomes = run_sweep(load_sweep(sweep_file), plan[:3], echo=lambda line: None)
    assert [(o.result, o.val_accuracy) for o in outcomes] == [("restored", 0.5), ("restored", 0.7), ("restored", 0.2)]
    restored = out / "learning_rate=1e-05,seed=1"
    assert (restored / "DONE").is_file() and not (restored / "final").exists()
    assert yaml.safe_load((restored / "config.yaml").read_text())["out"] == str(restored)
    assert run_status(restored, plan[1].config) == ("done", "")
    assert [r.status for r in plan_sweep(load_sweep(sweep_file))] == ["done", "done", "done", "new"]
    # summaries read records (restored or in place) as finished runs, with the same numbers as the originals
    for root in (out, record):
        summary = summarize(load_groups([root]))
        assert [(r.seed, r.finished, r.final_val_accuracy) for r in summary.runs] == [
            (0, True, 0.5), (1, True, 0.7), (0, True, 0.2)]
    # `rlvr train` into a restored record refuses rather than overwrite its logs
    with pytest.raises(FileExistsError, match="already holds a run"):
        from rlvr.stages.run import start_run
        start_run(plan[1].config)

    # a record made before a field existed matches while the sweep keeps that field's default (the old behaviour)
    kept_cfg = yaml.safe_load((kept / "config.yaml").read_text())
    (kept / "config.yaml").write_text(yaml.safe_dump({k: v for k, v in kept_cfg.items() if k != "eval_start_cache"}))
    shutil.rmtree(out / "learning_rate=1e-05,seed=1")
    assert plan_sweep(load_sweep(sweep_file))[1].status == "recorded"
    assert plan_sweep(load_sweep(sweep_file, ["eval_start_cache=false"]))[1].status == "new"
    restore_record(plan_sweep(load_sweep(sweep_file))[1])

    # a record of another config is not taken for this run: it trains, and its record is replaced when it finishes
    changed = record / "learning_rate=0.0001,seed=0"
    yaml_cfg = yaml.safe_load((changed / "config.yaml").read_text())
    (changed / "config.yaml").write_text(yaml.safe_dump({**yaml_cfg, "group_size": 4}))
    shutil.rmtree(out / "learning_rate=0.0001,seed=0")
    run = {r.name: r for r in plan_sweep(load_sweep(sweep_file))}["learning_rate=0.0001,seed=0"]
    assert run.status == "new" and "keeps another config" in run.detail
    _finish_fake(run, (0.1, 0.4))
    run_sweep(load_sweep(sweep_file), [run], echo=lambda line: None)  # done: its record is written anew
    assert yaml.safe_load((changed / "config.yaml").read_text())["group_size"] == 2
    assert json.loads((changed / "DONE").read_text()) == {"val/accuracy": 0.4}
    assert not list(record.glob(".*.tmp"))

    # another sweep reuses a record like a finished run: logs and DONE copied, no weights to link
    twin = write_sweep(tmp_path / "twin.yaml", {"learning_rate": [1e-5], "seed": [0, 1, 2]}, out=str(tmp_path / "twin"),
                       reuse=[str(record)], report=False)
    plan = plan_sweep(load_sweep(twin))
    assert [r.status for r in plan] == ["reuse", "reuse", "new"]
    run_sweep(load_sweep(twin), plan[:2], echo=lambda line: None)
    copy = tmp_path / "twin" / "seed=1"
    assert (copy / "DONE").is_file() and (copy / "REUSED").is_file() and not (copy / "final").exists()
    # the reused run keeps the record's provenance, and so does its record in the other sweep (not this machine's)
    assert (copy / "RECORD.json").read_text() == (record / "learning_rate=1e-05,seed=1" / "RECORD.json").read_text()
    from rlvr.experiments.sweep_records import record_run
    other = record_run(copy, tmp_path / "twin_record" / "seed=1", plan[1].config)
    assert (other / "RECORD.json").read_text() == (copy / "RECORD.json").read_text()
    assert summarize(load_groups([copy])).runs[0].final_val_accuracy == 0.7


def test_seed004_results_page_follows_the_runs(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed004_results", SWEEPS.parent / "examples" / "seed004_results.py")
    results = importlib.util.module_from_spec(spec)
    sys.modules["seed004_results"] = results  # its dataclasses look their module up while it loads
    spec.loader.exec_module(results)
    root = tmp_path / "sweeps" / "on_policy_variants"
    for algorithm, finals in (("grpo", (0.5, 0.6, 0.7)), ("grpo_constant", (0.2, 0.4, 0.3)),
                              ("grpo_token", (0.25, 0.45, 0.35))):
        for seed, final in enumerate(finals):
            write_run(root / f"algorithm={algorithm},seed={seed}", algorithm, seed, (0.1, 0.2, final))
    write_run(root / "algorithm=maxrl,seed=0", "maxrl", 0, (0.1, 0.9), finished=False)  # not counted yet
    (root / "algorithm=grpo,seed=2" / "RECORD.json").write_text(json.dumps(
        {"machine": {"cpu": "AMD EPYC"}, "start_model_sha256": "0123456789abcdef"}))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{results.README_BLOCK[0]}\nold table\n{results.README_BLOCK[1]}\n\nafter\n")
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md", readme).read_text()
    text = readme.read_text()
    assert "old table" not in text and text.endswith(f"{results.README_BLOCK[1]}\n\nafter\n")
    assert "| sequence vs constant normalisation (grpo - grpo_constant) | **+0.300 ± 0.227** | - |" in text
    assert "Not counted yet (unfinished): algorithm=maxrl,seed=0." in page
    assert "MaxRL vs GRPO: not measured yet (algorithm=maxrl has no finished runs)" in page
    # grpo [0.5, 0.6, 0.7] - grpo_constant [0.2, 0.4, 0.3]: 0.3 +- 2.7764 * sqrt(0.01 * 2/3) = 0.227
    assert ("- sequence vs constant normalisation (grpo - grpo_constant): greedy +0.300 ± 0.227, larger than the "
            "spread") in page
    assert "| algorithm=grpo | 3 (3) | 0.600 ± 0.248 (df 2) | 0.100 |" in page
    # grpo - grpo_token: 0.25 > 0.227, also resolved; maxrl's unfinished run is not in the answer
    assert ("**Answer, final greedy accuracy:** highest algorithm=grpo (0.600); within the spread of it: none; below it "
            "by more than the spread: algorithm=grpo_constant (0.300), algorithm=grpo_token (0.350).") in page
    # grpo_token - grpo_constant: +0.05, pooled variance 0.01; at 200 questions and accuracy 0.325 the binomial part
    # is 0.0011, leaving 0.0089 > 0.05^2 * 3 / (2 * 2.7764^2) = 0.00049 to training: no number of questions;
    # 32 seeds would: t(62) * sqrt(0.02 / 32) = 1.9990 * 0.025 = 0.04998 < 0.05 (31: 2.0003 * 0.02540 = 0.0508)
    assert ("greedy +0.050 ± 0.227, within the spread (32 runs per group would resolve it); at 3 seeds no number of "
            "validation questions would") in page
    assert ("Runs: 8 on unrecorded, 1 on AMD EPYC. Start model (sha256 of the weights): unrecorded (8 runs, step-0 "
            "greedy accuracy 0.100); 0123456789ab (1 run, step-0 greedy accuracy 0.100).") in page
    assert "std normalisation on vs off (grpo_constant - dr_grpo): not measured yet (algorithm=dr_grpo has no finished runs)" in page
    assert page.count("**Not run yet.**") == 3 and "rlvr sweep --config sweeps/lr_sweep.yaml" in page
    assert "![val_reward](results/on_policy_variants/val_reward.png)" in page
    assert "| sequence vs constant normalisation (grpo - grpo_constant) | **+0.300 ± 0.227** | - |" in page
    assert "| MaxRL vs GRPO | not measured yet | |" in page
    # write_run logs a step a second from t = 1000 (steps 0-4) and step 0's validation takes no time
    assert "| on_policy_variants | algorithm=grpo,seed=1 | 0.1 | - | 0.600 | - |" in page
    figures = tmp_path / "docs" / "results" / "on_policy_variants"
    assert (figures / "val_reward.png").is_file() and (figures / "report.html").is_file()
    assert "†" not in page  # one start model named (the others unrecorded): nothing to take out

    # grpo_token rebuilt from another SFT checkpoint whose step 0 scored higher: the pair also compares each
    # run's gain over its own step 0 (grpo_token: 0.45 - 0.3, 0.65 - 0.3, 0.55 - 0.3 = 0.15, 0.35, 0.25;
    # grpo_constant: 0.1, 0.3, 0.2), which here tells the same +0.05 as the finals less the 0.2 head start
    for seed, final in enumerate((0.45, 0.65, 0.55)):
        shutil.rmtree(root / f"algorithm=grpo_token,seed={seed}")
        run = write_run(root / f"algorithm=grpo_token,seed={seed}", "grpo_token", seed, (0.3, 0.4, final))
        (run / "RECORD.json").write_text(json.dumps({"start_model_sha256": "fedcba9876543210"}))
        (root / f"algorithm=grpo_constant,seed={seed}" / "RECORD.json").write_text(
            json.dumps({"start_model_sha256": "0123456789abcdef"}))
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md").read_text()
    assert ("| token-mean vs constant normalisation (grpo_token - grpo_constant) † | **+0.250 ± 0.227** / +0.050 ± "
            "0.227 | - |") in page
    assert "† The two sides started from different SFT checkpoints" in page
    assert "greedy gain over step 0 +0.050 ± 0.227, within the spread" in page
    # grpo_token now [0.45, 0.65, 0.55]: grpo - grpo_token +0.05 +- 0.227, within; grpo - grpo_constant beyond
    assert ("**Answer, final greedy accuracy:** highest algorithm=grpo (0.600); within the spread of it: "
            "algorithm=grpo_token (0.550); below it by more than the spread: algorithm=grpo_constant (0.300).") in page
    assert "(The groups began from different SFT checkpoints" in page
    # step times are labelled with the processor when a sweep's runs ran on more than one
    run = type("Run", (), {"path": root / "algorithm=grpo,seed=2"})()
    (run.path / "RECORD.json").write_text(json.dumps({"machine": {"cpu": "Intel(R) Xeon(R) Processor"}}))
    assert results.cpu_name(run) == "Intel Xeon"
    (run.path / "RECORD.json").write_text(json.dumps({"machine": {"cpu": "AMD EPYC", "native_bf16": False}}))
    assert results.cpu_name(run) == "AMD EPYC, fp32"  # its bf16 config ran in fp32 (no native bf16 kernels)
    # a side still short of seeds says so: its interval rests on the other side's spread alone
    for seed in (1, 2):
        shutil.rmtree(root / f"algorithm=grpo_token,seed={seed}")
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md").read_text()
    assert "| token-mean vs constant normalisation (grpo_token - grpo_constant) (n = 1 vs 3) † |" in page
    line = next(x for x in page.splitlines() if x.startswith("- token-mean vs constant normalisation"))
    assert "validation questions would" not in line  # that estimate assumes as many seeds a side


def test_seed004_results_page_says_when_a_group_never_trained(tmp_path):
    """A prompt whose rollouts all score 0 gives every group one reward: no advantage, no update. The page must
    say so instead of reading its (start model's) accuracy as the prompt's result."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed004_results", SWEEPS.parent / "examples" / "seed004_results.py")
    results = importlib.util.module_from_spec(spec)
    sys.modules["seed004_results"] = results
    spec.loader.exec_module(results)
    root = tmp_path / "sweeps" / "prompt_ablation"
    for seed in range(3):
        write_run(root / f"prompt=r1_zero,seed={seed}", seed=seed, val=(0.6, 0.65, 0.7 + 0.01 * seed), prompt="r1_zero")
        run = write_run(root / f"prompt=question_only,seed={seed}", seed=seed, val=(0.0, 0.0, 0.0),
                        prompt="question_only")
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        for row in rows[1:]:
            row.update({"train/updates_trained": 0, "train/reward": 0.0, "rollout/mean_tokens": 15.0})
            row.pop("train/loss")
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        rows = [json.loads(line) for line in (root / f"prompt=r1_zero,seed={seed}" / "metrics.jsonl").read_text()
                .splitlines()]  # one trained update a step: not flagged
        for row in rows[1:]:
            row["train/updates_trained"] = 1
        (root / f"prompt=r1_zero,seed={seed}" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md").read_text()
    assert ("**prompt=question_only never trained:** in its 3 run(s), at each of 4 steps, every group of rollouts got "
            "one reward (mean train reward 0.000, mean response 15.0 tokens)") in page
    assert "prompt=r1_zero never trained" not in page
    # 0 - [0.70, 0.71, 0.72]: -0.71, pooled s^2 = 0.0001 / 2, t(4) = 2.7764: 2.7764 * sqrt(0.00005 * 2/3) = 0.016
    assert "| question_only vs r1_zero ‡ | **-0.710 ± 0.016** | - |" in page
    assert "‡ One side never trained" in page
    assert ("**Answer, final greedy accuracy:** highest prompt=r1_zero (0.710); within the spread of it: none; below "
            "it by more than the spread: prompt=question_only (0.000, never trained).") in page
    assert "| r1_zero three-shot vs r1_zero | not measured yet | |" in page
    assert "AdamW was handed zero gradients from the first step, so its moments stayed 0 and the weights did not move" in page
    # with weight decay, AdamW shrinks the weights even at zero gradient: the page must not claim they stayed put
    for seed in range(3):
        config = root / f"prompt=question_only,seed={seed}" / "config.yaml"
        config.write_text(yaml.safe_dump({**yaml.safe_load(config.read_text()), "weight_decay": 0.01}))
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md").read_text()
    assert "only AdamW's weight decay moved the weights" in page and "the weights did not move" not in page
    # one run a side: no interval, so the answer neither ties nor separates them
    for seed in (1, 2):
        shutil.rmtree(root / f"prompt=question_only,seed={seed}")
        shutil.rmtree(root / f"prompt=r1_zero,seed={seed}")
    page = results.write_results(tmp_path / "sweeps", tmp_path / "docs" / "results.md").read_text()
    assert ("**Answer, final greedy accuracy:** highest prompt=r1_zero (0.700); within the spread of it: none; below "
            "it by more than the spread: none; one run a side, no interval yet: prompt=question_only (0.000, never "
            "trained).") in page


def test_seed004_wall_time_leaves_out_the_gap_of_a_resume():
    import importlib.util

    spec = importlib.util.spec_from_file_location("seed004_results", SWEEPS.parent / "examples" / "seed004_results.py")
    results = importlib.util.module_from_spec(spec)
    sys.modules["seed004_results"] = results
    spec.loader.exec_module(results)
    rows = [{"step": 0, "time": 0.0, "val/seconds": 30.0, "val_sampled/seconds": 30.0},
            {"step": 1, "time": 50.0, "time/step": 45.0},
            {"step": 2, "time": 130.0, "time/step": 40.0, "time/validate": 30.0},  # 10 s of checkpoint: counted
            {"step": 3, "time": 1330.0, "time/step": 50.0}]  # resumed a session later: 50 + 60 s of slack
    run = type("Run", (), {"metrics": rows})()
    assert results.wall_minutes(run) == pytest.approx((60 + 50 + 80 + 110) / 60)
    rows[0]["time/validate_cached"] = True
    assert results.wall_minutes(run) == pytest.approx((50 + 80 + 110) / 60)


def test_gsm8k_comparison_keeps_each_seed_and_pairs_it_with_its_own_start_model(tmp_path, monkeypatch, capsys):
    """examples/gsm8k_rl_vs_sft.py with its rlvr commands replaced by files: a recorded seed is not run again in a
    fresh checkout, and the table's difference is paired per seed."""
    import importlib.util

    monkeypatch.syspath_prepend(str(SWEEPS.parent / "examples"))
    spec = importlib.util.spec_from_file_location("gsm8k_rl_vs_sft", SWEEPS.parent / "examples" / "gsm8k_rl_vs_sft.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    monkeypatch.chdir(tmp_path)
    calls = []
    accuracy = {("sft", 0): 0.02, ("sft", 1): 0.03, ("grpo", 0): 0.05, ("grpo", 1): 0.04}

    def build_sft():
        calls.append("sft")
        (tmp_path / "runs" / "sft_gsm8k" / "final").mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / "sft_gsm8k" / "final" / "DONE").write_text("{}")

    def train(seed, steps):
        calls.append(f"train {seed}")
        run = write_run(tmp_path / example.run_dir(seed, steps), seed=seed, val=(0.02, 0.03))
        return run / "final"

    def evaluate(model, name, mode, seed=0):
        out = tmp_path / "runs" / "eval" / f"{name}-{mode}" / "summary.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        kind = "sft" if name == "sft" else "grpo"
        out.write_text(json.dumps({"accuracy": accuracy[kind, int(name[-1]) if kind == "grpo" else current[0]],
                                   "n": 1319, "format_rate": 0.9}))
        return out

    current = [0]
    monkeypatch.setattr(example, "build_sft", build_sft)
    monkeypatch.setattr(example, "train", train)
    monkeypatch.setattr(example, "evaluate", evaluate)
    monkeypatch.setattr(sys, "argv", ["gsm8k_rl_vs_sft.py", "--seeds", "0"])
    example.main()
    kept = tmp_path / "results" / "gsm8k_rl_vs_sft" / "grpo_gsm8k_dynamic_s0"
    assert sorted(p.name for p in (kept / "test").iterdir()) == ["grpo-greedy.json", "sft-greedy.json"]
    assert (kept / "DONE").is_file() and not (kept / "final").exists()
    # a fresh checkout: runs/ is gone; seed 0 is recorded, seed 1 is built on a new SFT checkpoint
    shutil.rmtree(tmp_path / "runs")
    calls.clear()
    current[0] = 1
    monkeypatch.setattr(sys, "argv", ["gsm8k_rl_vs_sft.py", "--seeds", "0", "1"])
    example.main()
    assert calls == ["sft", "train 1"]
    out = capsys.readouterr().out
    # paired: (0.05 - 0.02, 0.04 - 0.03) = (0.03, 0.01): mean 0.02, s = 0.01414, t(1) = 12.706 -> 12.706 * 0.01 = 0.1271
    assert "GRPO - SFT +0.0200 +- 0.1271" in out and "seed 1 (SFT ?): SFT 0.0300 +- 0.0092 -> GRPO 0.0400" in out

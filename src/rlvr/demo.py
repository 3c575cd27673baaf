"""`rlvr demo` (what `make demo` runs): the whole pipeline on the embedded default model and data.

    0. prompting  the default model on GSM8K with the r1_zero prompt (greedy): what it does untrained
    1. baseline   the same on the demo's task (default: generated arithmetic word problems)
    2. sft        teach the r1_zero answer format on worked training solutions
    3. grpo       GRPO from the SFT checkpoint
    4. final      evaluate the SFT and GRPO models on the same test questions
    5. a before/after table with 95 % intervals (also written to <out>/results.md)

Every stage writes into its own directory under `out` and is skipped when it already finished there, so an
interrupted demo picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from rlvr.config import DemoConfig, EvalConfig, SFTConfig, TrainConfig, load_config

log = logging.getLogger(__name__)


def _eval(cfg: DemoConfig, model: str, out: Path, baseline: bool = False, limit: int | None = None) -> dict:
    from rlvr.evaluate import run_eval

    summary_file = out / "summary.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())
    dataset, limit, tokens = ((cfg.baseline_dataset, cfg.baseline_limit, cfg.baseline_max_new_tokens) if baseline
                              else (cfg.dataset, limit or cfg.eval_limit, cfg.eval_max_new_tokens))
    eval_cfg = load_config(EvalConfig, overrides=dict(
        model=model, dataset=dataset, split="test", limit=limit, max_new_tokens=tokens,
        dtype="bfloat16", out=str(out), examples_per_category=1, seed=cfg.seed))
    return run_eval(eval_cfg)


def run_demo(cfg: DemoConfig) -> list[dict]:
    from rlvr.sft import train_sft
    from rlvr.rl import train_grpo

    out = Path(cfg.out)
    saved = out / "config.yaml"
    if saved.is_file():  # finished stages are reused: only when they were made by this same config
        import yaml

        before = yaml.safe_load(saved.read_text()) or {}
        changed = sorted(k for k, v in cfg.model_dump(mode="json").items() if before.get(k) != v)
        if changed:
            raise FileExistsError(f"{out} holds a demo run with other settings ({', '.join(changed)}); its finished "
                                  "stages would be reused: pass another out=... or remove that directory")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(saved)
    started = time.perf_counter()
    rows = []
    timings = {}

    prompting = None
    if cfg.baseline_dataset:
        t = time.perf_counter()
        prompting = _eval(cfg, cfg.model, out / "eval_prompting", baseline=True)
        timings[f"{cfg.baseline_dataset} prompting baseline"] = time.perf_counter() - t
    t = time.perf_counter()
    # the untrained model writes no answer format on any question: its row needs fewer of them (named in it)
    untrained = min(cfg.untrained_eval_limit or cfg.eval_limit, cfg.eval_limit)
    name = "baseline" if untrained == cfg.eval_limit else f"baseline (first {untrained})"
    rows.append((name, _eval(cfg, cfg.model, out / "eval_baseline", limit=untrained)))
    timings["baseline eval"] = time.perf_counter() - t

    t = time.perf_counter()
    sft_cfg = load_config(SFTConfig, overrides=dict(
        model=cfg.model, dataset=cfg.dataset, out=str(out / "sft"), seed=cfg.seed, steps=cfg.sft_steps,
        batch_size=cfg.sft_batch_size, microbatch_size=min(8, cfg.sft_batch_size), learning_rate=cfg.sft_learning_rate,
        eval_every=0, eval_at_start=False, eval_at_end=False, resume=True))
    train_sft(sft_cfg)
    timings["sft"] = time.perf_counter() - t
    sft_model = str(out / "sft" / "final")
    t = time.perf_counter()
    rows.append(("after SFT", _eval(cfg, sft_model, out / "eval_sft")))
    timings["sft eval"] = time.perf_counter() - t

    t = time.perf_counter()
    grpo_cfg = load_config(TrainConfig, overrides=dict(
        model=sft_model, dataset=cfg.dataset, out=str(out / "grpo"), seed=cfg.seed, algorithm=cfg.grpo_algorithm,
        steps=cfg.grpo_steps, learning_rate=cfg.grpo_learning_rate, rollout_batch_size=cfg.rollout_batch_size,
        group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens, eval_every=0, eval_at_start=False,
        eval_at_end=False, resume=True))
    train_grpo(grpo_cfg)
    timings["grpo"] = time.perf_counter() - t
    t = time.perf_counter()
    rows.append(("after SFT + GRPO", _eval(cfg, str(out / "grpo" / "final"), out / "eval_grpo")))
    timings["grpo eval"] = time.perf_counter() - t

    table = _table(rows, cfg, timings, time.perf_counter() - started, prompting)
    (out / "results.md").write_text(table, encoding="utf-8")
    if prompting is not None:
        _print([(f"{cfg.baseline_dataset}, prompting only", prompting)],
               f"prompting baseline on {cfg.baseline_dataset} test ({cfg.baseline_limit} questions, greedy)")
    _print(rows, f"before / after on {cfg.dataset} test ({cfg.eval_limit} questions, greedy)")
    print(f"\nwrote {out / 'results.md'}; total {time.perf_counter() - started:.0f} s")
    return [dict(stage=name, **summary) for name, summary in rows]


_COLUMNS = ("stage", "accuracy", "95% interval", "format rate", "correct", "formatted, wrong", "unformatted",
            "mean tokens")


def _cells(name: str, s: dict) -> list[str]:
    c, p, n = s["categories"], s["accuracy"], s["n"]
    half = 1.96 * math.sqrt(p * (1 - p) / n) if n else 0.0  # normal approximation of a binomial proportion
    return [name, f"{p:.3f}", f"+- {half:.3f}", f"{s['format_rate']:.3f}", str(c["format1_answer1"]),
            str(c["format1_answer0"]), str(c["format0_answer0"]), f"{s['mean_response_tokens']:.0f}"]


def _table(rows, cfg: DemoConfig, timings: dict, total: float, prompting: dict | None = None) -> str:
    head = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines = [f"# rlvr demo: {cfg.model}", ""]
    if prompting is not None:
        lines += [f"Prompting baseline on {cfg.baseline_dataset} test (first {cfg.baseline_limit} questions, greedy, "
                  "no training):", "", *head, "| " + " | ".join(_cells("prompting only", prompting)) + " |", ""]
    lines += [f"Training on {cfg.dataset}: test (first {cfg.eval_limit} questions, greedy) before and after:", "",
              *head, *["| " + " | ".join(_cells(name, s)) + " |" for name, s in rows]]
    lines += ["", "| phase | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in timings.items()] + [f"| total | {total:.0f} |", ""]
    return "\n".join(lines)


def _print(rows, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for col in _COLUMNS:
        table.add_column(col, justify="right" if col != "stage" else "left")
    for name, s in rows:
        table.add_row(*_cells(name, s))
    Console().print(table)

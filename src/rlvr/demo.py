"""`rlvr demo` (what `make demo` runs): the whole pipeline on the embedded default model and data.

    1. baseline   evaluate the default model with the r1_zero prompt (greedy)
    2. sft        teach the r1_zero answer format on worked training solutions
    3. grpo       a short GRPO run from the SFT checkpoint
    4. final      evaluate the SFT and GRPO models on the same questions
    5. a before/after table (also written to <out>/results.md)

Every stage writes into its own directory under `out` and is skipped when it already finished there, so an
interrupted demo picks up where it stopped.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from rlvr.config import DemoConfig, EvalConfig, SFTConfig, TrainConfig, load_config

log = logging.getLogger(__name__)


def _eval(cfg: DemoConfig, model: str, out: Path) -> dict:
    from rlvr.evaluate import run_eval

    summary_file = out / "summary.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())
    eval_cfg = load_config(EvalConfig, overrides=dict(
        model=model, dataset=cfg.dataset, split="test", limit=cfg.eval_limit, max_new_tokens=cfg.eval_max_new_tokens,
        dtype="bfloat16", out=str(out), examples_per_category=1, seed=cfg.seed))
    return run_eval(eval_cfg)


def run_demo(cfg: DemoConfig) -> list[dict]:
    from rlvr.sft import train_sft
    from rlvr.rl import train_grpo

    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.yaml")
    started = time.perf_counter()
    rows = []
    timings = {}

    t = time.perf_counter()
    rows.append(("baseline", _eval(cfg, cfg.model, out / "eval_baseline")))
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

    table = _table(rows, cfg, timings, time.perf_counter() - started)
    (out / "results.md").write_text(table, encoding="utf-8")
    _print(rows, cfg)
    print(f"\nwrote {out / 'results.md'}; total {time.perf_counter() - started:.0f} s")
    return [dict(stage=name, **summary) for name, summary in rows]


def _table(rows, cfg: DemoConfig, timings: dict, total: float) -> str:
    lines = [f"# rlvr demo: {cfg.model} on {cfg.dataset} test (first {cfg.eval_limit} questions, greedy)", "",
             "| stage | accuracy | format rate | correct | formatted, wrong | unformatted | mean tokens |",
             "|---|---|---|---|---|---|---|"]
    for name, s in rows:
        c = s["categories"]
        lines.append(f"| {name} | {s['accuracy']:.3f} | {s['format_rate']:.3f} | {c['format1_answer1']} | "
                     f"{c['format1_answer0']} | {c['format0_answer0']} | {s['mean_response_tokens']:.0f} |")
    lines += ["", "| phase | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in timings.items()] + [f"| total | {total:.0f} |", ""]
    return "\n".join(lines)


def _print(rows, cfg: DemoConfig) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"before / after on {cfg.dataset} test ({cfg.eval_limit} questions, greedy)")
    for col in ("stage", "accuracy", "format rate", "correct", "formatted, wrong", "unformatted", "mean tokens"):
        table.add_column(col, justify="right" if col != "stage" else "left")
    for name, s in rows:
        c = s["categories"]
        table.add_row(name, f"{s['accuracy']:.3f}", f"{s['format_rate']:.3f}", str(c["format1_answer1"]),
                      str(c["format1_answer0"]), str(c["format0_answer0"]), f"{s['mean_response_tokens']:.0f}")
    Console().print(table)

"""`rlvr demo` (what `make demo` runs): the whole pipeline on the embedded default model and data.

    0. prompting  the default model on GSM8K with the r1_zero prompt (greedy): what it does untrained, and right
                  after it why the rest exists (it never writes the answer format, so there is nothing to reward)
    1. baseline   the same on the demo's task (default: generated arithmetic word problems)
    2. sft        teach the r1_zero answer format on worked training solutions
    3. grpo       GRPO from the SFT checkpoint
    4. final      evaluate the SFT and GRPO models on the same test questions
    5. a before/after table with 95 % intervals (whole at 80 columns; every column in <out>/results.md), the
       gain of GRPO over SFT paired over the same test questions with its 95 % interval (said plainly when it
       includes 0), and a figure, <out>/results.png: the test accuracies with their intervals, and GRPO's validation accuracy
       (on `grpo_eval_limit` validation questions, every `grpo_eval_every` steps, with its interval) and
       training reward by step

Every stage writes into its own directory under `out` and is skipped when it already finished there (keeping
the time it took then); the training stages checkpoint every 10 steps and on Ctrl-C, so an interrupted demo
picks up where it stopped, inside a stage too. A "stage k of n" line before each stage says the time so far and
about how much is left.
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
    from rlvr.stages.evaluation import run_eval

    summary_file = out / "summary.json"
    if summary_file.is_file():
        return json.loads(summary_file.read_text())
    dataset, limit, tokens = ((cfg.baseline_dataset, cfg.baseline_limit, cfg.baseline_max_new_tokens) if baseline
                              else (cfg.dataset, limit or cfg.eval_limit, cfg.eval_max_new_tokens))
    eval_cfg = load_config(EvalConfig, overrides=dict(
        model=model, dataset=dataset, split="test", limit=limit, max_new_tokens=tokens,
        dtype="bfloat16", out=str(out), examples_per_category=1, seed=cfg.seed))
    return run_eval(eval_cfg)


# Each stage's share of a whole demo's time (2026-12-07, AMD EPYC with native bf16, 2 cores, 778 s in all, the
# GGUF already converted; evaluations on 1000 test questions): what is left is estimated from the stages done so
# far and these shares
_SHARES = {"prompting baseline": 0.012, "baseline eval": 0.010, "sft": 0.153, "sft eval": 0.163, "grpo": 0.477,
           "grpo eval": 0.186}


class _Stages:
    """"stage k of n: <name> (elapsed, about how long is left)" lines, and each stage's seconds, kept across
    re-runs in <out>/timings.json: a stage reused from an earlier run keeps the time it took then."""

    def __init__(self, out: Path, names: list[str]):
        self.path, self.names, self.started = out / "timings.json", names, time.perf_counter()
        self.saved = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.timings: dict[str, float] = {}
        self.reused: list[str] = []

    def run(self, name: str, done: bool, call):
        k = self.names.index(name) + 1
        elapsed = time.perf_counter() - self.started
        shares = [_SHARES.get(n, 0.1) for n in self.names]
        spent = sum(self.timings.get(n, 0.0) for n in self.names[: k - 1] if n not in self.reused)
        share_done = sum(sh for n, sh in zip(self.names[: k - 1], shares) if n not in self.reused)
        share_left = sum(shares[k - 1 :])
        left = f", about {spent / share_done * share_left / 60:.0f} min left" if spent > 0 and share_done else ""
        print(f"stage {k} of {len(self.names)}: {name}{' (done before: reused)' if done else ''} "
              f"[{elapsed / 60:.1f} min{left}]", flush=True)
        t = time.perf_counter()
        result = call()
        self.timings[name] = self.saved.get(name, time.perf_counter() - t) if done else time.perf_counter() - t
        if done:
            self.reused.append(name)
        self.path.write_text(json.dumps(self.timings, indent=1), encoding="utf-8")
        return result


def run_demo(cfg: DemoConfig) -> list[dict]:
    from rlvr.stages.run import RunInterrupted

    try:
        return _run_demo(cfg)
    except RunInterrupted as stopped:  # the stage's own line names its command; the demo's is the demo again
        raise RunInterrupted(f"{str(stopped).split('. Continue with:')[0]}. Run the same `rlvr demo` (or `make demo`) "
                             "again to continue from there") from None


def _run_demo(cfg: DemoConfig) -> list[dict]:
    from rlvr.training.rl import train_grpo
    from rlvr.training.sft import train_sft

    out = Path(cfg.out)
    saved = out / "config.yaml"
    if saved.is_file():  # finished stages are reused: only when they were made by this same config
        import yaml

        before = yaml.safe_load(saved.read_text()) or {}
        # (a field added to the demo since that run is not a difference: its finished stages stay valid)
        changed = sorted(k for k, v in cfg.model_dump(mode="json").items() if k in before and before[k] != v)
        if changed:
            raise FileExistsError(f"{out} holds a demo run with other settings ({', '.join(changed)}); its finished "
                                  "stages would be reused: pass another out=... or remove that directory")
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(saved)
    names = (["prompting baseline"] if cfg.baseline_dataset else []) + ["baseline eval", "sft", "sft eval", "grpo",
                                                                         "grpo eval"]
    stages = _Stages(out, names)
    rows = []
    finished = lambda d: (d / "summary.json").is_file() or (d / "final" / "DONE").is_file()  # noqa: E731

    prompting = None
    if cfg.baseline_dataset:
        prompting = stages.run("prompting baseline", finished(out / "eval_prompting"),
                               lambda: _eval(cfg, cfg.model, out / "eval_prompting", baseline=True))
        print(_why(prompting, cfg, names), flush=True)
    # the untrained model writes no answer format on any question: its row needs fewer of them (named in it)
    untrained = min(cfg.untrained_eval_limit or cfg.eval_limit, cfg.eval_limit)
    name = "baseline" if untrained == cfg.eval_limit else f"baseline (first {untrained})"
    rows.append((name, stages.run("baseline eval", finished(out / "eval_baseline"),
                                  lambda: _eval(cfg, cfg.model, out / "eval_baseline", limit=untrained))))

    # both training stages checkpoint (every 10 steps, and on Ctrl-C), so a second `rlvr demo` resumes inside them
    sft_cfg = load_config(SFTConfig, overrides=dict(
        model=cfg.model, dataset=cfg.dataset, out=str(out / "sft"), seed=cfg.seed, steps=cfg.sft_steps,
        batch_size=cfg.sft_batch_size, microbatch_size=min(8, cfg.sft_batch_size), learning_rate=cfg.sft_learning_rate,
        eval_every=0, eval_at_start=False, eval_at_end=False, save_every=10, keep_checkpoints=1, resume=True))
    stages.run("sft", finished(out / "sft"), lambda: train_sft(sft_cfg))
    sft_model = str(out / "sft" / "final")
    rows.append(("after SFT", stages.run("sft eval", finished(out / "eval_sft"),
                                         lambda: _eval(cfg, sft_model, out / "eval_sft"))))

    grpo_cfg = load_config(TrainConfig, overrides=dict(
        model=sft_model, dataset=cfg.dataset, out=str(out / "grpo"), seed=cfg.seed, algorithm=cfg.grpo_algorithm,
        steps=cfg.grpo_steps, learning_rate=cfg.grpo_learning_rate, rollout_batch_size=cfg.rollout_batch_size,
        group_size=cfg.group_size, max_new_tokens=cfg.max_new_tokens, save_every=10, keep_checkpoints=1, resume=True,
        # two groups a forward pass (the same update, to float rounding): packed, the instructions they share run
        # once and the matmuls are larger; 0.67-0.87 of the update time at microbatch 8 (issue 67, bench/README.md)
        microbatch_size=min(16, cfg.rollout_batch_size),
        # the figure's curve: validation questions (not the test ones of the table), greedy, from step 0
        eval_every=cfg.grpo_eval_every, eval_at_start=bool(cfg.grpo_eval_every),
        eval_at_end=bool(cfg.grpo_eval_every), eval_limit=cfg.grpo_eval_limit,
        eval_max_new_tokens=cfg.eval_max_new_tokens))
    stages.run("grpo", finished(out / "grpo"), lambda: train_grpo(grpo_cfg))
    rows.append(("after SFT + GRPO", stages.run("grpo eval", finished(out / "eval_grpo"),
                                                lambda: _eval(cfg, str(out / "grpo" / "final"), out / "eval_grpo"))))

    total = sum(stages.timings.values())
    gain = paired_gain(out / "eval_sft", out / "eval_grpo")
    figure = _figure(rows, out)
    table = _table(rows, cfg, stages.timings, total, prompting, stages.reused, gain)
    (out / "results.md").write_text(table + (f"\n![before and after]({figure.name})\n" if figure else ""),
                                    encoding="utf-8")
    if prompting is not None:
        _print([(f"{cfg.baseline_dataset}, prompting", prompting)],
               f"{cfg.baseline_dataset} test, first {cfg.baseline_limit} questions, greedy, no training")
        print(_why(prompting, cfg, names))
    _print(rows, f"{cfg.dataset} test accuracy, {cfg.eval_limit} questions, greedy")
    if gain is not None:
        print(_paired_line(gain))
    curve = _validation_curve(out)
    if curve:
        print(f"validation accuracy during GRPO ({cfg.grpo_eval_limit} validation questions, greedy): "
              + " -> ".join(f"{acc:.2f} (step {step})" for step, acc in curve))
    reused = f"; reused from an earlier run: {', '.join(stages.reused)}" if stages.reused else ""
    print(f"\nthe demo took {total / 60:.1f} min (stage times in results.md{reused})")
    print(f"wrote {out / 'results.md'}" + (f" and {figure}" if figure else ""))
    return [dict(stage=name, **summary) for name, summary in rows]


def _why(prompting: dict, cfg: DemoConfig, names: list[str]) -> str:
    """What the prompting baseline shows, with the stages that answer it: without the answer format there is no
    answer for the grader to read and no reward for RL to follow."""
    import textwrap

    n, formatted = prompting["n"], round(prompting["format_rate"] * prompting["n"])
    right, stage = prompting["categories"]["format1_answer1"], {name: names.index(name) + 1 for name in names}
    return textwrap.fill(
        f"why the rest exists: prompted alone, the untrained model wrote the <answer> format the grader reads in "
        f"{formatted} of {n} answers ({right} right; greedy, at most {cfg.baseline_max_new_tokens} new tokens). A "
        f"reward can only follow answers it can read: SFT (stage {stage['sft']}) teaches the format on worked "
        f"solutions, then GRPO (stage {stage['grpo']}) rewards right answers -- both on {cfg.dataset}, where stage "
        f"{stage['baseline eval']} shows the same start.", width=80)


def paired_gain(before: Path, after: Path) -> dict | None:
    """after - before on the questions both evaluations answered (matched by id, one sample each): the mean
    difference of the answer reward with its 95 % t-interval over questions, and how many questions each way.
    Far tighter than two independent intervals: a question both models get right (or wrong) adds no noise."""
    from rlvr.core.tracking import read_jsonl
    from rlvr.experiments.stats import spread

    paths = [d / "results.jsonl" for d in (before, after)]
    if not all(p.is_file() for p in paths):
        return None
    a, b = ({r["id"]: r["answer_reward"] for r in read_jsonl(p) if r.get("sample_index", 0) == 0} for p in paths)
    shared = [k for k in a if k in b]
    if len(shared) < 2:
        return None
    d = [b[k] - a[k] for k in shared]
    s = spread(d)
    return {"n": len(shared), "mean": s.mean, "half_width": s.half_width, "gained": sum(x > 0 for x in d),
            "lost": sum(x < 0 for x in d), "resolved": abs(s.mean) > s.half_width}


def _paired_line(gain: dict) -> str:
    verdict = ("the interval excludes 0" if gain["resolved"] else
               "the interval includes 0: this run does not resolve a difference")
    return (f"GRPO - SFT on the same {gain['n']} test questions: {gain['mean']:+.3f} +- {gain['half_width']:.3f} "
            f"(paired 95 % interval; {gain['gained']} questions gained, {gain['lost']} lost); {verdict}")


def _interval(s: dict) -> float:
    p, n = s["accuracy"], s["n"]
    return 1.96 * math.sqrt(p * (1 - p) / n) if n else 0.0  # normal approximation of a binomial proportion


def _wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson's interval of a proportion: inside [0, 1], and not empty at 0 or 1 correct (the normal one is)."""
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def _validation_curve(out: Path) -> list[tuple[int, float]]:
    """(step, validation accuracy) of the GRPO stage's validations, step 0 (the SFT model) first."""
    from rlvr.core.tracking import read_jsonl

    metrics = out / "grpo" / "metrics.jsonl"
    rows = read_jsonl(metrics) if metrics.is_file() else []
    return sorted({r["step"]: r["val/accuracy"] for r in rows if "val/accuracy" in r}.items())


_COLUMNS = ("stage", "accuracy", "95% interval", "format rate", "correct", "formatted, wrong", "unformatted",
            "mean tokens")


def _cells(name: str, s: dict) -> list[str]:
    c, p = s["categories"], s["accuracy"]
    return [name, f"{p:.3f}", f"+- {_interval(s):.3f}", f"{s['format_rate']:.3f}", str(c["format1_answer1"]),
            str(c["format1_answer0"]), str(c["format0_answer0"]), f"{s['mean_response_tokens']:.0f}"]


def _table(rows, cfg: DemoConfig, timings: dict, total: float, prompting: dict | None = None,
           reused: list[str] = (), gain: dict | None = None) -> str:
    head = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    lines = [f"# rlvr demo: {cfg.model}", ""]
    if prompting is not None:
        lines += [f"Prompting baseline on {cfg.baseline_dataset} test (first {cfg.baseline_limit} questions, greedy, "
                  "no training):", "", *head, "| " + " | ".join(_cells("prompting only", prompting)) + " |", ""]
    lines += [f"Training on {cfg.dataset}: test accuracy (first {cfg.eval_limit} questions, greedy) before and after:",
              "", *head, *["| " + " | ".join(_cells(name, s)) + " |" for name, s in rows]]
    if gain is not None:
        lines += ["", _paired_line(gain) + "."]
    lines += ["", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k}{' (reused)' if k in reused else ''} | {v:.0f} |" for k, v in timings.items()]
    lines += [f"| total | {total:.0f} |", ""]
    return "\n".join(lines)


def _print(rows, title: str) -> None:
    """The table a terminal shows, whole at 80 columns (results.md has every column)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for col in ("stage", "accuracy", "format", "correct", "tokens"):
        table.add_column(col, justify="right" if col != "stage" else "left", no_wrap=True)
    for name, s in rows:
        table.add_row(name, f"{s['accuracy']:.3f} ± {_interval(s):.3f}", f"{s['format_rate']:.3f}",
                      f"{s['categories']['format1_answer1']}/{s['n']}", f"{s['mean_response_tokens']:.0f}")
    Console().print(table)


def _grpo_eval_limit(out: Path) -> int:
    """How many validation questions the GRPO stage validated on (its saved config)."""
    import yaml

    return int((yaml.safe_load((out / "grpo" / "config.yaml").read_text()) or {})["eval_limit"])


def _figure(rows, out: Path) -> Path | None:
    """results.png: test accuracy before and after (95 % intervals), and GRPO's validation accuracy (its interval
    clipped to [0, 1]) and training reward by step."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from rlvr.core.tracking import read_jsonl

    fig = Figure(figsize=(9, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    bars, curve = fig.subplots(1, 2)
    names = [name for name, _ in rows]
    bars.bar(range(len(rows)), [s["accuracy"] for _, s in rows], yerr=[_interval(s) for _, s in rows], capsize=5,
             color=["#999999", "#4c72b0", "#dd8452"][: len(rows)])
    bars.set_xticks(range(len(rows)), names, fontsize=8)
    bars.set_ylim(0, 1)
    bars.set_ylabel("test accuracy (95% interval)")
    bars.set_title("before and after", fontsize=10)
    metrics = out / "grpo" / "metrics.jsonl"
    steps = [r for r in read_jsonl(metrics) if "train/reward" in r] if metrics.is_file() else []
    if steps:
        curve.plot([r["step"] for r in steps], [r["train/reward"] for r in steps], color="#999999", linewidth=1,
                   label="training reward (the step's rollouts)")
    validation = _validation_curve(out)
    if validation:
        n = _grpo_eval_limit(out)
        x, p = [s for s, _ in validation], [a for _, a in validation]
        bands = [_wilson(a, n) for a in p]
        curve.fill_between(x, [lo for lo, _ in bands], [hi for _, hi in bands], color="#dd8452", alpha=0.25,
                           linewidth=0)
        curve.plot(x, p, color="#dd8452", marker="o", markersize=4,
                   label=f"validation accuracy ({n} questions, Wilson 95% interval)")
    if steps or validation:
        curve.set_ylim(0, 1)
        curve.legend(fontsize=7, loc="lower right")
    curve.xaxis.set_major_locator(MaxNLocator(integer=True))
    curve.set_xlabel("GRPO step")
    curve.set_ylabel("accuracy / reward")
    curve.set_title("GRPO: validation accuracy while training", fontsize=10)
    curve.grid(True, alpha=0.3)
    path = out / "results.png"
    fig.savefig(path, dpi=120)
    return path

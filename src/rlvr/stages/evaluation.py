"""Evaluation: prompts -> completions -> rewards -> summary (seed 004 §3, problem prompting_baselines).

The same `evaluate` runs `rlvr eval`, the validation of `rlvr sft` and `rlvr train`, and the demo, so every
number in the project comes from one grading path.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from pathlib import Path

from rlvr.config import RESUME_FREE, EvalConfig, sampling_params, setting_changes
from rlvr.core import checkpoint as ckpt
from rlvr.engines.base import RolloutEngine, SamplingParams
from rlvr.stages.agents import rollout_source
from rlvr.stages.episodes import apply_env_rewards, episode_stats, generate
from rlvr.tasks.prompts import PromptTemplate
from rlvr.tasks.records import Example
from rlvr.tasks.reward_base import RewardContext, score_batch
from rlvr.tasks.rewards import get_reward_fn
from rlvr.tasks.scoring import binary_rate
from rlvr.tasks.task import eval_reward_fn, load_task

log = logging.getLogger(__name__)

CATEGORIES = {
    "format1_answer1": "correct (format 1, answer 1)",
    "format1_answer0": "formatted, wrong answer (format 1, answer 0)",
    "format0_answer0": "unformatted (format 0, answer 0)",
}


@dataclasses.dataclass
class EvalResult:
    records: list[dict]
    summary: dict


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def category(record: dict) -> str:
    fmt, answer = (record[k] if record[k] is not None else math.nan for k in ("format_reward", "answer_reward"))
    return f"format{int(fmt > 0)}_answer{int(answer > 0)}"


def summarize(records: list[dict], samples: int, seconds: float | None = None) -> dict:
    """Accuracy, format rate, seed 004's three categories, response length, truncation and pass@k."""
    n = len(records)
    counts = {name: 0 for name in CATEGORIES}
    for r in records:
        counts[category(r)] = counts.get(category(r), 0) + 1
    scored = [float(r["reward"]) for r in records if r["reward"] is not None and math.isfinite(float(r["reward"]))]
    summary = {
        "n": n,
        "questions": n // samples,
        "samples": samples,
        # the mean reward (over the rows some function scored); the rates only of 0/1 signals, else None
        "accuracy": sum(scored) / len(scored) if scored else 0.0,
        "answer_rate": binary_rate([r["answer_reward"] for r in records]),
        "format_rate": binary_rate([r["format_reward"] for r in records]),
        "categories": counts,
        "mean_response_tokens": sum(r["tokens"] for r in records) / n,
        "max_response_tokens": max(r["tokens"] for r in records),
        "truncated_rate": sum(r["finish_reason"] == "length" for r in records) / n,
    }
    if samples > 1 and binary_rate([r["reward"] for r in records]) is not None:  # pass@k of a 0/1 reward only
        by_question: dict[int, list[float]] = {}
        for r in records:
            by_question.setdefault(r["question_index"], []).append(r["reward"] if r["reward"] is not None else 0.0)
        summary["pass_at_k"] = {
            str(k): sum(pass_at_k(len(v), sum(x >= 1 for x in v), k) for v in by_question.values()) / len(by_question)
            for k in range(1, samples + 1)
        }
    if seconds is not None:
        summary["seconds"] = round(seconds, 2)
        summary["completions_per_second"] = round(n / seconds, 3) if seconds > 0 else None
    return summary


def evaluate(
    engine: RolloutEngine,
    examples: list[Example],
    prompt: PromptTemplate,
    sampling: SamplingParams,
    tokenizer=None,
    reward_fn=None,
    progress=None,
    env=None,
) -> EvalResult:
    """Generate `sampling.n` completions per example (multi-turn episodes with `env`: an environment's name, or an
    agent runner, rlvr.stages.agents), grade them with the prompt's reward function."""
    start = time.perf_counter()
    reward_fn = reward_fn or get_reward_fn(prompt.reward)
    prompts = [prompt.render(ex, tokenizer) for ex in examples]
    if prompt.stop and not sampling.stop:
        sampling = dataclasses.replace(sampling, stop=prompt.stop)
    completions = generate(engine, env, examples, prompts, sampling, tokenizer, progress)
    truths = [examples[c.prompt_index].answer for c in completions]
    scores, _ = score_batch(reward_fn, [c.text for c in completions], truths,
                            RewardContext.of_completions(completions, prompts, examples, template=prompt))
    apply_env_rewards(scores, completions)
    records = []
    for c, s in zip(completions, scores):
        ex = examples[c.prompt_index]
        records.append({
            "question_index": c.prompt_index,
            "sample_index": c.sample_index,
            "id": ex.id,
            "question": ex.question,
            "prompt": prompts[c.prompt_index],
            "response": c.text,
            "ground_truth": ex.answer,
            # NaN (no reward, no format signal) as null: the records are JSON
            **{k: None if math.isnan(float(v)) else float(v) for k, v in s.items() if not k.startswith("log/")},
            "tokens": len(c.token_ids),
            "finish_reason": c.finish_reason,
            **({k: c.episode.get(k, 0.0) for k in EPISODE_FIELDS} if c.episode is not None else {}),
        })
    summary = summarize(records, sampling.n, time.perf_counter() - start)
    if env is not None:  # turns, tool calls, how episodes ended, rewards by turn
        summary["env"] = env_summary(records)
    return EvalResult(records, summary)


# what each evaluated episode keeps in its record: all that episode_stats reads, so the summary of a resumed
# evaluation is computed from the records of both parts as from one
EPISODE_FIELDS = ("turns", "tool_calls", "end", "turn_rewards", "tool_errors", "observation_tokens", "tool_seconds",
                  "agent", "calls", "sequences", "failure")


def env_summary(records: list[dict]) -> dict:
    return {k: v for k, v in episode_stats([r for r in records if "turns" in r]).items()
            if k.startswith(("env/", "agent/"))}


def write_results(out_dir: str | Path, result: EvalResult) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.jsonl").open("w", encoding="utf-8") as f:
        for r in result.records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out / "summary.json").write_text(json.dumps(result.summary, indent=2) + "\n", encoding="utf-8")


def print_summary(result: EvalResult, title: str = "evaluation", examples_per_category: int = 2, console=None) -> None:
    """A table of the summary and a few example responses per category."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    s = result.summary
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("completions", str(s["n"]))
    table.add_row("accuracy", f"{s['accuracy']:.3f}")
    if s["format_rate"] is not None:
        table.add_row("format rate", f"{s['format_rate']:.3f}")
    for name, label in CATEGORIES.items():
        table.add_row(label, str(s["categories"].get(name, 0)))
    table.add_row("mean response tokens", f"{s['mean_response_tokens']:.1f}")
    table.add_row("truncated", f"{s['truncated_rate']:.3f}")
    for k, v in s.get("pass_at_k", {}).items():
        table.add_row(f"pass@{k}", f"{v:.3f}")
    if "completions_per_second" in s:
        table.add_row("completions / s", f"{s['completions_per_second']}")
    console.print(table)
    for name, label in CATEGORIES.items():
        shown = [r for r in result.records if category(r) == name][:examples_per_category]
        for r in shown:
            console.rule(f"[bold]{label}[/] (truth {r['ground_truth']})")
            console.print(r["response"][-600:], markup=False, highlight=False)


PARTIAL = "results.partial.jsonl"


def eval_blocks(examples: list[Example], prompt: PromptTemplate, tokenizer, per_block: int) -> list[list[int]]:
    """Question indices in blocks of the engine's chunk size, longest prompt first as the engine orders one call's
    prompts (a stable sort on the same ids): evaluating block by block decodes the very chunks one call over every
    question would, so the blocks an interrupted evaluation kept are what an uninterrupted one computes."""
    lengths = [len(tokenizer(prompt.render(ex, tokenizer), add_special_tokens=False).input_ids)
               for ex in examples]
    order = sorted(range(len(examples)), key=lambda i: -lengths[i])
    return [order[c : c + per_block] for c in range(0, len(order), per_block)]


def _partial_header(cfg: EvalConfig, n_questions: int) -> dict:
    """What a kept block must have been computed with: every setting that changes a completion, the weights."""
    settings = {k: v for k, v in cfg.model_dump(mode="json", by_alias=True).items() if k not in RESUME_FREE}
    return {"settings": settings, "weights": ckpt.model_digest(Path(cfg.model)), "questions": n_questions}


def read_partial(path: Path, header: dict) -> dict[int, dict]:
    """The blocks an interrupted evaluation finished, by block number. Its last line may be cut short (killed
    while writing): it is dropped. A header that differs from this command's names the settings that do."""
    lines = path.read_text(encoding="utf-8").splitlines()
    if not lines:
        return {}
    try:
        saved = json.loads(lines[0])["header"]
    except (ValueError, KeyError, TypeError):
        raise ValueError(f"{path}:1: not the header of an rlvr evaluation's partial results; move the file away "
                         "to evaluate from the beginning") from None
    changed = setting_changes(saved.get("settings", {}), header["settings"])
    if saved.get("weights") != header["weights"]:
        changed.append(f"the weights of {header['settings'].get('model')} differ from the ones evaluated")
    if saved.get("questions") != header["questions"]:
        changed.append(f"questions: saved {saved.get('questions')}, now {header['questions']}")
    if changed:
        raise ValueError(f"resume=true continues the evaluation kept in {path}, made with other settings: "
                         + "; ".join(changed) + ". Use the same settings, or another out= for a new evaluation")
    blocks = {}
    for number, line in enumerate(lines[1:], start=2):
        try:
            row = json.loads(line)
            blocks[int(row["block"])] = row
        except (ValueError, KeyError, TypeError):
            if number == len(lines):  # cut short by a kill while it was written: that block runs again
                log.warning("%s:%d: an incomplete last line (a block cut short); it is evaluated again", path, number)
                break
            raise ValueError(f"{path}:{number}: not a block of evaluation results; move the file away to evaluate "
                             "from the beginning") from None
    return blocks


def run_eval(cfg: EvalConfig) -> dict:
    """Evaluate a model with one prompt on one split; write results.jsonl and summary.json; print the table.
    Blocks of questions are appended to results.partial.jsonl as they finish, so Ctrl-C, SIGTERM or a kill
    loses at most the block in flight, and `resume=true` continues with the next one."""
    from tqdm import tqdm

    from rlvr.core.devices import engine_dtype, resolve
    from rlvr.core.models import load_model
    from rlvr.engines.hf import HFEngine
    from rlvr.stages.run import RunInterrupted, StopRequests
    device = resolve(cfg.device, "device")  # before anything is loaded or written
    if cfg.grades_code:  # likewise a sandbox that cannot isolate programs
        cfg.sandbox.apply()
    task = load_task(cfg)
    prompt, reward_fn = task.prompt, eval_reward_fn(cfg, task.prompt)
    examples = task.split(cfg.split, cfg.limit)
    out = Path(cfg.out or f"runs/eval/{Path(cfg.model).name}-{Path(cfg.prompt).stem}-{cfg.split}")
    partial = out / PARTIAL
    header = _partial_header(cfg, len(examples))
    kept = {}
    if partial.is_file():
        if not cfg.resume:
            raise FileExistsError(f"{partial} holds an interrupted evaluation; pass resume=true to continue it, "
                                  "or choose another out")
        kept = read_partial(partial, header)
    out.mkdir(parents=True, exist_ok=True)
    cfg.save(out / "config.yaml")
    dtype = engine_dtype(cfg.dtype, device)  # loaded in the engine's dtype: one copy of the weights (int8: fp32)
    model, tokenizer = load_model(cfg.model, dtype="float32" if dtype == "int8" else dtype, device=device)
    engine = HFEngine(model, tokenizer, batch_size=cfg.batch_size, dtype=dtype, prefix_cache_mib=cfg.env_cache_mib)
    sampling = sampling_params(cfg, stop=prompt.stop, seed=cfg.seed)
    blocks = eval_blocks(examples, prompt, tokenizer, max(1, cfg.batch_size // cfg.samples))
    source = rollout_source(cfg)
    if kept:
        log.info("resume: %d of %d blocks kept in %s", len(kept), len(blocks), partial)
    records = [r for b in sorted(kept) for r in kept[b]["records"]]
    seconds = sum(kept[b]["seconds"] for b in kept)
    # the header and the kept blocks written again (a line cut short by a kill is dropped), then appended to
    tmp = partial.with_name(partial.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n"
                           for row in [{"header": header}] + [kept[b] for b in sorted(kept)]), encoding="utf-8")
    os.replace(tmp, partial)
    with tqdm(total=len(examples) * cfg.samples, initial=len(records), unit="completion",
              desc=f"eval {cfg.prompt}") as bar, StopRequests("block") as stop, partial.open("a", encoding="utf-8") as f:
        for number, block in enumerate(blocks):
            if number in kept:
                continue
            if stop.requested is not None:
                raise RunInterrupted(
                    f"interrupted after {len(records) // cfg.samples} of {len(examples)} questions; they are kept in "
                    f"{partial}. Continue with: rlvr eval out={out} resume=true")
            part = evaluate(engine, [examples[i] for i in block], prompt, sampling, tokenizer=tokenizer,
                            reward_fn=reward_fn, progress=bar.update, env=source)
            for r in part.records:
                r["question_index"] = block[r["question_index"]]
            f.write(json.dumps({"block": number, "seconds": part.summary["seconds"], "records": part.records},
                               ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
            records += part.records
            seconds += part.summary["seconds"]
    records.sort(key=lambda r: (r["question_index"], r["sample_index"]))  # prompt-major, as one call returns them
    result = EvalResult(records, summarize(records, cfg.samples, seconds))
    if cfg.env is not None or cfg.agentic:
        result.summary["env"] = env_summary(records)
    result.summary.update(model=cfg.model, prompt=cfg.prompt, dataset=cfg.dataset, split=cfg.split)
    write_results(out, result)
    partial.unlink()  # after the results are written: nothing is lost between the two
    print_summary(result, title=f"{cfg.model} · {cfg.prompt} · {cfg.dataset}/{cfg.split}",
                  examples_per_category=cfg.examples_per_category)
    print(f"wrote {out}/results.jsonl and {out}/summary.json")
    return result.summary

"""One GRPO step, rlvr against TRL's GRPOTrainer on the same work (issue 8, deliverable 1).

    .venv/bin/python bench/grpo_step.py [--mode identical|recommended] [--json out.json] [--trl-stop] [--smoke]

The work: the default model (SmolLM2-135M-Instruct) in fp32, the same 4 GSM8K test questions x 4 samples
(G=4), at most 64 new tokens, temperature 1, top_p 1, the r1_zero prompt as plain text, reward = r1_zero
correctness + 0.2 x r1_zero format (the same rlvr grading code on both sides), advantages normalised by the
group std, beta 0 (no KL, no reference model), one optimizer step per rollout batch of 16 completions
(sequence-mean "grpo" loss, on-policy, no old-policy pass), AdamW at lr 1e-6, 1 warm-up step then 3 timed.

Each run is a child process of its own, run one after the other (never concurrently), with torch's
thread count set to this machine's cores in every child. A step is timed end to end: one iteration of
the training loop (generate, score, train incl. the optimizer step). Peak RSS is the child's VmHWM at the
end, so it includes the imports and the model.

Runs per mode:
  identical    trl        TRL, fp32, no stop string (TRL's transformers path cannot take one; see below)
               rlvr       rlvr, fp32 training and fp32 generation sharing the weights, no stop string,
                          microbatch 16 (one forward/backward, as TRL's per_device_train_batch_size=16;
                          --microbatch changes both),
                          and every rollout trained: zero advantages are replaced by 1e-12 so that
                          policy_gradient_update prunes nothing (TRL trains zero-advantage rows too);
                          the update packs its rows (no FLOP on padding, each group's prompt once:
                          rlvr.algorithms.packing), which TRL's padded batch does not
               rlvr_prune the same with rlvr's pruning of zero-advantage rollouts on (less work than TRL;
                          with this small model most groups often have no reward spread, and a step that
                          prunes every row also never allocates gradients or AdamW state, so its RSS is low)
               rlvr_stop  rlvr_prune stopping at "</answer>" as `rlvr train` does (less work still)
  recommended  trl        as above
               rlvr_recommended  rlvr's own CPU defaults: bf16 autocast training, a bf16 generation copy,
                          stop at "</answer>", microbatch 8 (TrainConfig defaults)
  rlvr_padded (no mode; `--runs trl,rlvr,rlvr_padded`): rlvr with the update's rows padded as TRL's are (each
  microbatch trimmed to its longest row, only the prompt every row shares run once), to show what packing gives.
  --trl-stop adds trl_stop: TRL with stop_strings=["</answer>"], made possible by patching the model's
  `generate` to receive the tokenizer (TRL does not pass it, and transformers refuses stop strings without
  it); a TRL user would have to do the same. Its rows also carry one padding token after the stop (pad=EOS).
  trl_bf16 / rlvr_bf16 (no mode; `--runs trl_bf16,rlvr_bf16 --headline rlvr_bf16/trl_bf16`): the identical
  work with bf16 autocast training on both sides (TRL bf16=True; rlvr precision=bf16 and a bf16 generation
  copy), what bench/gpu_check.py runs on a GPU with `--device cuda --model DIR` (DIR: a saved model and
  tokenizer; default the default model). On CUDA each run also reports its peak GPU memory
  (torch.cuda.max_memory_allocated at the end of the child).

Reading the output: one block per run (median step time, per-phase medians, generated and trained tokens
per step, peak RSS), then ratio lines; the LAST line is the headline pair of the mode:
    identical:    rlvr / trl              recommended: rlvr_recommended / trl
    rlvr/TRL: step time ratio X, peak RSS ratio Y
Below 1 means rlvr is faster / smaller. The two sides sample different completions (different random
streams), so their lengths differ; "gen tokens/step" tells how much work each side actually did. Run it on
an otherwise idle machine (the load average is printed); the numbers are noise otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, median, peak_rss_mb, rss_mb, run_child, set_threads  # noqa: E402

STOP = "</answer>"
FP32 = {"precision": "fp32", "generation_dtype": "float32", "microbatch": "same"}  # same: TRL's (--microbatch)
RUNS = {
    "trl": {"side": "trl", "stop": False},
    "trl_stop": {"side": "trl", "stop": True},
    "rlvr": {"side": "rlvr", "stop": False, "train_all": True, **FP32},
    # the same with the update's rows padded (pack=False): what packing takes off the step, in the same run
    "rlvr_padded": {"side": "rlvr", "stop": False, "train_all": True, "pack": False, **FP32},
    "rlvr_prune": {"side": "rlvr", "stop": False, "train_all": False, **FP32},
    "rlvr_stop": {"side": "rlvr", "stop": True, "train_all": False, **FP32},
    "rlvr_recommended": {"side": "rlvr", "stop": True, "train_all": False, "precision": "bf16",
                         "generation_dtype": "bfloat16", "microbatch": None},  # None: TrainConfig's default
    # the identical work in bf16 on both sides (bench/gpu_check.py's pair)
    "trl_bf16": {"side": "trl", "stop": False, "bf16": True},
    "rlvr_bf16": {"side": "rlvr", "stop": False, "train_all": True, "precision": "bf16",
                  "generation_dtype": "bfloat16", "microbatch": "same"},
}
MODES = {"identical": ["trl", "rlvr", "rlvr_prune", "rlvr_stop"], "recommended": ["trl", "rlvr_recommended"]}
HEADLINE = {"identical": "rlvr", "recommended": "rlvr_recommended"}


def synchronize(device: str) -> None:
    """Wait for queued GPU work, so that a clock read after it counts it (a no-op on the CPU)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------------------------
# rlvr: one iteration of src/rlvr/training/rl.py's loop, built from the library's public pieces.


def rlvr_child(spec: dict, args) -> dict:
    import torch

    from rlvr.algorithms.policy import tokenize_prompt_and_output
    from rlvr.algorithms.spec import compute_advantages
    from rlvr.algorithms.update import TrainBatch, policy_gradient_update
    from rlvr.config import TrainConfig
    from rlvr.core.models import load_model, prepare_for_training
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.stages.rollouts import build_reward_fn
    from rlvr.stages.run import build_optimizer
    from rlvr.tasks.rewards import score_batch
    from rlvr.tasks.scoring import rewards_and_metadata

    set_threads(args.threads)
    n = args.questions * args.group_size
    microbatch = min(args.microbatch, n) if spec["microbatch"] == "same" else spec["microbatch"]
    overrides = {"microbatch_size": microbatch} if microbatch else {}
    cfg = TrainConfig(algorithm="grpo", rollout_batch_size=n, group_size=args.group_size,
                      max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0, learning_rate=args.lr,
                      rewards={"r1_zero": 1.0, "format": 0.2}, precision=spec["precision"],
                      generation_dtype=spec["generation_dtype"], steps=args.warmup + args.steps,
                      tensorboard=False, **({"model": args.model} if args.model else {}), **overrides)
    prompts, answers = gsm8k_prompts(args.questions)
    model, tokenizer = load_model(cfg.model, device=args.device)
    model = prepare_for_training(model)
    optimizer, scheduler = build_optimizer(model, cfg, cfg.steps)
    reward_fn = build_reward_fn(cfg, "r1_zero")
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype,
                      device=args.device)
    setup_rss = rss_mb()

    steps = []
    for step in range(cfg.steps):
        t0 = time.perf_counter()
        engine.sync_weights(model)
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                                  stop=(STOP,) if spec["stop"] else (), n=cfg.group_size,
                                  seed=args.seed * 1_000_003 + step)
        completions = engine.generate(prompts, sampling)
        t1 = time.perf_counter()
        responses = [c.text for c in completions]
        repeated_prompts = [prompts[c.prompt_index] for c in completions]
        truths = [answers[c.prompt_index] for c in completions]
        scores, grading = score_batch(reward_fn, responses, truths)
        raw_rewards, reward_meta = rewards_and_metadata(scores, grading)
        advantages, _ = compute_advantages(raw_rewards, cfg.group_size, cfg.estimator)
        if spec["train_all"] or args.train_all:  # no rollout pruned; a 1e-12 advantage changes no timing
            advantages = torch.where(advantages == 0, torch.full_like(advantages, 1e-12), advantages)
        t2 = time.perf_counter()
        batch = tokenize_prompt_and_output(repeated_prompts, responses, tokenizer)
        _, meta = policy_gradient_update(
            model, optimizer, TrainBatch(batch["input_ids"], batch["labels"], batch["response_mask"], advantages),
            cfg.estimator, math.ceil(n / cfg.microbatch_size), cfg.max_grad_norm, precision=cfg.precision,
            pack=spec.get("pack", True))
        scheduler.step()
        synchronize(args.device)
        t3 = time.perf_counter()
        lengths = [len(c.token_ids) for c in completions]
        kept = [i for i in range(n) if advantages[i] != 0]
        prompt_lengths = [len(tokenizer(p, add_special_tokens=False).input_ids) for p in repeated_prompts]
        steps.append({
            "step_s": t3 - t0, "generate_s": t1 - t0, "score_s": t2 - t1, "train_s": t3 - t2,
            "generated_tokens": sum(lengths), "decoded_row_steps": sum(lengths),  # ~: rows leave once 25% are done
            "max_completion_tokens": max(lengths), "trained_rollouts": len(kept),
            "trained_response_tokens": int(meta["trained_tokens"]),
            "trained_positions": sum(prompt_lengths[i] + int(batch["response_mask"][i].sum()) for i in kept),
            "reward_mean": reward_meta["reward_mean"], "torch_threads": torch.get_num_threads(),
        })
        print(f"  [rlvr] step {step}: {steps[-1]['step_s']:.2f} s, {sum(lengths)} tokens", file=sys.stderr, flush=True)
    return {"setup_rss_mb": setup_rss, "steps": steps,
            "settings": {"precision": cfg.precision, "generation_dtype": cfg.generation_dtype,
                         "pack": spec.get("pack", True),
                         "microbatch_size": cfg.microbatch_size, "stop": spec["stop"],
                         "train_all": spec["train_all"] or args.train_all}}


# ----------------------------------------------------------------------------------------------------
# TRL: GRPOTrainer configured for the same work; the loop is timed between on_step_end callbacks.


def trl_child(spec: dict, args) -> dict:
    import functools

    import datasets
    import torch
    import trl
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlvr.core.models import load_model
    from rlvr.tasks.rewards import format_reward_fn, r1_zero_reward_fn, score_batch

    set_threads(args.threads)
    n = args.questions * args.group_size
    mb = min(args.microbatch, n)
    prompts, answers = gsm8k_prompts(args.questions)
    model, tokenizer = load_model(args.model) if args.model else load_model()  # the Trainer moves it to the device
    dataset = datasets.Dataset.from_dict({"prompt": prompts, "ground_truth": answers})

    def correctness(completions, ground_truth, **kwargs) -> list[float]:
        return [s["reward"] for s in score_batch(r1_zero_reward_fn, completions, ground_truth)[0]]

    def format_bonus(completions, ground_truth, **kwargs) -> list[float]:
        return [s["reward"] for s in score_batch(format_reward_fn("r1_zero"), completions, ground_truth)[0]]

    out_dir = tempfile.mkdtemp(prefix="trl-bench-")
    config = GRPOConfig(
        output_dir=out_dir, max_steps=args.warmup + args.steps, learning_rate=args.lr, lr_scheduler_type="constant",
        optim="adamw_torch", adam_beta2=0.95, weight_decay=0.0, max_grad_norm=1.0,
        per_device_train_batch_size=mb, gradient_accumulation_steps=n // mb,  # one optimizer step = n completions
        num_generations=args.group_size, num_iterations=1, max_completion_length=args.max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, beta=0.0, loss_type="grpo", scale_rewards="group",
        reward_weights=[1.0, 0.2], mask_truncated_completions=False,
        generation_kwargs={"stop_strings": [STOP]} if spec["stop"] else None,
        bf16=spec.get("bf16", False), fp16=False, use_cpu=args.device == "cpu",
        gradient_checkpointing=False,  # TRL's defaults: bf16 and checkpointing on
        shuffle_dataset=False, seed=args.seed, report_to="none", logging_strategy="no", save_strategy="no",
        eval_strategy="no", disable_tqdm=True, dataloader_num_workers=0, log_completions=False,
    )
    if spec["stop"]:  # TRL calls generate without the tokenizer, which stop strings need
        model.generate = functools.partial(model.generate, tokenizer=tokenizer)
    trainer = GRPOTrainer(model=model, reward_funcs=[correctness, format_bonus], args=config,
                          train_dataset=dataset, processing_class=tokenizer)
    set_threads(args.threads)  # in case anything above changed it

    # per-phase clocks: wrap the trainer's own methods (instance attributes shadow the class's)
    clock = {"generate_s": 0.0, "score_s": 0.0, "rollout_s": 0.0, "loss_forward_s": 0.0,
             "generated_tokens": 0, "decoded_row_steps": 0, "max_completion_tokens": 0, "trained_rollouts": 0,
             "trained_response_tokens": 0, "trained_positions": 0, "padded_positions": 0}

    def timed(name, fn, after=None):
        @functools.wraps(fn)
        def wrapper(*a, **kw):
            t = time.perf_counter()
            out = fn(*a, **kw)
            clock[name] += time.perf_counter() - t
            if after is not None:
                after(a, out)
            return out
        return wrapper

    def count_generated(_, out):
        lengths = [len(ids) for ids in out[0]]
        clock["generated_tokens"] += sum(lengths)
        clock["decoded_row_steps"] += len(lengths) * max(lengths)  # generate decodes every row to the longest
        clock["max_completion_tokens"] = max(clock["max_completion_tokens"], max(lengths))

    def count_trained(a, _):
        inputs = a[1]
        clock["trained_rollouts"] += inputs["completion_ids"].shape[0]  # TRL trains zero-advantage rows too
        clock["trained_response_tokens"] += int(inputs["completion_mask"].sum())
        clock["trained_positions"] += int(inputs["prompt_mask"].sum() + inputs["completion_mask"].sum())
        clock["padded_positions"] += inputs["prompt_ids"].numel() + inputs["completion_ids"].numel()

    trainer._generate_single_turn = timed("generate_s", trainer._generate_single_turn, count_generated)
    trainer._calculate_rewards = timed("score_s", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("rollout_s", trainer._generate_and_score_completions)
    trainer._compute_loss = timed("loss_forward_s", trainer._compute_loss, count_trained)

    class StepClock(TrainerCallback):
        def __init__(self):
            self.last = None
            self.steps = []

        def on_train_begin(self, args_, state, control, **kwargs):
            self.last = time.perf_counter()

        def on_step_end(self, args_, state, control, **kwargs):
            synchronize(args.device)
            now = time.perf_counter()
            step = {"step_s": now - self.last, "torch_threads": torch.get_num_threads(), **clock}
            step["train_s"] = step["step_s"] - clock["rollout_s"]  # logprob forward, backward, optimizer, overhead
            step["prep_s"] = clock["rollout_s"] - clock["generate_s"] - clock["score_s"]  # tokenize, pad, decode
            self.steps.append(step)
            for key in clock:
                clock[key] = 0 if isinstance(clock[key], int) else 0.0
            print(f"  [trl] step {len(self.steps) - 1}: {step['step_s']:.2f} s, {step['generated_tokens']} tokens",
                  file=sys.stderr, flush=True)
            self.last = time.perf_counter()

    step_clock = StepClock()
    trainer.add_callback(step_clock)
    trainer.remove_callback(PrinterCallback)  # logging is off; it would still print the final summary
    setup_rss = rss_mb()
    trainer.train()
    shutil.rmtree(out_dir, ignore_errors=True)  # nothing is saved there (save_strategy="no")
    return {"setup_rss_mb": setup_rss, "steps": step_clock.steps,
            "settings": {"trl": trl.__version__, "per_device_train_batch_size": mb,
                         "gradient_accumulation_steps": n // mb, "stop": spec["stop"],
                         "bf16": config.bf16, "gradient_checkpointing": config.gradient_checkpointing}}


# ----------------------------------------------------------------------------------------------------
# The parent: run the children one after the other, summarise, print the ratio.


def summarise(name: str, result: dict, warmup: int) -> dict:
    timed = result["steps"][warmup:]
    keys = [k for k in timed[0] if k.endswith("_s")]
    summary = {k.replace("_s", "_median_s") if k != "step_s" else "step_median_s": median([s[k] for s in timed])
               for k in keys}
    for k in ("generated_tokens", "decoded_row_steps", "trained_rollouts", "trained_response_tokens",
              "trained_positions"):
        summary[k + "_per_step"] = median([s[k] for s in timed])
    summary["step_times_s"] = [round(s["step_s"], 3) for s in timed]
    summary["peak_rss_mb"] = result["peak_rss_mb"]
    summary["peak_gpu_mb"] = result.get("peak_gpu_mb")
    summary["setup_rss_mb"] = result["setup_rss_mb"]
    summary["torch_threads"] = sorted({s["torch_threads"] for s in result["steps"]})
    summary["settings"] = result["settings"]
    return summary


def print_run(name: str, s: dict) -> None:
    phases = ", ".join(f"{k.replace('_median_s', '')} {v:.2f}" for k, v in s.items()
                       if k.endswith("_median_s") and k != "step_median_s")
    print(f"{name:17s} step {s['step_median_s']:7.2f} s (median of {s['step_times_s']})  phases [s]: {phases}")
    print(f"{'':17s} gen tokens/step {s['generated_tokens_per_step']:.0f} "
          f"(decoded row-steps {s['decoded_row_steps_per_step']:.0f}), "
          f"trained rollouts {s['trained_rollouts_per_step']:.0f}, "
          f"response tokens {s['trained_response_tokens_per_step']:.0f}, "
          f"positions {s['trained_positions_per_step']:.0f}")
    gpu = f"; peak GPU memory {s['peak_gpu_mb']:.0f} MB" if s.get("peak_gpu_mb") is not None else ""
    print(f"{'':17s} peak RSS {s['peak_rss_mb']:.0f} MB (after setup {s['setup_rss_mb']:.0f}){gpu}; "
          f"threads {s['torch_threads']}; {s['settings']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=list(MODES), default="identical")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--trl-stop", action="store_true", help="also run TRL with the stop string (patched generate)")
    parser.add_argument("--questions", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=3, help="timed steps")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=cores(), help="torch threads in every child (default: cores)")
    parser.add_argument("--microbatch", type=int, default=16,
                        help="rows per forward/backward: TRL's per_device_train_batch_size (gradient_accumulation_steps "
                             "= batch / this) and the fp32 rlvr runs' microbatch_size (default 16: the whole batch)")
    parser.add_argument("--runs", help=f"comma-separated runs to do (default: the mode's); valid: {', '.join(RUNS)}")
    parser.add_argument("--train-all", action="store_true",
                        help="no rlvr run prunes zero-advantage rollouts (e.g. rlvr_recommended on TRL's work)")
    parser.add_argument("--headline", help="the rlvr run of the last line (default: rlvr / rlvr_recommended), "
                                           "or RUN/BASE for a TRL run other than trl")
    parser.add_argument("--device", default="cpu", help="where both sides run: cpu (default) or cuda[:N]")
    parser.add_argument("--model", help="a saved model directory for both sides (default: the default model)")
    parser.add_argument("--smoke", action="store_true", help="tiny: 1 question x 2 samples, 8 tokens, 1 timed step")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--result-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.questions, args.group_size, args.max_new_tokens, args.steps = 1, 2, 8, 1
    if (args.questions * args.group_size) % min(args.microbatch, args.questions * args.group_size):
        parser.error("--microbatch must divide questions x group size")
    if args.warmup < 1:
        parser.error("--warmup must be >= 1 (TRL's first step is timed from the start of training)")

    if args.child:  # a child: do one run, write its result, exit
        spec = RUNS[args.child]
        result = (rlvr_child if spec["side"] == "rlvr" else trl_child)(spec, args)
        result["peak_rss_mb"] = peak_rss_mb()
        import torch

        if torch.cuda.is_initialized():
            result["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        Path(args.result_file).write_text(json.dumps(result))
        return

    runs = args.runs.split(",") if args.runs else MODES[args.mode] + (["trl_stop"] if args.trl_stop else [])
    for name in runs:
        if name not in RUNS:
            parser.error(f"unknown run {name!r}; valid: {', '.join(RUNS)}")
    passthrough = [a for a in sys.argv[1:] if not a.startswith("--json") and a != args.json]
    info = machine()
    print(f"machine: {info}")
    print(f"work: {args.questions} questions x {args.group_size} samples, <= {args.max_new_tokens} new tokens, "
          f"{args.warmup} warm-up + {args.steps} timed steps, {args.threads} threads; runs: {', '.join(runs)}")
    summaries = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in runs:
            print(f"--- {name}", flush=True)
            result_file = Path(tmp) / f"{name}.json"
            rc = run_child([__file__, *passthrough, "--child", name, "--result-file", str(result_file)], args.threads)
            if rc != 0 or not result_file.exists():
                raise SystemExit(f"run {name} failed (exit code {rc})")
            summaries[name] = summarise(name, json.loads(result_file.read_text()), args.warmup)

    print()
    for name, s in summaries.items():
        print_run(name, s)
    ratios = {}
    for name in summaries:
        for base in (b for b in summaries if RUNS[b]["side"] == "trl"):
            if RUNS[name]["side"] == "rlvr":
                ours, theirs = summaries[name], summaries[base]
                ratios[f"{name}/{base}"] = {"step_time": ours["step_median_s"] / theirs["step_median_s"],
                                            "peak_rss": ours["peak_rss_mb"] / theirs["peak_rss_mb"]}
                if ours["peak_gpu_mb"] and theirs["peak_gpu_mb"]:
                    ratios[f"{name}/{base}"]["peak_gpu"] = ours["peak_gpu_mb"] / theirs["peak_gpu_mb"]
    for key, r in ratios.items():
        gpu = f", peak GPU memory ratio {r['peak_gpu']:.3f}" if "peak_gpu" in r else ""
        print(f"{key}: step time ratio {r['step_time']:.3f}, peak RSS ratio {r['peak_rss']:.3f}{gpu}")
    if args.json:
        Path(args.json).write_text(json.dumps({"mode": args.mode, "machine": info, "args": vars(args),
                                               "runs": summaries, "ratios": ratios}, indent=2))
    head = args.headline if "/" in (args.headline or "") else f"{args.headline or HEADLINE[args.mode]}/trl"
    if head not in ratios:
        if len(runs) > 1:  # a single run asked for alone has no pair to print
            print(f"(no headline line: {head} needs both runs)")
    else:
        print(f"rlvr/TRL: step time ratio {ratios[head]['step_time']:.3f}, peak RSS ratio {ratios[head]['peak_rss']:.3f}")


if __name__ == "__main__":
    main()

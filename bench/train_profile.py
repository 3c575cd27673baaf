"""Where the training phase of a GRPO step spends its time (issue 59 item 3): one arithmetic rollout batch,
made and scored by rlvr's own loop stages, then `policy_gradient_update` on it under torch.profiler.

    .venv/bin/python bench/train_profile.py --model runs/sft_arithmetic/final [--precision bf16] [--microbatch 8]
    .venv/bin/python bench/train_profile.py --model runs/demo/sft/final --packing compare --no-profile
    .venv/bin/python bench/train_profile.py --work sft --packing compare --no-profile
    .venv/bin/python bench/train_profile.py --model SmolLM2-135M-Instruct --responses gsm8k --questions 4 --group 4 \
        --max-new-tokens 64 --microbatch 16 --precision fp32 --packing compare --no-profile     # grpo_step's training

The batch is what `rlvr train --config configs/grpo_arithmetic.yaml` trains at step 1 (8 questions x 8 samples,
r1_zero, temperature 1, <= 96 new tokens); every rollout is trained (zero advantages set to 1e-12, which
changes no timing), so the work does not depend on which groups happened to have reward spread. The update
runs `--repeats` times unprofiled (the median is printed), then once under the profiler; each profiled CPU op
is put in a bucket by its name (matmuls, their backward, the vocabulary head's log-softmax and entropy,
attention, the optimizer step, weight casts of autocast, ...). "python and dispatch" is the update's wall time
minus the profiled ops' self time.

`--packing compare` (issue 67) alternates, update by update in this one process, the padded microbatches
(`pack=False`: rows trimmed to the microbatch's longest, a shared prompt through its KV cache) with the packed
ones (rlvr.algorithms.packing), at each ATTENTION_EFFICIENCY of `--efficiencies` (the weight the bin-length choice
gives attention pairs: 0 packs everything into the fewest bins). `--responses sft` trains the worked solutions of
other training questions as a group's responses instead of sampled rollouts (no SFT checkpoint needed; their
lengths vary more within a group than a model's samples do, so it flatters packing), `--work sft` the SFT step
(rlvr sft's microbatches of worked solutions) instead of the GRPO update.
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, set_threads  # noqa: E402

BUCKETS = [  # (bucket, predicate on the op name); the first that matches wins
    ("optimizer (fused AdamW)", lambda op: "adam" in op),
    ("grad norm and clipping", lambda op: "_foreach" in op or op == "aten::linalg_vector_norm"),
    ("matmuls (forward and backward)", lambda op: op in ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm",
                                                         "aten::_addmm_activation", "aten::mkldnn_linear")),
    ("attention kernel (sdpa fwd/bwd)", lambda op: "attention" in op or "sdpa" in op or "_flash" in op),
    ("log-softmax, entropy, gather (the head's scores)", lambda op: op in (
        "aten::logsumexp", "aten::_softmax", "aten::_softmax_backward_data", "aten::gather", "aten::exp",
        "aten::_log_softmax", "aten::masked_fill", "aten::eq", "aten::sum", "aten::scatter_add_", "aten::scatter",
        "aten::sub", "aten::_log_softmax_backward_data", "aten::gather_backward", "aten::new_zeros")),
    ("dtype casts (autocast's bf16 copies, grads back to fp32)", lambda op: op in ("aten::_to_copy", "aten::copy_")),
    ("elementwise (norms, rope, silu, residual adds)", lambda op: op in (
        "aten::mul", "aten::add", "aten::add_", "aten::pow", "aten::mean", "aten::rsqrt", "aten::silu",
        "aten::silu_backward", "aten::neg", "aten::cat", "aten::div", "aten::where", "aten::index",
        "aten::index_copy", "aten::fill_", "aten::zero_", "aten::cos", "aten::sin", "aten::embedding_dense_backward",
        "aten::index_select", "aten::repeat_interleave", "aten::clone", "aten::contiguous", "aten::mul_")),
    ("other ops", lambda op: True),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="runs/sft_arithmetic/final")
    parser.add_argument("--questions", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--microbatches", help="compare these microbatch sizes (comma-separated), alternating in this "
                        "one process, packed per --packing (on or off)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--shapes", action="store_true", help="also list the costliest ops by input shape")
    parser.add_argument("--shapes-top", type=int, default=25)
    parser.add_argument("--attention", default="rlvr", choices=["rlvr", "sdpa", "compare"],
                        help="rlvr: the attention rlvr trains with (rlvr.core.models.use_training_attention: SDPA in "
                        "float32 under CPU autocast); sdpa: transformers' SDPA as autocast runs it (bf16); compare: "
                        "both, alternating update by update in this one process, --repeats each")
    parser.add_argument("--packing", default="on", choices=["on", "off", "compare"],
                        help="on: the update packs its microbatches (rlvr's default); off: padded rows; compare: "
                        "padded and packed alternating in this one process, --repeats each")
    parser.add_argument("--efficiencies", default="1.5",
                        help="packing.ATTENTION_EFFICIENCY values to compare (comma-separated)")
    parser.add_argument("--responses", default="rollouts", choices=["rollouts", "sft", "gsm8k"],
                        help="the responses trained: sampled by --model; other questions' worked solutions; or "
                        "bench/grpo_step.py's shape: GSM8K test questions with random ids of --max-new-tokens (a "
                        "fifth of them shorter, as some rollouts end early)")
    parser.add_argument("--work", default="grpo", choices=["grpo", "sft"],
                        help="grpo: policy_gradient_update on the rollout batch; sft: rlvr sft's step (16 worked "
                        "solutions, microbatch --microbatch)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 2 x 2 rollouts (numbers meaningless)")
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--json")
    args = parser.parse_args()
    set_threads(args.threads)

    from rlvr import stages
    from rlvr.algorithms import packing
    from rlvr.algorithms.policy import (autocast, autocast_paused, get_response_log_probs, sft_microbatch_train_step,
                                        tokenize_prompt_and_ids, tokenize_prompt_and_output)
    from rlvr.algorithms.update import TrainBatch, policy_gradient_update, token_slots
    from rlvr.config import TrainConfig, load_config
    from rlvr.core.models import TRAINING_ATTENTION, load_model, prepare_for_training
    from rlvr.engines.hf import HFEngine
    from rlvr.stages.run import build_optimizer
    from rlvr.tasks.datasets import load_split
    from rlvr.tasks.prompts import get_prompt
    from rlvr.tasks.records import DataOrder

    if args.smoke:
        args.questions, args.group, args.max_new_tokens, args.repeats = 2, 2, 8, 1
    if args.work == "sft":  # rlvr sft's batch: 16 questions, one worked solution each (the config's group unused)
        args.questions, args.group = 16 if not args.smoke else 4, 1
    n = args.questions * args.group
    cfg = load_config(TrainConfig, overrides=dict(
        model=args.model, dataset="arithmetic", prompt="r1_zero", rollout_batch_size=n,
        group_size=args.group if args.work == "grpo" else 2,
        max_new_tokens=args.max_new_tokens, precision=args.precision, microbatch_size=min(args.microbatch, n),
        out="/tmp/train-profile"))
    if args.smoke:
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        from rlvr.core.models import resolve_model_path

        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("SmolLM2-135M-Instruct"))
        model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    else:
        model, tokenizer = load_model(cfg.model, dtype="float32")
    model = prepare_for_training(model)
    optimizer, _ = build_optimizer(model, cfg, 100)
    train = load_split(cfg, "train")
    prompt = get_prompt(cfg.prompt)
    if args.responses == "gsm8k" and args.work == "grpo":
        texts, _ = gsm8k_prompts(args.questions)
        g = torch.Generator().manual_seed(0)
        low = args.max_new_tokens // 3
        short = lambda: int(torch.randint(low, args.max_new_tokens, (1,), generator=g))  # noqa: E731
        lengths = [args.max_new_tokens if torch.rand(1, generator=g) < 0.8 else short() for _ in range(n)]
        ids = [torch.randint(100, len(tokenizer) - 100, (k,), generator=g).tolist() for k in lengths]
        tok = tokenize_prompt_and_ids([t for t in texts for _ in range(args.group)], ids, tokenizer)
        batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"],
                           torch.tensor([1.0, -1.0]).repeat(n // 2 + 1)[:n])
    elif args.work == "sft" or args.responses == "sft":
        # worked solutions: question i's own (sft), or group i's G responses from G other questions (grpo)
        texts = [prompt.render(ex, tokenizer) for ex in train[: args.questions]]
        if args.work == "sft":
            tok = tokenize_prompt_and_output(texts, [prompt.sft_response(ex) for ex in train[: args.questions]],
                                             tokenizer)
            batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"], torch.ones(args.questions))
        else:
            others = [prompt.sft_response(ex) for ex in train[args.questions : args.questions + n]]
            ids = tokenizer(others, add_special_tokens=False)["input_ids"]
            tok = tokenize_prompt_and_ids([t for t in texts for _ in range(args.group)],
                                          [i + [tokenizer.eos_token_id] for i in ids], tokenizer)
            signs = torch.tensor([1.0, -1.0]).repeat(n // 2 + 1)[:n]
            batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"], signs)
    else:
        engine = HFEngine(model, tokenizer, batch_size=64, dtype=cfg.generation_dtype)
        engine.sync_weights(model)
        rollouts = stages.collect_rollouts(engine, model, train, DataOrder(len(train), f"grpo-{cfg.seed}"), prompt,
                                           tokenizer, cfg, 1)
        batch = stages.score_rollouts(rollouts, stages.build_reward_fn(cfg, prompt.reward), cfg.estimator, cfg,
                                      tokenizer).batch
        advantages = torch.where(batch.advantages == 0, torch.full_like(batch.advantages, 1e-12), batch.advantages)
        batch = TrainBatch(batch.input_ids, batch.labels, batch.response_mask, advantages,
                           rollout_log_probs=batch.rollout_log_probs)
    rows = len(batch)
    response_tokens = int(batch.response_mask.sum())
    prompt_tokens = int(batch.response_mask.long().argmax(1).sum())
    print(f"batch ({args.work}, {args.responses if args.work == 'grpo' else 'worked solutions'}): {rows} rows, "
          f"{response_tokens} response tokens, {prompt_tokens} prompt tokens (unshared), width "
          f"{batch.input_ids.shape[1]}; precision {args.precision}, microbatch {cfg.microbatch_size}", flush=True)

    sizes = [int(m) for m in args.microbatches.split(",")] if args.microbatches else [cfg.microbatch_size]
    slots = {}
    for size in sizes:
        slots[size] = token_slots(model, batch.input_ids, batch.response_mask, size, grouped=args.work == "grpo")
        print("microbatch {size}: decoder token slots per update (shared prefixes once): padded {padded}, "
              "packed {packed} ({packed_share:.3f} of padded; {sequences} packed sequences, {microbatches} "
              "microbatches)".format(
                  size=size, **slots[size]), flush=True)

    def sft_update(pack: bool, microbatch: int):
        """rlvr sft's step (rlvr.training.sft) on the batch: microbatches of its rows, one autocast region."""
        model.train()
        with autocast(cfg.precision, model):
            for m in range(0, rows, microbatch):
                part = slice(m, m + microbatch)
                out = get_response_log_probs(model, batch.input_ids[part], batch.labels[part],
                                             positions=batch.response_mask[part], share_prefix=True, pack=pack)
                with autocast_paused(cfg.precision, model):
                    sft_microbatch_train_step(out["log_probs"], batch.response_mask[part],
                                              -(-rows // microbatch))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def update(variant):
        attention, pack, efficiency, microbatch = variants[variant]
        model.set_attn_implementation({"rlvr": TRAINING_ATTENTION, "sdpa": "sdpa"}[attention])
        packing.ATTENTION_EFFICIENCY = efficiency
        if args.work == "sft":
            return sft_update(pack, microbatch)
        return policy_gradient_update(model, optimizer, batch, cfg.estimator, -(-rows // microbatch),
                                      cfg.max_grad_norm, precision=cfg.precision,
                                      rollout_correction=cfg.rollout_correction.spec(), pack=pack)

    efficiencies = [float(e) for e in args.efficiencies.split(",")]
    if sum((args.attention == "compare", args.packing == "compare", len(sizes) > 1)) > 1:
        parser.error("compare one thing at a time: --attention compare, --packing compare or --microbatches")
    pack_on, size = args.packing != "off", sizes[0]
    if args.attention == "compare":
        variants = {name: (name, pack_on, efficiencies[0], size) for name in ("sdpa", "rlvr")}
    elif args.packing == "compare":
        variants = {"padded": (args.attention, False, efficiencies[0], size),
                    **{f"packed (efficiency {e:g})": (args.attention, True, e, size) for e in efficiencies}}
    elif len(sizes) > 1:
        variants = {f"microbatch {m}": (args.attention, pack_on, efficiencies[0], m) for m in sizes}
    else:
        variants = {f"{args.attention} attention, {'packed' if pack_on else 'padded'}":
                    (args.attention, pack_on, efficiencies[0], size)}
    names = list(variants)
    update(names[0])  # warm-up (the first update allocates the optimizer state)
    times = {v: [] for v in names}
    for _ in range(args.repeats):
        for variant in names:
            start = time.perf_counter()
            update(variant)
            times[variant].append(time.perf_counter() - start)
    result = {"machine": machine(), "args": vars(args), "update_s": times, "response_tokens": response_tokens,
              "prompt_tokens": prompt_tokens, "token_slots": {str(k): v for k, v in slots.items()}}
    for variant, seconds in times.items():
        median = statistics.median(seconds)
        print(f"update ({variant}): {median:.2f} s median of {[round(t, 2) for t in seconds]}; "
              f"{response_tokens / median:.0f} response tokens/s", flush=True)
    base = ("sdpa" if args.attention == "compare" else "padded" if args.packing == "compare"
            else names[0] if len(sizes) > 1 else None)
    if base is not None:
        result["ratio"] = {}
        for variant in names[1:]:
            ratio = statistics.median(times[variant]) / statistics.median(times[base])
            print(f"{variant} / {base}: update time ratio {ratio:.3f}")
            result["ratio"][variant] = ratio
    if not args.no_profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], record_shapes=args.shapes) as prof:
            start = time.perf_counter()
            update(names[-1])
            wall = time.perf_counter() - start
        events = prof.key_averages()
        bucket = {e.key: next(b for b, match in BUCKETS if match(e.key)) for e in events}
        buckets = collections.Counter()
        for event in events:
            buckets[bucket[event.key]] += event.self_cpu_time_total / 1e6
        buckets["python and dispatch"] = max(0.0, wall - sum(buckets.values()))
        print(f"profiled update: {wall:.2f} s")
        for name, seconds in buckets.most_common():
            print(f"  {name:58s} {seconds:6.2f} s  {100 * seconds / wall:5.1f} %")
        other = sorted((e for e in events if bucket[e.key] == "other ops"), key=lambda e: -e.self_cpu_time_total)[:12]
        print("  other ops: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e6:.2f}" for e in other))
        top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]
        print("top ops by self time: " + ", ".join(f"{e.key} {e.self_cpu_time_total / 1e6:.2f}" for e in top))
        result["profile"] = dict(buckets)
        if args.shapes:
            by_shape = sorted(prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total)
            for e in by_shape[:args.shapes_top]:
                print(f"  {e.key:40s} {e.count:5d} calls {e.self_cpu_time_total / 1e6:6.2f} s  {e.input_shapes}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Generation tokens/s: rlvr's rollout engine (`HFEngine`) against plain `model.generate` (issue 8,
deliverable 2; also issue 4's "tokens/s at batch 1, 16, 64" with --batches 1,16,64).

    .venv/bin/python bench/rollout.py [--batches 8,64] [--groups 8x8] [--repeats 3] [--json out.json] [--smoke]

Same model (SmolLM2-135M-Instruct), same r1_zero GSM8K test prompts, sampling at temperature 1, top_p 1 (full
distribution, top_k off), at most 128 new tokens, stop at "</answer>", in one process, side by side:

  generate fp32   model.generate(do_sample=True, stop_strings=["</answer>"], tokenizer=..., pad_token_id=...),
                  left padding; G samples per prompt via num_return_sequences (each row prefills its prompt)
  generate bf16   the same on a bfloat16 copy of the model
  rlvr fp32       HFEngine sharing the fp32 model (batch_size = the case's rows)
  rlvr bf16       HFEngine with its own bfloat16 copy of the weights (what `rlvr train` uses by default)
  rlvr int8       (--int8) HFEngine with int8 weights (rlvr.engines.int8: what a CPU without native bf16 runs)

Cases ("batch" = sequences decoded together): B prompts x 1 sample for each B of --batches, and P prompts x G
samples for each PxG of --groups (RL samples G per prompt; rlvr prefills each prompt once and shares it).

Tokens are counted the same way on both sides: each row's generated tokens up to and including the
end-of-sequence token or the token that completes "</answer>", never the padding generate writes after a
finished row. tokens/s = counted tokens / wall time of the call (tokenisation and decoding included), the
median over --repeats calls with different seeds; engines alternate within each repeat. The two sides
sample different completions, so "mean len" (counted tokens per row) shows whether they did similar work.

Reading the output: a table per case, then one line per case with the ratios rlvr / generate of tokens/s
at the same dtype (above 1: rlvr is faster), and rlvr bf16 / generate fp32 for reference. Run it on an otherwise idle machine with --threads at most the idle cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, median, set_threads  # noqa: E402

STOP = "</answer>"


def count_generated(row: list[int], eos_ids: set[int], tokenizer) -> int:
    """Tokens a row really generated: up to and including the first EOS, or the token completing STOP."""
    end = next((i + 1 for i, t in enumerate(row) if t in eos_ids), len(row))  # through the first EOS
    body = row[: end - 1] if row[end - 1] in eos_ids else row[:end]
    if STOP not in tokenizer.decode(body):
        return end  # ended by EOS or by the length limit
    # ended by STOP (what follows is padding, which is EOS here): the shortest prefix containing it
    lo, hi = 1, len(body)
    while lo < hi:
        mid = (lo + hi) // 2
        if STOP in tokenizer.decode(body[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo


def run_generate(model, tokenizer, prompts: list[str], samples: int, max_new_tokens: int, seed: int) -> tuple[int, float]:
    """(counted tokens, seconds) for plain model.generate on the prompts, `samples` rows each."""
    import torch

    start = time.perf_counter()
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
                             stop_strings=[STOP], tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id,
                             num_return_sequences=samples)
    rows = out[:, enc["input_ids"].shape[1] :].tolist()
    texts = tokenizer.batch_decode(rows, skip_special_tokens=True)  # what a trainer would do next (timed alike)
    seconds = time.perf_counter() - start
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    assert len(texts) == len(prompts) * samples
    return sum(count_generated(r, eos_ids, tokenizer) for r in rows), seconds


def run_engine(engine, prompts: list[str], samples: int, max_new_tokens: int, seed: int,
               logprobs: bool = True, outputs: dict | None = None) -> tuple[int, float]:
    """`logprobs`: ask for the sampling log-probs, as `rlvr train` does; `outputs`: where to keep what was
    generated, by seed (the --before check compares them)."""
    from rlvr.engines.base import SamplingParams

    engine.batch_size = len(prompts) * samples  # every row decoded together
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=max_new_tokens, stop=(STOP,), n=samples,
                              seed=seed, logprobs=logprobs)
    start = time.perf_counter()
    completions = engine.generate(prompts, sampling)
    seconds = time.perf_counter() - start
    if outputs is not None:
        outputs[seed, len(prompts), samples] = [(c.token_ids, c.text, c.finish_reason, c.logprobs) for c in completions]
    return sum(len(c.token_ids) for c in completions), seconds


def engine_at(rev: str):
    """rlvr.engines.hf as it was at git revision `rev`, imported beside today's (same rlvr package under it)."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(["git", "show", f"{rev}:src/rlvr/engines/hf.py"], check=True, capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp()) / f"hf_engine_{rev.replace('/', '_')}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_cases(batches: str, groups: str) -> list[tuple[str, int, int]]:
    cases = [(f"batch {b}", b, 1) for b in (int(x) for x in batches.split(",") if x)]
    for g in (x for x in groups.split(",") if x):
        p, n = (int(v) for v in g.lower().split("x"))
        cases.append((f"grouped {p}x{n} = batch {p * n}", p, n))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="8,64", help="single-sample batch sizes, e.g. 1,8,16,64")
    parser.add_argument("--groups", default="8x8", help="PROMPTSxSAMPLES cases, e.g. 8x8,4x16 ('' for none)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bf16", action="store_true", help="skip the rlvr bf16 row")
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--smoke", action="store_true", help="tiny: batch 2 and 2x2, 8 new tokens, 1 repeat")
    parser.add_argument("--before", metavar="REV", help="also run the engine as it was at git revision REV (its "
                        "rows are named '... @REV'), check both give the same completions, print now / REV")
    parser.add_argument("--no-generate", action="store_true", help="skip the model.generate rows")
    parser.add_argument("--int8", action="store_true", help="add the rlvr int8 row (rlvr.engines.int8: int8 "
                        "weights, what a CPU without native bf16 runs)")
    args = parser.parse_args()
    if args.smoke:
        args.batches, args.groups, args.max_new_tokens, args.repeats = "2", "2x2", 8, 1

    set_threads(args.threads)
    import copy

    import torch

    from rlvr.core.models import load_model
    from rlvr.engines.hf import HFEngine

    model, tokenizer = load_model()
    model.eval()
    generators = {"generate fp32": model}
    engines = {"generate fp32": None, "rlvr fp32": HFEngine(model, tokenizer)}
    old = engine_at(args.before) if args.before else None
    if old:
        engines[f"rlvr fp32 @{args.before}"] = old.HFEngine(model, tokenizer)
    if not args.no_bf16:
        generators["generate bf16"] = copy.deepcopy(model).to(torch.bfloat16).eval()
        engines["generate bf16"] = None
        engines["rlvr bf16"] = HFEngine(model, tokenizer, dtype="bfloat16")
        if old:
            engines[f"rlvr bf16 @{args.before}"] = old.HFEngine(model, tokenizer, dtype="bfloat16")
    if args.int8:
        engines["rlvr int8"] = HFEngine(model, tokenizer, dtype="int8")
    if args.no_generate:
        engines = {k: v for k, v in engines.items() if v is not None}
    outputs = {name: {} for name in engines}
    cases = parse_cases(args.batches, args.groups)
    info = machine()
    print(f"machine: {info}")
    print(f"{args.max_new_tokens} new tokens max, stop at {STOP!r}, {args.repeats} repeats, {args.threads} threads")

    def call(name, prompts, samples, max_new_tokens, seed):
        if engines[name] is None:
            return run_generate(generators[name], tokenizer, prompts, samples, max_new_tokens, seed)
        return run_engine(engines[name], prompts, samples, max_new_tokens, seed, outputs=outputs[name])

    warm_prompts, _ = gsm8k_prompts(2)
    for name in engines:  # first calls pay one-off costs (allocator, kernels); keep them out of the numbers
        call(name, warm_prompts, 1, 4, args.seed)

    results = []
    for label, n_prompts, samples in cases:
        prompts, _ = gsm8k_prompts(n_prompts)
        runs = {name: [] for name in engines}
        for rep in range(args.repeats):
            for name in engines:
                tokens, seconds = call(name, prompts, samples, args.max_new_tokens, args.seed + 1 + rep)
                runs[name].append((tokens, seconds))
                print(f"  {label:24s} {name:14s} repeat {rep}: {tokens} tokens in {seconds:.2f} s", file=sys.stderr,
                      flush=True)
        rows = len(prompts) * samples
        for name, rs in runs.items():
            results.append({"case": label, "rows": rows, "engine": name,
                            "tokens_per_s": median([t / s for t, s in rs]),
                            "mean_len": sum(t for t, _ in rs) / (rows * len(rs)),
                            "seconds": median([s for _, s in rs]), "runs": rs})

    print(f"\n{'case':26s} {'engine':14s} {'tokens/s':>9s} {'mean len':>9s} {'s/call':>8s}")
    for r in results:
        print(f"{r['case']:26s} {r['engine']:14s} {r['tokens_per_s']:9.1f} {r['mean_len']:9.1f} {r['seconds']:8.2f}")
    print()
    ratios = {}
    for label, _, _ in cases:
        by = {r["engine"]: r for r in results if r["case"] == label}
        pairs = [("rlvr fp32", "generate fp32"), ("rlvr bf16", "generate bf16"), ("rlvr bf16", "generate fp32"),
                 ("rlvr int8", "rlvr fp32"), ("rlvr int8", "generate fp32"),
                 *[(f"rlvr {d}", f"rlvr {d} @{args.before}") for d in ("fp32", "bf16") if args.before]]
        ratios[label] = {f"{a} / {b}": by[a]["tokens_per_s"] / by[b]["tokens_per_s"] for a, b in pairs
                         if a in by and b in by}
        print(f"{label}: " + ", ".join(f"{name} tokens/s ratio {v:.2f}" for name, v in ratios[label].items()))
    if args.before:
        for d in ("fp32", "bf16"):
            now, then = outputs.get(f"rlvr {d}"), outputs.get(f"rlvr {d} @{args.before}")
            if now is not None and then is not None:
                same = now == then
                print(f"rlvr {d} vs @{args.before}: completions (ids, text, finish, log-probs) "
                      f"{'identical' if same else 'DIFFER'} in {len(now)} calls")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "results": results,
                                               "ratios": ratios}, indent=2))


if __name__ == "__main__":
    main()

"""The GPU and NCCL paths of issue 35 run for real on one device, and the engine vs policy log-prob gap by
position (issue 35 deliverable 6, issue 36 item 2): bench/gpu_check.py part e, about a minute on a GPU.

    python3 bench/gpu_paths.py --device cuda --json out.json      # on the GPU machine (gpu_check runs it)
    .venv/bin/python bench/gpu_paths.py --device cpu --smoke      # here: the same code on gloo, tiny sizes

1. Learner group of 1 (`init_learner_group`, the backend `choose_backend` picks: NCCL on a GPU): one real
   `policy_gradient_update` through the group against the same update with no group, from the same weights.
   Every tensor the update sends through the group is recorded with its device, and the group must refuse a
   CPU tensor before NCCL sees it (the old code all-reduced CPU float64 statistics into NCCL and crashed).
2. Weight broadcast between a learner process and a worker process (`WeightBroadcast`, `engine_weights` from
   the device the policy lives on, received into an `HFEngine`'s own tensors): the worker's engine weights
   must equal the learner's bit for bit. One GPU holds both ranks, which NCCL refuses ("Duplicate GPU";
   rlvr's config refuses it up front), so the pair runs on gloo with CUDA tensors, and a second pair asks NCCL
   for it anyway to record what NCCL says.
3. Log-prob gap: rows sampled by the bf16 engine (its log-probs at temperature 1) scored again by the policy,
   in fp32 and under bf16 autocast (the training precision), by position bucket up to --positions: mean and
   max |engine - policy| and the k3 estimate of KL(engine || policy).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / ".gpu" / "tokenizer"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokenizer():
    from transformers import AutoTokenizer

    from rlvr.core.models import DEFAULT_MODEL, load_tokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER) if (TOKENIZER / "tokenizer.json").is_file() else load_tokenizer(
        DEFAULT_MODEL)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def small_model(device, seed=0, layers=None):
    from rlvr.core.models import random_model

    model = random_model(device=device, seed=seed)
    if layers is not None:  # --smoke: the default shape, fewer layers
        model.model.layers = model.model.layers[:layers]
        model.config.num_hidden_layers = layers
    return model


def a_batch(vocab: int, device, rows=8, prompt=32, response=96, seed=0):
    from rlvr.algorithms.update import TrainBatch

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, prompt + response), generator=g)
    ids[:, :prompt] = ids[0, :prompt]  # one prompt, a group of rows
    mask = torch.zeros_like(ids, dtype=torch.bool)
    for i in range(rows):
        mask[i, prompt - 1 : prompt - 1 + int(torch.randint(1, response, (), generator=g))] = True
    adv = torch.randn(rows, generator=g)
    return TrainBatch(ids.to(device), torch.roll(ids, -1, 1).to(device), mask.to(device), adv.to(device))


# ----------------------------------------------------------------------------------------------------
# 1. The learners' group, size 1.


def learner_group(device: str, layers) -> dict:
    import torch.distributed as dist

    from rlvr.algorithms.spec import get_preset
    from rlvr.algorithms.update import policy_gradient_update
    from rlvr.config import choose_backend
    from rlvr.distributed.parallel import Group, init_learner_group

    dev = torch.device(device)
    backend = choose_backend("auto", [dev.type], "the learners' group")
    seen = []
    original = Group.check

    def recording(self, tensor, op):
        seen.append((op, str(tensor.device), str(tensor.dtype)))
        return original(self, tensor, op)

    Group.check = recording
    try:
        parallel = init_learner_group(0, 1, "127.0.0.1", free_port(), backend, dev, timeout_s=60)
        spec = get_preset("grpo")
        results = {}
        for name, par in (("group", parallel), ("alone", None)):
            model = small_model(dev, layers=layers)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            batch = a_batch(model.config.vocab_size, dev)
            _, meta = policy_gradient_update(model, opt, batch, spec, 2, 1.0, parallel=par)
            results[name] = (model.state_dict(), meta)
        diff = max(float((results["group"][0][k].float() - v.float()).abs().max()) for k, v in
                   results["alone"][0].items())
        other = "cpu" if dev.type == "cuda" else "meta"  # what NCCL cannot carry (on a CPU run: any other)
        try:
            parallel.group.all_reduce(torch.zeros(1, dtype=torch.float64, device=other))
            refused = "NOT refused"
        except ValueError as e:
            refused = f"refused: {e}"
        parallel.close()
        out = {"backend": backend, "device": str(dev), "initialized_after_close": dist.is_initialized(),
               "max_param_diff_group_vs_alone": diff, "grad_norm": [results[k][1]["grad_norm"] for k in results],
               "collectives": sorted({f"{op} {d} {t}" for op, d, t in seen}), "cpu_tensor": refused}
        out["ok"] = bool(diff == 0.0 and refused.startswith("refused") and all(d == str(dev) for _, d, _ in seen[:-1])
                         and len(seen) > 1)
        return out
    finally:
        Group.check = original


# ----------------------------------------------------------------------------------------------------
# 2. Weight broadcast, learner rank 0 -> worker rank 1, as rlvr.distributed.roles' Learner and RolloutWorker do it.


def _broadcast_rank(rank: int, port: int, backend: str, device: str, layers, out: str):
    try:
        from rlvr.distributed.parallel import WeightBroadcast
        from rlvr.engines.hf import HFEngine
        from rlvr.engines.weights import engine_weights

        dev = torch.device(device)
        model = small_model(dev, seed=rank, layers=layers)  # different weights on each side before the sync
        start = time.perf_counter()
        group = WeightBroadcast("127.0.0.1", port, rank, 2, backend, dev, timeout_s=45)
        if rank == 0:
            sent = engine_weights(model, "bfloat16", dev)
            group.broadcast_(list(sent.values()))
            torch.save({k: v.cpu() for k, v in sent.items()}, out + ".sent")
            result = {"sent_devices": sorted({str(v.device) for v in sent.values()}), "tensors": len(sent)}
        else:
            engine = HFEngine(model, tokenizer(), batch_size=1, dtype="bfloat16", device=dev)
            tensors = engine.named_tensors()
            names = list(engine_weights(model, "bfloat16", dev))  # the learner's order (same architecture)
            group.broadcast_([tensors[n] for n in names])
            torch.save({n: tensors[n].detach().cpu() for n in names}, out + ".received")
            result = {"received_devices": sorted({str(tensors[n].device) for n in names})}
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        result["seconds"] = time.perf_counter() - start
        group.close()
        Path(f"{out}.{rank}.json").write_text(json.dumps(result))
    except Exception as e:  # noqa: BLE001 -- reported by the parent
        Path(f"{out}.{rank}.json").write_text(json.dumps({"error": f"{type(e).__name__}: {e}",
                                                          "trace": traceback.format_exc()[-2000:]}))
        raise


def weight_broadcast(device: str, backend: str, layers, tmp: Path, timeout: float) -> dict:
    out = str(tmp / f"bcast-{backend}")
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_broadcast_rank, args=(r, port, backend, device, layers, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    deadline = time.time() + timeout
    for p in procs:
        p.join(max(1.0, deadline - time.time()))
    hung = [i for i, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    ranks = {}
    for r in (0, 1):
        f = Path(f"{out}.{r}.json")
        ranks[r] = json.loads(f.read_text()) if f.is_file() else {"error": "no result"}
    result = {"backend": backend, "device": device, "exit_codes": [p.exitcode for p in procs], "hung_ranks": hung,
              "ranks": {r: {k: v for k, v in d.items() if k != "trace"} for r, d in ranks.items()}}
    if Path(out + ".sent").is_file() and Path(out + ".received").is_file():
        sent, got = torch.load(out + ".sent"), torch.load(out + ".received")
        result["tensors_equal"] = all(torch.equal(sent[k], got[k]) for k in sent)
        result["bytes"] = sum(v.numel() * v.element_size() for v in sent.values())
    for r, d in ranks.items():
        if "trace" in d:
            result.setdefault("traces", {})[r] = d["trace"]
    result["ok"] = bool(result.get("tensors_equal")) and not hung
    return result


# ----------------------------------------------------------------------------------------------------
# 3. Engine vs policy log-probs by position.


def logprob_gap(device: str, rows: int, positions: int, bucket: int, layers) -> dict:
    from rlvr.algorithms.policy import autocast, get_response_log_probs
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    dev = torch.device(device)
    tok = tokenizer()
    model = small_model(dev, layers=layers).eval()
    prompt = tok.apply_chat_template([{"role": "user", "content": "Natalia sold clips to 48 of her friends in April, "
                                       "and then she sold half as many clips in May. How many clips did she sell?"}],
                                     tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
    new = positions - len(prompt_ids)
    engine = HFEngine(model, tok, batch_size=rows, dtype="bfloat16", device=dev)
    start = time.perf_counter()
    completions = engine.generate([prompt], SamplingParams(temperature=1.0, max_new_tokens=new, min_new_tokens=new,
                                                           n=rows, seed=0, logprobs=True))
    gen_s = time.perf_counter() - start
    ids = torch.tensor([prompt_ids + c.token_ids for c in completions], device=dev)
    engine_lp = torch.tensor([c.logprobs for c in completions], device=dev)
    labels = torch.roll(ids, -1, 1)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, len(prompt_ids) - 1 : -1] = True
    out = {"rows": rows, "positions": ids.shape[1], "prompt_tokens": len(prompt_ids), "generate_s": gen_s,
           "by_precision": {}}
    for precision in ("fp32", "bf16"):
        with torch.no_grad(), autocast(precision, model):
            lp = get_response_log_probs(model, ids, labels, positions=mask)["log_probs"]
        policy_lp = lp[:, len(prompt_ids) - 1 : -1].float()
        delta = engine_lp - policy_lp  # log(engine / policy) per sampled token
        k3 = torch.exp(-delta) - 1 + delta  # k3 estimate of KL(engine || policy), samples from the engine
        buckets = []
        for lo in range(0, ids.shape[1], bucket):
            cols = [p - (len(prompt_ids) - 1) for p in range(max(lo, len(prompt_ids) - 1), min(lo + bucket, ids.shape[1] - 1))]
            if not cols:
                continue
            d, k = delta[:, cols], k3[:, cols]
            buckets.append({"from": lo, "to": lo + bucket, "tokens": d.numel(), "mean_abs": float(d.abs().mean()),
                            "max_abs": float(d.abs().max()), "k3": float(k.mean())})
        out["by_precision"][precision] = {"mean_abs": float(delta.abs().mean()), "max_abs": float(delta.abs().max()),
                                          "k3": float(k3.mean()), "buckets": buckets}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json")
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--positions", type=int, default=2048)
    parser.add_argument("--bucket", type=int, default=256)
    parser.add_argument("--smoke", action="store_true", help="3 layers, 4 rows, 160 positions")
    args = parser.parse_args()
    layers = 3 if args.smoke else None
    if args.smoke:
        args.rows, args.positions, args.bucket = 4, 160, 64
    results = {"device": args.device, "torch": torch.__version__}

    def save():
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    import tempfile

    dev = torch.device(args.device)
    if dev.type == "cuda":
        results["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    for name, call in (
        ("learner_group", lambda: learner_group(args.device, layers)),
        ("broadcast_gloo", lambda: weight_broadcast(args.device, "gloo", layers, Path(tmp), 60)),
        ("broadcast_nccl_one_gpu", lambda: weight_broadcast(args.device, "nccl", layers, Path(tmp), 45)
         if dev.type == "cuda" else {"skipped": "no GPU"}),
        ("logprob_gap", lambda: logprob_gap(args.device, args.rows, args.positions, args.bucket, layers)),
    ):
        with tempfile.TemporaryDirectory(prefix="gpu-paths-") as tmp:
            start = time.perf_counter()
            try:
                results[name] = call()
            except Exception as e:  # noqa: BLE001 -- every part is reported, the rest still runs
                results[name] = {"error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-3000:]}
            results[name]["seconds"] = time.perf_counter() - start
        shown = {k: v for k, v in results[name].items() if k not in ("trace", "traces", "by_precision")}
        print(f"  {name}: {json.dumps(shown, default=str)}", flush=True)
        for trace in ([results[name]["trace"]] if "trace" in results[name] else
                      list(results[name].get("traces", {}).values())):
            print("    " + trace.replace("\n", "\n    "))
        save()
    gap = results["logprob_gap"].get("by_precision", {})
    for precision, g in gap.items():
        print(f"  log-prob gap, engine bf16 vs policy {precision}: mean |d| {g['mean_abs']:.4f}, max |d| "
              f"{g['max_abs']:.3f}, k3 KL {g['k3']:.2e}; by position: " + ", ".join(
                  f"{b['from']}-{b['to']}: {b['mean_abs']:.4f}/{b['max_abs']:.3f}" for b in g["buckets"]))
    save()


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.path.insert(0, str(ROOT / "src"))
    main()

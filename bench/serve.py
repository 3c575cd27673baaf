"""`rlvr serve` under load (issue 65): 64 concurrent clients against the engine called directly with the same
batch, time to first token, and a 1,000-request burst against a bounded queue.

    .venv/bin/python bench/serve.py [--clients 64] [--max-new-tokens 128] [--repeats 3] [--burst 1000]
                                    [--queue 256] [--dtype float32] [--threads N] [--json out.json] [--smoke]

The server runs as `rlvr serve MODEL` in a child process (so the clients' Python does not share its interpreter);
the clients are one asyncio loop of httpx requests in this process. Work is the same on every side: the first
`--clients` r1_zero GSM8K prompts as token ids, sampled at temperature 1 with one seed, at most --max-new-tokens
new tokens, stopping at "</answer>"; a row's random stream is keyed by its prompt and the seed, so the server
samples the tokens the engine samples (the output counts how many completions are identical).

  engine generate     HFEngine.generate(all prompts) in this process: what rlvr's trainer calls
  engine continuous   the engine's continuous batch (rlvr.engines.continuous) fed all prompts at once, no HTTP
  server              --clients concurrent POST /v1/completions to the child, each one prompt; wall time from
                      the first request sent to the last answer read

tokens/s = sampled tokens / wall seconds, the median over --repeats; the sides alternate within each repeat. The
ratio server / engine generate is the issue's number (goal >= 0.8). Time to first token: the same clients with
stream=true, from sending to the first streamed token, median and 90th percentile (all clients arrive at once,
so it includes waiting for the batch's prefill), and one request alone on the idle server.

Burst: --burst requests (max_tokens 16) sent at once to a server whose queue holds --queue; each gets 200 or 429
(nothing lost), none times out (nothing hangs); the server's resident memory after a first and a second burst
(memory flat: the second adds nothing to the first). --smoke: a random 2-layer model, 8 clients, 8 new tokens,
a burst of 60 against a queue of 8, one repeat (a check that the script runs, not a measurement).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, cores, gsm8k_prompts, machine, median, set_threads  # noqa: E402

STOP = "</answer>"


def start_server(model: str, args) -> tuple[subprocess.Popen, str]:
    """`rlvr serve MODEL` in a child process on a free port, its threads pinned; (process, its URL)."""
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               PYTHONPATH=str(ROOT / "src"), TOKENIZERS_PARALLELISM="false")
    command = [sys.executable, "-m", "rlvr.cli", "serve", model, "--port", "0", f"max_rows={args.clients}",
               f"max_queue={args.queue}", f"dtype={args.dtype}", "reuse_sampled_ids=false"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in process.stdout:
        if "rlvr serve:" in line:
            return process, line.split(" on ")[1].split("/v1")[0]
    raise SystemExit(f"the server did not start (exit {process.wait()})")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return float(line.split()[1]) / 1024
    return float("nan")


async def one(http, url: str, ids: list[int], args, seed: int, stream: bool = False, max_tokens=None):
    """(status, sampled ids, seconds to the first token or None, error or None) of one /v1/completions call."""
    body = {"prompt": ids, "max_tokens": max_tokens or args.max_new_tokens, "temperature": 1.0, "seed": seed,
            "stop": [STOP], "return_token_ids": True, "stream": stream}
    start = time.perf_counter()
    try:
        if not stream:
            response = await http.post(url + "/v1/completions", json=body)
            data = response.json()
            ids = data["choices"][0]["token_ids"] if response.status_code == 200 else []
            return response.status_code, ids, None, None
        first, out = None, []
        async with http.stream("POST", url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    piece = json.loads(line[6:])["choices"][0].get("token_ids") or []
                    if piece and first is None:
                        first = time.perf_counter() - start
                    out += piece
        return response.status_code, out, first, None
    except Exception as err:  # noqa: BLE001 -- counted and reported: a lost or hung request
        return None, [], None, f"{type(err).__name__}: {err}"


async def clients(url: str, prompts: list[list[int]], args, seed: int, stream: bool = False, max_tokens=None,
                  timeout: float = 600):
    import httpx

    limits = httpx.Limits(max_connections=len(prompts) + 8, max_keepalive_connections=len(prompts) + 8)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        start = time.perf_counter()
        results = await asyncio.gather(*(one(http, url, ids, args, seed, stream, max_tokens) for ids in prompts))
        return results, time.perf_counter() - start


def tiny_model_dir(where: Path) -> str:
    """A random 2-layer Llama with the default model's tokenizer, saved for the child (smoke only)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from rlvr.core.models import load_tokenizer

    tokenizer = load_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True)
    LlamaForCausalLM(config).save_pretrained(where)
    tokenizer.save_pretrained(where)
    return str(where)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--burst", type=int, default=1000)
    parser.add_argument("--queue", type=int, default=256)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--smoke", action="store_true", help="a random tiny model, 8 clients, 8 tokens, burst 60")
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory()
    if args.smoke:
        args.clients, args.max_new_tokens, args.repeats, args.burst, args.queue = 8, 8, 1, 60, 8
        args.model = tiny_model_dir(Path(scratch.name) / "tiny")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # a burst holds a socket per request on each side
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.burst + 256)), hard))
    set_threads(args.threads)

    from rlvr.core.models import load_model
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    model, tokenizer = load_model(args.model)
    engine = HFEngine(model.eval(), tokenizer, batch_size=args.clients, dtype=None if args.dtype == "float32"
                      else args.dtype, prefix_cache_mib=0)
    texts, _ = gsm8k_prompts(args.clients)
    prompts = [tokenizer(t, add_special_tokens=False).input_ids for t in texts]

    def sampling(seed):
        return SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens, stop=(STOP,), seed=seed)

    process, url = start_server(args.model, args)
    info = machine()
    print(f"machine: {info}\nserver {url} (pid {process.pid}), {args.clients} clients, {args.max_new_tokens} new "
          f"tokens max, {args.threads} threads, {args.dtype}", flush=True)
    try:
        asyncio.run(clients(url, prompts[:2], args, args.seed, max_tokens=4))  # one-off costs out of the numbers
        engine.generate(prompts[:2], SamplingParams(max_new_tokens=4))
        runs = {"engine generate": [], "engine continuous": [], "server": []}
        same = total = 0
        for rep in range(args.repeats):
            seed = args.seed + 1 + rep
            start = time.perf_counter()
            reference = engine.generate(prompts, sampling(seed))
            runs["engine generate"].append((sum(len(c.token_ids) for c in reference), time.perf_counter() - start))
            batch = engine.continuous_batch(args.clients)
            start = time.perf_counter()
            for k, ids in enumerate(prompts):
                batch.add_request(str(k), ids, sampling(seed))
            tokens = 0
            while batch.has_unfinished_requests():
                tokens += len(batch.step())
            runs["engine continuous"].append((tokens, time.perf_counter() - start))
            results, seconds = asyncio.run(clients(url, prompts, args, seed))
            lost = [r for r in results if r[0] != 200]
            if lost:
                raise SystemExit(f"{len(lost)} server requests failed: {lost[:3]}")
            runs["server"].append((sum(len(r[1]) for r in results), seconds))
            same += sum(r[1] == c.token_ids for r, c in zip(results, reference))
            total += len(results)
            for name, rs in runs.items():
                print(f"  repeat {rep} {name:18s} {rs[-1][0]} tokens in {rs[-1][1]:.2f} s", file=sys.stderr, flush=True)
        rates = {name: median([t / s for t, s in rs]) for name, rs in runs.items()}
        streamed, _ = asyncio.run(clients(url, prompts, args, args.seed + 99, stream=True))
        ttfts = sorted(r[2] for r in streamed if r[2] is not None)
        alone, _ = asyncio.run(clients(url, prompts[:1], args, args.seed + 99, stream=True))
        burst = []
        for _ in range(2):
            before = rss_mb(process.pid)
            answers, seconds = asyncio.run(clients(url, [prompts[k % len(prompts)] for k in range(args.burst)], args,
                                                   args.seed, max_tokens=16, timeout=900))
            codes = [a[0] for a in answers]
            burst.append({"ok": codes.count(200), "queue_full": codes.count(429), "errors": [a[3] for a in answers
                          if a[3]][:3], "other": len(codes) - codes.count(200) - codes.count(429),
                          "seconds": round(seconds, 2), "rss_before_mb": round(before, 1),
                          "rss_after_mb": round(rss_mb(process.pid), 1)})
    finally:
        process.send_signal(signal.SIGTERM)
        code = process.wait(120)
    print(f"\n{'side':20s} {'tokens/s':>9s}")
    for name, rate in rates.items():
        print(f"{name:20s} {rate:9.1f}")
    ratio, ratio_continuous = rates["server"] / rates["engine generate"], rates["server"] / rates["engine continuous"]
    print(f"server / engine generate: {ratio:.2f} (goal >= 0.8); server / engine continuous: {ratio_continuous:.2f}")
    print(f"completions identical to the engine's for the same seed: {same} of {total}")
    q = lambda p: ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))] if ttfts else float("nan")  # noqa: E731
    print(f"time to first token, {args.clients} clients at once: median {q(0.5):.3f} s, p90 {q(0.9):.3f} s; "
          f"alone: {alone[0][2]:.3f} s")
    for k, b in enumerate(burst):
        print(f"burst {k + 1}: {args.burst} requests, queue {args.queue}: {b['ok']} answered, {b['queue_full']} "
              f"refused 429, {b['other']} lost or failed {b['errors']}; {b['seconds']} s; server RSS "
              f"{b['rss_before_mb']} -> {b['rss_after_mb']} MB")
    print(f"server exit status after SIGTERM: {code}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": info, "args": vars(args), "tokens_per_s": rates,
                                               "runs": runs, "ratio": ratio, "identical": [same, total],
                                               "ttft": ttfts, "ttft_alone": alone[0][2], "burst": burst,
                                               "exit": code}, indent=2))
    if any(b["other"] for b in burst) or code != 0:
        raise SystemExit("requests were lost or the server did not stop cleanly")


if __name__ == "__main__":
    main()

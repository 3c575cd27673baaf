"""Multi-turn episodes: continuing each turn from the engine's kept KV against prefilling the whole history
again (issue 38: "the engine continues an episode after an observation from its KV cache ... measure both").

    .venv/bin/python bench/episode_cache.py [--questions 8] [--group 4] [--turns 6] [--max-tokens 384] [--repeats 2]
                                            [--json out.json] [--smoke]

Same model (SmolLM2-135M-Instruct), same r1_zero GSM8K test prompts, the same seed on both sides, in one process:
an environment that answers every line the model writes with a short note (stop "\n", observation " [noted]\n",
as a calculator answers each annotation), up to --turns turns, so most episodes have several turns whatever the
model writes. Two engines sharing the model:

  kept       HFEngine(prefix_cache_mib=4096): each turn's KV is kept; the next turn prefills only the last
             sampled id and the observation (what `rlvr train env=...` does by default, env_cache_mib)
  prefill    HFEngine(prefix_cache_mib=0): every turn prefills the prompt, every earlier turn and observation

Per side: wall seconds of run_episodes (median over --repeats; sides alternate), ids prefilled and ids taken from
kept KV (engine.stats), and whether the episodes came out the same (ids equal; they may differ by float rounding:
a prefill and a decode step sum in different orders). The line `ratio` is prefill seconds / kept seconds (above 1:
keeping the KV is faster). Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cores, gsm8k_prompts, machine, median, set_threads  # noqa: E402

NOTE = " [noted]\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--group", type=int, default=4, help="episodes per question (G)")
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=384, help="the episode's token budget (model + observations)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=cores())
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--smoke", action="store_true", help="a tiny end-to-end run (numbers meaningless)")
    args = ap.parse_args()
    if args.smoke:
        args.questions, args.group, args.turns, args.max_tokens, args.repeats = 1, 2, 2, 48, 1
    set_threads(args.threads)

    from rlvr.core.models import load_model
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.environments import Environment, Observation
    from rlvr.stages.episodes import run_episodes
    from rlvr.tasks.records import Example

    class Notes(Environment):
        stop = ("\n",)
        max_turns = args.turns
        max_total_tokens = args.max_tokens

        def step(self, text, ids):
            return Observation(text=NOTE)

    model, tokenizer = load_model(dtype=args.dtype)
    prompts, answers = gsm8k_prompts(args.questions)
    questions = [Example(p, a) for p, a in zip(prompts, answers)]
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_tokens, n=args.group, seed=1,
                              stop=("</answer>",), logprobs=True)
    engines = {"kept": HFEngine(model, tokenizer, batch_size=64, prefix_cache_mib=4096),
               "prefill": HFEngine(model, tokenizer, batch_size=64, prefix_cache_mib=0)}
    seconds = {name: [] for name in engines}
    episodes = {}
    for repeat in range(args.repeats):
        for name in (engines if repeat % 2 == 0 else reversed(list(engines))):
            engine = engines[name]
            start = time.perf_counter()
            episodes[name] = run_episodes(engine, Notes, questions, prompts, sampling, tokenizer)
            seconds[name].append(time.perf_counter() - start)
            print(f"repeat {repeat} {name:8s} {seconds[name][-1]:7.1f} s", flush=True)
    same = sum(a.token_ids == b.token_ids for a, b in zip(episodes["kept"], episodes["prefill"]))
    turns = [c.episode["turns"] for c in episodes["kept"]]
    result = {"machine": machine(), "args": {k: str(v) for k, v in vars(args).items()},
              "episodes": len(turns), "mean_turns": sum(turns) / len(turns),
              "same_episodes": same, "sides": {}}
    print(f"{len(turns)} episodes, {sum(turns) / len(turns):.2f} turns each; {same} identical on both sides")
    for name, engine in engines.items():
        side = {"seconds": median(seconds[name]), "all_seconds": seconds[name],
                "prefill_ids_per_repeat": engine.stats["prefill_tokens"] / args.repeats,
                "kept_ids_per_repeat": engine.stats["cached_tokens"] / args.repeats,
                "generated_ids_per_repeat": engine.stats["generated_tokens"] / args.repeats,
                "kept_kv_peak_mib": engine.prefix_cache.peak_bytes / 2**20 if engine.prefix_cache is not None else 0.0}
        result["sides"][name] = side
        print(f"{name:8s} {side['seconds']:7.1f} s  prefilled {side['prefill_ids_per_repeat']:8.0f} ids  "
              f"from kept KV {side['kept_ids_per_repeat']:8.0f}  generated {side['generated_ids_per_repeat']:7.0f}  "
              f"kept KV peak {side['kept_kv_peak_mib']:.0f} MiB")
    result["ratio"] = result["sides"]["prefill"]["seconds"] / result["sides"]["kept"]["seconds"]
    print(f"ratio prefill/kept seconds: {result['ratio']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

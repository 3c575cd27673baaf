"""Host memory of loading a rollout engine's model (issue 35, item 4): before, a rollout worker and `rlvr eval`
loaded the model in fp32 and the engine made its own bf16 copy (two copies, one of them in fp32); now they load
it in the engine's dtype and the engine uses it as it is (one copy).

    .venv/bin/python bench/load_memory.py [--model SmolLM2-135M-Instruct] [--dtype bfloat16]

Each way runs in a fresh process, after a warm-up process that converts and caches the model, for two
checkpoints: the model as rlvr caches it (fp32 safetensors) and the same weights saved in `--dtype` (how most
hub models are stored, a 7B model's 14 GB in bf16). Per process it prints the peak RSS (ru_maxrss), the RSS once
loaded, and the anonymous part of it (RssAnon: memory that cannot be dropped; safetensors maps the file, and the
mapped pages of a tensor used as it is on disk are file-backed), and the ratios now / before measured in the same
run. The engines' outputs are the same (tests/test_rollout.py).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile

CHILD = r"""
import gc, json, resource, sys
model_name, dtype, way = sys.argv[1:4]
from rlvr.engines.hf import HFEngine
from rlvr.core.models import load_model

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024

base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if way == "before":
    model, tok = load_model(model_name)  # fp32, then the engine's private copy in `dtype`
else:
    model, tok = load_model(model_name, dtype=dtype)
engine = HFEngine(model, tok, dtype=dtype)
gc.collect()
weights = sum(t.numel() * t.element_size() for t in engine.named_tensors().values())
print(json.dumps({"peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "imports_mib": base / 1024, "rss_mib": status("VmRSS"), "anon_mib": status("RssAnon"),
                  "engine_weights_mib": weights / 2**20, "copies": 1 if engine.model is model else 2}))
"""

SAVE = r"""
import sys, torch
from rlvr.core.models import load_model
model, tok = load_model(sys.argv[1], dtype=sys.argv[2])
model.save_pretrained(sys.argv[3]); tok.save_pretrained(sys.argv[3])
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="SmolLM2-135M-Instruct")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()

    def run(model: str, way: str) -> dict:
        out = subprocess.run([sys.executable, "-c", CHILD, model, args.dtype, way], check=True, capture_output=True,
                             text=True).stdout
        return json.loads(out.splitlines()[-1])

    run(args.model, "after")  # warm-up: the model converted into the cache
    with tempfile.TemporaryDirectory() as saved:
        subprocess.run([sys.executable, "-c", SAVE, args.model, args.dtype, saved], check=True, capture_output=True)
        for label, model in ((f"{args.model} (fp32 checkpoint)", args.model), (f"{args.dtype} checkpoint", saved)):
            before, after = run(model, "before"), run(model, "after")
            print(label)
            for way, r in (("before: fp32 load + engine copy", before), (f"now: {args.dtype} load, shared", after)):
                print(f"  {way:34s} peak RSS {r['peak_mib']:6.0f} MiB, loaded RSS {r['rss_mib']:6.0f} "
                      f"(anonymous {r['anon_mib']:5.0f}), imports {r['imports_mib']:.0f}, "
                      f"engine weights {r['engine_weights_mib']:.0f} MiB, {r['copies']} copies")
            grown = lambda r, k: r[k] - r["imports_mib"]  # noqa: E731
            print(f"  now / before: peak RSS {after['peak_mib'] / before['peak_mib']:.2f} (growth over the imports "
                  f"{grown(after, 'peak_mib') / grown(before, 'peak_mib'):.2f}), loaded RSS "
                  f"{after['rss_mib'] / before['rss_mib']:.2f}, anonymous {after['anon_mib'] / before['anon_mib']:.2f}")


if __name__ == "__main__":
    main()

"""The GPU check (issue 14, deliverable 5): rlvr's GPU tests and speed on one CUDA device, in one run.

    .venv/bin/python bench/gpu_check.py --prepare                 # here, where PyPI is reachable: fills .gpu/
    python3 bench/gpu_check.py [--json out.json]                  # on the GPU machine (see --prepare's command)
    .venv/bin/python bench/gpu_check.py --device cpu --smoke      # the whole check at tiny sizes, on a CPU

The GPU machine has torch, transformers, accelerate, peft and the other common packages, but not the rest of
what rlvr and TRL import, nothing can be downloaded there, and no model weights travel. So --prepare
downloads wheels of the missing packages (the versions installed here, for CPython 3.12 x86-64) into
.gpu/wheels/ and copies the default model's tokenizer into .gpu/tokenizer/; the check installs the wheels
with `pip --target` and runs on a randomly initialised model of the default model's shape (the config ships
with rlvr: rlvr.models.random_model). Random weights do the same work per token as the real ones.

The check, in order (each part's result is also written to --json as soon as it is known):
  a. `pytest -m gpu tests/`: its summary line (failures are reported, the check goes on).
  b. Generation tokens/s, rlvr's HFEngine (its bfloat16 copy) against `model.generate` on a bfloat16 copy, at
     batch 1, 16, 64, 256 (--batches): the same r1_zero GSM8K test prompts, temperature 1, top_p 1, top_k off,
     and exactly --new-tokens tokens per row on both sides (min = max new tokens, so no row stops early and
     both sides decode the same tokens). One warm-up call per side, then the median of --repeats calls, the
     sides alternating. Timed with the device synchronised; tokenising and decoding the text included.
  c. One GRPO step, rlvr against TRL's GRPOTrainer: bench/grpo_step.py's runs rlvr_bf16 and trl_bf16, one
     grpo_step.py call each (rlvr first, so that a TRL failing here still leaves rlvr's numbers), each run in a
     child process of its own, on the random model saved once to a temporary directory (both sides load the
     same weights): --questions x --group-size completions of --new-tokens tokens, bf16 autocast training on
     both sides, beta 0, no vLLM, every rollout trained on both sides (rewards of random weights are all 0,
     and rlvr would otherwise skip every zero-advantage rollout), 1 warm-up step, then 3 timed. Peak GPU
     memory is torch.cuda.max_memory_allocated at the end of each child.
  d. The dense bf16 matmul rate of this GPU (--matmul-n cubed, the mean of 10 after 3 warm-ups), and the
     share of it the training phase of (c) reaches: 6 x params x trained positions / train seconds, the count
     of bench/matmul.py (positions = prompt + response of every trained rollout; rlvr runs a group's shared
     prompt once, so it does less work than this counts).
  e. The last two lines: the engine/generate ratio at batch 64, then, in bench/grpo_step.py's form,
     `rlvr/TRL: step time ratio X, peak GPU memory ratio Y` (on a CPU: peak RSS ratio).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, cores, gsm8k_prompts, machine, median, set_threads  # noqa: E402
from grpo_step import synchronize  # noqa: E402

GPU_DIR = ROOT / ".gpu"
WHEELS = GPU_DIR / "wheels"
TOKENIZER = GPU_DIR / "tokenizer"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json")
SIZE_LIMIT_MIB = 40  # the working tree and .gpu travel together, at most 64 MiB in all

# What rlvr (and TRL, for part c) import that the GPU machine lacks, with their own dependencies.
# typing-extensions is there (torch needs it) but pydantic 2.14 needs >= 4.16, newer than torch asks for, and a
# newer typing-extensions shadowing an older one breaks nothing. pytest-timeout: pyproject's `timeout` setting.
# transformers and peft are there too, in other versions (transformers 5.17): rlvr's engine builds on
# transformers' cache classes, so the check carries the versions the CPU tests ran with (pure-python wheels).
MISSING_THERE = ("transformers", "peft", "pydantic", "pydantic-core", "annotated-types", "typing-inspection",
                 "typing-extensions",
                 "math-verify", "latex2sympy2-extended", "antlr4-python3-runtime", "pebble", "gguf",
                 "trl", "datasets", "dill", "multiprocess", "pytest-timeout")
# Installed there (as the machine is described), with the dependencies they come with.
PRESENT_THERE = {"torch", "accelerate", "safetensors", "tokenizers", "typer-slim", "shellingham", "numpy", "pytest", "pyyaml", "typer",
                 "rich", "tqdm", "tensorboard", "matplotlib", "pyarrow", "pandas", "xxhash", "fsspec",
                 "huggingface-hub", "requests", "sympy", "mpmath", "networkx", "jinja2", "filelock", "packaging",
                 "psutil", "tokenizers", "regex"}
# The target machine: CPython 3.12 on x86-64 Linux (for pip download and for evaluating Requires-Dist markers)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
TARGET_ENV = {"python_version": "3.12", "python_full_version": "3.12.0", "implementation_name": "cpython",
              "platform_python_implementation": "CPython", "sys_platform": "linux", "platform_system": "Linux",
              "platform_machine": "x86_64", "os_name": "posix", "extra": ""}
RUN_COMMAND = ("python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade "
               "--target /tmp/site .gpu/wheels/*.whl && export PYTHONPATH=/tmp/site:src PYTHONUNBUFFERED=1 && "
               "python3 bench/gpu_check.py --json $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log")


# ----------------------------------------------------------------------------------------------------
# --prepare: wheels and tokenizer for a machine that cannot download.


def wheel_requirements(wheel: Path) -> list:
    """The Requires-Dist entries of a wheel that apply on the target machine (markers evaluated, no extras)."""
    import zipfile

    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(name).decode().splitlines()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in lines if line.startswith("Requires-Dist:")]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(TARGET_ENV)]


def prepare() -> None:
    """Download the wheels, check their requirements, copy the tokenizer, print the GPU machine's command."""
    from importlib.metadata import version

    from packaging.utils import canonicalize_name, parse_wheel_filename

    wanted = {canonicalize_name(name): version(name) for name in MISSING_THERE}  # what this environment runs
    WHEELS.mkdir(parents=True, exist_ok=True)
    for wheel in WHEELS.glob("*.whl"):  # one version of each: drop wheels of other versions or packages
        name, ver, _, _ = parse_wheel_filename(wheel.name)
        if wanted.get(name) != str(ver):
            wheel.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS),
                    *(f"{name}=={ver}" for name, ver in wanted.items())], check=True)

    wheels = sorted(WHEELS.glob("*.whl"))
    have = {parse_wheel_filename(w.name)[0] for w in wheels}
    print(f"{len(wheels)} wheels in {WHEELS.relative_to(ROOT)}:")
    unmet = []
    for wheel in wheels:
        reqs = wheel_requirements(wheel)
        unmet += [f"{wheel.name} needs {r}" for r in reqs if canonicalize_name(r.name) not in have | PRESENT_THERE]
        print(f"  {wheel.name} ({wheel.stat().st_size / 2**20:.2f} MiB)  requires: {', '.join(map(str, reqs)) or '-'}")
    if have != set(wanted):
        unmet += [f"no wheel for {name}=={wanted[name]}" for name in sorted(set(wanted) - have)]

    from rlvr.models import DEFAULT_MODEL, resolve_model_path

    source = Path(resolve_model_path(DEFAULT_MODEL))
    TOKENIZER.mkdir(parents=True, exist_ok=True)
    copied = [f for f in TOKENIZER_FILES if (source / f).is_file()]
    for f in copied:
        shutil.copy2(source / f, TOKENIZER / f)
    print(f"tokenizer: {', '.join(copied)} from {source}")
    ensure_excluded()

    size = sum(f.stat().st_size for f in GPU_DIR.rglob("*") if f.is_file()) / 2**20
    print(f".gpu/ holds {size:.1f} MiB (limit {SIZE_LIMIT_MIB} MiB)")
    if unmet or size > SIZE_LIMIT_MIB:
        raise SystemExit("not ready:\n  " + "\n  ".join(unmet + ([f"{size:.1f} MiB is too much"]
                                                               if size > SIZE_LIMIT_MIB else [])))
    print("ready. On the GPU machine (device tool, carry [\".gpu\"]), run:")
    print(RUN_COMMAND)


def ensure_excluded() -> None:
    """.gpu/ holds downloads, not sources: keep it out of git (it travels as a carried path)."""
    exclude = ROOT / ".git" / "info" / "exclude"
    if not (ROOT / ".git").is_dir():
        return
    lines = exclude.read_text().splitlines() if exclude.is_file() else []
    if "/.gpu/" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        exclude.write_text("\n".join(lines + ["/.gpu/"]) + "\n")


# ----------------------------------------------------------------------------------------------------
# Running children: each with the source tree on its path, killed with its own children on a timeout.


def child_env() -> dict:
    """This environment plus src/ on PYTHONPATH: rlvr may be imported from the tree, not installed."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT / "src") not in {str(Path(p).resolve()) for p in paths}:
        paths.append(str(ROOT / "src"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), TOKENIZERS_PARALLELISM="false")


def run_limited(argv: list[str], timeout: float, capture: bool) -> tuple[int | None, str]:
    """(exit code or None on timeout, captured output). A timeout kills the child's whole process group, so
    grpo_step.py's own children do not outlive it."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=child_env(), start_new_session=True, text=True,
                            stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT if capture else None)
    try:
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out or ""
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        return None, out or ""


# ----------------------------------------------------------------------------------------------------
# The parts of the check.


def preflight(device: str) -> dict:
    """Versions of what the check imports, the imports that fail, and the wheels' requirements not met here."""
    from importlib.metadata import PackageNotFoundError, version

    import torch

    info = {"python": sys.version.split()[0], "imports": {}, "failed_imports": {}, "unmet_requirements": []}
    for module in ("torch", "transformers", "accelerate", "peft", "safetensors", "numpy", "yaml", "typer", "rich",
                   "tqdm", "pydantic", "math_verify", "pebble", "gguf", "datasets", "trl", "rlvr.update",
                   "rlvr.hf_engine"):
        try:
            mod = __import__(module, fromlist=["_"])
            info["imports"][module] = getattr(mod, "__version__", "ok")
        except Exception as e:  # noqa: BLE001 -- report every failure, whatever it is
            info["failed_imports"][module] = f"{type(e).__name__}: {e}"
    for wheel in sorted(WHEELS.glob("*.whl")):
        for req in wheel_requirements(wheel):
            try:
                have = version(req.name)
            except PackageNotFoundError:
                have = None
            if have is None or not req.specifier.contains(have, prereleases=True):
                info["unmet_requirements"].append(f"{wheel.name.split('-')[0]}: {req} (installed: {have})")
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        info["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                       "capability": f"{props.major}.{props.minor}", "cuda": torch.version.cuda}
    print(f"python {info['python']}; " + ", ".join(f"{m} {v}" for m, v in info["imports"].items()))
    for module, error in info["failed_imports"].items():
        print(f"  IMPORT FAILED {module}: {error}")
    for line in info["unmet_requirements"]:
        print(f"  unmet requirement {line}")
    if "gpu" in info:
        print(f"gpu: {info['gpu']}")
    return info


def gpu_tests(timeout: float, log_path: Path | None) -> dict:
    """pytest -m gpu tests/: exit code, summary line, and the failure lines; the full output to log_path."""
    argv = [sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/", "-p", "no:cacheprovider"]
    start = time.perf_counter()
    rc, out = run_limited(argv, timeout, capture=True)
    seconds = time.perf_counter() - start
    if log_path is not None:
        log_path.write_text(out)
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    summary = next((line for line in reversed(lines)
                    if re.search(r"\b(passed|failed|skipped|errors?|deselected|no tests ran)\b", line)), "(no summary)")
    problems = [line for line in lines if line.startswith(("FAILED", "ERROR"))]
    status = "timed out" if rc is None else "ok" if rc == 0 else f"exit code {rc}"
    print(f"pytest -m gpu: {summary.strip('= ')} [{status}, {seconds:.0f} s]")
    for line in problems[:20]:
        print(f"  {line}")
    if rc not in (0, 5):  # 5: no test selected
        print("  --- last lines of its output ---\n  " + "\n  ".join(out.splitlines()[-40:]))
    return {"exit_code": rc, "status": status, "summary": summary, "problems": problems, "seconds": seconds}


def run_generate(model, tokenizer, prompts: list[str], new_tokens: int, seed: int, device: str) -> tuple[int, float]:
    """(generated tokens, seconds) of model.generate forced to exactly new_tokens per row."""
    import torch

    synchronize(device)
    start = time.perf_counter()
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
    torch.manual_seed(seed)
    with torch.inference_mode():
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, min_new_tokens=new_tokens,
                             max_new_tokens=new_tokens, pad_token_id=tokenizer.pad_token_id)
    rows = out[:, enc["input_ids"].shape[1]:].tolist()
    tokenizer.batch_decode(rows, skip_special_tokens=True)  # the engine returns text too: time it alike
    synchronize(device)
    return sum(len(r) for r in rows), time.perf_counter() - start


def run_engine(engine, prompts: list[str], new_tokens: int, seed: int, device: str) -> tuple[int, float]:
    from rlvr.rollout import SamplingParams

    engine.batch_size = len(prompts)  # every row decoded together
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              n=1, seed=seed)
    synchronize(device)
    start = time.perf_counter()
    completions = engine.generate(prompts, sampling)
    synchronize(device)
    return sum(len(c.token_ids) for c in completions), time.perf_counter() - start


def generation_speed(model, tokenizer, batches: list[int], new_tokens: int, repeats: int, device: str) -> list[dict]:
    """tokens/s of HFEngine (bf16 copy) and of model.generate (bf16 copy) per batch size."""
    import torch

    from rlvr.hf_engine import HFEngine

    generator = copy.deepcopy(model).to(torch.bfloat16).eval()
    engine = HFEngine(model, tokenizer, batch_size=max(batches), dtype="bfloat16", device=device)
    sides = {"generate": lambda p, seed: run_generate(generator, tokenizer, p, new_tokens, seed, device),
             "rlvr": lambda p, seed: run_engine(engine, p, new_tokens, seed, device)}
    prompts, _ = gsm8k_prompts(max(batches))
    for call in sides.values():  # first calls pay one-off costs (allocator, kernels); keep them out of the numbers
        call(prompts[: min(16, max(batches))], 0)

    results = []
    for batch in batches:
        runs = {name: [] for name in sides}
        for rep in range(repeats):
            for name, call in sides.items():
                runs[name].append(call(prompts[:batch], 1 + rep))
        row = {"batch": batch}
        for name, rs in runs.items():
            row[f"{name}_tokens_per_s"] = median([t / s for t, s in rs])
            row[f"{name}_tokens_per_row"] = rs[0][0] / batch
        row["ratio"] = row["rlvr_tokens_per_s"] / row["generate_tokens_per_s"]
        print(f"  batch {batch:4d}: generate {row['generate_tokens_per_s']:9.1f} tok/s, "
              f"rlvr {row['rlvr_tokens_per_s']:9.1f} tok/s, rlvr/generate {row['ratio']:.2f}", flush=True)
        results.append(row)
    return results


def grpo_runs(model_dir: Path, args) -> dict:
    """bench/grpo_step.py's rlvr_bf16 and trl_bf16 on --device, one grpo_step.py call each (so that a TRL that
    cannot run here still leaves rlvr's numbers): {"runs": {name: summary}, "status": {name: ok | failure}}."""
    out = {"runs": {}, "status": {}}
    for name in ("rlvr_bf16",) + (() if args.skip_trl else ("trl_bf16",)):
        json_path = model_dir / f"{name}.json"
        argv = [sys.executable, str(ROOT / "bench" / "grpo_step.py"), "--runs", name, "--device", args.device,
                "--model", str(model_dir), "--questions", str(args.questions), "--group-size", str(args.group_size),
                "--max-new-tokens", str(args.new_tokens), "--microbatch", str(args.microbatch), "--warmup", "1",
                "--steps", "3", "--threads", str(args.threads), "--json", str(json_path)]
        argv += ["--smoke"] if args.smoke else []
        print("  " + " ".join(argv[1:]), flush=True)
        rc, _ = run_limited(argv, args.grpo_timeout, capture=False)
        if rc == 0 and json_path.is_file():
            out["runs"][name] = json.loads(json_path.read_text())["runs"][name]
            out["status"][name] = "ok"
        else:
            out["status"][name] = "timed out" if rc is None else f"exit code {rc}"
            print(f"  {name} failed: {out['status'][name]}")
    return out


def headline(runs: dict) -> dict | None:
    """rlvr_bf16 over trl_bf16: step time and peak memory (GPU where measured, else RSS), or None."""
    if not {"rlvr_bf16", "trl_bf16"} <= set(runs):
        return None
    ours, theirs = runs["rlvr_bf16"], runs["trl_bf16"]
    ratio = {"step_time": ours["step_median_s"] / theirs["step_median_s"],
             "peak_rss": ours["peak_rss_mb"] / theirs["peak_rss_mb"]}
    if ours.get("peak_gpu_mb") and theirs.get("peak_gpu_mb"):
        ratio["peak_gpu"] = ours["peak_gpu_mb"] / theirs["peak_gpu_mb"]
    return ratio


def matmul_rate(device: str, n: int, repeats: int = 10, warmup: int = 3) -> float:
    """Dense bf16 matmul TFLOP/s at n x n x n: the mean over `repeats` calls after `warmup`."""
    import torch

    a = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    b = torch.randn(n, n, dtype=torch.bfloat16, device=device)
    for _ in range(warmup):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    synchronize(device)
    return 2.0 * n**3 * repeats / (time.perf_counter() - start) / 1e12


def training_share(grpo: dict, params: int, rate_tflops: float) -> dict:
    """Each run's training phase: achieved TFLOP/s = 6 x params x trained positions / train seconds, and its
    share of the bf16 matmul rate."""
    out = {}
    for name, run in grpo["runs"].items():
        positions, seconds = run["trained_positions_per_step"], run["train_median_s"]
        achieved = 6.0 * params * positions / seconds / 1e12
        out[name] = {"trained_positions": positions, "train_s": seconds, "achieved_tflops": achieved,
                     "share_of_matmul_rate": achieved / rate_tflops}
    return out


# ----------------------------------------------------------------------------------------------------
# The check, top to bottom.


def check(args, start: float) -> None:
    import torch
    from transformers import AutoTokenizer

    from rlvr.models import random_model

    results = {"args": vars(args)}

    def save() -> None:  # after every part: a run cut short still leaves what it measured
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=2, default=str))

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available (torch {torch.__version__}); "
                         "use --device cpu for a CPU run")
    if not (TOKENIZER / "tokenizer.json").is_file():
        raise SystemExit(f"{TOKENIZER} is missing: run `python bench/gpu_check.py --prepare` first (where PyPI is)")
    set_threads(args.threads)
    results["machine"] = machine()
    print(f"machine: {results['machine']}")
    results["preflight"] = preflight(args.device)
    save()

    print("\n== a. GPU tests", flush=True)
    if args.skip_tests:
        print("skipped (--skip-tests)")
    else:
        log_path = Path(args.json).with_name("gpu_check_pytest.log") if args.json else None
        results["tests"] = gpu_tests(args.tests_timeout, log_path)
        save()

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generate's rows end where their prompts end
    model = random_model(device=args.device).eval()
    params = sum(p.numel() for p in model.parameters())  # tied head and embedding counted once
    results["params"] = params

    batches = [int(b) for b in args.batches.split(",")]
    print(f"\n== b. generation, {args.new_tokens} new tokens per row (forced), bf16, median of {args.repeats}",
          flush=True)
    results["generation"] = generation_speed(model, tokenizer, batches, args.new_tokens, args.repeats, args.device)
    if torch.device(args.device).type == "cuda":
        torch.cuda.empty_cache()  # the engine's and generate's copies are gone; the GRPO children need the room
    save()

    sizes = ("grpo_step.py --smoke's tiny sizes" if args.smoke else f"{args.questions} questions x "
             f"{args.group_size} samples, {args.new_tokens} new tokens, microbatch {args.microbatch}")
    print(f"\n== c. one GRPO step, bf16: {sizes}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-model-") as model_dir:
        model.save_pretrained(model_dir)  # both sides load these same random weights
        tokenizer.save_pretrained(model_dir)
        del model
        results["grpo"] = grpo_runs(Path(model_dir), args)
    save()

    print(f"\n== d. bf16 matmul rate ({args.matmul_n}^3) and the training phase's share", flush=True)
    rate = matmul_rate(args.device, args.matmul_n)
    results["matmul_bf16_tflops"] = rate
    results["training_share"] = training_share(results["grpo"], params, rate)
    print(f"  dense bf16 matmul: {rate:.1f} TFLOP/s")
    for name, s in results["training_share"].items():
        print(f"  {name}: {s['trained_positions']:.0f} positions in {s['train_s']:.3f} s = "
              f"{s['achieved_tflops']:.2f} TFLOP/s = {100 * s['share_of_matmul_rate']:.1f} % of the matmul rate "
              f"(6 x {params / 1e6:.1f}M params x positions / train s)")
    save()

    print("\n== summary")
    print(f"{'batch':>6s} {'generate tok/s':>15s} {'rlvr tok/s':>11s} {'rlvr/generate':>14s}")
    for row in results["generation"]:
        print(f"{row['batch']:6d} {row['generate_tokens_per_s']:15.1f} {row['rlvr_tokens_per_s']:11.1f} "
              f"{row['ratio']:14.2f}")
    for name, run in results["grpo"]["runs"].items():
        gpu = f", peak GPU memory {run['peak_gpu_mb']:.0f} MB" if run.get("peak_gpu_mb") else ""
        print(f"{name}: step {run['step_median_s']:.3f} s (generate {run['generate_median_s']:.3f}, "
              f"train {run['train_median_s']:.3f}), {run['generated_tokens_per_step']:.0f} generated tokens, "
              f"peak RSS {run['peak_rss_mb']:.0f} MB{gpu}")
    if "tests" in results:
        print(f"GPU tests: {results['tests']['summary']} [{results['tests']['status']}]")
    results["seconds"] = time.perf_counter() - start
    print(f"the check took {results['seconds']:.0f} s")

    # the last two lines: the engine ratio at batch 64 (or the largest batch below it), then the headline
    at = max((r for r in results["generation"] if r["batch"] <= 64), key=lambda r: r["batch"],
             default=results["generation"][-1])
    print(f"rlvr engine/generate tokens/s at batch {at['batch']}: {at['ratio']:.2f}")
    ratio = results["headline"] = headline(results["grpo"]["runs"])
    save()
    if ratio is None:
        print(f"(no headline line: {'TRL skipped' if args.skip_trl else results['grpo']['status']})")
    elif "peak_gpu" in ratio:
        print(f"rlvr/TRL: step time ratio {ratio['step_time']:.3f}, peak GPU memory ratio {ratio['peak_gpu']:.3f}")
    else:  # a CPU run has no GPU memory to compare
        print(f"rlvr/TRL: step time ratio {ratio['step_time']:.3f}, peak RSS ratio {ratio['peak_rss']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prepare", action="store_true", help="fill .gpu/ (wheels, tokenizer) and print the command")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--json", help="also write the results to this file (pytest's output goes beside it)")
    parser.add_argument("--batches", default="1,16,64,256", help="generation batch sizes")
    parser.add_argument("--new-tokens", type=int, default=128, help="tokens per row, generation and GRPO")
    parser.add_argument("--repeats", type=int, default=2, help="timed generation calls per side and batch")
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--microbatch", type=int, default=32, help="rows per forward/backward, both sides")
    parser.add_argument("--matmul-n", type=int, default=8192)
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument("--tests-timeout", type=float, default=120, help="seconds for pytest -m gpu")
    parser.add_argument("--grpo-timeout", type=float, default=140, help="seconds for each GRPO run (rlvr, TRL)")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-trl", action="store_true", help="the GRPO step of rlvr alone (no headline)")
    parser.add_argument("--smoke", action="store_true", help="tiny: batches 1,2, 8 new tokens, 1 repeat, "
                                                             "matmul 256, grpo_step.py --smoke")
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return
    if args.smoke:
        args.batches, args.new_tokens, args.repeats, args.matmul_n = "1,2", 8, 1, 256
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' load/save bars, here and in children
    check(args, time.perf_counter())


if __name__ == "__main__":
    main()

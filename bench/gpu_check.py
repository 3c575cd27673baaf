"""The GPU check (issue 14, deliverable 5): rlvr's GPU tests and speed on one CUDA device, in one run.

    .venv/bin/python bench/gpu_check.py --prepare                 # here, where PyPI is reachable: fills .gpu/
    python3 bench/gpu_check.py [--json out.json]                  # on the GPU machine (see --prepare's command)
    .venv/bin/python bench/gpu_check.py --device cpu --smoke      # the whole check at tiny sizes, on a CPU

The GPU machine has torch, transformers, accelerate, peft and the other common packages, but not the rest of
what rlvr and TRL import, nothing can be downloaded there, and no model weights travel. So --prepare
downloads wheels of the missing packages (the versions installed here, for CPython 3.12 x86-64) into
.gpu/wheels/ and copies the default model's tokenizer into .gpu/tokenizer/; the check installs the wheels
with `pip --target` and runs on a randomly initialised model of the default model's shape (the config ships
with rlvr: rlvr.core.models.random_model). Random weights do the same work per token as the real ones.

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
  e. The GPU and NCCL paths of issue 35 and the engine vs policy log-prob gap by position (issue 36 item 2):
     bench/gpu_paths.py in a child of its own (--paths-timeout), its results under "paths" in --json.
  f. The last two lines: the engine/generate ratio at batch 64, then, in bench/grpo_step.py's form,
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

# What rlvr (and TRL, for part c) import that the GPU image lacks, at versions whose Requires-Dist the image
# satisfies (`--check-wheels` proves it against ../.library/device/KINDS.md before any GPU time is spent).
# Everything else -- torch, transformers, accelerate, peft, safetensors, tokenizers, huggingface-hub, numpy,
# pytest -- is the image's own: the check runs on what a user of that image has.
CARRY = {"pydantic": "2.14.4", "pydantic-core": "2.50.5", "annotated-types": "0.8.0", "typing-inspection": "0.4.5",
         "typing-extensions": "4.16.0", "math-verify": "0.9.0", "latex2sympy2-extended": "1.11.0",
         "antlr4-python3-runtime": "4.13.2", "pebble": "5.2.3", "gguf": "0.19.0", "pyseccomp": "0.1.2",
         "trl": "1.16.0", "datasets": "5.2.0", "dill": "0.4.1", "multiprocess": "0.70.19"}
# Carried although the image has the package, and why (any other overlap fails --check-wheels).
OVERRIDES = {"typing-extensions": "pydantic 2.14 needs >= 4.16.0 and KINDS.md gives no version for the image's; "
                                  "a newer typing-extensions shadowing an older one breaks nothing"}
KINDS = ROOT.parent / ".library" / "device" / "KINDS.md"  # the device tool's description of the image
IMAGE_SNAPSHOT = Path(__file__).resolve().parent / "gpu_image.json"  # KINDS.md's lists, for machines without it
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


def read_kinds(path: Path) -> dict:
    """The nvidia-h200 image as KINDS.md describes it: {"packages": [names], "versions": {name: version}}. The
    names come from its "Python packages already there" list, the versions from its "pip list" row (a few)."""
    from packaging.utils import canonicalize_name

    text = path.read_text()
    listed = re.search(r"nvidia-h200: their image.*?Packages: (.+?)\.\s*$", text, re.S | re.M)
    pip_row = re.search(r"\| pip list, as a session saw it \|(.+?)\|\s*$", text, re.M)
    if listed is None or pip_row is None:
        raise SystemExit(f"{path}: no nvidia-h200 package list or pip list row found (has its layout changed?)")
    names = sorted({canonicalize_name(n.strip()) for n in listed.group(1).split(",") if n.strip()})
    versions = {canonicalize_name(n): v for n, v in re.findall(r"([A-Za-z0-9_.-]+) (\d[\w.+]*)",
                                                               pip_row.group(1).split("asked for:", 1)[-1])}
    python = re.search(r"python3 is Python (3\.\d+\.\d+)", pip_row.group(1))
    return {"source": str(path), "python": python.group(1) if python else None, "packages": names,
            "versions": versions}


def image_packages() -> dict:
    """KINDS.md's lists where this machine has the device tool's files, else the snapshot --prepare last wrote."""
    if KINDS.is_file():
        return read_kinds(KINDS)
    if IMAGE_SNAPSHOT.is_file():
        return json.loads(IMAGE_SNAPSHOT.read_text())
    raise SystemExit(f"neither {KINDS} nor {IMAGE_SNAPSHOT}: nothing says what the GPU image has")


def check_wheels(wheels_dir: Path = WHEELS) -> list[str]:
    """Every carried wheel's Requires-Dist against the image and the other carried wheels, by version where
    the version is known; returns the problems (empty: ready) and prints what it could not verify."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    image = image_packages()
    present, versions = set(image["packages"]), image["versions"]
    wheels = sorted(wheels_dir.glob("*.whl"))
    carried = {}
    problems = []
    for wheel in wheels:
        name, ver, _, _ = parse_wheel_filename(wheel.name)
        if name in carried:
            problems.append(f"two wheels of {name}: {carried[name]} and {ver}")
        carried[name] = str(ver)
    wanted = {canonicalize_name(n): v for n, v in CARRY.items()}
    for name, ver in sorted(wanted.items()):
        if carried.get(name) != ver:
            problems.append(f"no wheel {name}=={ver} in {wheels_dir} (found: {carried.get(name, 'none')})")
    for name in sorted(set(carried) - set(wanted)):
        problems.append(f"{name} {carried[name]} is carried but not in CARRY")
    for name in sorted(set(carried) & present):
        if name not in {canonicalize_name(n) for n in OVERRIDES}:
            problems.append(f"{name} is carried, but the image has it (KINDS.md): use the image's, or say why in "
                            "OVERRIDES")
    unverified = []
    for wheel in wheels:
        owner = parse_wheel_filename(wheel.name)[0]
        for req in wheel_requirements(wheel):
            dep = canonicalize_name(req.name)
            have = carried.get(dep) or versions.get(dep)
            if dep in carried:
                have = carried[dep]
            elif dep not in present:
                problems.append(f"{owner} needs {req}: neither carried nor in the image")
                continue
            if have is None:
                unverified.append(f"{owner}: {req}")
            elif not req.specifier.contains(have, prereleases=True):
                problems.append(f"{owner} needs {req}, {'carried' if dep in carried else 'the image has'} {have}")
    print(f"--check-wheels: {len(wheels)} wheels against {image['source']} ({len(present)} packages, "
          f"{len(versions)} with versions)")
    if unverified:  # KINDS.md names these packages without a version; the preflight checks them there
        print(f"  {len(unverified)} requirements on image packages of unlisted version (the preflight checks them "
              "on the GPU machine): " + "; ".join(unverified))
    for line in problems:
        print(f"  PROBLEM {line}")
    print("  ok" if not problems else f"  {len(problems)} problems")
    return problems


def prepare() -> None:
    """Download the wheels, check them against the image, copy the tokenizer, print the GPU machine's command."""
    from packaging.utils import canonicalize_name, parse_wheel_filename

    wanted = {canonicalize_name(name): ver for name, ver in CARRY.items()}
    WHEELS.mkdir(parents=True, exist_ok=True)
    for wheel in WHEELS.glob("*.whl"):  # one version of each: drop wheels of other versions or packages
        name, ver, _, _ = parse_wheel_filename(wheel.name)
        if wanted.get(name) != str(ver):
            wheel.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                    "--python-version", "3.12", "--implementation", "cp", *platforms, "-d", str(WHEELS),
                    *(f"{name}=={ver}" for name, ver in wanted.items())], check=True)
    if KINDS.is_file():  # keep the snapshot current for machines without the device tool's files
        IMAGE_SNAPSHOT.write_text(json.dumps(read_kinds(KINDS) | {"source": "KINDS.md (snapshot)"}, indent=1) + "\n")
    for wheel in sorted(WHEELS.glob("*.whl")):
        print(f"  {wheel.name} ({wheel.stat().st_size / 2**20:.2f} MiB)")

    from rlvr.core.models import DEFAULT_MODEL, resolve_model_path

    source = Path(resolve_model_path(DEFAULT_MODEL))
    TOKENIZER.mkdir(parents=True, exist_ok=True)
    copied = [f for f in TOKENIZER_FILES if (source / f).is_file()]
    for f in copied:
        shutil.copy2(source / f, TOKENIZER / f)
    print(f"tokenizer: {', '.join(copied)} from {source}")
    ensure_excluded()

    size = sum(f.stat().st_size for f in GPU_DIR.rglob("*") if f.is_file()) / 2**20
    print(f".gpu/ holds {size:.1f} MiB (limit {SIZE_LIMIT_MIB} MiB)")
    problems = check_wheels() + ([f"{size:.1f} MiB is too much"] if size > SIZE_LIMIT_MIB else [])
    if problems:
        raise SystemExit("not ready:\n  " + "\n  ".join(problems))
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
                   "tqdm", "pydantic", "math_verify", "pebble", "gguf", "datasets", "trl", "rlvr.algorithms.update",
                   "rlvr.engines.hf"):
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


def gpu_paths(args) -> dict:
    """bench/gpu_paths.py in a child: its JSON, plus the status of the run (ok / failed parts / timeout)."""
    with tempfile.TemporaryDirectory(prefix="gpu-check-paths-") as tmp:
        out = Path(tmp) / "gpu_paths.json"
        argv = [sys.executable, str(ROOT / "bench" / "gpu_paths.py"), "--device", args.device, "--json", str(out)]
        rc, _ = run_limited(argv + (["--smoke"] if args.smoke else []), args.paths_timeout, capture=False)
        result = json.loads(out.read_text()) if out.is_file() else {}
    # the NCCL pair on one GPU is there to record NCCL's refusal; every other part must hold
    failed = sorted(k for k, v in result.items() if isinstance(v, dict) and k != "broadcast_nccl_one_gpu"
                    and ("error" in v or v.get("ok") is False))
    result["status"] = ("timeout" if rc is None else f"exit {rc}" if rc else
                        f"failed: {', '.join(failed)}" if failed else "ok")
    return result


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
    from rlvr.engines.base import SamplingParams

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

    from rlvr.engines.hf import HFEngine

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

    from rlvr.core.models import random_model

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

    print("\n== e. GPU and NCCL paths (bench/gpu_paths.py), log-prob gap by position", flush=True)
    results["paths"] = gpu_paths(args)
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
    print(f"GPU paths: {results['paths']['status']}")
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
    parser.add_argument("--check-wheels", action="store_true", help="check .gpu/wheels against the GPU image's "
                        "packages (KINDS.md) by version, here, before any GPU time; exit 1 on a problem")
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
    parser.add_argument("--paths-timeout", type=float, default=150, help="seconds for bench/gpu_paths.py")
    parser.add_argument("--skip-tests", action="store_true")
    parser.add_argument("--skip-trl", action="store_true", help="the GRPO step of rlvr alone (no headline)")
    parser.add_argument("--smoke", action="store_true", help="tiny: batches 1,2, 8 new tokens, 1 repeat, "
                                                             "matmul 256, grpo_step.py --smoke")
    args = parser.parse_args()
    if args.prepare:
        prepare()
        return
    if args.check_wheels:
        raise SystemExit(1 if check_wheels() else 0)
    if args.smoke:
        args.batches, args.new_tokens, args.repeats, args.matmul_n = "1,2", 8, 1, 256
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' load/save bars, here and in children
    check(args, time.perf_counter())


if __name__ == "__main__":
    main()

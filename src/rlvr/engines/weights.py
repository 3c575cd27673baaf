"""An engine's copy of the policy's weights: an empty copy of its architecture in the engine's dtype and device,
and the policy's tensors as a plain model names them (LoRA merged), for a copy in this process or a broadcast to
another (rlvr.distributed)."""

from __future__ import annotations

import copy

import torch


def empty_copy(model, dtype: torch.dtype, device: torch.device):
    """A copy of the policy's architecture (without any LoRA wrapper) allocated directly in `dtype` on `device`."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.device("meta"):
            clone = type(base)(base.config)
    finally:
        torch.set_default_dtype(previous)
    clone = clone.to_empty(device=device)
    # parameters in `dtype`; buffers keep the dtype the architecture gives them (RoPE's inv_freq is fp32, as in
    # a policy loaded in bf16): rounding inv_freq to bf16 turns the rotary angle by 0.36 rad at position 256
    for param in clone.parameters():
        if param.is_floating_point() and param.dtype != dtype:
            param.data = param.data.to(dtype)
    clone.tie_weights()  # to_empty unties shared tensors such as a tied lm_head
    clone.generation_config = copy.deepcopy(base.generation_config)
    return clone.eval()


def merged_tensors(policy):
    """(name, tensor) of every parameter and buffer as a plain model would name it; LoRA deltas merged."""
    if not hasattr(policy, "get_base_model"):
        yield from policy.named_parameters()
        yield from policy.named_buffers()
        return
    from peft.tuners.lora import LoraLayer

    base = policy.get_base_model()
    for name, value in list(base.named_parameters()) + list(base.named_buffers()):
        if ".lora_" in name:
            continue
        if ".base_layer." in name:
            owner_name, _, leaf = name.partition(".base_layer.")
            owner = base.get_submodule(owner_name)
            if isinstance(owner, LoraLayer) and leaf == "weight" and not owner.merged:
                value = value + sum(owner.get_delta_weight(a) for a in owner.active_adapters)
            name = f"{owner_name}.{leaf}"
        yield name, value


@torch.no_grad()
def engine_weights(policy, dtype: str | None = None, device="cpu") -> dict[str, torch.Tensor]:
    """The policy's weights as an engine takes them (plain names, LoRA merged), on `device` (the CPU for Ray's
    object store; the policy's own device for a torch.distributed broadcast), parameters in `dtype` and buffers
    in their own, for a rollout engine in another process. Casting here rounds exactly as `copy_` into the
    engine's copy would."""
    target = getattr(torch, dtype) if dtype else None
    base = policy.get_base_model() if hasattr(policy, "get_base_model") else policy
    buffers = {name for name, _ in base.named_buffers()}  # kept in their own dtype, as the engine's copy keeps them
    return {name: value.detach().to(device=device, dtype=value.dtype if name in buffers else target or value.dtype)
            .contiguous() for name, value in merged_tensors(policy)}

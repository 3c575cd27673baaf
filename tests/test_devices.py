"""Devices on a CPU machine: seed 000's layer plan, placement checks before any model loads, and the loop with
every role placed on `cpu` giving today's numbers."""

import json

import pytest
import torch

from conftest import make_model, train_cfg
from rlvr.config import ConfigError, EvalConfig, SFTConfig, TrainConfig, load_config
from rlvr.core import devices
from rlvr.core.devices import Placement, device_map, layer_plan, resolve, resolve_placement


def test_layer_plan_is_seed_000s_ceil_rule():
    # ceil(30 / 4) = 8 layers per device, in order; the last device takes what is left
    plan = layer_plan(30, ["a", "b", "c", "d"])
    assert [plan.count(d) for d in "abcd"] == [8, 8, 8, 6]
    assert plan == sorted(plan)  # in order: a block per device
    # ceil(5 / 4) = 2: the fourth device gets nothing
    assert layer_plan(5, ["a", "b", "c", "d"]) == ["a", "a", "b", "b", "c"]
    assert layer_plan(3, ["x"]) == ["x", "x", "x"]
    with pytest.raises(ValueError):
        layer_plan(0, ["a"])


def test_device_map_covers_every_weight_with_head_and_embeddings_on_the_first_device():
    from accelerate.utils import check_device_map

    model = make_model(50, layers=5)
    plan = device_map(model, ["cuda:0", "cuda:1", "cuda:2"])
    check_device_map(model, plan)  # every parameter belongs to exactly one entry (raises otherwise)
    for name in ("model.embed_tokens", "model.norm", "model.rotary_emb", "lm_head"):
        assert plan[name] == "cuda:0"
    assert [plan[f"model.layers.{i}"] for i in range(5)] == ["cuda:0", "cuda:0", "cuda:1", "cuda:1", "cuda:2"]
    assert devices.decoder_layers(model) == ("model.layers", 5)


def test_device_names_are_checked_by_the_config_naming_the_field():
    with pytest.raises(ConfigError, match=r"placement\.rollout='gpu0' is not a device"):
        load_config(TrainConfig, overrides=["placement.rollout=gpu0"])
    with pytest.raises(ConfigError, match=r"placement\.policy\[1\]='cuda:a'"):
        load_config(TrainConfig, overrides=["placement.policy=[cuda:0, cuda:a]"])
    with pytest.raises(ConfigError, match=r"device='tpu'"):
        load_config(SFTConfig, overrides=["device=tpu"])
    with pytest.raises(ConfigError, match=r"device='cuda0'"):
        load_config(EvalConfig, overrides=["device=cuda0"])
    with pytest.raises(ConfigError, match="placement.policy is empty"):
        load_config(TrainConfig, overrides=["placement.policy=[]"])
    with pytest.raises(ConfigError, match=r"Ray places the roles"):
        load_config(TrainConfig, overrides=["distributed.rollout_workers=1", "placement.rollout=cpu"])
    cfg = load_config(TrainConfig, overrides=["placement.policy=[cuda:1, cuda:2]", "placement.rollout=cuda:0"])
    assert cfg.placement.policy == ["cuda:1", "cuda:2"] and cfg.device == "auto"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_a_device_this_machine_lacks_is_refused_naming_the_field():
    cfg = load_config(TrainConfig, overrides=["placement.reference=cuda:0"])
    with pytest.raises(ValueError, match=r"placement\.reference='cuda:0': this machine has no CUDA device"):
        resolve_placement(cfg.device, cfg.placement)
    with pytest.raises(ValueError, match=r"^device='cuda'"):
        resolve("cuda")
    assert resolve("auto") == torch.device("cpu")


def test_a_missing_device_stops_rlvr_train_before_any_model_loads(tmp_path, monkeypatch):
    from rlvr.stages import run as loop_common
    from rlvr.training.rl import train_grpo

    monkeypatch.setattr(devices, "cuda_count", lambda: 2)
    loaded = []
    monkeypatch.setattr(loop_common, "load_model", lambda *a, **k: loaded.append(a) or pytest.fail("loaded"))
    cfg = train_cfg(tmp_path / "no-model-needed", tmp_path / "run", **{"placement.eval": "cuda:5"})
    with pytest.raises(ValueError, match=r"placement\.eval='cuda:5': this machine has 2 CUDA device\(s\), "
                                         r"cuda:0\.\.cuda:1"):
        train_grpo(cfg)
    assert not loaded and not (tmp_path / "run").exists()


def test_placement_defaults_and_seed_000s_remaining_gpus(monkeypatch):
    monkeypatch.setattr(devices, "cuda_count", lambda: 8)
    cuda = lambda i: torch.device("cuda", i)  # noqa: E731
    # nothing placed: every role on `device` (auto = cuda:0)
    assert resolve_placement("auto") == Placement((cuda(0),), cuda(0), cuda(0), cuda(0), cuda(0))
    # seed 000's defaults: sampling cuda:7, reference cuda:6, eval cuda:5, the policy on all the others
    cfg = load_config(TrainConfig, overrides=["placement.rollout=cuda:7", "placement.reference=cuda:6",
                                              "placement.eval=cuda:5", "placement.policy=[auto]"])
    where = resolve_placement(cfg.device, cfg.placement)
    assert where.policy == tuple(cuda(i) for i in range(5))
    assert (where.rollout, where.reference, where.eval) == (cuda(7), cuda(6), cuda(5))
    assert where.teacher == cuda(6)  # a frozen scorer: the reference's device unless named
    assert where.main == cuda(0)
    # a single GPU: every role shares it, the policy falls back to the rollout device when none is free
    monkeypatch.setattr(devices, "cuda_count", lambda: 1)
    cfg = load_config(TrainConfig, overrides=["placement.rollout=cuda:0", "placement.policy=[auto]"])
    assert resolve_placement(cfg.device, cfg.placement).policy == (cuda(0),)
    with pytest.raises(ValueError, match="names a device twice"):
        resolve_placement("cuda", load_config(TrainConfig, overrides=["placement.policy=[cuda, cuda:0]"]).placement)
    with pytest.raises(ValueError, match="CUDA devices only"):
        resolve_placement("cpu", load_config(TrainConfig, overrides=["placement.policy=[cpu, cuda:0]"]).placement)


def test_engine_on_an_explicit_device_is_a_synced_copy(tiny_model, tokenizer):
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    shared = HFEngine(tiny_model, tokenizer)
    placed = HFEngine(tiny_model, tokenizer, device="cpu")
    assert shared.model is tiny_model and placed.model is tiny_model  # already there: no copy
    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, n=2, seed=3)
    assert ([c.token_ids for c in shared.generate(["Hi", "2+2="], sampling)]
            == [c.token_ids for c in placed.generate(["Hi", "2+2="], sampling)])


def _metrics(run_dir):
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/") and not k.endswith("/seconds")}
            for r in rows]


def test_every_role_placed_on_cpu_gives_todays_numbers(tmp_path, model_dir):
    """The whole loop with an explicit all-cpu placement (reference in use: beta > 0) equals the default run."""
    from rlvr.training.rl import train_grpo

    common = dict(beta=0.05, steps=2)
    train_grpo(train_cfg(model_dir, tmp_path / "default", **common))
    placed = {"device": "cpu", "placement.policy": ["cpu"], "placement.rollout": "cpu",
              "placement.reference": "cpu", "placement.eval": "cpu"}
    train_grpo(train_cfg(model_dir, tmp_path / "placed", **common, **placed))
    assert _metrics(tmp_path / "placed") == _metrics(tmp_path / "default")
    assert len(_metrics(tmp_path / "default")) == 3  # step 0 validation, 2 steps


def test_random_model_has_the_shipped_default_config_and_is_seeded():
    """What the GPU check measures: SmolLM2-135M-Instruct's shape, random weights, no download."""
    from rlvr.core.models import default_config_dir, random_model

    assert (default_config_dir() / "config.json").is_file()
    model = random_model(seed=1)
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.vocab_size, cfg.num_key_value_heads) == (30, 576, 49152, 3)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008  # tied head counted once
    assert model.generation_config.eos_token_id == 2
    again, other = random_model(seed=1), random_model(seed=2)
    weight = model.model.layers[0].mlp.down_proj.weight
    assert torch.equal(weight, again.model.layers[0].mlp.down_proj.weight)
    assert not torch.equal(weight, other.model.layers[0].mlp.down_proj.weight)
    assert random_model(dtype="bfloat16").dtype == torch.bfloat16


def test_reduced_precision_falls_back_to_float32_only_on_a_cpu_without_native_kernels(monkeypatch):
    from rlvr.core.devices import native_dtype

    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: False)
    assert native_dtype("bfloat16", "cpu") == "float32" and native_dtype("float16", torch.device("cpu")) == "float32"
    assert native_dtype("float32", "cpu") == "float32"
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: True)
    assert native_dtype("bfloat16", "cpu") == "bfloat16" and native_dtype("float16", "cpu") == "float16"
    # a GPU keeps bf16 where it has bf16 units (Ampere and later), not on a T4 or V100; fp16 everywhere
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert native_dtype("bfloat16", "cuda:0") == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert native_dtype("bfloat16", "cuda:0") == "float32" and native_dtype("float16", "cuda") == "float16"


def test_native_precision_rewrites_the_run_config_not_the_request(monkeypatch, tmp_path):
    from rlvr.stages.run import native_precision

    cfg = load_config(TrainConfig, overrides={"out": str(tmp_path), "precision": "bf16",
                                              "generation_dtype": "bfloat16"})
    where = resolve_placement("cpu")
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: True)
    assert native_precision(cfg, where) is cfg
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: False)
    ran = native_precision(cfg, where)
    assert (ran.precision, ran.generation_dtype) == ("fp32", "float32")
    assert (cfg.precision, cfg.generation_dtype) == ("bf16", "bfloat16")  # the caller's config is untouched
    fp32 = load_config(TrainConfig, overrides={"out": str(tmp_path), "precision": "fp32",
                                               "generation_dtype": "float32"})
    assert native_precision(fp32, where) is fp32


def test_a_bf16_run_on_a_cpu_without_bf16_kernels_is_the_fp32_run_and_records_its_request(tmp_path, model_dir,
                                                                                         monkeypatch):
    """Emulated bf16 is tens of times slower than float32 (72x for a matmul on an AVX2-only EPYC): such a CPU
    runs the fp32 computation, while config.yaml keeps what was asked (a sweep's record still matches its plan)."""
    from rlvr.training.rl import train_grpo

    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: False)
    train_grpo(train_cfg(model_dir, tmp_path / "fp32", steps=2))
    train_grpo(train_cfg(model_dir, tmp_path / "bf16", steps=2, precision="bf16", generation_dtype="bfloat16"))
    assert _metrics(tmp_path / "bf16") == _metrics(tmp_path / "fp32")
    saved = load_config(TrainConfig, path=tmp_path / "bf16" / "config.yaml")
    assert (saved.precision, saved.generation_dtype) == ("bf16", "bfloat16")


def test_frozen_models_load_in_the_dtype_the_policy_computes_in(model_dir):
    # issue 35.4: a KL reference / teacher kept in fp32 on a GPU doubles its memory for nothing when the policy
    # runs under bf16 autocast (every matmul rounds the weights to bf16 anyway); on the CPU fp32 stays
    import torch

    from rlvr.stages.run import frozen_dtype, load_frozen

    assert frozen_dtype("bf16", "cuda:0") == frozen_dtype("bf16", torch.device("cuda", 1)) == "bfloat16"
    assert frozen_dtype("fp32", "cuda:0") == frozen_dtype("bf16", "cpu") == frozen_dtype("fp32", "cpu") == "float32"
    model, _ = load_frozen(str(model_dir), "cpu", "bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.model.rotary_emb.inv_freq.dtype == torch.float32  # buffers keep their own dtype

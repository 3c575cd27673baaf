"""The int8 rollout and evaluation engine (issue 59): what it samples, when it is used, and that the rollout
correction is on whenever it is."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model, train_cfg
from test_train import _parity  # noqa: F401 (autouse: a reward the tiny model earns half the time)

from rlvr.config import ConfigError, TrainConfig, load_config
from rlvr.core import devices
from rlvr.core.devices import engine_dtype, resolve_placement
from rlvr.engines import int8
from rlvr.engines.base import SamplingParams
from rlvr.engines.hf import HFEngine

PROMPTS = ["2+2=", "Hello there", "x", "What is 7*6?"]


@pytest.fixture
def sharp_model(tokenizer):
    """A tiny random model whose greedy choices are decided by its weights: its layers scaled up (a random tiny
    model's last token embedding otherwise dominates, and greedy decoding repeats one token) and an untied LM
    head scaled up (its logits otherwise lie within hundredths, where any rounding flips the argmax)."""
    model = make_model(len(tokenizer), seed=1, hidden=64)
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        for param in model.model.layers.parameters():
            if param.dim() == 2:
                param.mul_(5.0)
    model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone() * 100.0)
    return model


def _greedy_reference(model, tokenizer, prompt: str, new: int) -> list[tuple[int, float]]:
    """(argmax, its margin over the runner-up) of `model`'s full forward, one token at a time, no cache."""
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    out = []
    with torch.no_grad():
        for _ in range(new):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            top = logits.topk(2)
            out.append((int(top.indices[0]), float(top.values[0] - top.values[1])))
            if out[-1][0] == 1:  # the model's eos
                break
            ids.append(out[-1][0])
    return out


@pytest.mark.parametrize("fast_decode", [True, False], ids=["rlvr decoder", "transformers forward"])
@pytest.mark.parametrize("n", [1, 3])
def test_the_int8_engine_decodes_what_its_quantized_model_computes(sharp_model, tokenizer, fast_decode, n):
    """Every greedy token of the int8 engine (prefill, KV cache, fused q/k/v and gate/up, shared-prefix
    attention for n > 1) is the argmax of the quantized model's plain forward over the whole sequence."""
    engine = HFEngine(sharp_model, tokenizer, dtype="int8", fast_decode=fast_decode)
    reference = int8.quantized_copy(sharp_model)
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=16, n=n))
    checked = 0
    for i, prompt in enumerate(PROMPTS):
        expected = _greedy_reference(reference, tokenizer, prompt, 16)
        for sample in out[i * n:(i + 1) * n]:
            for (token, margin), got in zip(expected, sample.token_ids):
                if margin < 1e-3:  # a near tie: batched kernels may round either way; stop comparing here
                    break
                assert got == token
                checked += 1
    assert checked >= 40 * n


def test_int8_samples_equal_float32_samples_wherever_the_two_agree_on_the_argmax(sharp_model, tokenizer):
    """Greedy, the int8 engine writes the fp32 engine's tokens up to the first position where the two models'
    argmaxes differ, and the two differ there only because their weights do (the fp32 and int8 forwards,
    teacher-forced on the shared prefix, pick different tokens)."""
    sampling = SamplingParams(temperature=0, max_new_tokens=24, n=2, logprobs=True)
    fp32 = HFEngine(sharp_model, tokenizer, dtype="float32").generate(PROMPTS, sampling)
    low = HFEngine(sharp_model, tokenizer, dtype="int8").generate(PROMPTS, sampling)
    reference = int8.quantized_copy(sharp_model)
    agreed = 0
    for a, b in zip(fp32, low):
        k = next((j for j, (x, y) in enumerate(zip(a.token_ids, b.token_ids)) if x != y), None)
        if k is None:
            assert a.token_ids == b.token_ids
            agreed += len(a.token_ids)
            continue
        prefix = torch.tensor([tokenizer(PROMPTS[a.prompt_index], add_special_tokens=False).input_ids
                               + a.token_ids[:k]])
        with torch.no_grad():
            assert int(sharp_model(prefix).logits[0, -1].argmax()) == a.token_ids[k]
            assert int(reference(prefix).logits[0, -1].argmax()) == b.token_ids[k]
        agreed += k
    assert agreed >= 12
    # before the first difference, the two engines' log-probs of the same tokens are close
    diffs = [abs(x - y) for a, b in zip(fp32, low) for x, y, s, t in
             zip(a.logprobs, b.logprobs, a.token_ids, b.token_ids) if s == t]
    assert max(diffs) < 0.5


def test_an_int8_engine_follows_the_policy_through_sync_weights(tokenizer):
    """After the policy changes and sync_weights, the engine samples what a fresh int8 engine of the new
    weights samples (the quantized copy and the decoder's fused weights are rebuilt)."""
    policy = make_model(len(tokenizer), seed=2, hidden=64)
    engine = HFEngine(policy, tokenizer, dtype="int8")
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, n=2, seed=5)
    before = [c.token_ids for c in engine.generate(PROMPTS, sampling)]
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(torch.randn_like(p) * 0.5)
    engine.sync_weights(policy)
    after = [c.token_ids for c in engine.generate(PROMPTS, sampling)]
    fresh = [c.token_ids for c in HFEngine(policy, tokenizer, dtype="int8").generate(PROMPTS, sampling)]
    assert after == fresh and after != before


def test_the_engine_runs_int8_only_when_asked(monkeypatch):
    """Never chosen for the user (docs/experiment_log.md, 2026-12-06 night: no faster on the arithmetic recipe,
    learning parity not shown); asked for, it runs on a CPU that multiplies int8 matrices, and nowhere else."""
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: False)
    assert engine_dtype("bfloat16", "cpu") == "float32" and engine_dtype("float16", "cpu") == "float32"
    assert engine_dtype("int8", "cpu") == "int8" and engine_dtype("float32", "cpu") == "float32"
    monkeypatch.setattr(devices, "cpu_has_native", lambda dtype: True)
    assert engine_dtype("bfloat16", "cpu") == "bfloat16" and engine_dtype("int8", "cpu") == "int8"
    with pytest.raises(ValueError, match="int8 runs on a CPU"):
        engine_dtype("int8", "cuda:0")
    monkeypatch.setattr(devices, "cpu_has_int8", lambda: False)
    with pytest.raises(ValueError, match="int8 runs on a CPU"):
        engine_dtype("int8", "cpu")


def test_int8_runs_only_with_the_rollout_correction_on_and_in_the_local_loop(monkeypatch, tmp_path):
    from rlvr.stages.run import native_precision

    where = resolve_placement("cpu")
    asked = load_config(TrainConfig, overrides={"out": str(tmp_path), "generation_dtype": "int8"})
    assert asked.rollout_correction.mode == "token_tis" and native_precision(asked, where).generation_dtype == "int8"
    with pytest.raises(ConfigError, match="needs the rollout correction"):
        load_config(TrainConfig, overrides={"out": str(tmp_path), "generation_dtype": "int8",
                                            "rollout_correction.mode": "none"})
    with pytest.raises(ConfigError, match="local loop only"):
        load_config(TrainConfig, overrides={"out": str(tmp_path), "generation_dtype": "int8",
                                            "distributed.rollout_workers": 1})


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_int8_run_samples_from_int8_weights_and_corrects_for_it(tmp_path, model_dir):
    """generation_dtype=int8: rollouts and validation from int8 weights, the mismatch against the fp32 learner
    measured, and the rollout correction weighting each token by pi_old / mu (not 1)."""
    from rlvr.training.rl import train_grpo

    train_grpo(train_cfg(model_dir, tmp_path / "int8", steps=2, generation_dtype="int8"))
    trained = [r for r in _rows(tmp_path / "int8") if "train/mismatch_kl" in r]
    assert len(trained) == 2
    assert all(r["train/mismatch_kl"] > 0 and r["train/is_weight_mean"] != 1.0 for r in trained)

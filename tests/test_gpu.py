"""CUDA: the same numbers as the CPU, the loops on a GPU, the engine's greedy output equal to model.generate's.

Marked `gpu` and skipped without CUDA; bench/gpu_check.py runs them on a GPU machine (`pytest -m gpu`)."""

import json

import pytest
import torch

from conftest import make_model, train_cfg

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["Question: what is 2+3?\nAnswer:", "Hi", "A much longer prompt, so the batch needs left padding:"]


@pytest.fixture(autouse=True)
def _no_tf32():
    """fp32 means fp32: TF32 matmuls would round to 10 mantissa bits and fail the 1e-4 comparison."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def _batch(tokenizer, rows: int = 6):
    from rlvr.algorithms.policy import tokenize_prompt_and_output

    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(rows)]
    outputs = [f" the answer is {i * 7} and then some words {i}" for i in range(rows)]
    return tokenize_prompt_and_output(prompts, outputs, tokenizer)


@pytest.mark.parametrize("precision,tolerance", [("fp32", 1e-4), ("bf16", 2e-2)])
def test_cuda_log_probs_equal_the_cpus(tokenizer, precision, tolerance):
    from rlvr.algorithms.policy import autocast, get_response_log_probs

    cpu = make_model(len(tokenizer), layers=4, hidden=64)
    cuda = make_model(len(tokenizer), layers=4, hidden=64).cuda()
    tok = _batch(tokenizer)
    out = {}
    for name, model in (("cpu", cpu), ("cuda", cuda)):
        with autocast(precision, model):
            scored = get_response_log_probs(model, tok["input_ids"], tok["labels"], return_token_entropy=True,
                                            positions=tok["response_mask"], share_prefix=True)
        out[name] = {k: v.float().cpu() for k, v in scored.items()}
    assert scored["log_probs"].device.type == "cuda"
    mask = tok["response_mask"]
    for key in ("log_probs", "token_entropy"):
        diff = (out["cpu"][key] - out["cuda"][key])[mask].abs().max()
        assert diff < tolerance, f"{key}: {diff}"


def test_engine_greedy_equals_model_generate_on_cuda(tokenizer):
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    model = make_model(len(tokenizer), layers=4, hidden=64).cuda()
    engine = HFEngine(model, tokenizer, batch_size=8)
    assert engine.model is model  # same dtype and device: no copy
    engine.eos_ids = [10**9]  # both sides generate exactly max_new_tokens
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=16))
    for prompt, completion in zip(PROMPTS, out):
        ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids.cuda()
        ref = model.generate(ids, max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert completion.token_ids == ref[0, ids.shape[1]:].tolist()


def test_engine_samples_on_cuda_with_rows_leaving_the_batch(tokenizer):
    """Sampling, log-probs, entropies, a stop string and finished rows compacted away, all on the GPU: the same
    call twice gives the same tokens, and each row's log-probs are its tokens' under the model."""
    from rlvr.algorithms.policy import get_response_log_probs
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine

    model = make_model(len(tokenizer), layers=4, hidden=64).cuda()
    engine = HFEngine(model, tokenizer, batch_size=16)
    engine.eos_ids = [10**9]  # rows end at a stop string (one byte each) or at the length limit
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, n=4, seed=5, stop=tuple("aeiou "), logprobs=True,
                              entropy=True)
    first, again = engine.generate(PROMPTS, sampling), engine.generate(PROMPTS, sampling)
    assert [c.token_ids for c in first] == [c.token_ids for c in again]
    assert {c.finish_reason for c in first} <= {"stop", "length"} and len({len(c.token_ids) for c in first}) > 1
    c = first[0]
    prompt = tokenizer(PROMPTS[0], add_special_tokens=False).input_ids
    ids = torch.tensor([prompt + c.token_ids])  # the sampled ids themselves (random bytes need not decode)
    lp = get_response_log_probs(model, ids[:, :-1], ids[:, 1:])["log_probs"][0, len(prompt) - 1 :]
    assert torch.allclose(lp.cpu(), torch.tensor(c.logprobs), atol=1e-4)


def test_bf16_engine_copy_on_cuda_syncs_device_to_device(tokenizer):
    from rlvr.engines.hf import HFEngine

    policy = make_model(len(tokenizer), layers=2, hidden=64).cuda()
    engine = HFEngine(policy, tokenizer, dtype="bfloat16", device="cuda")
    assert engine.model is not policy and next(engine.model.parameters()).dtype == torch.bfloat16
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    engine.sync_weights(policy)
    tensors = engine.named_tensors()
    for name, p in policy.named_parameters():
        assert tensors[name].device.type == "cuda"
        assert torch.equal(tensors[name], p.detach().to(torch.bfloat16))


def test_rlvr_train_three_steps_on_cuda(tmp_path, model_dir, caplog):
    from rlvr.training.rl import train_grpo

    caplog.set_level("INFO", logger="rlvr.stages.run")
    cfg = train_cfg(model_dir, tmp_path / "run", device="cuda", precision="bf16", generation_dtype="bfloat16",
                    beta=0.05)
    summary = train_grpo(cfg)
    assert "devices: policy [cuda:0], rollout cuda:0, reference cuda:0, eval cuda:0" in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for r in rows[1:]:
        assert r["train/nonfinite_steps"] == 0
        if r["train/updates_trained"]:
            assert r["train/kl"] >= 0
    assert summary["steps"] == 3 and "val/accuracy" in summary


def test_rlvr_sft_on_cuda_matches_the_cpu_loss(tmp_path, model_dir):
    from rlvr.config import SFTConfig, load_config
    from rlvr.training.sft import train_sft

    losses = {}
    for device in ("cpu", "cuda"):
        cfg = load_config(SFTConfig, overrides=dict(
            model=str(model_dir), dataset="arithmetic:steps=1,max=9", out=str(tmp_path / device), steps=2,
            batch_size=4, microbatch_size=2, precision="fp32", eval_at_start=False, eval_at_end=False,
            tensorboard=False, device=device))
        train_sft(cfg)
        rows = [json.loads(line) for line in (tmp_path / device / "metrics.jsonl").read_text().splitlines()]
        losses[device] = [r["train/loss"] for r in rows]
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-4)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="a layer split needs two CUDA devices")
def test_policy_split_over_two_gpus_scores_and_trains_like_one(tokenizer, model_dir):
    from rlvr.algorithms.policy import get_response_log_probs
    from rlvr.core.models import load_model

    split, _ = load_model(str(model_dir), device=["cuda:0", "cuda:1"])
    whole, _ = load_model(str(model_dir), device="cuda:0")
    assert {p.device for p in split.parameters()} == {torch.device("cuda", 0), torch.device("cuda", 1)}
    tok = _batch(tokenizer)
    a = get_response_log_probs(split, tok["input_ids"], tok["labels"])["log_probs"]
    b = get_response_log_probs(whole, tok["input_ids"], tok["labels"])["log_probs"]
    assert torch.allclose(a.cpu(), b.cpu(), atol=1e-5)
    a.sum().backward()
    assert all(p.grad is not None for p in split.parameters())

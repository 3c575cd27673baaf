"""Continuous batching in the engine (rlvr.engines.continuous): requests that join a running batch at any step,
with any sampling setting, sample what HFEngine.generate samples for them alone; aborted rows leave; per-row
sampling draws what one setting for the batch draws (issue 65)."""

import random

import pytest
import torch

from rlvr.engines.base import SamplingParams
from rlvr.engines.hf import HFEngine
from rlvr.engines.sampling import sample_rows, sample_tokens, uniforms


def _requests(tokenizer, count: int, seed: int = 0):
    """(request id, prompt ids, sampling, the step it arrives at): every sampling feature, random arrivals."""
    rng = random.Random(seed)
    out = []
    for k in range(count):
        text = "".join(rng.choice("abcdefgh xyz+=?") for _ in range(rng.randint(1, 40)))
        new = rng.randint(1, 40)
        sampling = SamplingParams(
            temperature=rng.choice([0, 0.7, 1.0]), top_p=rng.choice([1.0, 0.9]), top_k=rng.choice([0, 0, 7]),
            min_p=rng.choice([0, 0.02]), max_new_tokens=new, min_new_tokens=min(new, rng.choice([0, 0, 3])),
            n=rng.choice([1, 2, 3]), seed=k, logprobs=True, repetition_penalty=rng.choice([1.0, 1.0, 1.2]),
            stop=rng.choice([(), ("x",), ("ab", "z")]))
        out.append((f"r{k}", tokenizer(text, add_special_tokens=False).input_ids, sampling, rng.randint(0, 30)))
    return out


def _drive(batch, requests, abort=None):
    """Run the batch, adding each request at its step; {(request, sample): [StepOutput]}; `abort`: (request id,
    step) to abort it at."""
    got, step, pending = {}, 0, sorted(requests, key=lambda r: r[3])
    while pending or batch.has_unfinished_requests():
        while pending and pending[0][3] <= step:
            request_id, ids, sampling, _ = pending.pop(0)
            batch.add_request(request_id, ids, sampling)
        if abort is not None and step == abort[1]:
            batch.abort_request(abort[0])
        for out in batch.step():
            got.setdefault((out.request_id, out.sample_index), []).append(out)
        step += 1
    return got


@pytest.fixture
def ending_model(tiny_model):
    """The tiny model with its end token e times likelier: rows end at different steps."""
    tiny_model.get_output_embeddings().register_forward_hook(lambda m, i, o: o + torch.nn.functional.one_hot(
        torch.tensor(1), o.shape[-1]).to(o.dtype) * 1.0)
    return tiny_model


@pytest.mark.parametrize("fast_decode", [True, False])
def test_requests_joining_at_any_step_sample_what_generate_samples_alone(ending_model, tokenizer, fast_decode):
    engine = HFEngine(ending_model, tokenizer, batch_size=64, fast_decode=fast_decode)
    requests = _requests(tokenizer, 12)
    # few rows and a small prefill budget: requests wait, join mid-decode, rows leave and others take their place
    got = _drive(engine.continuous_batch(max_rows=10, max_prefill_tokens=64), requests)
    rows = 0
    for request_id, ids, sampling, _ in requests:
        for ref in engine.generate([ids], sampling):
            outs = got[request_id, ref.sample_index]
            assert [o.token_id for o in outs] == ref.token_ids, (request_id, sampling)
            assert outs[-1].finish_reason == ref.finish_reason and all(o.finish_reason is None for o in outs[:-1])
            torch.testing.assert_close(torch.tensor([o.logprob for o in outs]), torch.tensor(ref.logprobs),
                                       atol=1e-5, rtol=0)
            rows += 1
    assert rows == sum(r[2].n for r in requests) == len(got)
    assert {o.finish_reason for outs in got.values() for o in outs[-1:]} == {"stop", "length"}


@pytest.mark.parametrize("fast_decode", [True, False])
def test_requests_admitted_together_prefill_their_shared_beginning_once(tiny_model, tokenizer, fast_decode):
    from test_rollout import INSTRUCTION

    prompts = [tokenizer(INSTRUCTION + q, add_special_tokens=False).input_ids for q in ("2+3?", "what is 12?", "7?")]
    sampling = SamplingParams(max_new_tokens=10, n=2, seed=3, logprobs=True)
    engine = HFEngine(tiny_model, tokenizer, fast_decode=fast_decode)
    got = _drive(engine.continuous_batch(), [(f"r{k}", p, sampling, 0) for k, p in enumerate(prompts)])
    assert engine.stats["shared_prompt_tokens"] > 0  # the instruction's KV computed once, reused by each row
    for k, ref in enumerate(engine.generate(prompts, sampling)):  # generate shares the same beginning
        outs = got[f"r{ref.prompt_index}", ref.sample_index]
        assert [o.token_id for o in outs] == ref.token_ids, k
        torch.testing.assert_close(torch.tensor([o.logprob for o in outs]), torch.tensor(ref.logprobs), atol=1e-5,
                                   rtol=0)


def test_an_aborted_request_leaves_and_the_others_are_unchanged(ending_model, tokenizer):
    engine = HFEngine(ending_model, tokenizer)
    requests = [(f"r{k}", [5 + k, 6, 7], SamplingParams(max_new_tokens=30, n=2, seed=k), 0) for k in range(3)]
    engine.eos_ids = [10**9]  # every row runs its 30 steps unless aborted
    batch = engine.continuous_batch()
    got = _drive(batch, requests, abort=("r1", 5))
    assert len(got["r1", 0]) == len(got["r1", 1]) == 5 and not batch.rows and batch.store.k == []
    for request_id, ids, sampling, _ in requests[::2]:
        assert [[o.token_id for o in got[request_id, s]] for s in range(2)] == [
            c.token_ids for c in engine.generate([ids], sampling)]


def test_rows_wait_for_kv_memory_and_a_request_too_big_alone_is_refused(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    engine.eos_ids = [10**9]
    sampling = SamplingParams(max_new_tokens=20, seed=1)
    batch = engine.continuous_batch(max_kv_bytes=None)
    per_row = batch.kv_bytes(4, sampling)  # a 4-id prompt + 20 new ids
    batch = engine.continuous_batch(max_kv_bytes=2 * per_row + per_row // 2)  # two rows fit, not three
    for k in range(4):
        batch.add_request(f"r{k}", [5 + k, 6, 7, 8], sampling)
    got, most = {}, 0
    while batch.has_unfinished_requests():
        for out in batch.step():
            got.setdefault(out.request_id, []).append(out.token_id)
        most = max(most, len(batch.rows))
        assert sum(t.numel() * t.element_size() for t in batch.store.k + batch.store.v) <= batch.max_kv_bytes
    assert most == 2 and len(got) == 4
    for k in range(4):
        assert got[f"r{k}"] == engine.generate([[5 + k, 6, 7, 8]], sampling)[0].token_ids
    with pytest.raises(ValueError, match="MiB of KV cache"):
        batch.add_request("big", [5] * 60, sampling)


def test_top_logprobs_stop_token_ids_and_ignore_eos(tiny_model, tokenizer):
    engine = HFEngine(tiny_model, tokenizer)
    batch = engine.continuous_batch()
    free = _drive(batch, [("a", [5, 6], SamplingParams(max_new_tokens=12, seed=3), 0)])["a", 0]
    stopper = free[4].token_id
    batch.add_request("b", [5, 6], SamplingParams(max_new_tokens=12, seed=3), top_logprobs=3,
                      stop_token_ids=[stopper], ignore_eos=True)
    cut = _drive(batch, [])["b", 0]
    first = next(k for k, o in enumerate(free) if o.token_id == stopper)
    assert [o.token_id for o in cut] == [o.token_id for o in free[: first + 1]]
    assert cut[-1].finish_reason == "stop" and cut[-1].stop_reason == stopper
    logits = tiny_model(torch.tensor([[5, 6]])).logits[0, -1].log_softmax(-1)
    values, ids = logits.topk(3)
    assert [t for t, _ in cut[0].top_logprobs] == ids.tolist()
    torch.testing.assert_close(torch.tensor([v for _, v in cut[0].top_logprobs]), values, atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="already in the batch"):
        batch.add_request("c", [5], SamplingParams())
        batch.add_request("c", [5], SamplingParams())
    with pytest.raises(ValueError, match="more rows than the batch holds"):
        batch.add_request("d", [5], SamplingParams(n=65))


def test_per_row_sampling_draws_what_one_setting_for_the_batch_draws():
    torch.manual_seed(0)
    logits = torch.randn(12, 300) * 3
    u = uniforms(torch.arange(1, 13).numpy().astype("uint64"), 4)
    settings = [(0.0, 1.0, 0, 0.0), (1.0, 1.0, 0, 0.0), (0.7, 0.9, 0, 0.0), (1.0, 1.0, 5, 0.0), (1.3, 1.0, 0, 0.05),
                (0.8, 0.8, 20, 0.01)] * 2
    rows = sample_rows(logits, u, *(torch.tensor([s[i] for s in settings]) for i in range(4)))
    for r, (t, p, k, m) in enumerate(settings):
        assert rows[r] == sample_tokens(logits[r:r + 1], u[r:r + 1], t, p, top_k=k, min_p=m)[0]


def test_top_k_and_min_p_keep_what_they_say_hand_values():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    draw = lambda u, **kw: int(sample_tokens(logits, torch.tensor([u]), 1.0, 1.0, **kw)[0])  # noqa: E731
    assert [draw(u) for u in (0.1, 0.6, 0.85, 0.99)] == [0, 1, 2, 3]  # the cumulative 0.5, 0.8, 0.95, 1
    assert [draw(u, top_k=2) for u in (0.1, 0.6, 0.99)] == [0, 0, 1]  # 0.5/0.8 = 0.625 then token 1
    assert [draw(u, min_p=0.5) for u in (0.1, 0.7, 0.99)] == [0, 1, 1]  # 0.15 < 0.5 x 0.5: only 0 and 1 stay
    assert draw(0.99, top_k=1) == 0 and draw(0.99, min_p=1.0) == 0

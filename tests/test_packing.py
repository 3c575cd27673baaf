"""Padding-free (packed) scoring and training (rlvr.algorithms.packing, issue 67): the layout checked by hand, and
packed against padded passes -- log-probs, entropies, the teacher's KL and every parameter's gradient in fp32, for
get_response_log_probs, the policy-gradient update and the SFT step -- with the packed pass shown to have run."""

import copy
import dataclasses

import pytest
import torch

from rlvr.algorithms import packing
from rlvr.algorithms.policy import get_response_log_probs, sft_microbatch_train_step, tokenize_prompt_and_ids, \
    tokenize_prompt_and_output
from rlvr.algorithms.spec import PRESETS, EstimatorSpec
from rlvr.algorithms.update import RolloutCorrection, TrainBatch, policy_gradient_update, score_log_probs


@pytest.fixture
def always_pack(monkeypatch):
    """Attention pairs cost nothing: every microbatch with padding is packed (the tiny test model's heads are a large
    share of its FLOPs, so the real cost model would often keep its rows padded)."""
    monkeypatch.setattr(packing, "ATTENTION_EFFICIENCY", 0.0)


def _packed_shapes(model):
    """The (rows, columns) of every decoder pass, recorded by a hook on the embedding."""
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    return seen


def test_the_layout_by_hand():
    # input ids; columns 0-1 are shared by every row and unscored (the prefix); rows 0 and 1 share their own prompt
    # [7] (column 2), row 2 has none (it scores from column 2), row 3 scores nothing (an empty response)
    ids = torch.tensor([[1, 2, 7, 8, 30, 31, 32, 0],
                        [1, 2, 7, 8, 40, 0, 0, 0],
                        [1, 2, 9, 50, 51, 52, 53, 54],
                        [1, 2, 9, 0, 0, 0, 0, 0]])
    scored = torch.zeros(ids.shape, dtype=torch.bool)
    scored[0, 3:6] = True  # its response: columns 3-5 (ids 8 30 31; their labels 30 31 32)
    scored[1, 3] = True  # column 3 (id 8)
    scored[2, 2:7] = True  # columns 2-6 (ids 9 50 51 52 53)
    p = packing.pack_rows(ids, scored, 2, weight=0.0)
    # the longest row is 5 tokens (row 2); bins of 5: row 2 alone, then row 0 (its prompt 7 + 3) and row 1 (1 more:
    # the prompt is already there) -- 10 slots where the padded rows after the prefix take 4 x 6 = 24
    assert p.prefix == 2 and (p.cost, p.padded_cost) == (10, 24)
    assert p.input_ids.tolist() == [[9, 50, 51, 52, 53], [7, 8, 30, 31, 8]]
    assert p.position_ids.tolist() == [[2, 3, 4, 5, 6], [2, 3, 4, 5, 3]]
    # scored positions in the batch's row-major order -> packed slots (bin x 5 + slot)
    assert p.scored.tolist() == [6, 7, 8, 9, 0, 1, 2, 3, 4]
    keys = lambda r, i: p.mask[r, 0, i].nonzero().squeeze(-1).tolist()  # noqa: E731  (0-1 prefix, 2.. the bin)
    assert keys(1, 0) == [0, 1, 2]  # the prompt copy: the prefix and itself
    assert keys(1, 3) == [0, 1, 2, 3, 4, 5]  # row 0's last token: prefix, prompt, its response so far
    assert keys(1, 4) == [0, 1, 2, 6]  # row 1: prefix, the shared prompt copy, itself -- not row 0's tokens
    assert keys(0, 2) == [0, 1, 2, 3, 4]  # row 2: prefix and its own tokens so far
    assert p.mask.shape == (2, 1, 5, 7)


def test_rows_of_one_length_with_their_own_prompts_stay_padded():
    ids = torch.arange(24).view(3, 8)
    scored = torch.zeros(3, 8, dtype=torch.bool)
    scored[:, 4:] = True  # nothing to gain: every row is as long as the longest
    assert packing.pack_rows(ids, scored, 0, weight=1e-3) is None


def _batch(tokenizer):
    prompts = ["Shared preamble. Q: 1+1?"] * 3 + ["Shared preamble. Q: 22+3?"] * 2 + ["Shared preamble. Q: 5"]
    outputs = [" 2 </answer>", " two", " a much longer response than the others", " 25", "", " five or so"]
    return tokenize_prompt_and_output(prompts, outputs, tokenizer)


def _run(model, batch, weights, **kwargs):
    model.zero_grad(set_to_none=True)
    out = get_response_log_probs(model, batch["input_ids"], batch["labels"], True, positions=batch["response_mask"],
                                 **kwargs)
    (out["log_probs"] * weights).sum().backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters()}


def _assert_same(a, b):
    for key in a[0]:
        torch.testing.assert_close(a[0][key], b[0][key], atol=1e-5, rtol=1e-5)
    for name in a[1]:
        torch.testing.assert_close(a[1][name], b[1][name], atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("share_prefix", [False, True])
@pytest.mark.parametrize("attention", ["sdpa", "rlvr_sdpa", "eager"])
def test_packed_log_probs_and_gradients_equal_the_padded_ones(tiny_model, tokenizer, always_pack, share_prefix,
                                                             attention):
    from rlvr.core.models import prepare_for_training

    model = prepare_for_training(tiny_model)
    model.set_attn_implementation(attention)
    batch = _batch(tokenizer)
    weights = batch["response_mask"] * torch.linspace(0.5, 2.0, batch["labels"].shape[1])
    padded = _run(model, batch, weights, share_prefix=share_prefix, pack=False)
    seen = _packed_shapes(model)
    packed = _run(model, batch, weights, share_prefix=share_prefix, pack=True)
    _assert_same(packed, padded)
    assert packed[0]["log_probs"][4].abs().sum() == 0  # the empty response scores nothing
    rows, width = batch["input_ids"].shape
    # the packed pass ran: fewer token slots than the padded rows (after the shared prefix when it runs once)
    prefix = seen[0][1] if share_prefix and len(seen) == 2 else 0
    assert seen[-1][0] * seen[-1][1] < rows * (width - prefix)


def test_packing_under_gradient_checkpointing_equals_padding(tiny_model, tokenizer, always_pack):
    from rlvr.core.models import prepare_for_training

    model = prepare_for_training(tiny_model, gradient_checkpointing=True)
    batch = _batch(tokenizer)
    weights = batch["response_mask"].float()
    padded = _run(model, batch, weights, share_prefix=True, pack=False)
    seen = _packed_shapes(model)
    packed = _run(model, batch, weights, share_prefix=True, pack=True)
    _assert_same(packed, padded)
    assert len(seen) == 1 and seen[0][0] < batch["input_ids"].shape[0]  # no KV cache, the rows packed


def test_multi_turn_rows_with_unscored_observations_pack_exactly(tiny_model, tokenizer, always_pack):
    ids = [tokenizer(t, add_special_tokens=False).input_ids for t in (" call(1) -> 7 so 7", " 3", " call(2) -> 9 ok")]
    masks = [[True] * 7 + [False] * 5 + [True] * (len(ids[0]) - 12), None, [True] * 7 + [False] * (len(ids[2]) - 7)]
    batch = tokenize_prompt_and_ids(["Q: f(1)?", "Q: f(1)?", "Q: f(2)?"], ids, tokenizer, masks)
    weights = batch["response_mask"].float()
    _assert_same(_run(tiny_model, batch, weights, share_prefix=True, pack=True),
                 _run(tiny_model, batch, weights, share_prefix=True, pack=False))


def test_the_teachers_exact_kl_is_the_same_packed(tiny_model, tokenizer, always_pack):
    from conftest import make_model

    teacher = make_model(tiny_model.config.vocab_size, seed=3)
    batch = _batch(tokenizer)
    kwargs = dict(share_prefix=True, teacher=teacher, kl_direction="forward")
    padded, packed = ([get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], True,
                                              positions=batch["response_mask"], pack=pack, **kwargs)["teacher_kl"]]
                      for pack in (False, True))
    torch.testing.assert_close(packed[0], padded[0], atol=1e-5, rtol=1e-5)
    assert padded[0].abs().sum() > 0


def test_attention_that_takes_no_custom_mask_or_a_model_off_the_cpu_is_never_packed(tiny_model):
    assert packing.packable(tiny_model, 100)
    tiny_model.config._attn_implementation = "flash_attention_2"
    assert not packing.packable(tiny_model, 100)
    tiny_model.config._attn_implementation = "sdpa"
    tiny_model.config.sliding_window = 64  # a custom mask would drop the window: only rows inside it are packed
    assert packing.packable(tiny_model, 64) and not packing.packable(tiny_model, 65)
    tiny_model.config.sliding_window = None
    assert not packing.packable(tiny_model.to("meta"), 64)  # off the CPU (CUDA: not measured) the rows stay padded


def _groups(tokenizer):
    prompts = [p for p in ("Shared preamble. Q: 2+2?", "Shared preamble. Q: 13-4?") for _ in range(4)]
    responses = [" 4 </answer>", " four, I think", " 5", " it is 2+2 which is 4 </answer>",
                 " 9", " nine </answer>", " 13 minus 4 is 9 </answer>", " 8"]
    ids = [tokenizer(r, add_special_tokens=False).input_ids + [tokenizer.eos_token_id] for r in responses]
    return tokenize_prompt_and_ids(prompts, ids, tokenizer)


def _update_grads(model, batch, spec, pack, microbatches, **kwargs):
    """The update's gradients (caught before its optimizer step) and its loss and metadata."""
    grads = {}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    step = optimizer.step
    optimizer.step = lambda: (grads.update({n: p.grad.clone() for n, p in model.named_parameters()}), step())
    loss, meta = policy_gradient_update(model, optimizer, batch, spec, microbatches, None, pack=pack, **kwargs)
    return loss, meta, grads


@pytest.mark.parametrize("algorithm,microbatches", [("grpo", 1), ("grpo", 2), ("dapo", 3), ("grpo_token", 4)])
def test_packed_and_padded_updates_give_the_same_gradients(tiny_model, tokenizer, always_pack, algorithm,
                                                           microbatches):
    tok = _groups(tokenizer)
    spec = PRESETS[algorithm]
    if algorithm == "grpo" and microbatches == 2:  # with a KL term: every row trained, reference log-probs
        spec = dataclasses.replace(spec, beta=0.05)
    advantages = torch.tensor([1.0, -0.5, -1.0, 0.5, 0.0, 1.5, -0.5, -1.0])
    g = torch.Generator().manual_seed(0)
    noisy = lambda: -2.0 + 0.3 * torch.randn(tok["labels"].shape, generator=g)  # noqa: E731
    batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"], advantages,
                       old_log_probs=noisy() if spec.needs_old_log_probs else None,
                       reference_log_probs=noisy() if spec.beta else None, rollout_log_probs=noisy())
    correction = RolloutCorrection("token_tis")
    padded = _update_grads(copy.deepcopy(tiny_model), batch, spec, False, microbatches, rollout_correction=correction)
    seen = _packed_shapes(tiny_model)
    packed = _update_grads(tiny_model, batch, spec, True, microbatches, rollout_correction=correction)
    torch.testing.assert_close(packed[0], padded[0], atol=1e-6, rtol=1e-5)
    for key in ("trained_tokens", "grad_norm", "trained_token_entropy", "mismatch_kl", "is_weight_mean"):
        assert packed[1][key] == pytest.approx(padded[1][key], rel=1e-5, abs=1e-7), key
    for name in padded[2]:
        torch.testing.assert_close(packed[2][name], padded[2][name], atol=1e-6, rtol=1e-4)
    assert any(p != 0 for p in padded[2]["model.embed_tokens.weight"].flatten()[:1000])
    assert sum(r * c for r, c in seen) < batch.input_ids.numel()  # fewer token slots than the padded batch


def test_score_log_probs_packed_equals_padded(tiny_model, tokenizer, always_pack):
    tok = _groups(tokenizer)
    args = (tok["input_ids"], tok["labels"], tok["response_mask"], 3)
    packed, entropy = score_log_probs(tiny_model, *args, return_token_entropy=True, pack=True)
    padded, entropy_padded = score_log_probs(tiny_model, *args, return_token_entropy=True, pack=False)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy, entropy_padded, atol=1e-5, rtol=1e-5)


def test_the_sft_step_packed_equals_padded(tiny_model, tokenizer, always_pack):
    prompts = ["Shared preamble. Q: 2+2?", "Shared preamble. Q: 13-4?", "Shared preamble. Q: 7?", "Other: 1"]
    targets = [" <think> 2+2 = 4 </think> <answer> 4 </answer>", " <answer> 9 </answer>",
               " <think> it is seven, as written </think> <answer> 7 </answer>", " 1"]
    tok = tokenize_prompt_and_output(prompts, targets, tokenizer)

    def step(model, pack):
        model.zero_grad(set_to_none=True)
        for part in (slice(0, 2), slice(2, 4)):  # two microbatches, as rlvr sft accumulates them
            out = get_response_log_probs(model, tok["input_ids"][part], tok["labels"][part],
                                         positions=tok["response_mask"][part], share_prefix=True, pack=pack)
            loss, _ = sft_microbatch_train_step(out["log_probs"], tok["response_mask"][part], 2)
        return loss, {n: p.grad.clone() for n, p in model.named_parameters()}

    padded = step(copy.deepcopy(tiny_model), False)
    seen = _packed_shapes(tiny_model)
    packed = step(tiny_model, True)
    torch.testing.assert_close(packed[0], padded[0], atol=1e-6, rtol=1e-5)
    for name in padded[1]:
        torch.testing.assert_close(packed[1][name], padded[1][name], atol=1e-6, rtol=1e-4)
    assert sum(r * c for r, c in seen) < tok["input_ids"].numel()


@pytest.mark.parametrize("microbatch", [3, 8])
def test_token_slots_count_what_the_update_runs(tiny_model, tokenizer, always_pack, microbatch):
    from rlvr.algorithms.update import token_slots

    tok = _groups(tokenizer)
    batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"], torch.ones(8))
    slots = token_slots(tiny_model, tok["input_ids"], tok["response_mask"], microbatch)
    assert slots["microbatches"] == -(-8 // microbatch) and slots["packed"] < slots["padded"]
    for pack in (False, True):
        seen = []
        hook = tiny_model.get_input_embeddings().register_forward_hook(
            lambda m, i, o: seen.append(i[0].numel()) if torch.is_grad_enabled() else None)
        _update_grads(tiny_model, batch, PRESETS["grpo"], pack, -(-8 // microbatch))
        hook.remove()
        assert sum(seen) == slots["packed" if pack else "padded"]


def test_score_log_probs_runs_no_forward_for_a_row_without_a_response_token(tiny_model, tokenizer):
    tok = tokenize_prompt_and_output(["Q: 1?", "Q: 2?", "Q: 3?"], [" one", "", " three"], tokenizer)
    seen = _packed_shapes(tiny_model)
    out = score_log_probs(tiny_model, tok["input_ids"], tok["labels"], tok["response_mask"], 1)
    assert [rows for rows, _ in seen] == [1, 1]  # rows 0 and 2, one microbatch each; row 1 (EOS first) none
    assert out[1].abs().sum() == 0 and out[0].abs().sum() > 0

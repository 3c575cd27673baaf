"""tokenize_prompt_and_output, get_response_log_probs (chunked == naive), sft_microbatch_train_step."""

import types

import pytest
import torch

from rlvr.algorithms.policy import get_response_log_probs, sft_microbatch_train_step, tokenize_prompt_and_output


def test_tokenize_prompt_and_output_hand_checked(tokenizer):
    out = tokenize_prompt_and_output(["ab", "c"], ["xyz", "pq"], tokenizer)
    ids = lambda s: tokenizer(s, add_special_tokens=False).input_ids  # noqa: E731
    a, b, c, x, y, z, p, q = (ids(ch)[0] for ch in "abcxyzpq")
    pad = tokenizer.pad_token_id
    # row 0: a b x y z (5 tokens); row 1: c p q + 2 pads; width 5 -> tensors of width 4
    assert out["input_ids"].tolist() == [[a, b, x, y], [c, p, q, pad]]
    assert out["labels"].tolist() == [[b, x, y, z], [p, q, pad, pad]]
    assert out["response_mask"].tolist() == [[False, True, True, True], [True, True, False, False]]
    assert out["response_mask"].dtype == torch.bool


def test_tokenize_errors(tokenizer):
    with pytest.raises(ValueError, match="prompt_strs has 2 items but output_strs has 1"):
        tokenize_prompt_and_output(["a", "b"], ["c"], tokenizer)


def _naive(model, input_ids, labels):
    logits = model(input_ids=input_ids).logits
    logp = torch.log_softmax(logits.float(), -1)
    gathered = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    p = logp.exp()
    entropy = -(p * logp).sum(-1)
    return gathered, entropy


@pytest.mark.parametrize("chunk_elements", [1 << 25, 258 * 3, 1])
def test_chunked_log_probs_equal_naive_values_and_gradients(tiny_model, tokenizer, chunk_elements):
    batch = tokenize_prompt_and_output(["The sum is", "Q: 2+2?"], [" 12 </answer>", " A: 4"], tokenizer)
    naive_lp, naive_ent = _naive(tiny_model, batch["input_ids"], batch["labels"])
    (naive_lp * batch["response_mask"]).sum().backward()
    naive_grads = [p.grad.clone() for p in tiny_model.parameters()]
    tiny_model.zero_grad(set_to_none=True)

    out = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True,
                                 chunk_elements=chunk_elements)
    torch.testing.assert_close(out["log_probs"], naive_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out["token_entropy"], naive_ent.detach(), atol=1e-5, rtol=1e-5)
    assert not out["token_entropy"].requires_grad
    (out["log_probs"] * batch["response_mask"]).sum().backward()
    for g, p in zip(naive_grads, tiny_model.parameters()):
        torch.testing.assert_close(p.grad, g, atol=1e-5, rtol=1e-4)


def test_head_never_sees_more_than_one_chunk(tiny_model, tokenizer):
    seen = []
    tiny_model.get_output_embeddings().register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    batch = tokenize_prompt_and_output(["x" * 40] * 3, ["y" * 30] * 3, tokenizer)
    get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], chunk_elements=258 * 16)
    assert seen and max(seen) <= 16 and sum(seen) == batch["input_ids"].numel()


def test_one_chunk_of_logits_is_kept_for_backward_and_more_are_recomputed(tiny_model, tokenizer):
    calls = []
    tiny_model.get_output_embeddings().register_forward_hook(lambda m, i, o: calls.append(i[0].shape[0]))
    batch = tokenize_prompt_and_output(["x" * 20] * 3, ["y" * 10] * 3, tokenizer)
    scored = int(batch["response_mask"].sum())  # 30 positions
    for chunk_elements, expected in ((1 << 25, [scored]), (258 * 16, [16, 14, 14, 16])):
        calls.clear()
        out = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], positions=batch["response_mask"],
                                     chunk_elements=chunk_elements)
        out["log_probs"].sum().backward()
        # one chunk: its head matmul once; two chunks: each again in the backward pass (checkpointed), last first
        assert calls == expected, chunk_elements


def test_positions_score_only_the_response(tiny_model, tokenizer):
    batch = tokenize_prompt_and_output(["prompt one", "p2"], [" out", " longer output"], tokenizer)
    full = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True)
    part = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True,
                                  positions=batch["response_mask"])
    m = batch["response_mask"]
    torch.testing.assert_close(part["log_probs"][m], full["log_probs"][m])
    assert torch.equal(part["log_probs"][~m], torch.zeros_like(part["log_probs"][~m]))


def test_fallback_for_models_without_a_plain_head(tiny_model, tokenizer, monkeypatch):
    batch = tokenize_prompt_and_output(["abc"], [" def"], tokenizer)
    monkeypatch.setattr(tiny_model.config, "final_logit_softcapping", 30.0, raising=False)
    out = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], chunk_elements=258 * 2)
    naive_lp, _ = _naive(tiny_model, batch["input_ids"], batch["labels"])
    torch.testing.assert_close(out["log_probs"], naive_lp, atol=1e-5, rtol=1e-5)


def test_sft_microbatch_train_step_hand_values():
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.5, -9.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    loss, meta = sft_microbatch_train_step(logp, mask, gradient_accumulation_steps=2, normalize_constant=4.0)
    # per sequence: -(-3)/4 = 0.75 and -(-9.5)/4 = 2.375; mean 1.5625; / 2 steps = 0.78125
    assert loss.item() == pytest.approx(0.78125)
    torch.testing.assert_close(logp.grad, -mask.float() / (4.0 * 2 * 2))
    assert meta["response_tokens"].item() == 4
    assert meta["nll_per_token"].item() == pytest.approx((3 + 9.5) / 4)


@pytest.mark.parametrize("prompts", [
    ["Shared prompt of a group: 12+7=?"] * 4,  # one GRPO group: the whole prompt is shared
    ["Common preamble. Q: 1+1?", "Common preamble. Q: 22+3?", "Common preamble. Q: 5?", "Common preamble. Q: x"],
])
def test_shared_prefix_gives_the_same_values_and_gradients(tiny_model, tokenizer, prompts):
    outputs = [" 19 </answer>", " twenty", " 1", " a much longer response here"]
    batch = tokenize_prompt_and_output(prompts, outputs, tokenizer)
    mask = batch["response_mask"]

    def run(share):
        tiny_model.zero_grad(set_to_none=True)
        out = get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], return_token_entropy=True,
                                     positions=mask, share_prefix=share)
        (out["log_probs"] * mask * torch.arange(1.0, 1 + mask.shape[1])).sum().backward()
        return out, [p.grad.clone() for p in tiny_model.parameters()]

    plain, plain_grads = run(False)
    shared, shared_grads = run(True)
    torch.testing.assert_close(shared["log_probs"], plain["log_probs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(shared["token_entropy"], plain["token_entropy"], atol=1e-5, rtol=1e-5)
    for a, b in zip(shared_grads, plain_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_shared_prefix_runs_the_prefix_once(tiny_model, tokenizer):
    batch = tokenize_prompt_and_output(["p" * 50] * 4, [" a", " bb", " ccc", " d"], tokenizer)
    seen = []
    tiny_model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    get_response_log_probs(tiny_model, batch["input_ids"], batch["labels"], positions=batch["response_mask"],
                           share_prefix=True)
    # the prefix (49 shared columns that nobody scores) once, then 4 rows of the remaining columns
    assert seen == [(1, 49), (4, batch["input_ids"].shape[1] - 49)]


def test_shared_prefix_falls_back_under_gradient_checkpointing(tiny_model, tokenizer):
    from rlvr.core.models import prepare_for_training

    model = prepare_for_training(tiny_model, gradient_checkpointing=True)
    batch = tokenize_prompt_and_output(["p" * 30] * 3, [" a", " bb", " c"], tokenizer)
    seen = []
    model.get_input_embeddings().register_forward_hook(lambda m, i, o: seen.append(tuple(i[0].shape)))
    out = get_response_log_probs(model, batch["input_ids"], batch["labels"], positions=batch["response_mask"],
                                 share_prefix=True)
    out["log_probs"].sum().backward()
    assert seen[0] == tuple(batch["input_ids"].shape)  # one ordinary pass: the KV cache is off


def _softcapped_model(vocab_size: int, cap: float = 5.0):
    """A tiny Gemma2, whose head really soft-caps: logits = cap * tanh(lm_head(h) / cap). The head's weights
    are scaled so that the raw logits (about 30) are far past the cap and capping changes the distribution."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=256, sliding_window=16, query_pre_attn_scalar=8,
        final_logit_softcapping=cap, pad_token_id=0, eos_token_id=1, bos_token_id=None, attn_implementation="eager")
    model = Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    return model


@pytest.mark.parametrize("share_prefix", [False, True])
@pytest.mark.parametrize("with_positions", [False, True])
def test_a_softcapped_head_is_scored_through_the_models_own_logits(tokenizer, share_prefix, with_positions):
    model = _softcapped_model(len(tokenizer))
    # a group's shared prompt (longer than MIN_SHARED_PREFIX) so that share_prefix would split the pass
    batch = tokenize_prompt_and_output(["Shared prompt of a group: 12+7=?"] * 3, [" 19 </answer>", " twenty", " 1"],
                                       tokenizer)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["response_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        plain = model.get_output_embeddings()(model.get_decoder()(input_ids=ids).last_hidden_state)
    assert float(logits.abs().max()) <= 5.0 + 1e-4 < float(plain.abs().max())  # the cap is real and binding
    expected = torch.log_softmax(logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    uncapped = torch.log_softmax(plain.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert float((uncapped - expected)[mask].abs().max()) > 1.0  # scoring the plain head would be far off

    positions = mask if with_positions else None
    out = get_response_log_probs(model, ids, labels, return_token_entropy=True, positions=positions,
                                 share_prefix=share_prefix, chunk_elements=len(tokenizer) * 5)
    if with_positions:
        torch.testing.assert_close(out["log_probs"][mask], expected[mask], atol=1e-5, rtol=1e-5)
        assert torch.equal(out["log_probs"][~mask], torch.zeros_like(out["log_probs"][~mask]))
    else:
        torch.testing.assert_close(out["log_probs"], expected, atol=1e-5, rtol=1e-5)
    p = torch.softmax(logits.float(), -1)
    entropy = -(p * torch.log_softmax(logits.float(), -1)).sum(-1)
    torch.testing.assert_close(out["token_entropy"][mask], entropy[mask], atol=1e-4, rtol=1e-4)
    # and the gradient is the capped model's too
    (out["log_probs"] * mask).sum().backward()
    grads = [q.grad.clone() for q in model.parameters()]
    model.zero_grad(set_to_none=True)
    naive = torch.log_softmax(model(input_ids=ids).logits.float(), -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    (naive * mask).sum().backward()
    for g, q in zip(grads, model.parameters()):
        torch.testing.assert_close(g, q.grad, atol=1e-4, rtol=1e-4)


class _Logits(torch.nn.Module):
    """A "model" whose logits at every position are a free parameter: its gradient is the loss's gradient on the
    logits, to compare with a closed form."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.z = torch.nn.Parameter(logits.clone())

    def forward(self, input_ids, **_):
        return types.SimpleNamespace(logits=self.z.expand(input_ids.shape[0], -1, -1))


def test_the_entropy_bonus_gradient_is_the_closed_form_on_a_small_categorical():
    # issue 39.3: -coef x H(softmax(z / T)) at every scored position; dH/dz_v = -p_v (log p_v + H) / T
    torch.manual_seed(0)
    z = torch.randn(5, 7)  # 5 positions, 7 tokens
    model, temperature, coef = _Logits(z), 0.7, 0.05
    ids = torch.zeros(1, 5, dtype=torch.long)
    mask = torch.tensor([[False, True, True, True, True]])
    out = get_response_log_probs(model, ids, ids, return_token_entropy=True, positions=mask,
                                 temperature=temperature, entropy_grad=True)
    assert out["token_entropy"].requires_grad
    (-coef * out["token_entropy"][mask].sum()).backward()
    p = torch.softmax(z / temperature, dim=-1)
    h = -(p * p.log()).sum(-1, keepdim=True)
    expected = coef * p * (p.log() + h) / temperature
    expected[0] = 0  # an unscored position gets no gradient
    torch.testing.assert_close(model.z.grad, expected, atol=1e-6, rtol=1e-5)
    # without entropy_grad the entropy is for logging only: detached, the same values
    plain = get_response_log_probs(model, ids, ids, return_token_entropy=True, positions=mask,
                                   temperature=temperature)
    assert not plain["token_entropy"].requires_grad
    torch.testing.assert_close(plain["token_entropy"], out["token_entropy"].detach())


# ---------------------------------------------------------------------------------------------------------------
# Mixed-precision training on the CPU (issue 59): attention in float32, one autocast region per update


def _attention_inputs(seed: int = 0):
    torch.manual_seed(seed)
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)  # q and k leave RoPE in fp32 under autocast
    v = torch.randn(2, 2, 5, 8).to(torch.bfloat16)  # v leaves its projection in bf16
    return q, k, v, types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)


def test_training_attention_runs_in_float32_under_cpu_autocast_and_is_sdpa_elsewhere():
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlvr.core.models import _sdpa_fp32_on_cpu

    q, k, v, module = _attention_inputs()
    exact, _ = sdpa_attention_forward(module, q, k, v.float(), None)  # float32 throughout, no autocast
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours, _ = _sdpa_fp32_on_cpu(module, q, k, v, None)
        autocast_sdpa, _ = sdpa_attention_forward(module, q, k, v, None)
    assert ours.dtype == autocast_sdpa.dtype == torch.bfloat16  # what follows sees what autocast's SDPA returns
    assert torch.equal(ours, exact.to(torch.bfloat16))  # computed in fp32, rounded once at the end
    assert not torch.equal(autocast_sdpa, ours)  # autocast's own SDPA rounds q, k, v to bf16 first
    # no autocast (the engines' inference, fp32 training): SDPA exactly as transformers runs it
    plain, _ = _sdpa_fp32_on_cpu(module, q, k, v.float(), None)
    assert torch.equal(plain, exact)


def test_prepare_for_training_and_load_model_use_it_without_saving_it(tiny_model, tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlvr.core.models import TRAINING_ATTENTION, prepare_for_training

    model = prepare_for_training(tiny_model)
    assert model.config._attn_implementation == TRAINING_ATTENTION
    assert all(layer.self_attn.config._attn_implementation == TRAINING_ATTENTION for layer in model.model.layers)
    model.save_pretrained(tmp_path / "saved")  # a checkpoint another program loads: plain SDPA there
    assert AutoModelForCausalLM.from_pretrained(tmp_path / "saved").config._attn_implementation == "sdpa"
    # rlvr's own loader gives every model it loads (a reference, a teacher) the same attention as the policy
    from rlvr.core.models import load_model

    tokenizer.save_pretrained(tmp_path / "saved")
    assert load_model(str(tmp_path / "saved"))[0].config._attn_implementation == TRAINING_ATTENTION
    ids = torch.tensor([[3, 4, 5, 6, 7]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()  # trains: the fp32 attention has a backward
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _update_per_microbatch_regions(model, batch, spec, steps):
    """The update as it ran before issue 59: each microbatch's forward in its own autocast region, the loss and
    backward outside any (the reference the one-region update must equal bit for bit)."""
    from rlvr.algorithms.losses import aggregate_loss_across_microbatch, microbatch_loss_scale, whole_batch_normalizer
    from rlvr.algorithms.spec import policy_loss
    from rlvr.algorithms.packing import microbatches, row_widths

    n, mask_all = len(batch), batch.response_mask
    normalizer = whole_batch_normalizer(spec.loss_normalization, mask_all, spec.normalization_constant)
    widths = row_widths(mask_all)
    model.train()
    for mb in microbatches(list(range(n)), batch.input_ids, mask_all, -(-n // steps)):
        idx, w = torch.tensor(mb), int(widths[mb].max())
        mask = mask_all[idx, :w]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lp = get_response_log_probs(model, batch.input_ids[idx, :w], batch.labels[idx, :w], True,
                                        positions=mask, share_prefix=True, pack=True)["log_probs"]
        per_token, _ = policy_loss(spec, batch.advantages[idx], lp, lp.detach(), mask)
        loss = aggregate_loss_across_microbatch(per_token, mask, spec.loss_normalization, normalizer)
        (loss * microbatch_loss_scale(spec.loss_normalization, len(mb), n)).backward()


def test_a_bf16_update_in_one_autocast_region_equals_per_microbatch_regions_and_casts_each_weight_once(
        tiny_model, tokenizer):
    import copy

    from rlvr.algorithms.spec import EstimatorSpec
    from rlvr.algorithms.update import TrainBatch, policy_gradient_update

    prompts = ["1 + 2 =", "1 + 2 =", "3 + 4 =", "3 + 4 =", "5 + 6 =", "5 + 6 ="]
    tok = tokenize_prompt_and_output(prompts, [" 3", " three", " 7", " 8 or so", " 11", " 12"], tokenizer)
    batch = TrainBatch(tok["input_ids"], tok["labels"], tok["response_mask"],
                       torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0]))
    spec = EstimatorSpec("mean", "none", "none", "sequence")
    reference = copy.deepcopy(tiny_model)
    _update_per_microbatch_regions(reference, batch, spec, steps=3)
    # the update's gradients, caught before its optimizer step (lr 0 would still let AdamW read them)
    grads = {}
    optimizer = torch.optim.SGD(tiny_model.parameters(), lr=0.0)
    step = optimizer.step
    optimizer.step = lambda: (grads.update({n: p.grad.clone() for n, p in tiny_model.named_parameters()}), step())
    from torch.profiler import profile

    with profile(record_shapes=True) as prof:
        policy_gradient_update(tiny_model, optimizer, batch, spec, 3, None, on_policy_ratio=True, precision="bf16")

    def in_backward(event):
        while event is not None:
            if "Backward" in event.name:
                return True
            event = event.cpu_parent
        return False

    shape = list(tiny_model.model.layers[0].mlp.down_proj.weight.shape)  # the down projections' shape alone
    casts = [e for e in prof.events() if e.name == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] == shape
             and not in_backward(e)]
    for name, p in reference.named_parameters():
        assert torch.equal(grads[name], p.grad), name  # the loss and backward still run outside autocast
    # each layer's down_proj weight went to bf16 once in the forward passes, not once for each of 3 microbatches
    assert len(casts) == len(tiny_model.model.layers)

"""On-policy distillation (issue 17): the expected gradient of the estimator equals the reverse KL's, by
exact enumeration of every response over a 3-token vocabulary; and `rlvr train algorithm=opd` end to end.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from conftest import make_model, make_tokenizer
from rlvr import stages
from rlvr.algorithms.estimators import distill_advantages
from rlvr.algorithms.losses import aggregate_loss_across_microbatch, compute_policy_gradient_loss
from rlvr.algorithms.policy import get_response_log_probs
from rlvr.config import ConfigError, TrainConfig, load_config
from rlvr.core.tracking import read_jsonl
from rlvr.training import rl as train_module

V, L = 3, 2  # vocabulary, response length: 9 responses, enumerated
PROMPT = [0, 1]


def _tiny(seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=16,
                         pad_token_id=0, eos_token_id=2, bos_token_id=None, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).double()
    with torch.no_grad():  # sharper distributions than the default init, so the two models differ clearly
        model.lm_head.weight.mul_(20)
    return model


def _enumerated():
    full = torch.tensor([PROMPT + list(y) for y in itertools.product(range(V), repeat=L)])
    input_ids, labels = full[:, :-1], full[:, 1:]
    mask = torch.zeros_like(labels, dtype=torch.bool)
    mask[:, len(PROMPT) - 1:] = True
    return input_ids, labels, mask


def _log_probs(model, input_ids, labels, mask):
    return get_response_log_probs(model, input_ids, labels, positions=mask)["log_probs"].double()


def _estimator_gradient(student, teacher, discount):
    """E_{y ~ pi}[grad of the distillation loss], exactly: every response weighted by its probability."""
    input_ids, labels, mask = _enumerated()
    with torch.no_grad():
        student_lp = _log_probs(student, input_ids, labels, mask)
        teacher_lp = _log_probs(teacher, input_ids, labels, mask)
    advantages = distill_advantages(student_lp, teacher_lp, mask, discount).double()
    weights = student_lp.masked_fill(~mask, 0).sum(-1).exp()  # pi(y), detached
    assert float(weights.sum()) == pytest.approx(1.0, abs=1e-6)  # (log-probs come out in float32)
    student.zero_grad()
    log_probs = _log_probs(student, input_ids, labels, mask)
    per_token, _ = compute_policy_gradient_loss(advantages * weights[:, None] * len(weights), log_probs, "none")
    aggregate_loss_across_microbatch(per_token, mask, "sum").backward()  # token sum, mean over the 9 rows
    return [p.grad.clone() for p in student.parameters()]


def _exact_gradient(student, teacher, loss_fn):
    student.zero_grad()
    loss_fn(student, teacher).backward()
    return [p.grad.clone() for p in student.parameters()]


def _sequence_kl(student, teacher):
    """KL(pi(y) || p_teacher(y)) over the 9 responses."""
    input_ids, labels, mask = _enumerated()
    log_pi = _log_probs(student, input_ids, labels, mask).masked_fill(~mask, 0).sum(-1)
    with torch.no_grad():
        log_q = _log_probs(teacher, input_ids, labels, mask).masked_fill(~mask, 0).sum(-1)
    return (log_pi.exp() * (log_pi - log_q)).sum()


def _per_token_kl(student, teacher):
    """sum_t E_{y<t ~ pi}[KL(pi(.|y<t) || p_teacher(.|y<t))], with the state distribution held fixed."""
    contexts = [torch.tensor([PROMPT + list(prefix)]) for t in range(L) for prefix in itertools.product(range(V), repeat=t)]
    total = torch.zeros((), dtype=torch.float64)
    for ctx in contexts:
        logits = torch.log_softmax(student(ctx).logits[0, -1].double(), -1)
        with torch.no_grad():
            teacher_logits = torch.log_softmax(teacher(ctx).logits[0, -1].double(), -1)
            prefix = ctx[0, len(PROMPT):]
            weight = torch.ones((), dtype=torch.float64)
            for i, token in enumerate(prefix):  # pi(prefix), not differentiated: the visited states are given
                step_logits = torch.log_softmax(student(ctx[:, : len(PROMPT) + i]).logits[0, -1].double(), -1)
                weight = weight * step_logits[token].exp()
        total = total + weight * (logits.exp() * (logits - teacher_logits)).sum()
    return total


@pytest.mark.parametrize("discount, objective", [(1.0, _sequence_kl), (0.0, _per_token_kl)], ids=["sequence", "per_token"])
def test_the_expected_gradient_is_the_reverse_kls(discount, objective):
    student, teacher = _tiny(0), _tiny(1)
    estimated = _estimator_gradient(student, teacher, discount)
    exact = _exact_gradient(student, teacher, objective)
    assert float(objective(student, teacher).detach()) > 0.05  # the two models really differ
    for e, x in zip(estimated, exact):
        torch.testing.assert_close(e, x, rtol=1e-4, atol=1e-6)
    # and the two objectives are different functions: each gradient is only the estimator with its discount
    other = _exact_gradient(student, teacher, _per_token_kl if discount == 1.0 else _sequence_kl)
    assert max(float((e - o).abs().max()) for e, o in zip(estimated, other)) > 1e-4


def test_the_full_vocabulary_kl_has_the_per_token_reverse_kls_gradient():
    # distill_kl=reverse: every response weighted by pi(y) (detached: the visited states are given), the exact KL at
    # each of its states summed -- its gradient is the per-token reverse KL's, which the sampled estimator with
    # discount 0 only matches in expectation
    student, teacher = _tiny(0), _tiny(1)
    input_ids, labels, mask = _enumerated()
    with torch.no_grad():
        weights = _log_probs(student, input_ids, labels, mask).masked_fill(~mask, 0).sum(-1).exp()
    student.zero_grad()
    kl = get_response_log_probs(student, input_ids, labels, positions=mask, teacher=teacher)["teacher_kl"].double()
    (weights[:, None] * kl).sum().backward()
    full = [p.grad.clone() for p in student.parameters()]
    exact = _exact_gradient(student, teacher, _per_token_kl)
    for f, x in zip(full, exact):
        torch.testing.assert_close(f, x, rtol=1e-4, atol=1e-6)
    sampled = _estimator_gradient(student, teacher, 0.0)
    for f, e in zip(full, sampled):
        torch.testing.assert_close(f, e, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("direction", ["reverse", "forward"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_full_vocabulary_kl_by_its_definition(temperature, direction):
    student, teacher = _tiny(0), _tiny(1)
    input_ids, labels, mask = _enumerated()
    kl = get_response_log_probs(student, input_ids, labels, positions=mask, teacher=teacher,
                                temperature=temperature, kl_direction=direction)["teacher_kl"]
    with torch.no_grad():
        p = torch.log_softmax(student(input_ids).logits.double() / temperature, -1)
        q = torch.log_softmax(teacher(input_ids).logits.double(), -1)  # the teacher at its own temperature
    expected = (p.exp() * (p - q)).sum(-1) if direction == "reverse" else (q.exp() * (q - p)).sum(-1)
    torch.testing.assert_close(kl.double(), expected * mask, rtol=1e-5, atol=1e-6)
    kl = kl.detach()
    assert float(kl[mask].min()) > 0 and float(kl[~mask].abs().max()) == 0


def test_the_forward_kls_gradient_on_the_logits_is_p_minus_q():
    # the closed form: d KL(q || softmax(z)) / dz = softmax(z) - q -- it raises a token the teacher wants however
    # little mass the student gives it, where the reverse KL's gradient p (log p - log q - KL) is scaled by p
    from rlvr.algorithms.policy import _scores

    z = torch.tensor([[4.0, 0.0, -6.0]], dtype=torch.float64, requires_grad=True)
    q = torch.log(torch.tensor([[0.2, 0.1, 0.7]], dtype=torch.float64))
    _, _, kl = _scores(z, torch.tensor([0]), False, teacher_log_probs=q, kl_direction="forward")
    kl.sum().backward()
    torch.testing.assert_close(z.grad, torch.softmax(z.detach(), -1) - q.exp(), rtol=1e-5, atol=1e-6)
    assert float(z.grad[0, 2]) == pytest.approx(-0.7, abs=1e-4)  # the teacher's favourite token, pushed up hard
    z.grad = None
    _, _, kl = _scores(z, torch.tensor([0]), False, teacher_log_probs=q, kl_direction="reverse")
    kl.sum().backward()
    p = torch.softmax(z.detach(), -1)
    torch.testing.assert_close(z.grad, p * (p.log() - q - (p * (p.log() - q)).sum()), rtol=1e-5, atol=1e-6)
    assert float(z.grad[0, 2]) > -1e-3  # the reverse KL barely moves the teacher's favourite token (p = 2e-5)


def test_distill_advantages_by_hand():
    student = torch.log(torch.tensor([[0.5, 0.25, 0.5, 1.0]]))
    teacher = torch.log(torch.tensor([[0.25, 0.5, 0.5, 1.0]]))
    mask = torch.tensor([[False, True, True, True]])
    ln2 = torch.log(torch.tensor(2.0))
    torch.testing.assert_close(distill_advantages(student, teacher, mask), torch.tensor([[0, ln2, 0, 0]]))
    torch.testing.assert_close(distill_advantages(student, teacher, mask, 0.5), torch.tensor([[0, ln2, 0, 0]]))
    teacher2 = torch.log(torch.tensor([[0.25, 0.5, 0.25, 1.0]]))  # the third token now costs log 2
    torch.testing.assert_close(distill_advantages(student, teacher2, mask, 0.5), torch.tensor([[0, ln2 - 0.5 * ln2, -ln2, 0]]))


# ----------------------------------------------------------------------------------------------------
# Through the loop.


@pytest.fixture
def teacher_dir(tmp_path, tokenizer):
    path = tmp_path / "teacher"
    make_model(len(tokenizer), seed=7).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _opd_cfg(model_dir, teacher_dir, out, **kw):
    base = dict(model=str(model_dir), teacher=str(teacher_dir), algorithm="opd", dataset="arithmetic:steps=1,max=9",
                out=str(out), steps=2, rollout_batch_size=4, group_size=2, max_new_tokens=6, microbatch_size=2,
                learning_rate=1e-2, eval_every=0, eval_at_start=False, eval_at_end=False, generation_dtype="float32",
                precision="fp32", tensorboard=False, log_rollouts_every=1)
    base.update(kw)
    return load_config(TrainConfig, overrides=base)


def test_opd_trains_on_per_token_teacher_advantages(tmp_path, model_dir, teacher_dir, monkeypatch):
    seen = []
    update = stages.learn.policy_gradient_update

    def spy(model, optimizer, batch, spec, *args, **kwargs):
        seen.append(batch.advantages.clone())
        return update(model, optimizer, batch, spec, *args, **kwargs)

    monkeypatch.setattr(stages.learn, "policy_gradient_update", spy)
    cfg = _opd_cfg(model_dir, teacher_dir, tmp_path / "run")
    train_module.train_grpo(cfg)
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert all(abs(r["train/teacher_reverse_kl"]) > 1e-3 and r["train/trained_tokens"] > 0 for r in rows)
    assert seen[0].dim() == 2 and seen[0].shape[0] == 4  # one advantage per token
    assert len({round(float(v), 6) for v in seen[0][seen[0] != 0]}) > 4  # and they differ token to token


def test_opd_with_the_student_as_its_own_teacher_has_nothing_to_learn(tmp_path, model_dir):
    cfg = _opd_cfg(model_dir, model_dir, tmp_path / "run", steps=1)
    train_module.train_grpo(cfg)
    (row,) = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert abs(row["train/teacher_reverse_kl"]) < 1e-5
    assert row["train/pruned_fraction"] == 1.0  # every advantage is exactly 0


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_opd_with_the_full_vocabulary_kl_trains_every_token_on_it(direction, tmp_path, model_dir, teacher_dir,
                                                                  monkeypatch):
    seen = []
    update = stages.learn.policy_gradient_update

    def spy(model, optimizer, batch, spec, *args, **kwargs):
        seen.append((batch.advantages.clone(), kwargs.get("teacher")))
        return update(model, optimizer, batch, spec, *args, **kwargs)

    monkeypatch.setattr(stages.learn, "policy_gradient_update", spy)
    train_module.train_grpo(_opd_cfg(model_dir, teacher_dir, tmp_path / "run", distill_kl=direction))
    rows = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    advantages, teacher = seen[0]
    assert teacher is not None and float(advantages.abs().max()) == 0  # the KL is the loss, not an advantage
    assert all(r["train/teacher_kl_exact"] > 1e-3 and r["train/trained_tokens"] > 0 and r["train/grad_norm"] > 0
               and r["train/pruned_fraction"] == 0 for r in rows)
    # its own teacher: the KL is exactly 0 everywhere, so is the gradient
    train_module.train_grpo(_opd_cfg(model_dir, model_dir, tmp_path / "self", steps=1, distill_kl=direction))
    (row,) = read_jsonl(tmp_path / "self" / "metrics.jsonl")
    assert abs(row["train/teacher_kl_exact"]) < 1e-6 and row["train/grad_norm"] < 1e-6


def test_full_vocabulary_kl_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="distill_kl='reverse'.*distill_discount=1"):
        load_config(TrainConfig, overrides={"algorithm": "opd", "teacher": "t", "distill_kl": "reverse",
                                            "distill_discount": 1.0})
    with pytest.raises(ConfigError, match="distill_kl='kl' is not one of 'sampled', 'reverse', 'forward'"):
        load_config(TrainConfig, overrides={"algorithm": "opd", "teacher": "t", "distill_kl": "kl"})


def test_opd_needs_a_teacher_and_one_with_the_same_tokenizer(tmp_path, model_dir):
    with pytest.raises(ConfigError, match="teacher="):
        load_config(TrainConfig, overrides={"algorithm": "opd"})
    other = tmp_path / "other"
    tok = make_tokenizer()
    tok.add_tokens(["<extra>"])
    make_model(len(tok), seed=3).save_pretrained(other)
    tok.save_pretrained(other)
    with pytest.raises(ValueError, match="different tokenizers"):
        train_module.train_grpo(_opd_cfg(model_dir, other, tmp_path / "run", steps=1))


def test_opd_forward_with_lora_is_killed_and_resumes_exactly(tmp_path, model_dir, teacher_dir, crash_at):
    kw = dict(steps=4, save_every=2, lora_rank=4, distill_kl="forward")
    train_module.train_grpo(_opd_cfg(model_dir, teacher_dir, tmp_path / "straight", **kw))
    undo = crash_at(3)
    with pytest.raises(KeyboardInterrupt):
        train_module.train_grpo(_opd_cfg(model_dir, teacher_dir, tmp_path / "crashed", **kw))
    undo()
    train_module.train_grpo(_opd_cfg(model_dir, teacher_dir, tmp_path / "crashed", resume=True, **kw))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "time" and not k.startswith("time/")}  # noqa: E731
                          for r in rows]
    straight = strip(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
    assert strip(read_jsonl(tmp_path / "crashed" / "metrics.jsonl")) == straight
    assert [r["step"] for r in straight] == [1, 2, 3, 4]
    # only the adapter trains, and it does: the forward KL to the teacher moves
    assert all(r["train/grad_norm"] > 0 for r in straight)
    assert len({round(r["train/teacher_kl_exact"], 6) for r in straight}) == 4
    assert (tmp_path / "straight" / "final" / "model.safetensors").is_file()  # merged for evaluation


@pytest.mark.parametrize("direction", ["reverse", "forward", "sampled"])
def test_a_teacher_with_a_padded_vocabulary_is_the_same_teacher(direction, tmp_path, model_dir, teacher_dir,
                                                                tokenizer):
    """Issue 36 item 5: one tokenizer, embedding matrices padded to other sizes (Qwen2.5 0.5B: 151,936 rows;
    7B: 152,064). The teacher padded by 64 rows of noise distills exactly as the unpadded one."""
    import torch
    from transformers import AutoModelForCausalLM

    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    padded = make_model(len(tokenizer) + 64, seed=3)
    state = teacher.state_dict()
    with torch.no_grad():
        for name, value in padded.state_dict().items():
            if value.shape == state[name].shape:
                value.copy_(state[name])
            else:  # the embedding (tied head): the teacher's rows, then 64 random ones no token id names
                value[: len(tokenizer)].copy_(state[name])
    padded_dir = tmp_path / "padded"
    padded.save_pretrained(padded_dir)
    tokenizer.save_pretrained(padded_dir)
    kw = dict(steps=1) if direction == "sampled" else dict(steps=1, distill_kl=direction)
    rows = {}
    for name, path in (("plain", teacher_dir), ("padded", padded_dir)):
        train_module.train_grpo(_opd_cfg(model_dir, path, tmp_path / name, **kw))
        (rows[name],) = read_jsonl(tmp_path / name / "metrics.jsonl")
    key = "train/teacher_reverse_kl" if direction == "sampled" else "train/teacher_kl_exact"
    assert rows["padded"][key] == pytest.approx(rows["plain"][key], rel=1e-5) and rows["plain"][key] != 0
    assert rows["padded"]["train/grad_norm"] == pytest.approx(rows["plain"]["train/grad_norm"], rel=1e-4)

"""Data-parallel learners (rlvr.parallel): two gloo processes make exactly the update one process makes."""

import socket

import pytest
import torch
import torch.multiprocessing as mp

from conftest import make_model, make_tokenizer
from rlvr.algorithms import get_preset
from rlvr.parallel import shard_rows
from rlvr.update import TrainBatch, policy_gradient_update

import dataclasses


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _batch(seed: int = 0, n: int = 12, group: int = 4) -> TrainBatch:
    """Three prompts x four responses of different lengths; a third of the advantages are zero (pruned), one
    response is empty (EOS first)."""
    g = torch.Generator().manual_seed(seed)
    vocab = len(make_tokenizer())
    prompt_len, t = 5, 17
    ids = torch.randint(2, vocab, (n, t), generator=g)
    mask = torch.zeros(n, t, dtype=torch.bool)
    for i in range(n):
        ids[i, :prompt_len] = ids[(i // group) * group, :prompt_len]  # one prompt per group
        length = int(torch.randint(1, t - prompt_len, (), generator=g))
        mask[i, prompt_len - 1 : prompt_len - 1 + length] = True
    mask[5] = False  # an empty response
    labels = torch.roll(ids, -1, dims=1)
    adv = torch.randn(n, generator=g)
    adv[[1, 6, 7, 10]] = 0.0
    return TrainBatch(ids, labels, mask, adv)


def _spec(aggregation: str):
    return dataclasses.replace(get_preset("grpo"), loss_normalization=aggregation,
                               normalization_constant=100.0 if aggregation == "constant" else None).validate()


def _model():
    # float64: the two paths sum the same per-row gradients in a different order, and AdamW's division by
    # sqrt(v) would blow float32's last-bit differences of near-zero gradients up past 1e-6
    return make_model(len(make_tokenizer())).double()


def _train(model, batches, spec, parallel=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    metas = []
    for batch in batches:
        _, meta = policy_gradient_update(model, opt, batch, spec, 3, 1.0, parallel=parallel)
        metas.append(meta)
    return metas


def _worker(rank: int, world: int, port: int, aggregation: str, out: str):
    from rlvr.parallel import init_learner_group

    torch.set_num_threads(1)
    parallel = init_learner_group(rank, world, "127.0.0.1", port, backend="gloo", timeout_s=60)
    model = _model()
    metas = _train(model, [_batch(0), _batch(1), _batch(2)], _spec(aggregation), parallel)
    if rank == 0:
        torch.save({"state": model.state_dict(), "metas": metas}, out)
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("aggregation", ["sequence", "constant", "token"])
def test_two_gloo_learners_make_the_single_process_update(tmp_path, aggregation):
    out = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, _free_port(), aggregation, out), nprocs=2, join=True)
    got = torch.load(out)

    model = _model()
    metas = _train(model, [_batch(0), _batch(1), _batch(2)], _spec(aggregation))
    moved = 0.0
    fresh = _model().state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(got["state"][name], value, atol=1e-6, rtol=0, msg=name)
        moved = max(moved, float((value - fresh[name]).abs().max()))
    assert moved > 1e-2  # the weights really moved, so agreement is not trivial
    for single, parallel in zip(metas, got["metas"]):
        for key in ("trained_rollouts", "trained_tokens", "pruned_fraction", "microbatches"):
            assert parallel[key] == single[key], key
        assert parallel["grad_norm"] == pytest.approx(single["grad_norm"], rel=1e-5)
        assert parallel["trained_token_entropy"] == pytest.approx(single["trained_token_entropy"], rel=1e-5)


def test_shards_keep_prompts_together_and_cover_every_row_once():
    batch = _batch()
    rows = [r for r in range(len(batch)) if r not in (1, 5)]
    shards = shard_rows(rows, batch.input_ids, batch.response_mask, 2)
    assert sorted(shards[0] + shards[1]) == rows
    group_of = {r: r // 4 for r in rows}
    assert not {group_of[r] for r in shards[0]} & {group_of[r] for r in shards[1]}
    assert all(shards)  # three prompts over two ranks: both get work
    # more ranks than prompts: the extra ranks get nothing, and that is allowed
    assert sum(map(len, shard_rows(rows, batch.input_ids, batch.response_mask, 5))) == len(rows)


def test_truncated_importance_sampling_weights_each_token_by_the_capped_ratio():
    """With sampling-time log-probs, the on-policy loss of each token is weighted by min(pi / pi_old, cap): the
    same step as per-token advantages A * w."""
    from rlvr.update import score_log_probs

    batch = _batch(3)
    spec = _spec("sequence")
    live = make_model(len(make_tokenizer())).double()
    lp = score_log_probs(live, batch.input_ids, batch.labels, batch.response_mask, 4)
    shift = torch.where(torch.arange(lp.shape[1]) % 2 == 0, -1.5, 0.4).expand_as(lp)  # ratios e^1.5 (capped), e^-0.4
    behaviour = (lp + shift).masked_fill(~batch.response_mask, 0.0)
    behaviour[0, :] = float("nan")  # unknown sampling log-probs: the live policy's stand in (weight 1)
    weight = torch.exp(-shift).clamp(max=2.0) * batch.response_mask
    weight[0] = batch.response_mask[0].double()

    tis, reference = make_model(len(make_tokenizer())).double(), make_model(len(make_tokenizer())).double()
    with_tis = dataclasses.replace(batch, old_log_probs=behaviour)
    per_token = dataclasses.replace(batch, advantages=batch.advantages.unsqueeze(-1) * weight)
    _, meta = policy_gradient_update(tis, torch.optim.SGD(tis.parameters(), lr=0.5), with_tis, spec, 2, None,
                                     tis_cap=2.0)
    policy_gradient_update(reference, torch.optim.SGD(reference.parameters(), lr=0.5), per_token, spec, 2, None)
    for (name, a), b in zip(tis.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=0, msg=name)  # lp above is float32-rounded
    assert meta["is_weight_max"] == pytest.approx(2.0)
    assert 0.3 < meta["is_capped_fraction"] < 0.7

"""Data-parallel learners (rlvr.distributed.parallel): two gloo processes make exactly the update one process makes."""

import dataclasses
import socket

import pytest
import torch
import torch.multiprocessing as mp

from conftest import make_model, make_tokenizer
from rlvr.algorithms.spec import get_preset
from rlvr.algorithms.update import TrainBatch, policy_gradient_update
from rlvr.distributed.parallel import shard_rows


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
    from rlvr.distributed.parallel import init_learner_group

    torch.set_num_threads(1)
    parallel = init_learner_group(rank, world, "127.0.0.1", port, backend="gloo", device="cpu", timeout_s=60)
    parallel.group = _Declared(parallel.group)  # every collective of the real update passes the device check
    model = _model()
    metas = _train(model, [_batch(0), _batch(1), _batch(2)], _spec(aggregation), parallel)
    if rank == 0:
        torch.save({"state": model.state_dict(), "metas": metas, "devices": parallel.group.seen}, out)
    parallel.close()


class _Declared:
    """A learner group that records the device of every tensor sent through it and refuses any other than its
    declared one (what NCCL does to a CPU tensor), around the real group."""

    def __init__(self, group, device=None):
        self.inner, self.device, self.seen = group, torch.device(device or group.device), []

    def _check(self, tensor, op):
        self.seen.append((op, str(tensor.device)))
        if tensor.device != self.device:
            raise ValueError(f"{op}: tensor on {tensor.device}, group declared on {self.device}")

    def all_reduce(self, tensor, op=torch.distributed.ReduceOp.SUM):
        self._check(tensor, "all_reduce")
        return self.inner.all_reduce(tensor, op) if self.inner is not None else tensor

    def broadcast(self, tensor, src=0):
        self._check(tensor, "broadcast")
        return self.inner.broadcast(tensor, src) if self.inner is not None else tensor

    def rank(self):
        return self.inner.rank() if self.inner is not None else 0

    def size(self):
        return self.inner.size() if self.inner is not None else 2

    def close(self):
        self.inner.close()


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
    ops = {op for op, _ in got["devices"]}
    assert ops == {"all_reduce"} and {d for _, d in got["devices"]} == {"cpu"}
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
    """With sampling-time log-probs mu, the on-policy loss of each token is weighted by min(pi / mu, cap): the
    same step as per-token advantages A * w."""
    from rlvr.algorithms.update import RolloutCorrection, score_log_probs

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
    with_tis = dataclasses.replace(batch, rollout_log_probs=behaviour)
    per_token = dataclasses.replace(batch, advantages=batch.advantages.unsqueeze(-1) * weight)
    _, meta = policy_gradient_update(tis, torch.optim.SGD(tis.parameters(), lr=0.5), with_tis, spec, 2, None,
                                     rollout_correction=RolloutCorrection("token_tis", 2.0))
    policy_gradient_update(reference, torch.optim.SGD(reference.parameters(), lr=0.5), per_token, spec, 2, None)
    for (name, a), b in zip(tis.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=0, msg=name)  # lp above is float32-rounded
    assert meta["is_weight_max"] == pytest.approx(2.0)
    assert 0.3 < meta["is_capped_fraction"] < 0.7


def test_a_group_refuses_a_tensor_on_another_device_and_nccl_on_the_cpu():
    from rlvr.distributed.parallel import Group

    group = Group("gloo", "meta", 60.0)
    with pytest.raises(ValueError, match=r"all_reduce: a tensor on cpu sent to a gloo group on meta"):
        group.all_reduce(torch.zeros(3))
    with pytest.raises(ValueError, match="broadcast"):
        group.broadcast(torch.zeros(3))
    with pytest.raises(ValueError, match="NCCL group carries CUDA tensors"):
        Group("nccl", "cpu", 60.0)


def test_statistics_are_reduced_on_the_groups_device_not_the_cpu():
    """The learners' sums and maxima (update.py) go on the group's device: on GPUs an NCCL group has no CPU
    backend, and the old code made them float64 CPU tensors whatever the group. A group declared on `meta`
    (a device that is not the CPU) sees where they are made."""
    from rlvr.distributed.parallel import DataParallel

    class Meta(_Declared):
        def all_reduce(self, tensor, op=torch.distributed.ReduceOp.SUM):
            self._check(tensor, "all_reduce")
            return torch.tensor([7.0] * tensor.numel(), dtype=tensor.dtype)  # what a reduction would bring back

    group = Meta(None, "meta")
    parallel = DataParallel(group)
    assert parallel.sum_floats([1.0, 2.0]) == [7.0, 7.0]
    assert parallel.max_floats([1.0]) == [7.0]
    assert group.seen == [("all_reduce", "meta"), ("all_reduce", "meta")]


def test_one_backend_per_group_from_where_its_ranks_run():
    from rlvr.config import TrainConfig, choose_backend

    assert choose_backend("auto", ["cuda", "cuda"], "x") == "nccl"
    assert choose_backend("auto", ["cpu", "cpu"], "x") == "gloo"
    assert choose_backend("gloo", ["cuda"], "x") == "gloo"
    with pytest.raises(ValueError, match="CPU and on GPUs"):
        choose_backend("auto", ["cuda", "cpu"], "x")
    with pytest.raises(ValueError, match="nccl needs every rank on a GPU"):
        choose_backend("nccl", ["cpu"], "x")
    # learners that asked Ray for no GPU are CPU ranks: gloo, even on a machine with GPUs (the old code picked
    # NCCL from torch.cuda.is_available() and crashed at the first CPU all-reduce)
    cfg = TrainConfig(distributed={"rollout_workers": 1, "learners": 2})
    assert cfg.distributed.learner_device == "cpu" and cfg.distributed.learner_backend == "gloo"
    cfg = TrainConfig(distributed={"rollout_workers": 1, "learners": 2, "learner_num_gpus": 1})
    assert cfg.distributed.learner_backend == "nccl"
    for fields, message in (
            ({"rollout_workers": 2, "learner_num_gpus": 1, "weight_sync": "broadcast"},
             r"weight_sync=broadcast with distributed.learner_num_gpus=1 and distributed.rollout_num_gpus=0"),
            ({"rollout_workers": 1, "learners": 2, "learner_num_gpus": 0.5}, "Duplicate GPU"),
            ({"rollout_workers": 2, "learner_num_gpus": 1, "rollout_num_gpus": 0.5, "weight_sync": "broadcast"},
             "share a GPU"),
            ({"rollout_workers": 1, "learners": 2, "backend": "nccl"}, "nccl needs every rank on a GPU")):
        with pytest.raises(ValueError, match=message):
            TrainConfig(distributed=fields)
    with pytest.raises(ValueError, match="device=cpu with distributed.learner_num_gpus=1"):
        TrainConfig(device="cpu", distributed={"rollout_workers": 1, "learner_num_gpus": 1})


def test_async_mode_with_a_broadcast_weight_sync_is_refused_naming_the_way_that_overlaps():
    from rlvr.config import TrainConfig

    # a worker joins the broadcast only after the batches queued on it: the learners would wait for them
    with pytest.raises(ValueError, match=r"async.max_staleness=2 with distributed.weight_sync=broadcast does not "
                                         r"overlap.*use distributed.weight_sync=object_store"):
        TrainConfig(distributed={"rollout_workers": 2, "weight_sync": "broadcast"}, **{"async": {"max_staleness": 2}})
    # each alone, and K=0 (synchronous) with the broadcast, stay valid
    assert TrainConfig(distributed={"rollout_workers": 2}, **{"async": {"max_staleness": 2}}).async_.max_staleness == 2
    for k in (None, 0):
        cfg = TrainConfig(distributed={"rollout_workers": 2, "weight_sync": "broadcast"}, **{"async": {"max_staleness": k}})
        assert cfg.distributed.weight_sync == "broadcast"


def test_an_actor_runs_where_ray_put_it(monkeypatch):
    from rlvr.core import devices
    from rlvr.core.devices import actor_device

    monkeypatch.setattr(devices, "cuda_count", lambda: 8)  # Ray >= 2.60: an actor without GPUs still sees them
    assert actor_device("auto", 0, [], "f") == torch.device("cpu")
    assert actor_device("cuda:3", 0, [], "f") == torch.device("cpu")
    with pytest.raises(RuntimeError, match=r"Ray gave this actor GPU\(s\) \[5\], but torch sees 8"):
        actor_device("auto", 1, [5], "distributed.learner_num_gpus")
    monkeypatch.setattr(devices, "cuda_count", lambda: 1)  # CUDA_VISIBLE_DEVICES=5: Ray's GPU is cuda:0
    assert actor_device("auto", 1, [5], "f") == torch.device("cuda", 0)
    assert actor_device("auto", 0.5, [5], "f") == torch.device("cuda", 0)
    with pytest.raises(RuntimeError, match="no GPU"):
        actor_device("auto", 1, [], "f")
    with pytest.raises(RuntimeError, match="use device=auto"):
        actor_device("cuda:1", 1, [5], "f")


def test_a_learner_that_does_not_see_the_drivers_run_directory_stops(tmp_path, monkeypatch):
    import ray

    from rlvr.distributed.placement import check_shared_run_dir, write_run_token

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.7")
    token = write_run_token(tmp_path)
    check_shared_run_dir(tmp_path, token, "learner rank 1")  # sees it
    with pytest.raises(RuntimeError, match=r"learner rank 1 on node 10.0.0.7 .* missing.*shares"):
        check_shared_run_dir(tmp_path / "elsewhere", token, "learner rank 1")
    with pytest.raises(RuntimeError, match="from another run"):
        check_shared_run_dir(tmp_path, "0" * 16, "learner rank 1")


def test_paths_are_made_absolute_on_the_driver(tmp_path, monkeypatch):
    from rlvr.config import TrainConfig
    from rlvr.distributed.placement import absolute_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "est.py").write_text("from rlvr.algorithms.spec import get_preset\nSPEC = get_preset('grpo')\n")
    (tmp_path / "m").mkdir()
    cfg = absolute_paths(TrainConfig(out="runs/x", model="m", algorithm="est.py:SPEC"))
    assert cfg.out == str(tmp_path / "runs/x") and cfg.model == str(tmp_path / "m")
    assert cfg.algorithm == f"{tmp_path / 'est.py'}:SPEC"
    assert absolute_paths(TrainConfig(model="SmolLM2-135M-Instruct")).model == "SmolLM2-135M-Instruct"


def test_a_role_on_a_node_without_the_drivers_model_directory_stops_naming_it(tmp_path, monkeypatch):
    import ray

    from rlvr.config import TrainConfig
    from rlvr.distributed.placement import check_model_here

    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "10.0.0.7")
    (tmp_path / "m").mkdir()
    check_model_here(TrainConfig(model=str(tmp_path / "m")), "learner rank 1")  # there
    check_model_here(TrainConfig(model="SmolLM2-135M-Instruct"), "learner rank 1")  # a name each node resolves
    with pytest.raises(RuntimeError, match=r"rollout worker 0 on node 10.0.0.7: model=/nfs/x does not exist there"):
        check_model_here(TrainConfig(model="/nfs/x"), "rollout worker 0")


_THREADS_AFTER_CLOSE = r"""
import os, socket, sys, time
import torch
def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
from rlvr.distributed.parallel import init_learner_group
before = threads()
parallel = init_learner_group(0, 1, "127.0.0.1", port, backend="gloo", device="cpu", timeout_s=30)
# a new thread names itself once it runs, which on a busy machine can be after init returns
deadline = time.monotonic() + 30
while not any(name.startswith("pt_gloo") for name in threads()) and time.monotonic() < deadline:
    time.sleep(0.05)
during = threads()
import torch.distributed.nn.functional  # what transformers imports while it builds a model
parallel.close()
print(repr((before, during, threads())))
"""


def test_closing_the_learner_group_frees_its_gloo_threads():
    """The cause of the gloo test's SIGABRT: a group kept alive past destroy_process_group (by default arguments
    bound to group.WORLD in torch.distributed.nn.functional) still has worker threads at interpreter exit. In a
    fresh interpreter, so that the import order is the one a learner process has."""
    import ast
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _THREADS_AFTER_CLOSE], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    before, during, after = ast.literal_eval(out.stdout.strip().splitlines()[-1])
    assert any(name.startswith("pt_gloo") for name in during)  # the probe sees the group's threads at all
    assert after == before, f"threads left after close: {sorted(set(after) - set(before))}"

"""Data-parallel learners on torch.distributed: which rollouts each learner trains, and the sums that make
M learners' update exactly the update one process makes.

Every learner holds the whole scored rollout batch (a few hundred KB of token ids), so every whole-batch
quantity -- the sequence count N, the token count, the constant Z, the group advantages -- is computed from
the same tensors on every rank, exactly as the single process computes it. Each learner then backpropagates
only its shard of the rows; the per-row losses are already divided by the global normalisers, so the sum of
the M local gradients is the single process's gradient. `all_reduce_gradients` forms that sum (SUM, not
DDP's mean), after which the clipped norm and the AdamW step are the same on every rank and the replicas
never drift apart.

Why not wrap the model in DistributedDataParallel: pruning leaves ranks with different numbers of
microbatches (a rank may have none at all), and DDP's gradient hooks need every rank to run the same number
of synchronising backward passes. One bucketed all-reduce after the local backward passes is what DDP does
minus the overlap, and it cannot hang on an uneven shard.
"""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist

_BUCKET_BYTES = 64 << 20


class DataParallel:
    """This process's place in a data-parallel learner group (torch.distributed must be initialised)."""

    def __init__(self, group=None):
        if not dist.is_initialized():
            raise RuntimeError("DataParallel needs torch.distributed.init_process_group first (see init_learner_group)")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)

    def shard(self, rows: list[int], input_ids: torch.Tensor, response_mask: torch.Tensor) -> list[int]:
        """This rank's rows out of `rows`: the rows of one prompt stay together (its prefix runs once), and
        prompts go to the least-loaded rank by response tokens, largest first. Deterministic, so every rank
        computes the same partition from the same batch."""
        return shard_rows(rows, input_ids, response_mask, self.world_size)[self.rank]

    def all_reduce_(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group)
        return tensor

    def sum_floats(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        return self.all_reduce_(t).tolist()

    def max_floats(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return t.tolist()

    @torch.no_grad()
    def all_reduce_gradients(self, params: list[torch.Tensor]) -> None:
        """Sum every parameter's gradient over the group, in buckets of one dtype (a rank that trained no
        row contributes zeros)."""
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        size = 0
        for p in params:
            if bucket and (p.grad.dtype != bucket[0].grad.dtype or size + p.grad.nbytes > _BUCKET_BYTES):
                self._reduce_bucket(bucket)
                bucket, size = [], 0
            bucket.append(p)
            size += p.grad.nbytes
        if bucket:
            self._reduce_bucket(bucket)

    def _reduce_bucket(self, bucket: list[torch.Tensor]) -> None:
        flat = torch.cat([p.grad.reshape(-1) for p in bucket])
        self.all_reduce_(flat)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def broadcast_module_(self, module: torch.nn.Module, src: int = 0) -> None:
        """Make every rank's parameters and buffers rank `src`'s (after loading, before the first step)."""
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=src, group=self.group)


def shard_rows(rows: list[int], input_ids: torch.Tensor, response_mask: torch.Tensor, world_size: int) -> list[list[int]]:
    """`rows` split into `world_size` shards (see DataParallel.shard); each shard keeps the input order."""
    starts = response_mask.long().argmax(dim=1)
    tokens = response_mask.long().sum(dim=1)
    prompts: dict[tuple, list[int]] = {}
    for r in rows:
        prompts.setdefault(tuple(input_ids[r, : int(starts[r])].tolist()), []).append(r)
    groups = sorted(prompts.values(), key=lambda g: (-int(tokens[g].sum()), g[0]))
    load = [0] * world_size
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for g in groups:
        rank = min(range(world_size), key=lambda k: (load[k], k))
        shards[rank].extend(g)
        load[rank] += int(tokens[g].sum())
    return [sorted(s) for s in shards]


def init_learner_group(rank: int, world_size: int, master_addr: str, master_port: int, backend: str = "auto",
                       timeout_s: float = 600.0) -> DataParallel:
    """Join the learners' process group (gloo on CPU, NCCL on CUDA) and return this rank's DataParallel."""
    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s))
    return DataParallel()


class WeightBroadcast:
    """A process group of its own for weight sync: learner rank 0 is rank 0, the rollout workers 1..N. It is
    built from its own TCP store, apart from the learners' default group, so the learners keep theirs (the
    pattern RL frameworks use to push weights into inference engines). Gloo on CPU, NCCL on GPU."""

    def __init__(self, host: str, port: int, rank: int, size: int, backend: str = "auto", timeout_s: float = 600.0):
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore("rlvr-weights", dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout))
        if backend == "nccl":
            self.group = dist.ProcessGroupNCCL(store, rank, size)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.rank = rank

    @torch.no_grad()
    def broadcast_(self, tensors: list[torch.Tensor]) -> None:
        """Rank 0's `tensors` into every other rank's (same shapes and dtypes, same order), a bucket per dtype."""
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for t in tensors:
            by_dtype.setdefault(t.dtype, []).append(t)
        for group in by_dtype.values():
            flat = (torch.cat([t.reshape(-1) for t in group]) if self.rank == 0 else
                    torch.empty(sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device))
            self.group.broadcast(flat, 0).wait()
            if self.rank != 0:
                offset = 0
                for t in group:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()

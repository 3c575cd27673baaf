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

# Imported before any group exists, on purpose: torch.distributed.nn.functional binds `group=group.WORLD` as
# default arguments when it is first imported, and transformers imports it while a model is built. Imported
# after init_process_group, those defaults hold the default group, and its gloo worker threads, past
# destroy_process_group until the interpreter exits, where a worker still freeing a tensor takes the GIL
# during finalisation and the process aborts ("terminate called without an active exception": test_parallel's
# flake, 1 run in 60). Imported first, the defaults hold the unset WORLD (None).
import torch.distributed.nn  # noqa: F401

_BUCKET_BYTES = 64 << 20


class Group:
    """A process group, its backend and the one device its tensors live on. Every collective rlvr makes goes
    through here, and a tensor on another device is refused with the op's name, before the backend sees it:
    NCCL carries only CUDA tensors ("No backend type associated with device type cpu"), and a group whose
    ranks disagree on the device hangs instead of failing. `pg` is None for the default (world) group."""

    def __init__(self, backend: str, device, timeout_s: float, pg=None):
        self.backend, self.device, self.timeout_s, self.pg = backend, torch.device(device), timeout_s, pg
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"an NCCL group carries CUDA tensors; this one was declared on {self.device}")

    def check(self, tensor: torch.Tensor, op: str) -> torch.Tensor:
        if tensor.device != self.device:
            raise ValueError(f"{op}: a tensor on {tensor.device} sent to a {self.backend} group on {self.device}")
        return tensor

    def rank(self) -> int:
        return self.pg.rank() if self.pg is not None else dist.get_rank()

    def size(self) -> int:
        return self.pg.size() if self.pg is not None else dist.get_world_size()

    def all_reduce(self, tensor: torch.Tensor, op=dist.ReduceOp.SUM) -> torch.Tensor:
        self.check(tensor, "all_reduce")
        if self.pg is None:
            dist.all_reduce(tensor, op=op)
        else:
            options = dist.AllreduceOptions()
            options.reduceOp = op
            self.pg.allreduce([tensor], options).wait()
        return tensor

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> torch.Tensor:
        self.check(tensor, "broadcast")
        if self.pg is None:
            dist.broadcast(tensor, src=src)
        else:
            self.pg.broadcast(tensor, src).wait()
        return tensor

    def close(self) -> None:
        """Leave the group once every rank has reached here (a rank that tears its connections down while a peer
        is still in its last collective fails the peer's), and free it (the comment on this module's
        `import torch.distributed.nn` says what used to keep the default group alive past destroy_process_group)."""
        if self.pg is None:
            if dist.is_initialized():
                dist.barrier()
                dist.destroy_process_group()
        else:
            self.all_reduce(torch.zeros(1, device=self.device))  # a barrier on this group
            self.pg = None


class DataParallel:
    """This process's place in a data-parallel learner group (see `init_learner_group`)."""

    def __init__(self, group: Group):
        self.group = group
        self.device = group.device
        self.rank = group.rank()
        self.world_size = group.size()

    def shard(self, rows: list[int], input_ids: torch.Tensor, response_mask: torch.Tensor) -> list[int]:
        """This rank's rows out of `rows`: the rows of one prompt stay together (its prefix runs once), and
        prompts go to the least-loaded rank by response tokens, largest first. Deterministic, so every rank
        computes the same partition from the same batch."""
        return shard_rows(rows, input_ids, response_mask, self.world_size)[self.rank]

    def sum_floats(self, values: list[float]) -> list[float]:
        """One all-reduce of a few statistics, on the group's device (float64: exact sums of counts)."""
        return self.group.all_reduce(torch.tensor(values, dtype=torch.float64, device=self.device)).tolist()

    def max_floats(self, values: list[float]) -> list[float]:
        return self.group.all_reduce(torch.tensor(values, dtype=torch.float64, device=self.device),
                                     dist.ReduceOp.MAX).tolist()

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
        self.group.all_reduce(flat)
        offset = 0
        for p in bucket:
            n = p.grad.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p.grad))
            offset += n

    def broadcast_module_(self, module: torch.nn.Module, src: int = 0) -> None:
        """Make every rank's parameters and buffers rank `src`'s (after loading, before the first step)."""
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                self.group.broadcast(t.data, src=src)

    def same_on_every_rank(self, what: str, value: float) -> None:
        """Stop with an error when ranks disagree on `value` (e.g. the checkpoint step each resumed from)."""
        low, high = self.max_floats([-float(value), float(value)])
        if -low != high:
            raise RuntimeError(f"learner rank {self.rank}: {what} is {value:g} here, but the learners disagree "
                               f"(from {-low:g} to {high:g}); every learner must see the same run directory")

    def close(self) -> None:
        self.group.close()


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


def init_learner_group(rank: int, world_size: int, master_addr: str, master_port: int, backend: str,
                       device, timeout_s: float = 600.0) -> DataParallel:
    """Join the learners' process group (the default group of this process) on `backend`, decided by the
    caller for every rank at once (rlvr.config.choose_backend), with `device` the device this rank's gradients live on."""
    device = torch.device(device)
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                            world_size=world_size, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return DataParallel(Group(backend, device, timeout_s))


def agreed_dtype(dtypes: list[str]) -> str:
    """The one dtype every rollout engine holds its weights in for a weight broadcast: theirs when they agree,
    else float32 (a node without native kernels for a reduced precision runs float32, devices.native_dtype;
    casting the others up costs nothing that matters, and one collective then carries one layout)."""
    return dtypes[0] if len(set(dtypes)) == 1 else "float32"


def check_same_layout(sent: dict, held: dict, sender: str, receiver: str) -> None:
    """Stop before the first broadcast when `receiver` would not receive what `sender` sends: a layout is
    {"node": address, "tensors": [[name, shape, dtype], ...]} in the order sent. A mismatch would otherwise
    hang the collective or copy bytes of one tensor into another (WeightBroadcast buckets by dtype)."""
    held_by_name = {name: (list(shape), dtype) for name, shape, dtype in held["tensors"]}
    for name, shape, dtype in sent["tensors"]:
        there = held_by_name.get(name)
        if there != (list(shape), dtype):
            what = "has no such tensor" if there is None else f"holds it as {there[1]} {tuple(there[0])}"
            raise RuntimeError(f"weight broadcast: {sender} (node {sent['node']}) sends {name!r} as {dtype} "
                               f"{tuple(shape)}, but {receiver} (node {held['node']}) {what}; every rollout engine "
                               "must hold the learner's model in one dtype (distributed.weight_sync=object_store "
                               "casts on each worker instead)")


class WeightBroadcast:
    """A process group of its own for weight sync: learner rank 0 is rank 0, the rollout workers 1..N. It is
    built from its own TCP store, apart from the learners' default group, so the learners keep theirs (the
    pattern RL frameworks use to push weights into inference engines). The tensors go from the device they
    live on (the learner's GPU) to the devices they are received into (each worker's), with no CPU trip; the
    backend is decided once for every rank (rlvr.config.choose_backend) and passed in."""

    def __init__(self, host: str, port: int, rank: int, size: int, backend: str, device, timeout_s: float = 600.0):
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.PrefixStore("rlvr-weights", dist.TCPStore(host, port, size, is_master=rank == 0, timeout=timeout))
        if backend == "nccl":
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = timeout
            pg = dist.ProcessGroupNCCL(store, rank, size, options)
        else:
            pg = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.group = Group(backend, device, timeout_s, pg)
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
            self.group.broadcast(flat, 0)
            if self.rank != 0:
                offset = 0
                for t in group:
                    t.copy_(flat[offset : offset + t.numel()].view_as(t))
                    offset += t.numel()

    def close(self) -> None:
        self.group.close()

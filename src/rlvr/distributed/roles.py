"""The Ray roles of a distributed run (see rlvr.distributed.driver): rollout workers (an engine each, worker 0
also validates) and data-parallel learners (the policy, its optimizer, the KL reference), plain classes made
actors by `Roles`, which starts them and waits on every call with a timeout and a name. Importing this module
does not need Ray.
"""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

import torch

from rlvr import stages
from rlvr.config import TrainConfig
from rlvr.core import checkpoint as ckpt
from rlvr.core.devices import actor_device, native_dtype, resolve_placement
from rlvr.distributed.parallel import agreed_dtype, check_same_layout
from rlvr.distributed.placement import (
    RoleFailed,
    actor_environment,
    check_feasible,
    check_model_here,
    check_shared_run_dir,
)
from rlvr.tasks.records import DataOrder
from rlvr.tasks.task import task_prompt

log = logging.getLogger(__name__)


def _threads(num_cpus: float) -> None:
    torch.set_num_threads(max(1, int(num_cpus)))


def _actor_device(cfg: TrainConfig, num_gpus: float, field: str) -> torch.device:
    import ray

    return actor_device(cfg.device, num_gpus, ray.get_gpu_ids() if num_gpus > 0 else [], field)


def _layout(tensors: dict[str, torch.Tensor]) -> dict:
    """What a weight broadcast carries, in order, and from or to which node (parallel.check_same_layout)."""
    import ray

    return {"node": ray.util.get_node_ip_address(),
            "tensors": [[name, list(t.shape), str(t.dtype).removeprefix("torch.")] for name, t in tensors.items()]}


class RolloutWorker:
    """A rollout engine in its own process; also the evaluator (worker 0 validates)."""

    def __init__(self, cfg: dict, index: int):
        from rlvr.core.models import load_model
        from rlvr.engines.hf import HFEngine

        self.cfg = TrainConfig.model_validate(cfg)
        check_model_here(self.cfg, f"rollout worker {index}")
        _threads(self.cfg.distributed.rollout_num_cpus)
        self.device = device = _actor_device(self.cfg, self.cfg.distributed.rollout_num_gpus,
                                             "distributed.rollout_num_gpus")
        self.dtype = native_dtype(self.cfg.generation_dtype, device)  # loaded in it: no fp32 copy beside the engine's
        model, self.tokenizer = load_model(self.cfg.model, dtype=self.dtype, device=device)
        self.engine = HFEngine(model, self.tokenizer, batch_size=self.cfg.generation_batch_size, dtype=self.dtype,
                               prefix_cache_mib=self.cfg.env_cache_mib)
        self.index, self.version = index, -1

    def weight_layout(self) -> dict:
        """The engine's dtype and the tensors a weight broadcast writes into (Roles agrees on one dtype)."""
        return {"dtype": self.dtype, **_layout(self.engine.named_tensors())}

    def use_dtype(self, dtype: str) -> None:
        """Hold the engine's weights in `dtype`, the one the driver agreed on for a weight broadcast because the
        workers' nodes differ in native support (only ever float32: a cast up, before the first push
        overwrites the weights anyway)."""
        from rlvr.engines.hf import HFEngine

        if dtype != self.dtype:
            model = self.engine.model.to(getattr(torch, dtype))
            self.engine = HFEngine(model, self.tokenizer, batch_size=self.cfg.generation_batch_size, dtype=dtype,
                                   prefix_cache_mib=self.cfg.env_cache_mib)
            self.dtype = dtype

    def set_weights(self, weights: dict, version: int) -> int:
        self.engine.load_weights(weights)
        self.version = version
        return version

    def join_weight_group(self, host: str, port: int, names: list[str]) -> None:
        """distributed.weight_sync=broadcast: rank index + 1 of the weight group; receive straight into the
        engine's tensors, in `names` order (learner rank 0's)."""
        from rlvr.distributed.parallel import WeightBroadcast

        d = self.cfg.distributed
        self.weight_group = WeightBroadcast(host, port, self.index + 1, d.rollout_workers + 1, d.weight_backend,
                                            self.device, d.timeout_s)
        tensors = self.engine.named_tensors()
        self.receive_into = [tensors[name] for name in names]

    def receive_weights(self, version: int) -> int:
        self.weight_group.broadcast_(self.receive_into)
        self.version = version
        return version

    def generate(self, prompts: list[str], sampling) -> tuple[list, int]:
        """(completions, the policy version that produced them)."""
        return self.engine.generate(prompts, sampling), self.version

    def validate(self, examples: list) -> dict:
        metrics, _ = stages.validate(self.engine, self.engine.model, examples, task_prompt(self.cfg),
                                     self.tokenizer, self.cfg)
        return metrics


class Learner:
    """One data-parallel learner: the trainable policy, its optimizer and schedule, the KL reference."""

    def __init__(self, cfg: dict, rank: int, world_size: int):
        self.cfg = TrainConfig.model_validate(cfg)
        self.rank, self.world_size, self.parallel = rank, world_size, None
        _threads(self.cfg.distributed.learner_num_cpus)

    def rendezvous(self) -> tuple[str, int]:
        """Rank 0's address and a free port for the process group."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            return ray.util.get_node_ip_address(), s.getsockname()[1]

    def setup(self, master_addr: str, master_port: int, run_token: str = "") -> dict | None:
        """Join the group, load the policy (from the last checkpoint when resuming); returns the checkpoint's
        loop state (step, data position, monitor) or None. `run_token`: what the driver wrote into the run
        directory, which this learner must see (a shared filesystem)."""
        cfg = self.cfg
        check_shared_run_dir(Path(cfg.out), run_token, f"learner rank {self.rank}")
        check_model_here(cfg, f"learner rank {self.rank}")
        self.device = device = _actor_device(cfg, cfg.distributed.learner_num_gpus, "distributed.learner_num_gpus")
        if self.world_size > 1:
            from rlvr.distributed.parallel import init_learner_group

            self.parallel = init_learner_group(self.rank, self.world_size, master_addr, master_port,
                                               cfg.distributed.learner_backend, device, cfg.distributed.timeout_s)
        ckpt.seed_everything(cfg.seed)
        self.run_dir = Path(cfg.out)
        self.cfg = cfg = stages.native_precision(cfg, resolve_placement(str(device)))
        self.model, self.tokenizer, state = stages.load_policy(cfg, self.run_dir, [device])
        if self.parallel is not None:  # identical replicas, whatever the loading did (LoRA's random init)
            self.parallel.broadcast_module_(self.model)
        self.spec = cfg.estimator
        total = cfg.steps * self.spec.steps_per_rollout
        self.optimizer, self.scheduler = stages.build_optimizer(self.model, cfg, total)
        self.reference = stages.reference_model(cfg, device)
        stages.restore(state, self.optimizer, self.scheduler, DataOrder(1, "learner"))
        if self.parallel is not None:  # a rank that found another (or no) checkpoint would drift with no error
            self.parallel.same_on_every_rank("the checkpoint step it resumed from", state["step"] if state else 0)
        if state is None:
            return None
        return {**{k: state[k] for k in ("step", "epoch", "position", "monitor")}, "driver": state.get("driver", {})}

    def train(self, batch, step: int) -> dict:
        times: dict[str, float] = {}
        updates = stages.train_on_rollouts(self.model, self.optimizer, self.scheduler, self.reference, batch, self.spec,
                                    self.cfg, step, times, parallel=self.parallel)
        return {"updates": updates, "lr": self.scheduler.get_last_lr()[0], "times": times}

    def weights(self, dtype: str | None = None) -> dict:
        """The policy's weights for the engines, parameters in `dtype` (the driver's: the one the workers' engines
        hold; default this learner's own generation_dtype)."""
        from rlvr.engines.weights import engine_weights

        return engine_weights(self.model, dtype or self.cfg.generation_dtype)

    def weight_layout(self, dtype: str) -> dict:
        """What the weight broadcast sends, in the order it sends it."""
        return _layout(self.weights(dtype))

    def join_weight_group(self, host: str, port: int) -> None:
        """Rank 0 of the weight-broadcast group (see RolloutWorker.join_weight_group)."""
        from rlvr.distributed.parallel import WeightBroadcast

        d = self.cfg.distributed
        self.weight_group = WeightBroadcast(host, port, 0, d.rollout_workers + 1, d.weight_backend, self.device,
                                            d.timeout_s)

    def broadcast_weights(self, dtype: str) -> None:
        from rlvr.engines.weights import engine_weights

        # from the device the policy lives on: no GPU -> CPU -> GPU trip
        self.weight_group.broadcast_(list(engine_weights(self.model, dtype, self.device).values()))

    def save_checkpoint(self, step: int, order: DataOrder, monitor: dict, driver: dict | None = None) -> str:
        """`driver`: the driver loop's own state (async mode: the batches in flight, re-queued on resume)."""
        state = stages.trainer_state(self.optimizer, self.scheduler, order, monitor=monitor, driver=driver or {})
        return str(ckpt.save_checkpoint(self.run_dir, step, self.model, self.tokenizer, state,
                                        keep=self.cfg.keep_checkpoints))

    def save_final(self, summary: dict) -> str:
        return str(ckpt.save_final(self.run_dir, self.model, self.tokenizer, summary))

    def close(self) -> None:
        if self.parallel is not None:
            self.parallel.close()


class Roles:
    """The run's actors, and every wait on them with a timeout and a name."""

    def __init__(self, cfg: TrainConfig):
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        d = cfg.distributed
        check_feasible(cfg, ray.nodes())
        runtime_env, payload = actor_environment(cfg)  # rlvr's code and the user's files, wherever Ray came from
        worker_cls = ray.remote(num_cpus=d.rollout_num_cpus, num_gpus=d.rollout_num_gpus)(RolloutWorker)
        learner_cls = ray.remote(num_cpus=d.learner_num_cpus, num_gpus=d.learner_num_gpus)(Learner)
        self.cfg, self.run_dir = cfg, Path(cfg.out)
        # the learners' resources reserved together, on one node where they fit (their all-reduce is the
        # step's critical path); a request the cluster can hold but not now waits ready_timeout_s, no longer
        bundle = {"CPU": d.learner_num_cpus, **({"GPU": d.learner_num_gpus} if d.learner_num_gpus else {})}
        self.group = placement_group([bundle] * d.learners, strategy="PACK")
        try:
            ray.get(self.group.ready(), timeout=d.ready_timeout_s)
        except GetTimeoutError:
            ray.util.remove_placement_group(self.group)
            raise RoleFailed(f"the cluster could not place {d.learners} learners x {bundle} within "
                             f"distributed.ready_timeout_s={d.ready_timeout_s:g} s (available now: "
                             f"{ray.available_resources()}); free resources or ask for fewer") from None
        self.workers = [worker_cls.options(runtime_env=runtime_env).remote(payload, i)
                        for i in range(d.rollout_workers)]
        self.learners = [learner_cls.options(runtime_env=runtime_env, scheduling_strategy=
                                             PlacementGroupSchedulingStrategy(placement_group=self.group,
                                                                              placement_group_bundle_index=r))
                         .remote(payload, r, d.learners) for r in range(d.learners)]
        self.names = {**{w: f"rollout worker {i}" for i, w in enumerate(self.workers)},
                      **{a: f"learner rank {r}" for r, a in enumerate(self.learners)}}
        self.pushes: list[tuple] = []  # weight pushes not yet collected: (ref, actor, version, time sent)
        self.weight_dtype = cfg.generation_dtype  # the engines' own, once setup_learners has asked them

    def wait(self, refs: list, actors: list, what: str) -> list:
        """ray.get with the run's timeout; a failure names the role, what it was doing and the checkpoint."""
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        try:
            return ray.get(refs, timeout=self.cfg.distributed.timeout_s)
        except GetTimeoutError:
            raise RoleFailed(f"no answer after {self.cfg.distributed.timeout_s:.0f} s from "
                             f"{', '.join(self.names[a] for a in actors)} ({what}); {self._resume_hint()}") from None
        except RayActorError as err:
            who = self._dead(actors) or ", ".join(self.names[a] for a in actors)
            raise RoleFailed(f"{who} died ({what}): {str(err).splitlines()[0]}; {self._resume_hint()}") from None
        except RayTaskError as err:
            who = ", ".join(self.names[a] for a in actors)
            raise RoleFailed(f"{who} raised ({what}): {err.cause!r}; {self._resume_hint()}") from err.cause

    def _dead(self, actors: list) -> str:
        import ray

        dead = []
        for a in actors:
            try:
                ray.get(a.__ray_ready__.remote(), timeout=5)
            except Exception:  # noqa: BLE001 -- any failure to answer marks it
                dead.append(self.names[a])
        return ", ".join(dead)

    def _resume_hint(self) -> str:
        last = ckpt.latest_checkpoint(self.run_dir)
        return (f"last checkpoint {last}: continue with resume=true" if last is not None else
                "no checkpoint yet (save_every): resume=true starts from the beginning")

    def setup_learners(self, run_token: str = "") -> dict | None:
        addr, port = self.wait([self.learners[0].rendezvous.remote()], self.learners[:1], "choosing a port")[0]
        states = self.wait([a.setup.remote(addr, port, run_token) for a in self.learners], self.learners,
                           "joining the process group and loading the policy")
        self.wait([w.__ray_ready__.remote() for w in self.workers], self.workers, "loading the model")
        layouts = self._agree_weight_dtype()
        if self.cfg.distributed.weight_sync == "broadcast":
            host, port = self.wait([self.learners[0].rendezvous.remote()], self.learners[:1], "choosing a port")[0]
            sent = self.wait([self.learners[0].weight_layout.remote(self.weight_dtype)], self.learners[:1],
                             "listing the weights")[0]
            for worker, held in zip(self.workers, layouts):
                check_same_layout(sent, held, "learner rank 0", self.names[worker])
            names = [name for name, _, _ in sent["tensors"]]
            self.wait([self.learners[0].join_weight_group.remote(host, port),
                       *[w.join_weight_group.remote(host, port, names) for w in self.workers]],
                      self.learners[:1] + self.workers, "forming the weight-broadcast group")
        return states[0]

    def _agree_weight_dtype(self) -> list[dict]:
        """Each worker's engine chose its dtype on its own node (float32 where bf16 would be emulated): the
        learner sends the one they hold, and for a broadcast, which needs one layout on every rank, workers that
        differ all hold float32 (parallel.agreed_dtype). Returns the workers' layouts."""
        layouts = self.wait([w.weight_layout.remote() for w in self.workers], self.workers, "listing the weights")
        self.weight_dtype = agreed_dtype([lay["dtype"] for lay in layouts])
        moved = [w for w, lay in zip(self.workers, layouts) if lay["dtype"] != self.weight_dtype]
        if moved and self.cfg.distributed.weight_sync == "broadcast":
            log.warning("the rollout workers' nodes differ in native %s (%s): every engine holds %s, so that one "
                        "broadcast carries the weights", self.cfg.generation_dtype,
                        ", ".join(f"{self.names[w]}: {lay['dtype']}" for w, lay in zip(self.workers, layouts)),
                        self.weight_dtype)
            self.wait([w.use_dtype.remote(self.weight_dtype) for w in moved], moved, "changing the engine's dtype")
            layouts = self.wait([w.weight_layout.remote() for w in self.workers], self.workers, "listing the weights")
        return layouts

    def push_weights(self, version: int) -> None:
        """Learner rank 0's weights to every worker; each applies them before its next generate (Ray runs an
        actor's calls in order). object_store: one put, one read per worker; broadcast: one collective.
        The push is not waited for here (async mode overlaps it with generation): `check_pushes` collects it."""
        if self.cfg.distributed.weight_sync == "broadcast":
            refs = [self.learners[0].broadcast_weights.remote(self.weight_dtype),
                    *[w.receive_weights.remote(version) for w in self.workers]]
            actors = self.learners[:1] + self.workers
        else:
            weights = self.learners[0].weights.remote(self.weight_dtype)
            refs, actors = [w.set_weights.remote(weights, version) for w in self.workers], list(self.workers)
        self.pushes.extend((ref, actor, version, time.monotonic()) for ref, actor in zip(refs, actors))

    def check_pushes(self, wait: bool = False) -> None:
        """Raise the error of any weight push that failed (a worker left on old weights would make only batches
        too stale to train, and the run would never end), and stop when one has not finished `timeout_s` after
        it was sent. `wait`: wait for all of them (synchronous mode)."""
        import ray

        if wait:
            for ref, actor, version, _ in self.pushes:
                self.wait([ref], [actor], f"sending the step-{version} weights")
            self.pushes.clear()
            return
        refs = [p[0] for p in self.pushes]
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) if refs else set()
        for ref, actor, version, sent in list(self.pushes):
            if ref in done:
                self.wait([ref], [actor], f"sending the step-{version} weights")  # raises its error, if any
                self.pushes.remove((ref, actor, version, sent))
            elif time.monotonic() - sent > self.cfg.distributed.timeout_s:
                raise RoleFailed(f"{self.names[actor]} has not applied the step-{version} weights "
                                 f"{self.cfg.distributed.timeout_s:.0f} s after they were sent; {self._resume_hint()}")

    def train(self, batch, step: int) -> dict:
        refs = [a.train.remote(batch, step) for a in self.learners]
        return self.wait(refs, self.learners, f"training step {step}")[0]  # every rank reports the same

    def validate(self, examples: list, step: int) -> dict:
        return self.wait([self.workers[0].validate.remote(examples)], self.workers[:1], f"validating step {step}")[0]

    def close(self) -> None:
        import ray

        try:
            ray.get([a.close.remote() for a in self.learners], timeout=30)
        except Exception:  # noqa: BLE001 -- closing after a failure must not hide it
            pass
        for actor in self.workers + self.learners:
            ray.kill(actor)
        ray.util.remove_placement_group(self.group)

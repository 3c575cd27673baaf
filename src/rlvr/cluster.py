"""`rlvr train distributed.*`: the RL loop with its roles as Ray actors (seed 000's role split; seed 003's
synchronous vs asynchronous RL).

    driver (this process)   the loop of rl.py: data order, prompts, rewards, advantages, metrics, the monitor
    RolloutWorker x N       an HFEngine each; generates with the newest weights it was sent
    Learner x M             one torch.distributed group (its backend decided once for all ranks by
                            rlvr.config.choose_backend): policy, optimizer, reference;
                            each trains its shard of the batch and the gradients are summed (rlvr.parallel), so
                            M learners make the one-process update
    weights                 learner rank 0 -> one object in Ray's store -> every worker reads it (any node), or
                            one torch.distributed broadcast (weight_sync=broadcast: NCCL on GPUs); each rollout
                            carries the policy version that produced it

Synchronous mode (default) is the local loop's step: the rollout batch is split over the workers, every row is
a function of (seed, step, question, sample index) as in the local engine, the learners train, the new weights
reach every worker before the next generate (Ray runs an actor's calls in the order they were sent).

Asynchronous mode (async.max_staleness=K >= 1): workers generate the next batches with the weights they have
while the learners train. A batch is submitted only when it will be trained at most K versions after the
weights it is generated with (batches in flight + the one training <= K), and a batch older than K when its turn
comes (batches finishing out of order) is dropped and counted. Weight pushes are not waited for, but each
step collects the finished ones and raises a failed push's error (or one not applied within timeout_s): a
worker left on old weights would make only batches too stale to train. The batches in flight when a checkpoint
is written are part of it, and a resumed run generates them again before drawing new questions
(async/requeued_batches), so no question is skipped. As in every mode, pi_old is the learner's policy
before the batch's first update (decoupled PPO) and the workers' sampling log-probs enter through
rollout_correction.* (truncated or masked importance sampling of pi_old / mu).

Every wait has a timeout (distributed.timeout_s) and names what it waits for; a dead actor stops the run with
an error naming the role and the last checkpoint, from which resume=true continues (exactly, in synchronous
mode). Checkpoints are written by learner rank 0, metrics by the driver, each once.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import socket
import time
from pathlib import Path

import torch

from rlvr import checkpoint as ckpt
from rlvr import rl
from rlvr.config import TrainConfig
from rlvr.data import DataOrder, load_split
from rlvr.devices import actor_device, native_dtype, resolve_placement
from rlvr.loop_common import (StopRequests, build_optimizer, load_policy, native_precision, open_logger, restore,
                              start_run, trainer_state, validate)
from rlvr.prompts import get_prompt
from rlvr.rl import (Rollouts, RunMonitor, _reference_model, _step_metrics, _timed, log_step, next_questions,
                     rollout_sampling, score_rollouts, train_on_rollouts, validation_due)

log = logging.getLogger(__name__)


class RoleFailed(RuntimeError):
    """A Ray role died, raised, or did not answer in time; the message names it and the last checkpoint."""


# ----------------------------------------------------------------------------------------------------
# The roles. Plain classes, made Ray actors by `Roles` (importing this module does not need Ray).


def _threads(num_cpus: float) -> None:
    torch.set_num_threads(max(1, int(num_cpus)))


def _actor_device(cfg: TrainConfig, num_gpus: float, field: str) -> torch.device:
    import ray

    return actor_device(cfg.device, num_gpus, ray.get_gpu_ids() if num_gpus > 0 else [], field)


class RolloutWorker:
    """A rollout engine in its own process; also the evaluator (worker 0 validates)."""

    def __init__(self, cfg: dict, index: int):
        from rlvr.hf_engine import HFEngine
        from rlvr.models import load_model

        self.cfg = TrainConfig.model_validate(cfg)
        check_model_here(self.cfg, f"rollout worker {index}")
        _threads(self.cfg.distributed.rollout_num_cpus)
        self.device = device = _actor_device(self.cfg, self.cfg.distributed.rollout_num_gpus, "distributed.rollout_num_gpus")
        dtype = native_dtype(self.cfg.generation_dtype, device)  # loaded in it: no fp32 copy beside the engine's
        model, self.tokenizer = load_model(self.cfg.model, dtype=dtype, device=device)
        self.engine = HFEngine(model, self.tokenizer, batch_size=self.cfg.generation_batch_size, dtype=dtype)
        self.index, self.version = index, -1

    def set_weights(self, weights: dict, version: int) -> int:
        self.engine.load_weights(weights)
        self.version = version
        return version

    def join_weight_group(self, host: str, port: int, names: list[str]) -> None:
        """distributed.weight_sync=broadcast: rank index + 1 of the weight group; receive straight into the
        engine's tensors, in `names` order (learner rank 0's)."""
        from rlvr.parallel import WeightBroadcast

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
        metrics, _ = validate(self.engine, self.engine.model, examples, get_prompt(self.cfg.prompt), self.tokenizer,
                              self.cfg)
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
            from rlvr.parallel import init_learner_group

            self.parallel = init_learner_group(self.rank, self.world_size, master_addr, master_port,
                                               cfg.distributed.learner_backend, device, cfg.distributed.timeout_s)
        ckpt.seed_everything(cfg.seed)
        self.run_dir = Path(cfg.out)
        self.cfg = cfg = native_precision(cfg, resolve_placement(str(device)))
        self.model, self.tokenizer, state = load_policy(cfg, self.run_dir, [device])
        if self.parallel is not None:  # identical replicas, whatever the loading did (LoRA's random init)
            self.parallel.broadcast_module_(self.model)
        self.spec = cfg.estimator
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg, cfg.steps * self.spec.steps_per_rollout)
        self.reference = _reference_model(cfg, device)
        restore(state, self.optimizer, self.scheduler, DataOrder(1, "learner"))
        if self.parallel is not None:  # a rank that found another (or no) checkpoint would drift with no error
            self.parallel.same_on_every_rank("the checkpoint step it resumed from", state["step"] if state else 0)
        if state is None:
            return None
        return {**{k: state[k] for k in ("step", "epoch", "position", "monitor")}, "driver": state.get("driver", {})}

    def train(self, batch, step: int) -> dict:
        times: dict[str, float] = {}
        updates = train_on_rollouts(self.model, self.optimizer, self.scheduler, self.reference, batch, self.spec,
                                    self.cfg, step, times, parallel=self.parallel)
        return {"updates": updates, "lr": self.scheduler.get_last_lr()[0], "times": times}

    def weights(self) -> dict:
        from rlvr.hf_engine import engine_weights

        return engine_weights(self.model, self.cfg.generation_dtype)

    def weight_names(self) -> list[str]:
        """The order the weight broadcast sends tensors in."""
        return list(self.weights())

    def join_weight_group(self, host: str, port: int) -> None:
        """Rank 0 of the weight-broadcast group (see RolloutWorker.join_weight_group)."""
        from rlvr.parallel import WeightBroadcast

        d = self.cfg.distributed
        self.weight_group = WeightBroadcast(host, port, 0, d.rollout_workers + 1, d.weight_backend, self.device,
                                            d.timeout_s)

    def broadcast_weights(self) -> None:
        from rlvr.hf_engine import engine_weights

        # from the device the policy lives on: no GPU -> CPU -> GPU trip
        self.weight_group.broadcast_(list(engine_weights(self.model, self.cfg.generation_dtype, self.device).values()))

    def save_checkpoint(self, step: int, order: DataOrder, monitor: dict, driver: dict | None = None) -> str:
        """`driver`: the driver loop's own state (async mode: the batches in flight, re-queued on resume)."""
        state = trainer_state(self.optimizer, self.scheduler, order, monitor=monitor, driver=driver or {})
        return str(ckpt.save_checkpoint(self.run_dir, step, self.model, self.tokenizer, state,
                                        keep=self.cfg.keep_checkpoints))

    def save_final(self, summary: dict) -> str:
        return str(ckpt.save_final(self.run_dir, self.model, self.tokenizer, summary))

    def close(self) -> None:
        if self.parallel is not None:
            self.parallel.close()


# ----------------------------------------------------------------------------------------------------
# Starting the roles and waiting for them.

_TOKEN = ".rlvr-driver"


def write_run_token(run_dir: Path) -> str:
    """A fresh random token in the run directory, which every learner must read back (check_shared_run_dir)."""
    token = os.urandom(8).hex()
    (run_dir / _TOKEN).write_text(token)
    return token


def check_shared_run_dir(run_dir: Path, token: str, who: str) -> None:
    """Learner 0 writes checkpoints and the final model into `out` and the driver reads them back, and every
    learner resumes from the `latest` checkpoint there: on a cluster without a shared `out`, each node would
    see its own disk. Stop before loading anything when this process does not see the driver's token."""
    if not token:
        return
    try:
        seen = (run_dir / _TOKEN).read_text()
    except OSError:
        seen = None
    if seen != token:
        import ray

        raise RuntimeError(f"{who} on node {ray.util.get_node_ip_address()} does not see the run directory the driver "
                           f"wrote ({run_dir}/{_TOKEN} is {'missing' if seen is None else 'from another run'}):"
                           " `out` must be on a filesystem every node shares")


def check_model_here(cfg: TrainConfig, who: str) -> None:
    """A model the driver found as a local directory (absolute_paths made it absolute) must be on this node
    too: nothing copies gigabytes of weights between nodes, so say so before transformers fails obscurely."""
    for field in ("model", "teacher"):
        value = getattr(cfg, field, None)
        if value and Path(value).is_absolute() and not Path(value).exists():
            import ray

            raise RuntimeError(f"{who} on node {ray.util.get_node_ip_address()}: {field}={value} does not exist "
                               "there; put it on a filesystem every node shares (or name a hub model)")


def absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """`out`, and `model` / `teacher` / a file estimator when they name local paths, made absolute on the driver:
    Ray actors do not start in the driver's directory."""
    update = {"out": str(Path(cfg.out).resolve())}
    for field in ("model", "teacher"):
        value = getattr(cfg, field, None)
        if value and Path(value).exists():
            update[field] = str(Path(value).resolve())
    path, sep, attr = cfg.algorithm.rpartition(":")
    if sep and path.endswith(".py") and Path(path).exists():
        update["algorithm"] = f"{Path(path).resolve()}:{attr}"
    return cfg.model_copy(update=update)


def shipped(cfg: TrainConfig) -> tuple[dict, TrainConfig]:
    """(runtime_env for ray.init, the config the actors get) for a cluster this process joins: nodes other than
    the driver's have neither this checkout nor a user's estimator file, so rlvr's code and the file travel with
    the job (Ray's py_modules, uploaded once), and the actors import the file as the module it ships as."""
    import rlvr

    modules = [str(Path(rlvr.__file__).parent)]
    path, sep, attr = cfg.algorithm.rpartition(":")
    if sep and path.endswith(".py"):
        modules.append(path)
        cfg = cfg.model_copy(update={"algorithm": f"{Path(path).stem}:{attr}"})
    return {"py_modules": modules, "env_vars": {"TOKENIZERS_PARALLELISM": "false"}}, cfg


def check_feasible(cfg: TrainConfig, nodes: list[dict]) -> None:
    """Fail at once, saying what was asked and what the cluster has, when Ray could never place the roles
    (it would otherwise wait for resources that will not come). `nodes`: ray.nodes()."""
    d = cfg.distributed
    alive = [n["Resources"] for n in nodes if n.get("Alive", True)]
    have = {k: sum(r.get(k, 0) for r in alive) for k in ("CPU", "GPU")}
    roles = [("learner", d.learners, {"CPU": d.learner_num_cpus, "GPU": d.learner_num_gpus}),
             ("rollout worker", d.rollout_workers, {"CPU": d.rollout_num_cpus, "GPU": d.rollout_num_gpus})]
    asked = {k: sum(n * r[k] for _, n, r in roles) for k in ("CPU", "GPU")}
    problems = [f"{k}: asked for {asked[k]:g}, the cluster has {have[k]:g}" for k in asked if asked[k] > have[k] + 1e-9]
    for name, n, req in roles:  # every role must fit on some node
        if n and not any(all(r.get(k, 0) + 1e-9 >= v for k, v in req.items()) for r in alive):
            problems.append(f"no node has a {name}'s {req['CPU']:g} CPU + {req['GPU']:g} GPU")
    if problems:
        raise RoleFailed(f"infeasible: {'; '.join(problems)} ({d.learners} learners x {d.learner_num_cpus:g} CPU + "
                         f"{d.learner_num_gpus:g} GPU, {d.rollout_workers} rollout workers x {d.rollout_num_cpus:g} CPU + "
                         f"{d.rollout_num_gpus:g} GPU; distributed.*_num_cpus / *_num_gpus)")


def start_ray(cfg: TrainConfig) -> bool:
    """Join `distributed.address` or start a local Ray with enough CPUs for every role; True if started here."""
    import ray

    d = cfg.distributed
    if ray.is_initialized():
        return False
    if d.address:  # other nodes get rlvr's code and a file estimator from here (shipped)
        ray.init(address=d.address, log_to_driver=True, runtime_env=shipped(cfg)[0])
        return True
    wanted = d.rollout_workers * d.rollout_num_cpus + d.learners * d.learner_num_cpus
    # logical CPUs: in synchronous mode the roles take turns, so a 2-core machine can host 2 workers + 2 learners
    ray.init(num_cpus=max(os.cpu_count() or 1, int(wanted + 0.999)), include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    return True


class Roles:
    """The run's actors, and every wait on them with a timeout and a name."""

    def __init__(self, cfg: TrainConfig):
        import ray
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        d = cfg.distributed
        check_feasible(cfg, ray.nodes())
        payload = (shipped(cfg)[1] if d.address else cfg).model_dump(mode="json", by_alias=True)
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
        self.workers = [worker_cls.remote(payload, i) for i in range(d.rollout_workers)]
        self.learners = [learner_cls.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            placement_group=self.group, placement_group_bundle_index=r)).remote(payload, r, d.learners)
            for r in range(d.learners)]
        self.names = {**{w: f"rollout worker {i}" for i, w in enumerate(self.workers)},
                      **{a: f"learner rank {r}" for r, a in enumerate(self.learners)}}
        self.pushes: list[tuple] = []  # weight pushes not yet collected: (ref, actor, version, time sent)

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
        if self.cfg.distributed.weight_sync == "broadcast":
            host, port = self.wait([self.learners[0].rendezvous.remote()], self.learners[:1], "choosing a port")[0]
            names = self.wait([self.learners[0].weight_names.remote()], self.learners[:1], "listing the weights")[0]
            self.wait([self.learners[0].join_weight_group.remote(host, port),
                       *[w.join_weight_group.remote(host, port, names) for w in self.workers]],
                      self.learners[:1] + self.workers, "forming the weight-broadcast group")
        return states[0]

    def push_weights(self, version: int) -> None:
        """Learner rank 0's weights to every worker; each applies them before its next generate (Ray runs an
        actor's calls in order). object_store: one put, one read per worker; broadcast: one collective.
        The push is not waited for here (async mode overlaps it with generation): `check_pushes` collects it."""
        if self.cfg.distributed.weight_sync == "broadcast":
            refs = [self.learners[0].broadcast_weights.remote(), *[w.receive_weights.remote(version) for w in self.workers]]
            actors = self.learners[:1] + self.workers
        else:
            weights = self.learners[0].weights.remote()
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
        done = set(ray.wait([p[0] for p in self.pushes], num_returns=len(self.pushes), timeout=0)[0]) if self.pushes else set()
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


# ----------------------------------------------------------------------------------------------------
# The driver.


@dataclasses.dataclass
class _InFlight:
    """A rollout batch being generated: its data, the worker, the version of the weights it samples from."""

    index: int  # 1, 2, ...: the batch's place in submission order (its sampling seed)
    ids: list[int]  # the questions' indices in the training split
    questions: list
    prompts: list[str]
    worker: object
    version: int
    ref: object


def train_distributed(cfg: TrainConfig) -> dict:
    """`rlvr train` with distributed.rollout_workers >= 1 or distributed.learners >= 2 (see the module doc)."""
    import ray
    from tqdm import tqdm

    from rlvr.models import load_tokenizer

    if cfg.distributed.rollout_workers < 1:
        raise ValueError("distributed.learners > 1 needs distributed.rollout_workers >= 1 (the learners do not "
                         "generate)")
    cfg = absolute_paths(cfg)
    run_dir = start_run(cfg)
    run_token = write_run_token(run_dir)
    ckpt.seed_everything(cfg.seed)
    prompt, spec = get_prompt(cfg.prompt), cfg.estimator
    train = load_split(cfg, "train", cfg.train_limit)
    val = load_split(cfg, "validation", cfg.eval_limit)
    reward_fn = rl.build_reward_fn(cfg, prompt.reward)
    tokenizer = load_tokenizer(cfg.model)
    started = start_ray(cfg)
    roles = Roles(cfg)
    try:
        state = roles.setup_learners(run_token)
        monitor = RunMonitor(cfg.max_new_tokens)
        order = DataOrder(len(train), f"grpo-{cfg.seed}")
        step = 0
        if state is not None:
            step, order = state["step"], DataOrder(order.n, order.key, state["epoch"], state["position"])
            monitor.load(state["monitor"])
        logger = open_logger(run_dir, cfg, state)
        roles.push_weights(step)
        if step == 0 and cfg.eval_at_start:
            logger.log(0, roles.validate(val, 0))
        loop = _AsyncLoop if cfg.async_.max_staleness else _SyncLoop
        driver = loop(cfg, roles, train, order, prompt, tokenizer, reward_fn, spec, step)
        driver.resume(state.get("driver", {}) if state else {})
        bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.algorithm} (ray)", unit="step")
        metrics: dict = {}

        def save() -> str:  # learner rank 0 writes it; the batches in flight go in with the driver's state
            return roles.wait([roles.learners[0].save_checkpoint.remote(step, order, monitor.state(),
                                                                         driver.checkpoint_state())],
                              roles.learners[:1], f"saving the step-{step} checkpoint")[0]

        with StopRequests() as stop:  # Ctrl-C / SIGTERM: the step in flight finishes, is saved, one line says so
            while step < cfg.steps:
                rollouts, scored, result, times, extra = driver.step()
                step = driver.step_count
                metrics = {**_step_metrics(cfg, rollouts, scored, result["updates"], times, result["lr"]), **extra}
                if validation_due(cfg, step):
                    with _timed(times, "validate"):
                        metrics.update(roles.validate(val, step))
                    metrics["time/validate"] = times["validate"]
                log_step(step, metrics, rollouts, scored, times, monitor, logger, bar, cfg)
                stop.after_step(cfg, run_dir, step, "rlvr train", save, close=(bar.close, logger.close))
        bar.close()
        summary = {"steps": step, "algorithm": cfg.algorithm, **{k: v for k, v in metrics.items() if k.startswith("val/")}}
        final = roles.wait([roles.learners[0].save_final.remote(summary)], roles.learners[:1], "saving the model")[0]
        logger.close()
        return {**summary, "final": final}
    finally:
        roles.close()
        if started:
            ray.shutdown()


class _SyncLoop:
    """One rollout batch split over the workers, trained on the weights that generated it (staleness 0)."""

    def __init__(self, cfg, roles: Roles, train, order, prompt, tokenizer, reward_fn, spec, step: int):
        self.cfg, self.roles, self.train, self.order, self.prompt = cfg, roles, train, order, prompt
        self.tokenizer, self.reward_fn, self.spec, self.step_count = tokenizer, reward_fn, spec, step
        self.idle = self.busy = 0.0  # seconds the learners waited for rollouts / trained and synced

    def resume(self, state: dict) -> None:
        """Synchronous mode keeps nothing between steps beyond the learners' checkpoint."""

    def checkpoint_state(self) -> dict:
        return {}

    def idle_fraction(self) -> dict:
        return {"time/learner_idle_fraction": self.idle / max(self.idle + self.busy, 1e-9)}

    def step(self):
        self.step_count += 1
        step, times = self.step_count, {}
        with _timed(times, "generate"):
            questions, prompts = next_questions(self.train, self.order, self.prompt, self.tokenizer, self.cfg)
            rollouts = self.generate(questions, prompts, step)
        with _timed(times, "score"):
            scored = score_rollouts(rollouts, self.reward_fn, self.spec, self.cfg, self.tokenizer)
        result = self.train_and_sync(scored, step, times)
        self.idle += times["generate"] + times["score"]
        self.busy += times["train"] + times["sync_weights"]
        return rollouts, scored, result, times, {"async/staleness": 0, "async/staleness_optimizer_steps": 0,
                                                 **self.idle_fraction()}

    def generate(self, questions, prompts, step: int) -> Rollouts:
        workers = self.roles.workers
        sampling = rollout_sampling(self.cfg, self.prompt, step)
        bounds = [round(i * len(prompts) / len(workers)) for i in range(len(workers) + 1)]
        refs = [w.generate.remote(prompts[a:b], sampling) for w, a, b in zip(workers, bounds, bounds[1:]) if b > a]
        used = [w for w, a, b in zip(workers, bounds, bounds[1:]) if b > a]
        completions = []
        for (part, _), a in zip(self.roles.wait(refs, used, f"generating step {step}"), bounds):
            for c in part:
                c.prompt_index += a
            completions.extend(part)
        return Rollouts(questions, prompts, completions)

    def train_and_sync(self, scored, step: int, times: dict, wait: bool = True) -> dict:
        """Train step `step`, then send its weights (version `step`) to every worker. `wait=False` (async): the
        batches in flight keep the weights they started with; the submissions queued behind this get the new."""
        with _timed(times, "train"):
            result = self.roles.train(scored.batch, step)
        with _timed(times, "sync_weights"):
            self.roles.push_weights(step)
            self.roles.check_pushes(wait=wait)
        for phase in ("old_logprobs", "reference"):
            if result["times"].get(phase):
                times[phase] = result["times"][phase]
        return result


class _AsyncLoop(_SyncLoop):
    """Bounded-staleness pipelining: batches are generated while the learners train (see the module doc)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_staleness = self.cfg.async_.max_staleness
        self.in_flight: list[_InFlight] = []
        self.submitted = self.step_count  # batch indices continue after a resume
        self.dropped = self.requeued = 0
        self.histogram: collections.Counter = collections.Counter()
        self.requeue: list[tuple[int, list[int]]] = []  # (index, ids) of batches in flight at the checkpoint

    def resume(self, state: dict) -> None:
        """Continue from a checkpoint's driver state: the batches that were in flight when it was written had
        drawn their questions but were not trained; they are generated again (same index, so the same sampling
        seed, with the checkpoint's weights) before any new batch."""
        if not state:
            return
        self.submitted, self.dropped = state["submitted"], state["dropped"]
        self.histogram.update({int(k): v for k, v in state["histogram"].items()})
        self.requeue = [(index, ids) for index, ids in state["in_flight"]]
        self.requeued = state.get("requeued", 0) + len(self.requeue)
        if self.requeue:
            log.info("resume: %d batches that were generating at the checkpoint are generated again",
                     len(self.requeue))

    def checkpoint_state(self) -> dict:
        pending = [[f.index, f.ids] for f in self.in_flight] + [[i, ids] for i, ids in self.requeue]
        return {"submitted": self.submitted, "dropped": self.dropped, "requeued": self.requeued,
                "histogram": {str(k): v for k, v in self.histogram.items()}, "in_flight": sorted(pending)}

    def _fill(self, training: int) -> None:
        """Submit batches while each would be trained at most K versions after the weights it gets (version
        step_count, the steps trained so far): the ones in flight and the one training are trained before it."""
        while len(self.in_flight) + training <= self.max_staleness and (self.requeue or
                                                                         self.submitted < self._last_index()):
            if self.requeue:
                index, ids = self.requeue.pop(0)
            else:
                self.submitted += 1
                index, ids = self.submitted, self.order.take(self.cfg.rollout_batch_size // self.cfg.group_size)
            questions = [self.train[i] for i in ids]
            prompts = [self.prompt.format(q.question, self.tokenizer) for q in questions]
            load = collections.Counter(f.worker for f in self.in_flight)
            worker = min(self.roles.workers, key=lambda w: load[w])
            sampling = rollout_sampling(self.cfg, self.prompt, index)
            self.in_flight.append(_InFlight(index, ids, questions, prompts, worker, self.step_count,
                                            worker.generate.remote(prompts, sampling)))

    def _last_index(self) -> int:
        # dropped batches are replaced, so the run can submit as many as it still needs plus those lost
        return self.cfg.steps + self.dropped

    def _next_ready(self) -> _InFlight:
        import ray

        refs = [f.ref for f in self.in_flight]
        ready, _ = ray.wait(refs, num_returns=1, timeout=self.cfg.distributed.timeout_s)
        if not ready:
            self.roles.wait(refs[:1], [self.in_flight[0].worker], f"generating batch {self.in_flight[0].index}")
        done = set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
        oldest = next(f for f in self.in_flight if f.ref in done)  # the oldest ready batch trains first
        self.in_flight.remove(oldest)
        return oldest

    def step(self):
        times: dict[str, float] = {}
        while True:
            self.roles.check_pushes()  # a failed push would otherwise make every later batch too stale
            self._fill(training=0)
            waited = time.perf_counter()
            with _timed(times, "generate"):
                batch = self._next_ready()
                completions, version = self.roles.wait([batch.ref], [batch.worker], f"generating batch {batch.index}")[0]
            self.idle += time.perf_counter() - waited
            staleness = self.step_count - version
            if staleness <= self.max_staleness:
                break
            self.dropped += 1
            log.info("batch %d dropped: %d versions old (max_staleness=%d)", batch.index, staleness, self.max_staleness)
        step = self.step_count + 1
        self.histogram[staleness] += 1
        self._fill(training=1)  # the next batches generate while this one trains
        rollouts = Rollouts(batch.questions, batch.prompts, completions)
        with _timed(times, "score"):
            scored = score_rollouts(rollouts, self.reward_fn, self.spec, self.cfg, self.tokenizer)
        busy = time.perf_counter()
        result = self.train_and_sync(scored, step, times, wait=False)
        self.step_count = step
        self.busy += time.perf_counter() - busy
        # staleness counts policy versions (rollout batches trained); each is steps_per_rollout optimizer steps
        extra = {"async/staleness": staleness,
                 "async/staleness_optimizer_steps": staleness * self.spec.steps_per_rollout,
                 "async/dropped_batches": self.dropped,
                 "async/requeued_batches": self.requeued,
                 "async/behaviour_unknown_rows": scored.unknown_rows, "async/in_flight": len(self.in_flight),
                 **self.idle_fraction(),
                 **{f"async/staleness_{k}": self.histogram[k] for k in range(self.max_staleness + 1)}}
        return rollouts, scored, result, times, extra

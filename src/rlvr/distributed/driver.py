"""`rlvr train distributed.*`: the RL loop with its roles as Ray actors (seed 000's role split; seed 003's
synchronous vs asynchronous RL).

    driver (this process)   the stages of the local loop (rlvr.stages): data order, prompts, rewards, metrics
    RolloutWorker x N       an HFEngine each; generates with the newest weights it was sent
    Learner x M             one torch.distributed group (its backend decided once for all ranks by
                            rlvr.config.choose_backend): policy, optimizer, reference;
                            each trains its shard of the batch and the gradients are summed
                            (rlvr.distributed.parallel), so
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
comes (batches finishing out of order) is dropped and counted. Weight pushes (through the object store: the
broadcast cannot overlap and is refused in this mode at config time) are not waited for, but each
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
import time

from rlvr import stages
from rlvr.config import TrainConfig
from rlvr.core import checkpoint as ckpt
from rlvr.distributed.placement import absolute_paths, start_ray, write_run_token
from rlvr.distributed.roles import Roles
from rlvr.tasks.task import load_task
from rlvr.tasks.records import DataOrder

log = logging.getLogger(__name__)


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

    from rlvr.core.models import load_tokenizer

    if cfg.distributed.rollout_workers < 1:
        raise ValueError("distributed.learners > 1 needs distributed.rollout_workers >= 1 (the learners do not "
                         "generate)")
    cfg = absolute_paths(cfg)
    run_dir = stages.start_run(cfg)
    run_token = write_run_token(run_dir)
    ckpt.seed_everything(cfg.seed)
    task, spec = load_task(cfg), cfg.estimator
    prompt, train, val = task.prompt, task.split("train", cfg.train_limit), stages.validation_rows(task, cfg)
    stages.check_before_loading(task, cfg, train + val)  # every row's prompt fills and fits the model's context
    reward_fn = stages.build_reward_fn(cfg, prompt.reward)
    tokenizer = load_tokenizer(cfg.model)
    started = start_ray(cfg)
    roles = Roles(cfg)
    try:
        state = roles.setup_learners(run_token)
        monitor = stages.RunMonitor(cfg.max_new_tokens)
        order = DataOrder(len(train), f"grpo-{cfg.seed}")
        step = 0
        if state is not None:
            step, order = state["step"], DataOrder(order.n, order.key, state["epoch"], state["position"])
            monitor.load(state["monitor"])
        logger = stages.open_logger(run_dir, cfg, state)
        roles.push_weights(step)
        if step == 0 and cfg.eval_at_start and val:
            logger.log(0, roles.validate(val, 0))
        loop = _AsyncLoop if cfg.async_.max_staleness else _SyncLoop
        # the order, or a pass-rate curriculum around it (its statistics are the driver's checkpoint state)
        sampler = stages.question_sampler(cfg, order, train, state.get("driver") if state else None)
        driver = loop(cfg, roles, train, sampler, prompt, tokenizer, reward_fn, spec, step)
        driver.resume(state.get("driver", {}) if state else {})
        bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.algorithm} (ray)", unit="step")
        metrics: dict = {}

        def save() -> str:  # learner rank 0 writes it; the batches in flight go in with the driver's state
            return roles.wait([roles.learners[0].save_checkpoint.remote(step, order, monitor.state(),
                                                                         driver.checkpoint_state())],
                              roles.learners[:1], f"saving the step-{step} checkpoint")[0]

        with stages.StopRequests() as stop:  # Ctrl-C / SIGTERM: the step in flight finishes, is saved, one line says so
            while step < cfg.steps:
                rollouts, scored, result, times, extra = driver.step()
                step = driver.step_count
                metrics = {**stages.step_metrics(cfg, rollouts, scored, result["updates"], times, result["lr"]),
                           **extra}
                if val and stages.validation_due(cfg, step):
                    with stages.timed(times, "validate"):
                        metrics.update(roles.validate(val, step))
                    metrics["time/validate"] = times["validate"]
                stages.log_step(step, metrics, rollouts, scored, times, monitor, logger, bar, cfg)
                stop.after_step(cfg, run_dir, step, "rlvr train", save, close=(bar.close, logger.close))
        bar.close()
        summary = {"steps": step, "algorithm": cfg.algorithm,
                   **{k: v for k, v in metrics.items() if k.startswith("val/")}}
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
        return stages.sampler_state(self.order)

    def idle_fraction(self) -> dict:
        return {"time/learner_idle_fraction": self.idle / max(self.idle + self.busy, 1e-9)}

    def step(self):
        self.step_count += 1
        step, times = self.step_count, {}
        with stages.timed(times, "generate"):
            questions, prompts = stages.next_questions(self.train, self.order, self.prompt, self.tokenizer, self.cfg)
            rollouts = self.generate(questions, prompts, step)
        with stages.timed(times, "score"):
            scored = stages.score_rollouts(rollouts, self.reward_fn, self.spec, self.cfg, self.tokenizer)
            curriculum = stages.record_rollouts(self.order, rollouts, scored.scores, scored.scores,
                                                self.cfg.group_size)
        result = self.train_and_sync(scored, step, times)
        self.idle += times["generate"] + times["score"]
        self.busy += times["train"] + times["sync_weights"]
        return rollouts, scored, result, times, {"async/staleness": 0, "async/staleness_optimizer_steps": 0,
                                                 **self.idle_fraction(), **curriculum}

    def generate(self, questions, prompts, step: int) -> stages.Rollouts:
        workers = self.roles.workers
        sampling = stages.rollout_sampling(self.cfg, self.prompt, step)
        bounds = [round(i * len(prompts) / len(workers)) for i in range(len(workers) + 1)]
        refs = [w.generate.remote(prompts[a:b], sampling) for w, a, b in zip(workers, bounds, bounds[1:]) if b > a]
        used = [w for w, a, b in zip(workers, bounds, bounds[1:]) if b > a]
        completions = []
        for (part, _), a in zip(self.roles.wait(refs, used, f"generating step {step}"), bounds):
            for c in part:
                c.prompt_index += a
            completions.extend(part)
        return stages.Rollouts(questions, prompts, completions, step)

    def train_and_sync(self, scored, step: int, times: dict, wait: bool = True) -> dict:
        """Train step `step`, then send its weights (version `step`) to every worker. `wait=False` (async): the
        batches in flight keep the weights they started with; the submissions queued behind this get the new."""
        with stages.timed(times, "train"):
            result = self.roles.train(scored.batch, step)
        with stages.timed(times, "sync_weights"):
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
                "histogram": {str(k): v for k, v in self.histogram.items()}, "in_flight": sorted(pending),
                **stages.sampler_state(self.order)}

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
            prompts = [self.prompt.render(q, self.tokenizer) for q in questions]
            load = collections.Counter(f.worker for f in self.in_flight)
            worker = min(self.roles.workers, key=lambda w: load[w])
            sampling = stages.rollout_sampling(self.cfg, self.prompt, index)
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
            with stages.timed(times, "generate"):
                batch = self._next_ready()
                what = f"generating batch {batch.index}"
                completions, version = self.roles.wait([batch.ref], [batch.worker], what)[0]
            self.idle += time.perf_counter() - waited
            staleness = self.step_count - version
            if staleness <= self.max_staleness:
                break
            self.dropped += 1
            log.info("batch %d dropped: %d versions old (max_staleness=%d)", batch.index, staleness, self.max_staleness)
        step = self.step_count + 1
        self.histogram[staleness] += 1
        self._fill(training=1)  # the next batches generate while this one trains
        rollouts = stages.Rollouts(batch.questions, batch.prompts, completions, step)
        with stages.timed(times, "score"):
            scored = stages.score_rollouts(rollouts, self.reward_fn, self.spec, self.cfg, self.tokenizer)
            curriculum = stages.record_rollouts(self.order, rollouts, scored.scores, scored.scores,
                                                self.cfg.group_size)
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
                 **self.idle_fraction(), **curriculum,
                 **{f"async/staleness_{k}": self.histogram[k] for k in range(self.max_staleness + 1)}}
        return rollouts, scored, result, times, extra

"""`rlvr train`: the RL loop of seed 004 Algorithm 1, for every estimator (preset or user-registered).

    for step in 1..steps:
        rollouts   <- G samples for each of the next questions, from the engine (weights synced)  Rollouts
        scored     <- rewards, advantages over the whole rollout batch, tokens                   TrainBatch
        [teacher log-probs -> per-token advantages]                                (distill > 0: opd)
        [old log-probs of train batches 2..k, once, before the first update]      (off-policy)
        [reference log-probs]                                                      (beta > 0)
        for each of the k = steps_per_rollout train batches: one policy_gradient_update
        log; validate every eval_every; checkpoint every save_every

Each line is a stage of rlvr.stages, which the distributed loop (rlvr.distributed) runs too; a run with
`distributed.*` set is handed to it. Entry logic (seed 000): if `out` already holds a finished model, it is
evaluated instead of trained. Every rollout is reproducible from (seed, step, question, sample index).
"""

from __future__ import annotations

import logging
from pathlib import Path

from rlvr import stages
from rlvr.config import TrainConfig
from rlvr.core import checkpoint as ckpt
from rlvr.core.models import load_model
from rlvr.engines.hf import HFEngine
from rlvr.tasks.records import DataOrder
from rlvr.tasks.task import load_task

log = logging.getLogger(__name__)


def train_grpo(cfg: TrainConfig) -> dict:
    finished = ckpt.finished_model(Path(cfg.out))
    if finished is not None:
        return evaluate_finished(cfg, finished)
    if cfg.distributed.enabled:  # Ray roles: the same step, split over processes and machines
        from rlvr.distributed.driver import train_distributed

        return train_distributed(cfg)
    where = stages.placement(cfg)  # a device this machine lacks stops the run here, before anything is written
    ckpt.seed_everything(cfg.seed)
    task, spec = load_task(cfg), cfg.estimator  # rows + prompt + reward, a built-in task's or a user's
    prompt, train, val = task.prompt, task.split("train", cfg.train_limit), stages.validation_rows(task, cfg)
    stages.check_before_loading(task, cfg, train + val)  # every row's prompt fills and fits the model's context
    run_dir = stages.start_run(cfg)  # (after the data's checks: a run that cannot start leaves no directory behind)
    cfg = stages.native_precision(cfg, where)
    reward_fn = stages.build_reward_fn(cfg, prompt.reward)
    model, tokenizer, state = stages.load_policy(cfg, run_dir, where.policy)
    # a reward that cannot tell a right answer from none: said now, not after hours (an agent's episodes are
    # scored on their conversation, which a text completion of the row does not have: not checked)
    if state is None and not cfg.agentic:
        stages.warn_unlearnable(task, train, tokenizer)
    optimizer, scheduler = stages.build_optimizer(model, cfg, cfg.steps * spec.steps_per_rollout)
    reference = stages.reference_model(cfg, where.reference)
    teacher = stages.teacher_model(cfg, tokenizer, where.teacher)
    monitor = stages.RunMonitor(cfg.max_new_tokens)
    step, order = stages.restore(state, optimizer, scheduler, DataOrder(len(train), f"grpo-{cfg.seed}"))
    if state is not None:
        monitor.load(state["monitor"])
    sampler = stages.question_sampler(cfg, order, train, state)  # the order, or a pass-rate curriculum around it
    logger = stages.open_logger(run_dir, cfg, state)
    engine, val_engine = stages.build_engines(model, tokenizer, cfg, where)
    if step == 0 and cfg.curriculum.enabled and cfg.curriculum.first_pass:
        logger.log(0, stages.first_pass(sampler, engine, model, train, prompt, tokenizer, cfg, reward_fn))
    if step == 0 and cfg.eval_at_start and val:
        metrics = stages.start_validation(val_engine, model, val, prompt, tokenizer, cfg)
        logger.log(0, metrics)
        log.info("step 0 validation: %s", stages.finished_validation(metrics))

    from tqdm import tqdm

    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {cfg.algorithm}", unit="step")
    metrics: dict = {}
    def state_now() -> dict:
        return stages.trainer_state(optimizer, scheduler, order, monitor=monitor.state(),
                                    **stages.sampler_state(sampler))

    with stages.StopRequests() as stop:
        while step < cfg.steps:
            step += 1
            times: dict[str, float] = {}
            dynamic, graded, sampled = {}, None, None
            # a step that fails (a reward function's error) keeps the steps before it: this is what they left
            last, updated = stages.finished_state(state_now()), []
            save_last = lambda: stages.save_finished(  # noqa: E731
                run_dir, step if updated else step - 1, model, tokenizer, state_now() if updated else last, cfg)
            with stop.step(cfg, run_dir, step, "rlvr train", save_last, close=(bar.close, logger.close)):
                with stages.timed(times, "generate"):
                    if cfg.dynamic_sampling:
                        rollouts, dynamic, graded, sampled = stages.dynamic_rollouts(
                            engine, model, train, sampler, prompt, tokenizer, cfg, step, reward_fn, spec)
                    else:
                        rollouts = stages.collect_rollouts(engine, model, train, sampler, prompt, tokenizer, cfg,
                                                           step)
                with stages.timed(times, "score"):
                    scored = stages.score_rollouts(rollouts, reward_fn, spec, cfg, tokenizer, graded)
                    every, every_scores = sampled if sampled is not None else (rollouts, scored.scores)
                    curriculum = stages.record_rollouts(sampler, every, every_scores, scored.scores, cfg.group_size)
                with stages.timed(times, "teacher"):
                    # (distill_kl reverse / forward: the update scores the teacher itself, logs train/teacher_kl_exact)
                    distilled = stages.distill_from_teacher(scored.batch, model, teacher, spec, cfg) \
                        if teacher is not None and not spec.exact_distill else {}
                updated.append(True)  # from here the model has moved: a failure saves this step
                updates = stages.train_on_rollouts(model, optimizer, scheduler, reference, scored.batch, spec, cfg,
                                                   step, times, teacher=teacher)

                lr = scheduler.get_last_lr()[0]
                metrics = {**stages.step_metrics(cfg, rollouts, scored, updates, times, lr, sampled),
                           **distilled,
                           **dynamic,
                           **curriculum}
                if val and stages.validation_due(cfg, step):
                    with stages.timed(times, "validate"):
                        val_metrics, _ = stages.validate(val_engine, model, val, prompt, tokenizer, cfg)
                    metrics.update(val_metrics, **{"time/validate": times["validate"]})
                stages.log_step(step, metrics, rollouts, scored, times, monitor, logger, bar, cfg)
            # the periodic checkpoint; on Ctrl-C / SIGTERM this step saved and the run stopped with one line
            stop.after_step(cfg, run_dir, step, "rlvr train", close=(bar.close, logger.close),
                            save=lambda: ckpt.save_checkpoint(run_dir, step, model, tokenizer, state_now(),
                                                              keep=cfg.keep_checkpoints))
    bar.close()
    summary = {"steps": step, "algorithm": cfg.algorithm,
               **{k_: v for k_, v in metrics.items() if k_.startswith("val/")}}
    final = ckpt.save_final(run_dir, model, tokenizer, summary)
    logger.close()
    log.info("training finished: %s; model in %s", stages.finished_validation(summary), final)
    return {**summary, "final": str(final)}


def evaluate_finished(cfg: TrainConfig, final: Path) -> dict:
    """Seed 000's entry logic: a finished run is evaluated, not trained again."""

    log.info("%s holds a finished model; evaluating it instead of training", final)
    where = stages.placement(cfg)
    if cfg.grades_code:
        cfg.sandbox.apply()
    cfg = stages.native_precision(cfg, where)
    model, tokenizer = load_model(str(final), device=where.eval)
    engine = HFEngine(model, tokenizer, batch_size=cfg.generation_batch_size, dtype=cfg.generation_dtype,
                      prefix_cache_mib=cfg.env_cache_mib)
    task = load_task(cfg)
    metrics, _ = stages.validate(engine, model, task.split("validation", cfg.eval_limit), task.prompt, tokenizer, cfg)
    log.info("finished model: %s", ", ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    return {**metrics, "final": str(final), "already_finished": True}

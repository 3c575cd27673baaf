"""The stages every training loop is made of, shared by the local loop (rlvr.training.rl) and the
distributed one (rlvr.distributed): sample rollouts, score them (rewards, advantages, the TrainBatch), train,
log, validate, and the plumbing of a run (its directory, policy and optimizer, engines, resume, Ctrl-C). Both
loops call them as `stages.<name>` from this one module.

    rollouts  sample (collect_rollouts, dynamic_rollouts) and score (score_rollouts) a step's rollouts
    learn     the optimizer steps on one rollout batch (train_on_rollouts), the reference and the teacher
    metrics   a step's metrics, seed 002's warning signs, log_step
    evaluation  evaluating an engine on examples, validation during training, `rlvr eval`
    curriculum  an online pass-rate curriculum: which questions a batch draws
    episodes  multi-turn rollouts (`env=`): batched episodes, the ids the learner trains on, env/* metrics
    agents    programs' episodes (`agent=`, `env_class=`) through rlvr's server beside the rollout engine, bounded
    trajectories  an agent's recorded calls as sequences (merged while the prompt extends), the batch, agent/*
    run       run directories, loading the policy, optimizer, engines, resume, StopRequests
    check     checking a task before training: rows, prompts, whether its reward can vary (rlvr check-task)

May import: rlvr.core, rlvr.sandbox, rlvr.grading, rlvr.tasks, rlvr.environments, rlvr.engines, rlvr.algorithms,
rlvr.config, rlvr.serve.
"""

from rlvr.stages.check import TaskReport, check_before_loading, check_task, warn_unlearnable
from rlvr.stages.curriculum import (Curriculum, first_pass, question_sampler, record_rollouts,
                                    sampler_state)
from rlvr.stages.episodes import episode_metrics, run_episodes
from rlvr.stages.evaluation import evaluate, run_eval
from rlvr.stages.learn import (distill_from_teacher, reference_log_probs, reference_model, teacher_model,
                               train_on_rollouts)
from rlvr.stages.metrics import (RunMonitor, finished_validation, log_step, rollout_rows, step_metrics, timed,
                                 validation_due)
from rlvr.stages.rollouts import (Rollouts, Scored, build_reward_fn, collect_rollouts, dynamic_rollouts,
                                  next_questions, rollout_sampling, sampled_log_probs, score_completions,
                                  score_rollouts)
from rlvr.stages.run import (RunFailed, RunInterrupted, StopRequests, build_engines, build_optimizer, finish_run,
                             finished_state, fmt_metrics, frozen_dtype, load_frozen, load_policy, native_precision,
                             open_logger, placement, restore, save_finished, start_run, trainer_state)
from rlvr.stages.validation import start_validation, validate, validation_rows

__all__ = ["TaskReport", "check_before_loading", "check_task", "warn_unlearnable", "Curriculum", "first_pass", "question_sampler", "record_rollouts", "sampler_state", "episode_metrics",
    "run_episodes",
    "Rollouts", "RunFailed", "RunInterrupted", "finished_state", "save_finished", "RunMonitor", "Scored", "StopRequests", "build_engines", "build_optimizer",
    "build_reward_fn", "collect_rollouts", "distill_from_teacher", "dynamic_rollouts", "evaluate", "finish_run",
    "finished_validation", "fmt_metrics", "frozen_dtype", "load_frozen", "load_policy", "log_step",
    "native_precision", "next_questions", "open_logger", "placement", "reference_log_probs", "reference_model",
    "restore", "rollout_rows", "rollout_sampling", "run_eval", "sampled_log_probs", "score_completions",
    "score_rollouts", "start_run", "start_validation", "step_metrics", "teacher_model", "timed", "train_on_rollouts",
    "trainer_state", "validate", "validation_due", "validation_rows"]

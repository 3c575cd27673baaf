"""rlvr: reinforcement learning from verifiable rewards for small language models.

The public functions are re-exported here lazily (PEP 562), so `import rlvr` stays cheap: the grading
worker processes import this package without paying for torch or transformers.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    # rewards: answer grading and reward functions (no torch at import time)
    "r1_zero_reward_fn": "rlvr.tasks.rewards",
    "question_only_reward_fn": "rlvr.tasks.rewards",
    "answer_tag_reward_fn": "rlvr.tasks.rewards",
    "combine_rewards": "rlvr.tasks.rewards",
    "grade_answer": "rlvr.tasks.rewards",
    "parse_gsm8k_answer": "rlvr.tasks.records",
    "compute_rollout_rewards": "rlvr.tasks.scoring",
    # estimators: pure tensor math of the GRPO family
    "compute_group_normalized_rewards": "rlvr.algorithms.estimators",
    "compute_policy_gradient_loss": "rlvr.algorithms.losses",
    "aggregate_loss_across_microbatch": "rlvr.algorithms.losses",
    "masked_mean": "rlvr.algorithms.estimators",
    "masked_normalize": "rlvr.algorithms.estimators",
    "compute_entropy": "rlvr.algorithms.estimators",
    "kl_penalty": "rlvr.algorithms.estimators",
    "PRESETS": "rlvr.algorithms.spec",
    "get_preset": "rlvr.algorithms.spec",
    # models: loading (seed 004's get_model_and_tokenizer) and a random model of the default's shape
    "get_model_and_tokenizer": "rlvr.core.models",
    "load_model": "rlvr.core.models",
    # policy: tokenisation, log-probs, the SFT microbatch step
    "tokenize_prompt_and_output": "rlvr.algorithms.policy",
    "tokenize_prompt_and_ids": "rlvr.algorithms.policy",
    "get_response_log_probs": "rlvr.algorithms.policy",
    "sft_microbatch_train_step": "rlvr.algorithms.policy",
    # your own task, from Python: the same loops as `rlvr train` / `rlvr eval` (docs/your_task.md)
    "train": "rlvr.training.api",
    "evaluate": "rlvr.training.api",
    "register_reward": "rlvr.tasks.user_rewards",
    "load_task": "rlvr.tasks.task",
    # training
    "grpo_train_step": "rlvr.algorithms.train_step",
    "policy_gradient_update": "rlvr.algorithms.update",
    "EstimatorSpec": "rlvr.algorithms.spec",
    "register_advantage": "rlvr.algorithms.spec",
    "register_policy_loss": "rlvr.algorithms.spec",
    "register_estimator": "rlvr.algorithms.spec",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rlvr' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(list(globals()) + __all__)

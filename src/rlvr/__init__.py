"""rlvr: reinforcement learning from verifiable rewards for small language models.

The public functions are re-exported here lazily (PEP 562), so `import rlvr` stays cheap: the grading
worker processes import this package without paying for torch or transformers.
"""

from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    # rewards: answer grading and reward functions (no torch at import time)
    "r1_zero_reward_fn": "rlvr.rewards",
    "question_only_reward_fn": "rlvr.rewards",
    "answer_tag_reward_fn": "rlvr.rewards",
    "combine_rewards": "rlvr.rewards",
    "grade_answer": "rlvr.rewards",
    "parse_gsm8k_answer": "rlvr.data",
    "compute_rollout_rewards": "rlvr.rewards",
    # estimators: pure tensor math of the GRPO family
    "compute_group_normalized_rewards": "rlvr.estimators",
    "compute_policy_gradient_loss": "rlvr.estimators",
    "aggregate_loss_across_microbatch": "rlvr.estimators",
    "masked_mean": "rlvr.estimators",
    "masked_normalize": "rlvr.estimators",
    "compute_entropy": "rlvr.estimators",
    "kl_penalty": "rlvr.estimators",
    "PRESETS": "rlvr.algorithms",
    "get_preset": "rlvr.algorithms",
    # models: loading (seed 004's get_model_and_tokenizer) and a random model of the default's shape
    "get_model_and_tokenizer": "rlvr.models",
    "load_model": "rlvr.models",
    # policy: tokenisation, log-probs, the SFT microbatch step
    "tokenize_prompt_and_output": "rlvr.policy",
    "tokenize_prompt_and_ids": "rlvr.policy",
    "get_response_log_probs": "rlvr.policy",
    "sft_microbatch_train_step": "rlvr.policy",
    # training
    "grpo_train_step": "rlvr.update",
    "policy_gradient_update": "rlvr.update",
    "EstimatorSpec": "rlvr.algorithms",
    "register_advantage": "rlvr.algorithms",
    "register_policy_loss": "rlvr.algorithms",
    "register_estimator": "rlvr.algorithms",
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

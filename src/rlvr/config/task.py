"""The fields that say what a user's task is, beyond the dataset and the prompt (rlvr.tasks.task): its reward
terms, stop strings, chat rendering and a validation file of its own; checked before any model is loaded.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from rlvr.config.base import BaseConfig


class TaskFields(BaseConfig):
    """Mixed into every command's config (DataFields)."""

    rewards: dict[str, float] | None = Field(None, description="weighted rewards: built-ins (r1_zero, answer_tag, "
                                             "code_tests, reasoning_gym, format: the prompt's format reward; "
                                             "rlvr train also overlong) and your own functions as "
                                             "path/to/file.py:fn or package.module:fn, e.g. {r1_zero: 1.0, "
                                             "format: 0.2} or {my_rewards.py:short_answer: 1.0}; none: the "
                                             "prompt's reward (docs/your_task.md)")
    stop: list[str] | None = Field(None, description="stop strings (generation stops after one; it stays in the "
                                   "response); none: the prompt's own")
    system_prompt: str | None = Field(None, description="system message; renders the prompt through the "
                                      "tokenizer's chat template")
    chat_template: bool = Field(False, description="render the filled prompt as the user turn of the tokenizer's "
                                "chat template (conversation rows always are)")
    answer_term: str | None = Field(None, description="the reward term whose answer signal is the answer's "
                                    "correctness (accuracy, pass@k, dynamic sampling, the curriculum, RFT/MaxRL): "
                                    "a function's name or its rewards= key; none: the first built-in grader's, or "
                                    "with your functions only, the weighted reward")
    reward_timeout: float | None = Field(300.0, gt=0, description="seconds a reward function of yours may take "
                                         "on one batch; past them, or on a stop signal, the run stops with its "
                                         "last finished step saved (none: no bound)")
    validation_dataset: str | None = Field(None, description="validation rows from their own file or name (then "
                                           "all of `dataset` is trained on); none: a seeded tenth of `dataset` "
                                           "(split_seed), or the dataset's own validation split")

    @field_validator("prompt", check_fields=False)
    @classmethod
    def _known_prompt(cls, value: str) -> str:
        from rlvr.tasks.prompts import get_prompt

        get_prompt(value)  # an unknown name or a template file that is missing or has no placeholder fails here
        return value

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, value: dict | None) -> dict | None:
        """Each term resolves before any model is loaded: a user's file imports, its function exists and has a
        signature rlvr knows, a built-in name exists."""
        from rlvr.tasks.task import check_reward_name

        for name in value or {}:  # a RewardError is a ValueError: pydantic reports it with the field
            check_reward_name(name)
        return value

    def _check_task(self) -> None:
        """The prompt and the reward terms fit together (a prompt without a reward of its own needs rewards=)."""
        from rlvr.tasks.task import check_reward_names, task_prompt

        check_reward_names(self, task_prompt(self))

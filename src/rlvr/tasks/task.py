"""A task is rows + a prompt + a reward, whoever wrote it: GSM8K, arithmetic and the generated code task ship
with rlvr, reasoning-gym's tasks come with its extra, and a user brings a table, a template and reward
functions. `load_task(cfg)` is the one reader every command calls (train, eval, sft, dpo, the distributed
driver, sweeps), so a user's task goes everywhere a built-in one goes.

    rows     `dataset=` (rlvr.tasks.datasets: names, files of any format, reasoning_gym:NAME) and its columns
    prompt   `prompt=` a name or a template file, with `stop=`, `system_prompt=`, `chat_template=`
    reward   `rewards={name: weight}` mixing built-ins (r1_zero, answer_tag, code_tests, format, ...) with a
             user's functions (path/to/file.py:fn, package.module:fn); none given: the prompt's own reward
"""

from __future__ import annotations

import dataclasses

from rlvr.tasks.datasets import load_split
from rlvr.tasks.prompts import PromptTemplate, resolve_prompt
from rlvr.tasks.records import Example
from rlvr.tasks.reward_base import RewardFn
from rlvr.tasks.rewards import combine_rewards, format_reward_fn, get_reward_fn
from rlvr.tasks.user_rewards import UserReward, is_user_reward, reward_label

# reward terms that are not functions of one answer against its ground truth
SHAPING = ("format", "overlong")


def task_prompt(cfg) -> PromptTemplate:
    """The config's prompt with its stop strings, system prompt and chat rendering."""
    return resolve_prompt(cfg.prompt, getattr(cfg, "stop", None), getattr(cfg, "system_prompt", None),
                          getattr(cfg, "chat_template", False))


def reward_terms(cfg, prompt: PromptTemplate) -> dict[str, float]:
    """{name: weight} of the run's reward: `rewards=`, or the prompt's own reward at weight 1."""
    rewards = getattr(cfg, "rewards", None)
    if rewards:
        return dict(rewards)
    if prompt.reward is None and getattr(cfg, "episodes_reward", False):
        return {}  # an agent's episodes may be scored by the agent itself (rlvr.stages.agents)
    if prompt.reward is None:
        raise ValueError(f"prompt {prompt.name!r} has no reward of its own: say what grades a response with "
                         "rewards={path/to/rewards.py:my_reward: 1.0} (or a built-in such as answer_tag), or "
                         "ask for a template that has one (prompt=r1_zero grades the answer column)")
    return {prompt.reward: 1.0}


class Unscored(RewardFn):
    """No reward function: every response is left unscored (an agent's episodes score themselves; one that
    returns None has no reward, and its group's statistics leave it out)."""

    name = "unscored"

    def plan(self, responses, ground_truths, context=None):
        return [], lambda _: [{"reward": None, "format_reward": None, "answer_reward": None} for _ in responses]


def check_reward_name(name: str) -> None:
    """Fail now, before any model is loaded, on a reward term that does not resolve: an unknown name, a user's
    file that does not import, a function that is not callable or has neither signature."""
    if name not in SHAPING:
        UserReward(name) if is_user_reward(name) else get_reward_fn(name)


def check_reward_names(cfg, prompt: PromptTemplate) -> None:
    """The run's reward terms fit its prompt: a prompt without a reward of its own needs rewards=, and the
    `format` term is the prompt's format reward."""
    for name in reward_terms(cfg, prompt):
        if name == "format" and prompt.reward is None:
            raise ValueError(f"rewards has a format term, which is the prompt's format reward, but prompt "
                             f"{prompt.name!r} has none: write the format check as a reward function")
    answer = getattr(cfg, "answer_term", None)
    terms = [k for k in reward_terms(cfg, prompt) if k != "overlong"]
    if answer is not None and answer not in terms + term_labels(terms):
        raise ValueError(f"answer_term={answer!r} is not one of the run's reward terms "
                         f"({', '.join(term_labels(terms))})")


def _component(name: str, prompt: PromptTemplate, timeout: float | None = None, label: str | None = None) -> RewardFn:
    if name == "format":
        return format_reward_fn(prompt.reward)
    if is_user_reward(name):
        return UserReward(name, timeout=timeout, label=label)
    return get_reward_fn(name)


def term_labels(names) -> list[str]:
    """The name each term is logged under (`reward/<label>`): a function's name, with #2, #3, ... after it when
    two terms share one (two lambdas, [f, f], two files' `score`)."""
    labels, seen = [], {}
    for name in names:
        label = reward_label(name)
        seen[label] = seen.get(label, 0) + 1
        labels.append(label if seen[label] == 1 else f"{label}#{seen[label]}")
    return labels


def build_reward_fn(cfg, prompt: PromptTemplate) -> RewardFn:
    """The prompt's reward, or the weighted combination `rewards=` names (seed 002's correctness + format;
    a user's functions beside built-ins), each term logged as `reward/<name>`. The length term `overlong` is not
    a function of the text: rlvr.stages.rollouts adds it. A user's function may take `reward_timeout` seconds a
    batch."""
    terms = {k: w for k, w in reward_terms(cfg, prompt).items() if k != "overlong"}
    timeout = getattr(cfg, "reward_timeout", None)
    if not terms:
        return Unscored()
    if not getattr(cfg, "rewards", None):
        return _component(next(iter(terms)), prompt, timeout)
    labels = term_labels(terms)
    answer = getattr(cfg, "answer_term", None)
    answer = dict(zip(terms, labels)).get(answer, answer)  # a rewards= key names its term too
    return combine_rewards([(label, _component(name, prompt, timeout, label), weight)
                            for name, label, weight in zip(terms, labels, terms.values())], answer_term=answer)


def eval_reward_fn(cfg, prompt: PromptTemplate) -> RewardFn:
    """What evaluation and validation score: the prompt's own reward (correctness) on a built-in task, as
    always; the run's whole reward when it has a user's function or the prompt has no reward of its own."""
    terms = getattr(cfg, "rewards", None) or {}
    if prompt.reward is not None and not any(is_user_reward(n) for n in terms):
        return get_reward_fn(prompt.reward)
    return build_reward_fn(cfg, prompt)


def needs_answer(cfg, prompt: PromptTemplate) -> bool:
    """Whether the run's reward grades against the rows' answer column (built-in graders do; a user's
    functions read what they need from the row)."""
    return any(not is_user_reward(n) and n not in SHAPING and n != "reasoning_gym"
               for n in reward_terms(cfg, prompt))


@dataclasses.dataclass
class Task:
    """What a command needs of its task: the rows of a split, the prompt that formats them, the reward."""

    cfg: object
    prompt: PromptTemplate
    reward_fn: RewardFn
    needs_answer: bool = True

    def split(self, split: str, limit: int | None = None) -> list[Example]:
        return load_split(self.cfg, split, limit, require_answer=self.needs_answer)

    def render(self, examples: list[Example], tokenizer=None) -> list[str]:
        return [self.prompt.render(ex, tokenizer) for ex in examples]


def load_task(cfg) -> Task:
    """The task a config names (see the module docstring)."""
    prompt = task_prompt(cfg)
    return Task(cfg, prompt, build_reward_fn(cfg, prompt), needs_answer(cfg, prompt))

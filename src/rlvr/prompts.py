"""Prompt templates. Each one knows how to format a question, where generation stops, and which reward
function grades what the model writes, so evaluation and training can never disagree about the contract.

    question_only        "{question} Please put your final answer within \\boxed{}."    no stop string
    r1_zero              DeepSeek R1-Zero's think/answer prompt (seed 004 §3.2)       stops at "</answer>"
    r1_zero_three_shot   r1_zero with three worked GSM8K examples before the question stops at "</answer>"
    chat                 the tokenizer's chat template, answer in <answer></answer> tags  stops at "</answer>"
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from importlib import resources

from rlvr.data import few_shot_examples, r1_zero_response

CHAT_INSTRUCTION = (
    "Solve the math problem step by step. Then write only the final number inside <answer></answer> tags, "
    "for example <answer> 42 </answer>."
)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    name: str
    template: str  # str.format template with a {question} field ({{ }} are literal braces)
    stop: tuple[str, ...]  # generation stops after any of these; the stop string stays in the output
    reward: str  # name in rlvr.rewards.REWARD_FNS
    chat: bool = False  # format through the tokenizer's chat template

    def format(self, question: str, tokenizer=None) -> str:
        if not self.chat:
            return self.template.format(question=question)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"prompt {self.name!r} needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": self.template.format(question=question)}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _read(name: str) -> str:
    return (resources.files("rlvr") / "prompts" / f"{name}.prompt").read_text(encoding="utf-8")


def _three_shot_template() -> str:
    r1 = _read("r1_zero")
    preamble, _, _ = r1.partition("User:")
    # The worked examples contain literal braces only through {question}; escape everything else for format().
    shots = "".join(
        f"User: {ex.question}\nAssistant: <think>{r1_zero_response(ex)}\n".replace("{", "{{").replace("}", "}}")
        for ex in few_shot_examples()
    )
    return preamble + shots + "User: {question}\nAssistant: <think>"


@lru_cache(maxsize=None)
def get_prompt(name: str) -> PromptTemplate:
    """The template called `name`; an unknown name fails with the list of valid ones."""
    if name == "question_only":
        return PromptTemplate(name, _read("question_only"), stop=(), reward="question_only")
    if name == "r1_zero":
        return PromptTemplate(name, _read("r1_zero"), stop=("</answer>",), reward="r1_zero")
    if name == "r1_zero_three_shot":
        return PromptTemplate(name, _three_shot_template(), stop=("</answer>",), reward="r1_zero")
    if name == "chat":
        return PromptTemplate(name, "{question}\n\n" + CHAT_INSTRUCTION, stop=("</answer>",), reward="answer_tag", chat=True)
    raise ValueError(f"unknown prompt {name!r}; valid: {', '.join(PROMPTS)}")


PROMPTS = ("question_only", "r1_zero", "r1_zero_three_shot", "chat")

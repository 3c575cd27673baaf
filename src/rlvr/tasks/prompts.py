"""Prompt templates. Each one knows how to format a question, where generation stops, and which reward
function grades what the model writes, so evaluation and training can never disagree about the contract.

    question_only        "{question} Please put your final answer within \\boxed{}."    no stop string
    r1_zero              DeepSeek R1-Zero's think/answer prompt (seed 004 §3.2)       stops at "</answer>"
    r1_zero_three_shot   r1_zero with three worked GSM8K examples before the question stops at "</answer>"
    chat                 the tokenizer's chat template, answer in <answer></answer> tags  stops at "</answer>"
    code                 r1_zero's think block, then the program in one ```python block  stops at "\\n```\\n"
    code_chat            the chat template; one ```python block, no explanation          stops at "\\n```\\n"

The code prompts are for code datasets (rlvr.tasks.code) and are graded by running the dataset's tests
(reward "code_tests:think" for code: its format also needs the closed reasoning trace; "code_tests" for
code_chat). `PromptTemplate.sft_response` is each prompt's supervised target.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from importlib import resources

from rlvr.tasks.code import code_response
from rlvr.tasks.gsm8k import few_shot_examples, r1_zero_response
from rlvr.tasks.records import Example

CHAT_INSTRUCTION = (
    "Solve the math problem step by step. Then write only the final number inside <answer></answer> tags, "
    "for example <answer> 42 </answer>."
)
CODE_CHAT_INSTRUCTION = "Write the Python function in a single ```python code block. No explanation is needed."
# a code block's closing fence: generation stops right after it, and the SFT targets end with it
CODE_STOP = ("\n```\n",)


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    name: str
    template: str  # str.format template with a {question} field ({{ }} are literal braces)
    stop: tuple[str, ...]  # generation stops after any of these; the stop string stays in the output
    reward: str  # name in rlvr.tasks.rewards.REWARD_FNS
    chat: bool = False  # format through the tokenizer's chat template

    def format(self, question: str, tokenizer=None) -> str:
        if not self.chat:
            return self.template.format(question=question)
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"prompt {self.name!r} needs a tokenizer with a chat template")
        messages = [{"role": "user", "content": self.template.format(question=question)}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def sft_response(self, example: Example, annotations: bool = False) -> str:
        """The supervised target for `example` under this prompt: what the model should write after
        `format(example.question)`, ending where generation stops (`annotations`: GSM8K's calculator
        annotations kept, for the calculator environment)."""
        if self.name in ("r1_zero", "r1_zero_three_shot"):
            return r1_zero_response(example, annotations)
        if self.name in ("code", "code_chat"):
            return code_response(example, think=self.name == "code")
        raise ValueError(f"prompt {self.name!r} has no SFT target; prompts with one: r1_zero, r1_zero_three_shot, "
                         "code, code_chat")


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
    if name == "code":
        return PromptTemplate(name, _read("code"), stop=CODE_STOP, reward="code_tests:think")
    if name == "code_chat":
        return PromptTemplate(name, "{question}\n\n" + CODE_CHAT_INSTRUCTION, stop=CODE_STOP, reward="code_tests",
                              chat=True)
    import difflib

    close = difflib.get_close_matches(name, PROMPTS, n=1, cutoff=0.6)
    raise ValueError(f"unknown prompt {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}"
                     f"valid: {', '.join(PROMPTS)}")


PROMPTS = ("question_only", "r1_zero", "r1_zero_three_shot", "chat", "code", "code_chat")

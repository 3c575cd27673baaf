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
import string
from functools import lru_cache
from importlib import resources
from pathlib import Path

from rlvr.tasks.code import code_response
from rlvr.tasks.gsm8k import few_shot_examples, r1_zero_response
from rlvr.tasks.records import DataError, Example

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
    template: str  # str.format template with {question} or any {column} of the row ({{ }} are literal braces)
    stop: tuple[str, ...]  # generation stops after any of these; the stop string stays in the output
    reward: str | None  # name in rlvr.tasks.rewards.REWARD_FNS; None: the run's `rewards=` must say
    chat: bool = False  # format through the tokenizer's chat template
    system: str | None = None  # the system message of chat rendering

    def format(self, question: str, tokenizer=None) -> str:
        return self._chat(self.template.format(question=question), tokenizer)

    def _chat(self, text: str, tokenizer, conversation: tuple | None = None) -> str:
        if not self.chat and conversation is None:
            return text
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ValueError(f"prompt {self.name!r} needs a tokenizer with a chat template")
        messages = list(conversation) if conversation is not None else [{"role": "user", "content": text}]
        if self.system and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system})
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    def render(self, example: Example, tokenizer=None) -> str:
        """The prompt of a row: the template filled from the row's columns ({question} is the question), or
        the row's own chat conversation rendered with the chat template (prompt=row)."""
        if example.conversation is not None:
            if self.name != "row":
                raise DataError(f"{example.id}: the row's prompt is a chat conversation, which prompt "
                                f"{self.name!r} cannot format; use prompt=row (the conversation as it is)")
            return self._chat("", tokenizer, example.conversation)
        return self._chat(self.fill(example), tokenizer)

    def fill(self, example: Example) -> str:
        """The template filled from a text row's columns, before any chat template: the row's prompt as a TRL
        reward function is handed it."""
        columns = {**example.fields, "question": example.question}
        try:
            return self.template.format_map(columns)
        except KeyError as err:
            raise DataError(f"{example.id}: prompt {self.name!r} has the placeholder {{{err.args[0]}}}, but the "
                            f"row has no such column (columns: {', '.join(columns)})") from None

    def reward_prompt(self, example: Example):
        """What a reward function gets as the row's prompt (TRL's `prompts`): its conversation, or its text."""
        return list(example.conversation) if example.conversation is not None else self.fill(example)

    def sft_response(self, example: Example, annotations: bool = False) -> str:
        """The supervised target for `example` under this prompt: what the model should write after
        `format(example.question)`, ending where generation stops (`annotations`: GSM8K's calculator
        annotations kept, for the calculator environment)."""
        if self.name in ("r1_zero", "r1_zero_three_shot"):
            return r1_zero_response(example, annotations)
        if self.name in ("code", "code_chat"):
            return code_response(example, think=self.name == "code")
        if self.name not in PROMPTS and example.solution.strip():  # a user's prompt: the row's solution column
            return example.solution
        raise ValueError(f"prompt {self.name!r} has no SFT target; prompts with one: r1_zero, r1_zero_three_shot, "
                         "code, code_chat, and a user's prompt (prompt=row or a template file) on rows with a "
                         "solution_field column")


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
    if name == "row":
        return PromptTemplate(name, "{question}", stop=(), reward=None)
    if name == "reasoning_gym":  # built here: rlvr.tasks.reasoning_gym importing this module would be a cycle
        from rlvr.tasks.reasoning_gym import STOP, system_prompt

        return PromptTemplate(name, "{question}", stop=STOP, reward="reasoning_gym", chat=True, system=system_prompt())
    path = Path(name)
    if path.suffix in (".txt", ".prompt", ".md") or path.is_file():
        return template_file(path)
    import difflib

    close = difflib.get_close_matches(name, PROMPTS + USER_PROMPTS, n=1, cutoff=0.6)
    raise ValueError(f"unknown prompt {name!r}; {f'did you mean {close[0]!r}? ' if close else ''}"
                     f"valid: {', '.join(PROMPTS + USER_PROMPTS)}, or a template file path/to/prompt.txt")


def template_file(path: Path) -> PromptTemplate:
    """A user's template: the file's text with {question} or {column} placeholders ({{ }} for a literal brace);
    no stop strings (set `stop=`) and no reward of its own (set `rewards=`)."""
    if not path.is_file():
        raise ValueError(f"prompt {str(path)!r}: no such template file")
    text = path.read_text(encoding="utf-8")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
    except ValueError as err:
        raise ValueError(f"prompt {str(path)!r}: not a template ({err}); write literal braces as {{{{ }}}}") from None
    if not fields:
        raise ValueError(f"prompt {str(path)!r} has no placeholder: every row would get the same prompt; write "
                         "{question} or {column} where the row goes")
    bad = [f for f in fields if not f.isidentifier()]
    if bad:
        raise ValueError(f"prompt {str(path)!r}: placeholders must be column names, got {{{bad[0]}}}")
    return PromptTemplate(str(path), text, stop=(), reward=None)


def resolve_prompt(name: str, stop: list[str] | None = None, system_prompt: str | None = None,
                   chat: bool = False) -> PromptTemplate:
    """A run's prompt: a name or a template file, with the config's stop strings (None: the prompt's own), its
    system prompt and chat rendering (a system prompt implies it)."""
    prompt = get_prompt(name)
    if stop is not None:
        prompt = dataclasses.replace(prompt, stop=tuple(stop))
    if system_prompt is not None or chat:
        prompt = dataclasses.replace(prompt, system=system_prompt or prompt.system, chat=True)
    return prompt


PROMPTS = ("question_only", "r1_zero", "r1_zero_three_shot", "chat", "code", "code_chat")
# the prompts of a user's task: the row's own prompt (text verbatim, a conversation through the chat template)
# and reasoning-gym's (its default system prompt, the answer in <answer></answer>)
USER_PROMPTS = ("row", "reasoning_gym")

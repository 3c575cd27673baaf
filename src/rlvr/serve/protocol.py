"""The OpenAI wire as `rlvr serve` reads it: request bodies (pydantic, so a bad field answers 400 naming it), the
OpenAI error object, and a request's sampling fields turned into the engine's `SamplingParams`.

Fields follow OpenAI's API and vLLM's extras (top_k, min_p, repetition_penalty, min_tokens, stop_token_ids,
ignore_eos, skip_special_tokens, include_stop_str_in_output, return_token_ids, return_tokens_as_token_ids,
add_special_tokens, chat_template_kwargs). Unknown fields are ignored, as vLLM ignores them; fields rlvr's engine
cannot honour (presence/frequency penalties, logit_bias, prompt log-probs) answer 400 rather than being dropped.
"""

from __future__ import annotations

import secrets
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlvr.engines.base import SamplingParams

MAX_TOP_LOGPROBS = 20


class APIError(Exception):
    """An error answered as OpenAI's error object: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.code = status, message, param, kind, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False


class SamplingFields(_Body):
    """The sampling fields /v1/chat/completions and /v1/completions share."""

    model: str | None = None
    n: int = Field(1, ge=1, le=128)
    temperature: float | None = Field(None, ge=0, le=100)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    repetition_penalty: float | None = Field(None, gt=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else value or []
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return value


class FunctionCall(_Body):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Body):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(_Body):
    type: str
    text: str | None = None


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as one string: text parts joined (a part of another type answers 400)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        kinds = {part.type for part in self.content} - {"text"}
        if kinds:
            raise APIError(400, f"content parts of type {sorted(kinds)} are not supported (text only)", "messages")
        return "".join(part.text or "" for part in self.content)


class FunctionSpec(_Body):
    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Body):
    type: Literal["function"] = "function"
    function: FunctionSpec


class NamedToolChoice(_Body):
    type: Literal["function"] = "function"
    function: dict[str, str]


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_completion_tokens: int | None = Field(None, ge=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = False

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, value):
        if isinstance(value, list) and (not value or any(isinstance(p, list) and not p for p in value)):
            raise ValueError("a prompt must hold at least one token or string")
        return value


class GenerateSampling(_Body):
    """vLLM's SamplingParams as /inference/v1/generate takes them."""

    n: int = Field(1, ge=1, le=128)
    temperature: float = Field(1.0, ge=0, le=100)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    seed: int | None = None
    max_tokens: int | None = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    repetition_penalty: float = Field(1.0, gt=0)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    prompt_logprobs: int | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False


class GenerateRequest(_Body):
    request_id: str | None = None
    token_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSampling = GenerateSampling()
    model: str | None = None
    stream: bool = False


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[Message] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]


def sampling_params(body, prompt_tokens: int, max_model_len: int, default_max_tokens: int | None = None,
                    max_tokens: int | None = None) -> SamplingParams:
    """The engine's SamplingParams for a request's fields (SamplingFields or GenerateSampling). A prompt with no
    room left, or room for fewer ids than max_tokens asks, answers 400 with OpenAI's "maximum context length"
    wording (which clients look for). Without a seed, a random one (recorded with the call)."""
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(body, name, None):
            raise APIError(400, f"{name} is not supported by rlvr's engine (use repetition_penalty)", name)
    if getattr(body, "logit_bias", None):
        raise APIError(400, "logit_bias is not supported by rlvr's engine", "logit_bias")
    if getattr(body, "prompt_logprobs", None) is not None:
        raise APIError(400, "prompt_logprobs is not supported by rlvr's engine", "prompt_logprobs")
    room = max_model_len - prompt_tokens
    if room < 1:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, your request "
                            f"has {prompt_tokens} input tokens. Please reduce the length of the input.",
                       "messages", code="context_length_exceeded")
    if max_tokens is not None and max_tokens > room:
        raise APIError(400, f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the input, {max_tokens} in the "
                            "completion). Please reduce the length of the input or completion.", "max_tokens",
                       code="context_length_exceeded")
    new = max_tokens or min(room, default_max_tokens or room)
    stop = body.stop if body.stop is not None else ()
    temperature = 1.0 if body.temperature is None else body.temperature
    top_k = body.top_k if body.top_k is not None else 0
    try:
        return SamplingParams(
            temperature=temperature, top_p=body.top_p if body.top_p is not None else 1.0,
            top_k=max(top_k, 0), min_p=body.min_p or 0.0, max_new_tokens=new,
            min_new_tokens=min(body.min_tokens, new), repetition_penalty=body.repetition_penalty or 1.0,
            stop=(stop,) if isinstance(stop, str) else tuple(stop), n=body.n,
            seed=body.seed if body.seed is not None else secrets.randbits(63), logprobs=True)
    except ValueError as err:
        raise APIError(400, str(err).replace("SamplingParams.", "")) from None

"""The rollout engine interface: `generate(prompts, sampling) -> list[Completion]`, `sync_weights(policy)`.

Everything above the engine (training loops, evaluation, the demo) speaks only this interface, so another
backend -- vLLM, or an engine in another process or on another machine (a Ray actor) -- plugs in by
implementing two methods:

    generate(prompts, sampling, progress=None, keys=None) -> list[Completion]   len(prompts) * sampling.n
    sync_weights(policy)                                             sample from the policy's weights now

Optional capabilities are asked for in `SamplingParams`: per-token log-probs (`logprobs=True`) and
entropies (`entropy=True`) of the distribution sampled from, softmax(logits / temperature). An engine
that cannot provide them leaves `Completion.logprobs` / `.entropies` None.

`HFEngine` (rlvr.engines.hf) is the transformers implementation. This module imports neither torch nor
transformers, so configs can build `SamplingParams` cheaply.

A server (rlvr.serve) needs one more, step-level capability: `continuous_batch()` returning a `StepBatch`, which
requests join and leave between decode steps -- vLLM's LLMEngine interface (add_request / step / abort_request /
has_unfinished_requests), so a vLLM backend hands its own engine through; HFEngine's is rlvr.engines.continuous.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # keep the k likeliest ids (0: all)
    min_p: float = 0.0  # keep the ids at least min_p x as likely as the likeliest
    max_new_tokens: int = 256
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()  # stop strings; the matched string stays in the output text
    n: int = 1  # samples per prompt
    seed: int = 0
    logprobs: bool = False  # return each generated token's log-prob under softmax(logits / temperature)
    entropy: bool = False  # return the entropy of softmax(logits / temperature) at each generated token
    # a later call will likely continue these completions (a multi-turn episode's turn): an engine with a prefix
    # cache keeps their KV so that call prefills only its new ids; engines without one ignore it
    keep_cache: bool = False

    def __post_init__(self):
        checks = [
            ("temperature", self.temperature >= 0),
            ("top_p", 0 < self.top_p <= 1),
            ("top_k", self.top_k >= 0),
            ("min_p", 0 <= self.min_p <= 1),
            ("max_new_tokens", self.max_new_tokens >= 1),
            ("min_new_tokens", 0 <= self.min_new_tokens <= self.max_new_tokens),
            ("repetition_penalty", self.repetition_penalty > 0),
            ("n", self.n >= 1),
        ]
        for field, ok in checks:
            if not ok:
                raise ValueError(f"SamplingParams.{field}={getattr(self, field)!r} is out of range")
        if isinstance(self.stop, str) or any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("SamplingParams.stop must be a tuple of non-empty strings")


@dataclasses.dataclass
class Completion:
    prompt_index: int  # index into the prompts passed to generate
    sample_index: int  # 0..n-1
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (stop string or end-of-sequence token) or "length"
    logprobs: list[float] | None = None
    entropies: list[float] | None = None  # nats, per generated token (SamplingParams.entropy)
    # a multi-turn episode (rlvr.stages.episodes): True on the ids the engine sampled, False on observation
    # ids (their logprobs / entropies are NaN); None: every id was sampled
    loss_mask: list[bool] | None = None
    episode: dict | None = None  # what the episode did: turns, tool calls, how it ended


class StepBatch(Protocol):
    """A decode batch driven one step at a time (rlvr.engines.continuous.ContinuousBatch for HFEngine)."""

    def add_request(self, request_id: str, prompt_ids: list[int], sampling: SamplingParams, key: str | None = None,
                    top_logprobs: int = 0, stop_token_ids=(), ignore_eos: bool = False) -> None:
        """Queue `sampling.n` rows; a row's random stream is keyed as generate keys it (`key` or the ids)."""
        ...

    def step(self) -> list:
        """One new token for every live row (StepOutput: request id, sample index, id, log-prob, top log-probs,
        finish reason)."""
        ...

    def abort_request(self, request_id: str) -> None: ...

    def has_unfinished_requests(self) -> bool: ...


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str] | list[list[int]], sampling: SamplingParams, progress=None,
                 keys: list[str] | None = None) -> list[Completion]:
        """len(prompts) * sampling.n completions, prompt-major: prompt 0's samples first. A prompt is text or
        token ids (a multi-turn episode's history, used as it is). `keys`, when given, key each prompt's random
        streams instead of its text. `progress(k)`, when given, is called as k more completions finish."""
        ...

    def sync_weights(self, policy) -> None:
        """Make the engine sample from the policy's current weights."""
        ...

"""What the server records of each call, for a trainer that trains on the calls an agent made (issue 66).

Every completed call (chat, completions, generate; streamed or not) becomes a `CallRecord` handed to the server's
`on_record(record)` hook, in the server's event-loop thread, after the last token: the prompt ids the engine was
given, and per choice the ids it sampled with their sampling log-probs (always, whether or not the client asked
for log-probs) and the finish reason -- exactly what the engine produced, never a re-tokenisation. `admit(call)`,
called before a request is queued, can refuse it (return a message: the client gets 403 with it): an episode over
its budget of calls or tokens, a call after its episode ended, a temperature other than the run's.
`ServerHandle.end_episode(episode)` aborts an episode's calls in flight (a timed-out agent): each answers 409.

Calls are attributed to an episode by the client: its base_url `http://HOST:PORT/episodes/<episode>/v1` (every
route is served under `/episodes/<episode>` too; `ServerHandle.episode_url(episode)` builds it) or the header
`X-Episode-Id`. A call with neither has episode None.
"""

from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class CallStart:
    """What `admit` sees: the call before it is queued."""

    episode: str | None
    endpoint: str  # "chat.completions", "completions" or "generate"
    prompt_tokens: int  # one prompt's ids (a completions call with several prompts: their sum)
    max_tokens: int  # the most ids it may sample per choice
    n: int
    sampling: object = None  # the engine's SamplingParams it would run with (temperature, seed, ...)


@dataclasses.dataclass
class SampleRecord:
    """One choice: what the engine sampled for it."""

    index: int
    token_ids: list[int]  # every sampled id, the end token included
    logprobs: list[float]  # each id's log-prob under softmax(logits / temperature) (temperature 1 when greedy)
    finish_reason: str  # "stop", "length", "tool_calls", or "abort" (the client went away)
    text: str  # the content returned (before tool-call parsing: the model's text)
    tool_calls: list[dict] | None = None


@dataclasses.dataclass
class CallRecord:
    episode: str | None
    endpoint: str
    request_id: str
    prompt_ids: list[int]  # the ids the engine was given (a completions call with several prompts: one record each)
    samples: list[SampleRecord]
    seed: int  # the seed the sampling used (drawn at random when the request gave none)
    sampling: dict  # the engine's SamplingParams as a dict
    request: dict  # the request body as parsed (messages, tools, ...)
    spliced_turns: int = 0  # earlier assistant turns whose sampled ids the prompt holds (rlvr.serve.chat)
    weights_version: tuple[int, int] = (0, 0)  # the engine's weights_version when the call was queued and ended
    created: float = dataclasses.field(default_factory=time.time)
    finished: float = 0.0

"""One HTTP call in the engine: its prompts queued as submissions, their choices filled as the engine's steps
arrive, the call given up when its client goes away, and its records handed to the server's hooks."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time

from rlvr.serve.outputs import ChoiceState
from rlvr.serve.protocol import APIError
from rlvr.serve.records import CallRecord, CallStart, SampleRecord
from rlvr.serve.scheduler import EpisodeEnded, QueueFull, ShuttingDown, Submission

log = logging.getLogger(__name__)


_OBJECTS = {"chat.completions": ("chatcmpl", "chat.completion.chunk"), "completions": ("cmpl", "text_completion"),
            "generate": ("gen", "generate")}


class ClientGone(Exception):
    """The client disconnected before its answer was ready."""


@dataclasses.dataclass
class Hooks:
    """The server's hooks (rlvr.serve.records): `admit(CallStart) -> refusal | None`, `on_record(CallRecord)`."""

    admit: object = None
    on_record: object = None


@dataclasses.dataclass
class ServerState:
    """What every route reads: the engine and its scheduler, the tokenizer, the limits, the hooks."""

    engine: object
    tokenizer: object
    scheduler: object
    model_name: str
    max_model_len: int
    parser: object  # rlvr.serve.tools parser
    memory: object = None  # rlvr.serve.chat.SampledTurns, or None: re-rendered turns are tokenised from their text
    hooks: Hooks = dataclasses.field(default_factory=Hooks)
    api_key: str | None = None
    default_max_tokens: int | None = None
    max_body_bytes: int = 8 * 2**20
    draining: bool = False

    def __post_init__(self):
        self.vocab = self.engine.model.get_input_embeddings().weight.shape[0]
        self.max_rows = self.scheduler.max_rows

    def check(self, model: str | None, n: int = 1) -> None:
        """The request names this server's model (or none), asks for rows the batch holds, and the server is open."""
        if self.draining:
            raise APIError(503, "the server is shutting down", kind="service_unavailable", code="shutting_down")
        if model and model != self.model_name:
            raise APIError(404, f"The model `{model}` does not exist (this server serves `{self.model_name}`)",
                           "model", code="model_not_found")
        if n > self.max_rows:
            raise APIError(400, f"n={n} is more choices than the server decodes at once ({self.max_rows}: "
                                "`rlvr serve max_rows=`)", "n")

    def check_ids(self, ids: list[int], field: str) -> None:
        bad = next((i for i in ids if not 0 <= i < self.vocab), None)
        if bad is not None:
            raise APIError(400, f"{field}: token id {bad} is not in the vocabulary (0..{self.vocab - 1})", field)


class Call:
    """The engine work of one request: one submission per prompt, `sampling.n` choices each."""

    def __init__(self, state, endpoint: str, episode: str | None, prompts: list[list[int]], sampling,
                 choice_args: dict, body: dict, top_logprobs: int = 0, stop_token_ids=(), ignore_eos=False,
                 spliced: int = 0):
        self.state, self.endpoint, self.episode, self.body, self.spliced = state, endpoint, episode, body, spliced
        self.id = secrets.token_hex(12)
        self.created = int(time.time())
        self.prompts, self.sampling = prompts, sampling
        self.events: asyncio.Queue = asyncio.Queue()
        self.subs = [Submission(f"{self.id}-{p}", ids, sampling, top_logprobs, tuple(stop_token_ids or ()),
                                ignore_eos, episode).bind(self.events) for p, ids in enumerate(prompts)]
        n = sampling.n
        self.choices = [ChoiceState(p * n + s, state.tokenizer, sampling.stop, **choice_args)
                        for p in range(len(prompts)) for s in range(n)]
        self._by_id = {sub.request_id: p for p, sub in enumerate(self.subs)}
        self._open = set(self._by_id)
        self.version = state.engine.weights_version
        self.recorded = False

    def head(self, choices: list[dict], **extra) -> dict:
        """A streamed chunk of this call."""
        prefix, kind = _OBJECTS[self.endpoint]
        return {"id": f"{prefix}-{self.id}", "object": kind, "created": self.created, "model": self.state.model_name,
                "choices": choices, **extra}

    def admit(self) -> None:
        """Ask the admit hook, then queue every prompt (429 when the queue is full, 503 when shutting down)."""
        batch = self.state.scheduler.batch
        for ids in self.prompts:
            need = batch.kv_bytes(len(ids), self.sampling)
            if batch.max_kv_bytes and need > batch.max_kv_bytes:
                raise APIError(400, f"{self.sampling.n} choice(s) of {len(ids)} prompt + "
                                    f"{self.sampling.max_new_tokens} new tokens need {need / 2**20:.0f} MiB of KV "
                                    f"cache, more than the server's {batch.max_kv_bytes / 2**20:.0f} MiB (`rlvr serve "
                                    "max_kv_mib=`): ask for fewer max_tokens or choices", "max_tokens")
        hook = self.state.hooks.admit
        if hook is not None:
            start = CallStart(self.episode, self.endpoint, sum(map(len, self.prompts)), self.sampling.max_new_tokens,
                              self.sampling.n, self.sampling)
            refusal = hook(start)
            if refusal:
                raise APIError(403, str(refusal), kind="permission_error", code="refused")
        try:
            for sub in self.subs:
                self.state.scheduler.submit(sub)
        except QueueFull as err:
            self.cancel()
            raise APIError(429, str(err), kind="rate_limit_error", code="queue_full") from None
        except ShuttingDown as err:
            self.cancel()
            raise APIError(503, str(err), kind="service_unavailable", code="shutting_down") from None

    def cancel(self) -> None:
        for request_id in self._open:
            self.state.scheduler.cancel(request_id)

    @property
    def done(self) -> bool:
        return not self._open

    async def updates(self):
        """Yield after each batch of new tokens (the choices are updated) until every prompt has finished."""
        while self._open:
            request_id, item = await self.events.get()
            if item is None:
                self._open.discard(request_id)
            elif isinstance(item, ShuttingDown):
                self._open.discard(request_id)
                raise APIError(503, str(item), kind="service_unavailable", code="shutting_down")
            elif isinstance(item, EpisodeEnded):
                self._open.discard(request_id)
                self.cancel()
                self.record(aborted=True)
                raise APIError(409, str(item), kind="conflict_error", code="episode_ended")
            elif isinstance(item, Exception):
                self._open.discard(request_id)
                raise APIError(400 if isinstance(item, ValueError) else 500, str(item),
                               kind="invalid_request_error" if isinstance(item, ValueError) else "internal_error")
            else:
                base = self._by_id[request_id] * self.sampling.n
                for out in item:
                    self.choices[base + out.sample_index].add(out)
            yield

    async def wait(self, request) -> None:
        """Run to the end; ClientGone (and the call cancelled) if the client disconnects first."""
        async def drain():
            async for _ in self.updates():
                pass

        async def gone():
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(drain()), asyncio.ensure_future(gone())
        abandoned = False
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                abandoned = True
                work.cancel()
                self.cancel()
                self.record(aborted=True)
        # (a task asked to cancel is not yet `cancelled()`: its result is not set, and asking for it would raise)
        if abandoned or work.cancelled():
            raise ClientGone()
        work.result()

    def record(self, aborted: bool = False, texts: list[str] | None = None, calls: list | None = None) -> None:
        """Hand one CallRecord per prompt to on_record (once per call; errors in the hook are logged, not raised)."""
        hook = self.state.hooks.on_record
        if hook is None or self.recorded:
            return
        self.recorded = True
        n = self.sampling.n
        version = (self.version, self.state.engine.weights_version)
        for p, ids in enumerate(self.prompts):
            samples = []
            for choice in self.choices[p * n:(p + 1) * n]:
                if aborted:
                    choice.abort()
                k = choice.index
                samples.append(SampleRecord(k, list(choice.token_ids), list(choice.logprobs), choice.finish_reason
                                            or "abort", texts[k] if texts else choice.text(),
                                            calls[k] if calls else None))
            record = CallRecord(self.episode, self.endpoint, self.subs[p].request_id, list(ids), samples,
                                self.sampling.seed, dataclasses.asdict(self.sampling), self.body, self.spliced,
                                version, float(self.created), time.time())
            try:
                hook(record)
            except Exception:  # noqa: BLE001 -- a trainer's hook must not fail the client's call
                log.exception("the on_record hook raised; the call is answered anyway")

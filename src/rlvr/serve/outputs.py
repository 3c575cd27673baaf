"""A choice as it is sampled: its ids, log-probs and finish reason from the engine's steps, its text (cut at a stop
string, end token left out, as vLLM writes it), the text a stream may send so far, and the wire's log-prob shapes.
"""

from __future__ import annotations

from rlvr.engines.continuous import StepOutput


class ChoiceState:
    """One choice of one prompt (see the module)."""

    def __init__(self, index: int, tokenizer, stops: tuple[str, ...] = (), include_stop: bool = False,
                 skip_special: bool = True, marker: str | None = None, hold_all: bool = False):
        """`marker`: a tool call's start (a stream holds back from it); `hold_all`: a stream sends nothing before
        the end (a tool parser without a marker)."""
        self.index, self.tokenizer, self.stops = index, tokenizer, stops
        self.include_stop, self.skip_special, self.marker, self.hold_all = include_stop, skip_special, marker, hold_all
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.top: list[list[tuple[int, float]]] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | int | None = None
        self.sent = ""  # text already streamed
        self.sent_tokens = 0  # ids already streamed (their log-probs and ids go with the text)
        self.closed = False  # its last chunk has been streamed

    def add(self, out: StepOutput) -> None:
        self.token_ids.append(out.token_id)
        self.logprobs.append(out.logprob if out.logprob is not None else float("nan"))
        self.top.append(out.top_logprobs or [])
        if out.finish_reason is not None:
            self.finish_reason, self.stop_reason = out.finish_reason, out.stop_reason

    def abort(self) -> None:
        if self.finish_reason is None:
            self.finish_reason = "abort"

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def text_ids(self) -> list[int]:
        """The ids the text is decoded from: an end token or stop token id that ended the choice is left out."""
        ended_by_id = self.finish_reason == "stop" and not isinstance(self.stop_reason, str)
        return self.token_ids[:-1] if ended_by_id and self.token_ids else self.token_ids

    def text(self) -> str:
        """The choice's text so far; once finished at a stop string, cut before it (or after, include_stop)."""
        text = self.tokenizer.decode(self.text_ids(), skip_special_tokens=self.skip_special)
        if self.done and isinstance(self.stop_reason, str):
            hits = [(text.find(s), s) for s in self.stops if s in text]
            if hits:
                at, stop = min(hits)
                text = text[: at + (len(stop) if self.include_stop else 0)]
        return text

    def delta(self) -> tuple[str, int]:
        """(text a stream may send now, ids that go with it): what is new since the last delta, holding back an
        unfinished character, a possible stop string's beginning and (with tools) a possible tool call."""
        text = self.text()
        if not self.done:
            if self.hold_all:
                return "", 0
            safe = len(text.rstrip("\ufffd"))
            if self.stops:
                safe = min(safe, len(text) - (max(len(s) for s in self.stops) - 1))
            if self.marker:
                at = text.find(self.marker, len(self.sent))
                safe = min(safe, at if at >= 0 else len(text) - _partial(text, self.marker))
            text = text[: max(safe, len(self.sent))]
        if not text.startswith(self.sent):  # decoding more ids rewrote earlier text (rare): send nothing more
            return "", 0
        new, self.sent = text[len(self.sent):], text
        ids = len(self.token_ids) - self.sent_tokens if (new or self.done) else 0
        self.sent_tokens += ids
        return new, ids


def _partial(text: str, marker: str) -> int:
    """How many of text's last characters are the start of `marker`."""
    for k in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:k]):
            return k
    return 0


def token_strings(tokenizer, ids: list[int], as_ids: bool) -> list[str]:
    """Each id's text, or "token_id:N" (return_tokens_as_token_ids)."""
    if as_ids:
        return [f"token_id:{i}" for i in ids]
    return tokenizer.batch_decode([[i] for i in ids])


def chat_logprobs(tokenizer, choice: ChoiceState, start: int, stop: int, top: int, as_ids: bool) -> dict:
    """OpenAI chat log-probs ({"content": [{token, logprob, bytes, top_logprobs}]}) for ids start..stop."""
    ids = choice.token_ids[start:stop]
    names = token_strings(tokenizer, ids, as_ids)
    tops = [choice.top[k][:top] for k in range(start, stop)]
    top_names = token_strings(tokenizer, [t for row in tops for t, _ in row], as_ids)
    content, at = [], 0
    for name, lp, row in zip(names, choice.logprobs[start:stop], tops):
        alternatives = []
        for _, value in row:
            alternatives.append({"token": top_names[at], "logprob": value, "bytes": list(top_names[at].encode())})
            at += 1
        content.append({"token": name, "logprob": lp, "bytes": list(name.encode()), "top_logprobs": alternatives})
    return {"content": content}


def completion_logprobs(tokenizer, choice: ChoiceState, start: int, stop: int, top: int, as_ids: bool,
                        offset: int = 0) -> dict:
    """OpenAI completions log-probs ({tokens, token_logprobs, top_logprobs, text_offset}) for ids start..stop."""
    ids = choice.token_ids[start:stop]
    names = token_strings(tokenizer, ids, as_ids)
    offsets, at = [], offset
    for name in names:
        offsets.append(at)
        at += len(name)
    tops = None
    if top:
        tops = []
        for k in range(start, stop):
            row = choice.top[k][:top]
            tops.append(dict(zip(token_strings(tokenizer, [t for t, _ in row], as_ids), [v for _, v in row])))
    return {"tokens": names, "token_logprobs": choice.logprobs[start:stop], "top_logprobs": tops,
            "text_offset": offsets}

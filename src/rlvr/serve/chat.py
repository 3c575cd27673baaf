"""Chat turns to prompt ids: the tokenizer's chat template (tools passed to it), a fallback for templates without
a tool format, and the sampled ids of earlier turns put back where a prompt re-renders them.

Token exactness across turns. An agent's second call re-sends the first turn as text; tokenising that text again
need not give the ids the engine sampled (a model may sample a non-canonical split of a word; a turn cut at a
length limit has no end token). `SampledTurns` remembers, for recent completions, the sampled ids by the content
returned (and by tool-call ids, for a turn returned as tool calls), within each episode; a prompt of that episode
that renders such a turn gets those ids in its place. So a second prompt starts with the first prompt + the
sampled ids whenever the template renders the first prompt unchanged as the start of the second and the earlier
turn's content as it was returned. Where not:

- a template that rewrites history (Qwen3 drops <think> blocks of earlier turns; a template that strips or
  reformats content): the prefix breaks there; rendered text is checked, and a turn it changed is tokenised from
  the template's text (the whole prompt is then tokenised plainly);
- a turn cut by a stop string (its content excludes the stop string the sampled ids hold), or a turn whose ids
  hold special tokens the returned text leaves out (skip_special_tokens): tokenised from its text;
- a native tool template (the model's own tool format) re-renders tool calls from their JSON: tokenised; rlvr's
  fallback format (below) renders them as the text the model wrote, spliced;
- the assistant header the template writes after a turn's end token (ChatML's "\n") is template text, not sampled:
  the second prompt is the first prompt + the sampled ids + the template's ids for what follows.

Templates without a tool format (the default model's, for one): the tools are described in a system message
(rlvr.serve.tools.tools_prompt, Hermes' layout), an assistant turn with tool calls is rendered as <tool_call>
blocks (the model's own text when remembered), and tool results as a user turn inside <tool_response> tags.
"""

from __future__ import annotations

import collections
import json
import re
import threading

from rlvr.serve.protocol import APIError, Message
from rlvr.serve.tools import hermes_call_text, tools_prompt


class SampledTurns:
    """The engine's ids for recent completions, keyed by the content returned and by tool-call ids (LRU), per
    episode (`scoped`): an episode's prompt gets back its own turns' ids, never another's for the same text."""

    def __init__(self, max_entries: int = 4096, scope: tuple = (None,), tables=None):
        self.max_entries, self.scope = max_entries, scope
        self.by_text, self.by_calls, self.lock = tables or (collections.OrderedDict(), collections.OrderedDict(),
                                                            threading.Lock())

    def scoped(self, episode: str | None) -> SampledTurns:
        """The same tables, keyed within `episode` (None: calls attributed to no episode)."""
        return SampledTurns(self.max_entries, (episode,), (self.by_text, self.by_calls, self.lock))

    def remember(self, text: str, ids: list[int], call_ids: tuple[str, ...] = ()) -> None:
        """`ids` decode to `text` exactly (the caller checks); `call_ids`: the tool calls returned for it."""
        if not text or self.max_entries <= 0:
            return
        with self.lock:
            self.by_text[self.scope + (text,)] = list(ids)
            self.by_text.move_to_end(self.scope + (text,))
            if call_ids:
                self.by_calls[self.scope + tuple(call_ids)] = text
            for table in (self.by_text, self.by_calls):
                while len(table) > self.max_entries:
                    table.popitem(last=False)

    def ids(self, text: str) -> list[int] | None:
        with self.lock:
            return self.by_text.get(self.scope + (text,))

    def call_text(self, call_ids: tuple[str, ...]) -> str | None:
        with self.lock:
            return self.by_calls.get(self.scope + tuple(call_ids))


def native_tools(tokenizer) -> bool:
    """Whether the chat template renders `tools` itself."""
    template = tokenizer.chat_template
    return isinstance(template, str) and "tools" in template


def _arguments(value):
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def conversation(messages: list[Message], tools: list[dict] | None, tool_choice, native: bool,
                 memory: SampledTurns | None) -> list[dict]:
    """The messages as the chat template takes them; without a native tool format, rlvr's fallback (module doc)."""
    out: list[dict] = []
    for m in messages:
        role = "system" if m.role == "developer" else m.role
        entry = {"role": role, "content": m.text()}
        if m.name:
            entry["name"] = m.name
        calls = [c.model_dump() for c in m.tool_calls or []]
        if native:
            if calls:
                entry["tool_calls"] = [{"id": c["id"], "type": "function", "function": {
                    "name": c["function"]["name"], "arguments": _arguments(c["function"]["arguments"])}} for c in calls]
            if m.tool_call_id:
                entry["tool_call_id"] = m.tool_call_id
        elif calls:
            said = memory.call_text(tuple(c["id"] for c in calls)) if memory is not None else None
            entry["content"] = said if said is not None else "\n".join(
                part for part in (entry["content"], hermes_call_text(calls)) if part)
        elif role == "tool":
            result = f"<tool_response>\n{entry['content']}\n</tool_response>"
            if out and out[-1].get("tool_results"):  # consecutive results: one user turn
                out[-1]["content"] += "\n" + result
                continue
            entry = {"role": "user", "content": result, "tool_results": True}
        out.append(entry)
    for entry in out:
        entry.pop("tool_results", None)
    if tools and not native:
        text = tools_prompt(tools, tool_choice)
        if out[0]["role"] == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{text}" if out[0]["content"] else text}
        else:
            out.insert(0, {"role": "system", "content": text})
    return out


def _template(tokenizer, turns: list[dict], tools, add_generation_prompt: bool, continue_final_message: bool,
              kwargs: dict | None) -> str:
    try:
        return tokenizer.apply_chat_template(turns, tools=tools, tokenize=False,
                                             add_generation_prompt=add_generation_prompt and not continue_final_message,
                                             continue_final_message=continue_final_message, **(kwargs or {}))
    except Exception as err:  # noqa: BLE001 -- a template's own error (roles out of order, ...) is the request's
        raise APIError(400, f"the chat template cannot render these messages: {type(err).__name__}: {err}",
                       "messages") from None


def render_chat(tokenizer, messages: list[Message], tools: list[dict] | None = None, tool_choice=None,
                add_generation_prompt: bool = True, continue_final_message: bool = False,
                chat_template_kwargs: dict | None = None, memory: SampledTurns | None = None) -> tuple[list[int], int]:
    """(prompt ids, how many earlier turns hold their sampled ids). The ids are the template's text tokenised
    without added special tokens (as apply_chat_template(tokenize=True)), with remembered turns spliced in."""
    if not isinstance(tokenizer.chat_template, str):
        raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions with a prompt",
                       "messages")
    native = native_tools(tokenizer)
    turns = conversation(messages, tools, tool_choice, native, memory)
    passed = tools if native and tools else None
    plain = _template(tokenizer, turns, passed, add_generation_prompt, continue_final_message, chat_template_kwargs)
    splices: dict[str, tuple[list[int], str]] = {}
    if memory is not None:
        marked = []
        for i, turn in enumerate(turns):
            ids = memory.ids(turn["content"]) if turn["role"] == "assistant" and turn["content"] else None
            if ids is not None and not (continue_final_message and i == len(turns) - 1):
                sentinel = f"\x00rlvr-sampled-{i}\x00"
                splices[sentinel] = (ids, turn["content"])
                turn = {**turn, "content": sentinel}
            marked.append(turn)
        if splices:
            text = _template(tokenizer, marked, passed, add_generation_prompt, continue_final_message,
                             chat_template_kwargs)
            rebuilt = text
            for sentinel, (_, content) in splices.items():
                rebuilt = rebuilt.replace(sentinel, content) if text.count(sentinel) == 1 else "\x00"
            if rebuilt != plain:  # the template changed a turn's text: no splicing (module doc)
                splices = {}
            else:
                plain = text
    ids: list[int] = []
    for piece in re.split("(\x00rlvr-sampled-\\d+\x00)", plain) if splices else [plain]:
        if piece in splices:
            ids += splices[piece][0]
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False).input_ids
    return ids, len(splices)

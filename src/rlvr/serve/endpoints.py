"""The generating routes: /v1/chat/completions, /v1/completions and vLLM's token-in/token-out
/inference/v1/generate, each answered whole or (the first two) streamed as server-sent events."""

from __future__ import annotations

import json
import secrets

from pydantic import BaseModel
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse

from rlvr.serve.calls import Call
from rlvr.serve.chat import render_chat
from rlvr.serve.outputs import chat_logprobs, completion_logprobs
from rlvr.serve.protocol import APIError, ChatCompletionRequest, CompletionRequest, GenerateRequest, sampling_params
from rlvr.serve.tools import check_tools, parse_none, parse_turn

_DONE = "data: [DONE]\n\n"


def _event(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def _usage(call: Call) -> dict:
    prompt, sampled = sum(map(len, call.prompts)), sum(len(c.token_ids) for c in call.choices)
    return {"prompt_tokens": prompt, "completion_tokens": sampled, "total_tokens": prompt + sampled}


def _remember(memory, tokenizer, choice, text: str, tool_calls: list[dict]) -> None:
    """Keep a finished turn's sampled ids for a later prompt of its episode that re-renders it (rlvr.serve.chat)."""
    if memory is None or choice.finish_reason not in ("stop", "length"):
        return
    ids = choice.text_ids()
    if tokenizer.decode(ids, skip_special_tokens=False) == text:
        memory.remember(text, ids, tuple(c["id"] for c in tool_calls))


def _tool_calls(calls: list[dict]) -> list[dict]:
    return [{"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": c} for c in calls]


def _stream(call: Call, pieces, tail, opening: str | None = None) -> StreamingResponse:
    """SSE: `opening`, then `pieces(choice) -> dict | None` after each step, then `tail()`'s events; the call cancelled
    and recorded as aborted if the client goes away (or the server stops) before the end."""
    async def events():
        try:
            if opening is not None:
                yield opening
            async for _ in call.updates():
                out = [p for c in call.choices if not c.closed and (p := pieces(c)) is not None]
                if out:
                    yield _event(call.head(out))
            for event in tail():
                yield event
            yield _DONE
        except APIError as err:  # after the 200 has gone out: the error as an event, as vLLM sends it
            yield _event(err.body())
            yield _DONE
        finally:
            if not call.done:
                call.cancel()
                call.record(aborted=True)

    return StreamingResponse(events(), media_type="text/event-stream")


# ----------------------------------------------------------------------------------------------------
# /v1/chat/completions


async def chat_completion(state, body: ChatCompletionRequest, request, episode: str | None):
    state.check(body.model, body.n)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    if tools:
        check_tools(tools)
    if (body.response_format or {}).get("type", "text") != "text":
        raise APIError(400, "response_format other than text is not supported (rlvr does not constrain decoding)",
                       "response_format")
    choice = body.tool_choice.model_dump() if isinstance(body.tool_choice, BaseModel) else body.tool_choice
    memory = state.memory.scoped(episode) if state.memory is not None else None
    ids, spliced = await run_in_threadpool(
        render_chat, state.tokenizer, body.messages, tools, choice, body.add_generation_prompt,
        body.continue_final_message, body.chat_template_kwargs, memory)
    sampling = sampling_params(body, len(ids), state.max_model_len, state.default_max_tokens,
                               body.max_completion_tokens or body.max_tokens)
    parsing = bool(tools) and choice != "none" and state.parser is not parse_none
    marker = getattr(state.parser, "start_marker", None) if parsing else None
    top = (body.top_logprobs or 0) if body.logprobs else 0
    call = Call(state, "chat.completions", episode, [ids], sampling,
                {"include_stop": body.include_stop_str_in_output, "skip_special": body.skip_special_tokens,
                 "marker": marker, "hold_all": parsing and marker is None},
                body.model_dump(exclude_none=True), top, body.stop_token_ids, body.ignore_eos, spliced)
    call.admit()
    if body.stream:
        return _chat_stream(state, call, body, parsing, marker, memory)
    await call.wait(request)
    out, texts, made = [], [], []
    for c in call.choices:
        text = c.text()
        content, calls = parse_turn(state.parser, text) if parsing else (text, [])
        calls = _tool_calls(calls)
        message = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
        entry = {"index": c.index, "message": message, "finish_reason": "tool_calls" if calls else c.finish_reason,
                 "stop_reason": c.stop_reason, "logprobs": chat_logprobs(
                     state.tokenizer, c, 0, len(c.token_ids), top, body.return_tokens_as_token_ids)
                 if body.logprobs else None}
        if body.return_token_ids:
            entry["token_ids"] = c.token_ids
        out.append(entry)
        texts.append(text)
        made.append(calls or None)
        _remember(memory, state.tokenizer, c, text, calls)
    answer = {"id": f"chatcmpl-{call.id}", "object": "chat.completion", "created": call.created,
              "model": state.model_name, "choices": out, "usage": _usage(call)}
    if body.return_token_ids:
        answer["prompt_token_ids"] = ids
    call.record(texts=texts, calls=made)
    return JSONResponse(answer)


def _chat_stream(state, call: Call, body: ChatCompletionRequest, parsing: bool, marker: str | None, memory):
    top = (body.top_logprobs or 0) if body.logprobs else 0
    made: dict[int, list] = {}
    first = [{"index": c.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
              "finish_reason": None} for c in call.choices]
    opening = _event(call.head(first, **({"prompt_token_ids": call.prompts[0]} if body.return_token_ids else {})))

    def piece(c):
        start, calls = c.sent_tokens, []
        if c.done and parsing:
            full = c.text()
            _, found = parse_turn(state.parser, full)
            if found:
                calls = made[c.index] = _tool_calls(found)
                before = full[: full.find(marker)] if marker and marker in full else ""
                text = before[len(c.sent):] if before.startswith(c.sent) else ""
                c.sent, c.sent_tokens = full, len(c.token_ids)
            else:
                text, _ = c.delta()
        else:
            text, _ = c.delta()
        if not c.done and not text:
            return None
        stop = c.sent_tokens
        delta = {**({"content": text} if text else {}),
                 **({"tool_calls": [{"index": k, **t} for k, t in enumerate(calls)]} if calls else {})}
        entry = {"index": c.index, "delta": delta, "finish_reason": None, "logprobs": chat_logprobs(
            state.tokenizer, c, start, stop, top, body.return_tokens_as_token_ids) if body.logprobs else None}
        if body.return_token_ids:
            entry["token_ids"] = c.token_ids[start:stop]
        if c.done:
            entry["finish_reason"], entry["stop_reason"] = ("tool_calls" if calls else c.finish_reason), c.stop_reason
            c.closed = True
            _remember(memory, state.tokenizer, c, c.text(), calls)
        return entry

    def tail():
        if body.stream_options is not None and body.stream_options.include_usage:
            yield _event(call.head([], usage=_usage(call)))
        call.record(calls=[made.get(c.index) for c in call.choices])

    return _stream(call, piece, tail, opening)


# ----------------------------------------------------------------------------------------------------
# /v1/completions and /inference/v1/generate


async def completion(state, body: CompletionRequest, request, episode: str | None):
    state.check(body.model, body.n)
    if body.suffix:
        raise APIError(400, "suffix is not supported", "suffix")
    if body.best_of is not None and body.best_of != body.n:
        raise APIError(400, "best_of other than n is not supported", "best_of")
    if body.echo and body.logprobs is not None:
        raise APIError(400, "echo with logprobs would need the prompt's log-probs, which rlvr does not compute", "echo")
    given = body.prompt
    if isinstance(given, str) or (isinstance(given, list) and isinstance(given[0], str)):
        texts = [given] if isinstance(given, str) else given
        prompts = await run_in_threadpool(
            lambda: [state.tokenizer(t, add_special_tokens=body.add_special_tokens).input_ids for t in texts])
    else:
        prompts = [given] if isinstance(given[0], int) else given
    for k, ids in enumerate(prompts):
        if not ids:
            raise APIError(400, f"prompt {k} is empty (no tokens)", "prompt")
        state.check_ids(ids, "prompt")
    sampling = sampling_params(body, max(map(len, prompts)), state.max_model_len, state.default_max_tokens,
                               body.max_tokens)
    top = body.logprobs or 0
    call = Call(state, "completions", episode, prompts, sampling,
                {"include_stop": body.include_stop_str_in_output, "skip_special": body.skip_special_tokens},
                body.model_dump(exclude_none=True), top, body.stop_token_ids, body.ignore_eos)
    echoes = [state.tokenizer.decode(ids) if body.echo else "" for ids in prompts]
    call.admit()
    as_ids = body.return_tokens_as_token_ids

    def entry(c, text, start, stop):
        out = {"index": c.index, "text": text, "finish_reason": c.finish_reason if c.done else None,
               "stop_reason": c.stop_reason, "logprobs": None if body.logprobs is None else
               completion_logprobs(state.tokenizer, c, start, stop, top, as_ids)}
        if body.return_token_ids:
            out["token_ids"] = c.token_ids[start:stop]
            out["prompt_token_ids"] = call.prompts[c.index // body.n] if start == 0 else None
        return out

    if body.stream:
        def piece(c):
            start = c.sent_tokens
            text, _ = c.delta()
            if not c.done and not text:
                return None
            if start == 0:
                text = echoes[c.index // body.n] + text
            c.closed = c.done
            return entry(c, text, start, c.sent_tokens)

        def tail():
            if body.stream_options is not None and body.stream_options.include_usage:
                yield _event(call.head([], usage=_usage(call)))
            call.record()

        return _stream(call, piece, tail)
    await call.wait(request)
    out = [entry(c, echoes[c.index // body.n] + c.text(), 0, len(c.token_ids)) for c in call.choices]
    call.record()
    return JSONResponse({"id": f"cmpl-{call.id}", "object": "text_completion", "created": call.created,
                         "model": state.model_name, "choices": out, "usage": _usage(call)})


async def generate(state, body: GenerateRequest, request, episode: str | None):
    """vLLM's token-in/token-out route: token_ids + sampling_params -> choices[].token_ids, log-probs, finish."""
    params = body.sampling_params
    state.check(body.model, params.n)
    if body.stream:
        raise APIError(400, "stream is not supported on /inference/v1/generate", "stream")
    state.check_ids(body.token_ids, "token_ids")
    sampling = sampling_params(params, len(body.token_ids), state.max_model_len, state.default_max_tokens,
                               params.max_tokens)
    top = params.logprobs or 0
    call = Call(state, "generate", episode, [body.token_ids], sampling,
                {"include_stop": params.include_stop_str_in_output, "skip_special": params.skip_special_tokens},
                body.model_dump(exclude_none=True), top, params.stop_token_ids, params.ignore_eos)
    call.admit()
    await call.wait(request)
    # tokens named "token_id:<id>", as vLLM's route names them (verifiers' renderers check that each one is its id)
    choices = [{"index": c.index, "token_ids": c.token_ids, "finish_reason": c.finish_reason,
                "logprobs": chat_logprobs(state.tokenizer, c, 0, len(c.token_ids), top, True)
                if params.logprobs is not None else None} for c in call.choices]
    call.record()
    return JSONResponse({"request_id": body.request_id or call.id, "choices": choices, "prompt_logprobs": None})

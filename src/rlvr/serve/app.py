"""The FastAPI application of `rlvr serve`: its routes (each also under /episodes/{episode}, rlvr.serve.records),
the optional API key, a body-size limit, and every error as OpenAI's error object -- bad JSON or a bad field 400
naming it, an unknown route 404, a failure of rlvr's 500 with one line, never a stack trace."""

from __future__ import annotations

import hmac
import logging
import time

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.exceptions import RequestValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse, Response

from rlvr.serve import endpoints
from rlvr.serve.calls import ClientGone, ServerState
from rlvr.serve.chat import render_chat
from rlvr.serve.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    GenerateRequest,
    TokenizeRequest,
)
from rlvr.serve.tools import check_tools

log = logging.getLogger(__name__)


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
           code: str | None = None) -> JSONResponse:
    return JSONResponse(APIError(status, message, param, kind, code).body(), status_code=status)


def _validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """One line per problem, each naming its field (dotted, as the client wrote it) -- and the first field."""
    lines, first = [], None
    for item in err.errors():
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        if item.get("type") == "json_invalid":
            detail = (item.get("ctx") or {}).get("error", item.get("msg"))
            lines.append(f"malformed JSON body: {detail}")
            continue
        field = ".".join(loc) if loc else "body"
        first = first or field
        message = item.get("msg", "invalid").removeprefix("Value error, ")
        given = item.get("input")
        shown = f" (got {given!r})" if isinstance(given, (int, float, str, bool)) and len(repr(given)) <= 60 else ""
        lines.append(f"{field}: {message}{shown}")
    return "; ".join(lines) or "invalid request", first


class BodyLimit:
    """Refuse a request body over `limit` bytes (413), declared or streamed."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope.get("headers") or []).get(b"content-length")
        too_big = APIError(413, f"the request body is over the server's limit of {self.limit} bytes", "body")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await JSONResponse(too_big.body(), status_code=413)(scope, receive, send)
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.limit:
                raise too_big
            return message

        return await self.app(scope, counted, send)


def build_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="rlvr serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.rlvr = state

    @app.exception_handler(APIError)
    async def _api_error(request, err: APIError):
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, err: RequestValidationError):
        message, field = _validation_message(err)
        return _error(400, message, field)

    @app.exception_handler(HTTPException)
    async def _http(request, err: HTTPException):
        return _error(err.status_code, str(err.detail), kind="not_found_error" if err.status_code == 404
                      else "invalid_request_error")

    @app.exception_handler(ClientGone)
    async def _gone(request, err):
        return Response(status_code=499)

    @app.exception_handler(Exception)
    async def _bug(request, err: Exception):
        log.exception("%s %s failed", request.method, request.url.path)
        return _error(500, f"internal error: {type(err).__name__}: {err} (logged by the server)",
                      kind="internal_error")

    def authorized(authorization: str | None = Header(None)) -> None:
        if state.api_key is None:
            return
        given = (authorization or "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), state.api_key.encode()):
            raise APIError(401, "Incorrect API key provided (send it as Authorization: Bearer <key>)",
                           kind="authentication_error", code="invalid_api_key")

    def episode_of(episode: str | None, header: str | None) -> str | None:
        return episode or header or None

    router = APIRouter(dependencies=[Depends(authorized)])

    @router.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "rlvr", "root": state.model_name,
                                            "max_model_len": state.max_model_len}]}

    @router.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request, episode: str | None = None,
                   x_episode_id: str | None = Header(None)):
        return await endpoints.chat_completion(state, body, request, episode_of(episode, x_episode_id))

    @router.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request, episode: str | None = None,
                          x_episode_id: str | None = Header(None)):
        return await endpoints.completion(state, body, request, episode_of(episode, x_episode_id))

    @router.post("/inference/v1/generate")
    async def generate(body: GenerateRequest, request: Request, episode: str | None = None,
                       x_episode_id: str | None = Header(None)):
        return await endpoints.generate(state, body, request, episode_of(episode, x_episode_id))

    async def tokenize(body: TokenizeRequest, episode: str | None = None, x_episode_id: str | None = Header(None)):
        state.check(body.model)
        if (body.prompt is None) == (body.messages is None):
            raise APIError(400, "give either prompt or messages", "prompt")
        if body.messages is not None:
            tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
            if tools:
                check_tools(tools)
            ids, _ = await run_in_threadpool(render_chat, state.tokenizer, body.messages, tools, None,
                                             body.add_generation_prompt, body.continue_final_message,
                                             body.chat_template_kwargs, None if state.memory is None else
                                             state.memory.scoped(episode_of(episode, x_episode_id)))
        else:
            ids = await run_in_threadpool(
                lambda: state.tokenizer(body.prompt, add_special_tokens=body.add_special_tokens).input_ids)
        return {"count": len(ids), "max_model_len": state.max_model_len, "tokens": ids}

    async def detokenize(body: DetokenizeRequest):
        state.check(body.model)
        state.check_ids(body.tokens, "tokens")
        return {"prompt": state.tokenizer.decode(body.tokens)}

    for path in ("/tokenize", "/v1/tokenize"):
        router.add_api_route(path, tokenize, methods=["POST"])
    for path in ("/detokenize", "/v1/detokenize"):
        router.add_api_route(path, detokenize, methods=["POST"])

    @app.get("/health")
    async def health():
        return {"status": "draining" if state.draining else "ok", "waiting": state.scheduler.waiting,
                "active": state.scheduler.active}

    app.include_router(router)
    app.include_router(router, prefix="/episodes/{episode}")
    return BodyLimit(app, state.max_body_bytes)

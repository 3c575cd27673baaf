"""`rlvr serve`: the policy behind an OpenAI-compatible HTTP API, token-exact and continuously batched.

    protocol   request bodies (pydantic), OpenAI error objects, a request's sampling fields -> SamplingParams
    tools      tool schemas checked as JSON Schema, rlvr's tool prompt, the tool-call parsers (hermes, none, yours)
    chat       chat messages -> prompt ids through the chat template, earlier sampled ids spliced back in
    scheduler  the engine thread: a bounded queue into the engine's continuous batch, tokens back to each request
    outputs    one choice's ids, log-probs, finish and text (stop strings, streaming deltas), log-prob shapes
    records    CallRecord / CallStart: what a trainer's hooks see of each call, attributed to an episode
    calls      one HTTP call's work in the engine, cancelled when its client goes away; the server's state
    endpoints  /v1/chat/completions, /v1/completions, /inference/v1/generate (whole or streamed)
    app        the FastAPI app: routes (also under /episodes/{id}), API key, body limit, errors
    config     ServeConfig, `rlvr serve`'s fields
    server     `rlvr serve` in the foreground; start_server() in a background thread beside a trainer

FastAPI and uvicorn come with the `serve` extra (pip install 'rlvr[serve]'); nothing here imports them until a
server starts. docs/serve.md is the guide.

May import: rlvr.core, rlvr.engines, rlvr.config (and the packages below them).
"""


def start_server(*args, **kwargs):
    """rlvr.serve.server.start_server (imported when called: FastAPI is an extra)."""
    from rlvr.serve.server import start_server as start

    return start(*args, **kwargs)

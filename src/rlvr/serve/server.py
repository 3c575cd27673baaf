"""Starting the server: from the command line (`rlvr serve`, in the foreground; SIGTERM or Ctrl-C lets requests in
flight finish, up to shutdown_timeout_s, then releases the port), or from Python beside a training run's engine
(`start_server`: a background thread on a free port, stopped with the handle it returns)."""

from __future__ import annotations

import contextlib
import json
import logging
import signal
import socket
import threading
import time
from pathlib import Path
from urllib.parse import quote

from rlvr.core import checkpoint as ckpt
from rlvr.core.models import load_model
from rlvr.engines.hf import HFEngine
from rlvr.serve.calls import Hooks, ServerState
from rlvr.serve.chat import SampledTurns
from rlvr.serve.config import ServeConfig
from rlvr.serve.scheduler import Scheduler
from rlvr.serve.tools import load_parser

log = logging.getLogger(__name__)


def resolve_served_model(name: str) -> tuple[str, str | None]:
    """(what load_model takes, what was chosen when `name` is a run directory)."""
    path = Path(name).expanduser()
    if path.is_dir() and not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        final = ckpt.finished_model(path)
        if final is not None:
            return str(final), f"the finished model of run {path}"
        last = ckpt.latest_checkpoint(path)
        if last is not None:
            return str(last), f"run {path} has not finished: its latest checkpoint, {last.name}"
        raise FileNotFoundError(f"model={name}: a directory with no config.json, no final/ model and no checkpoint")
    return name, None


def load_served_model(name: str, dtype: str = "float32", device: str = "cpu"):
    """(model, tokenizer) for a run directory, a checkpoint (a LoRA one merged into its base), or a model name."""
    target, note = resolve_served_model(name)
    if note:
        log.info("serving %s", note)
    load_dtype = dtype if dtype in ("float32", "bfloat16", "float16") else "float32"
    adapter = Path(target) / "adapter_config.json"
    if adapter.is_file() and not (Path(target) / "config.json").is_file():
        from peft import PeftModel

        base = json.loads(adapter.read_text(encoding="utf-8"))["base_model_name_or_path"]
        model, tokenizer = load_model(base, load_dtype, device)
        model = PeftModel.from_pretrained(model, target).merge_and_unload()
        if (Path(target) / "tokenizer_config.json").is_file():  # the run's own tokenizer (its chat template)
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(target)
            tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
        return model.eval(), tokenizer
    model, tokenizer = load_model(target, load_dtype, device)
    return model.eval(), tokenizer


def model_context(model, tokenizer, limit: int | None = None) -> int:
    """The longest prompt + completion: the model's positions, the tokenizer's limit if smaller, `limit` if given."""
    lengths = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    known = [n for n in lengths if isinstance(n, int) and 0 < n < 10**8]
    return min(known + ([limit] if limit else [])) if known or limit else 4096


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(err.errno, f"cannot listen on {host}:{port}: {err.strerror}") from None
    sock.listen(2048)
    return sock


class ServerHandle:
    """A server running in a background thread (start_server). `base_url` is what an OpenAI client takes;
    `episode_url(e)` the base_url that attributes the calls to episode e (rlvr.serve.records)."""

    def __init__(self, server, thread: threading.Thread, state: ServerState, host: str, port: int):
        self.server, self.thread, self.state = server, thread, state
        self.host, self.port = host, port
        self.url = f"http://{host}:{port}"
        self.base_url = f"{self.url}/v1"
        self.engine, self.scheduler = state.engine, state.scheduler

    def episode_url(self, episode: str) -> str:
        return f"{self.url}/episodes/{quote(str(episode), safe='')}/v1"

    @contextlib.contextmanager
    def paused(self):
        """No decode step runs inside (rows in flight keep their place and continue after)."""
        with self.scheduler.paused():
            yield

    def end_episode(self, episode: str) -> int:
        """Abort the episode's calls queued or decoding (they answer 409 "episode ended"); how many were."""
        return self.scheduler.end_episode(str(episode))

    def sync_weights(self, policy) -> None:
        """Copy the policy's weights into the served engine between two decode steps."""
        with self.paused():
            self.engine.sync_weights(policy)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop taking requests, let those in flight finish (up to the server's shutdown timeout), release the port."""
        self.state.draining = True
        self.server.should_exit = True
        self.thread.join(timeout)
        self.scheduler.stop(timeout)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def build_state(engine, tokenizer, model_name: str, *, max_rows: int | None = None, max_queue: int = 256,
                max_model_len: int | None = None, default_max_tokens: int | None = None,
                max_prefill_tokens: int = 8192, max_kv_mib: float | None = 4096, tool_parser: str = "hermes",
                reuse_sampled_ids: bool = True, api_key: str | None = None, max_body_mib: float = 8.0, on_record=None,
                admit=None) -> ServerState:
    scheduler = Scheduler(engine, max_rows or engine.batch_size, max_queue, max_prefill_tokens,
                          int(max_kv_mib * 2**20) if max_kv_mib else None)
    state = ServerState(engine, tokenizer, scheduler, model_name, model_context(engine.model, tokenizer, max_model_len),
                        load_parser(tool_parser), SampledTurns() if reuse_sampled_ids else None,
                        Hooks(admit, on_record), api_key, default_max_tokens, int(max_body_mib * 2**20))
    scheduler.start()
    return state


def _uvicorn(state: ServerState, shutdown_timeout_s: float):
    import uvicorn

    from rlvr.serve.app import build_app

    config = uvicorn.Config(build_app(state), log_level="warning", lifespan="off", access_log=False,
                            timeout_graceful_shutdown=shutdown_timeout_s)
    return uvicorn.Server(config)


def start_server(engine: HFEngine, tokenizer=None, *, model_name: str = "rlvr", host: str = "127.0.0.1",
                 port: int = 0, shutdown_timeout_s: float = 30.0, **options) -> ServerHandle:
    """Serve `engine` from a background thread (port 0: a free one) and return once it accepts connections.
    `options`: build_state's (on_record and admit are the trainer's hooks, rlvr.serve.records)."""
    tokenizer = tokenizer if tokenizer is not None else engine.tokenizer
    state = build_state(engine, tokenizer, model_name, **options)
    sock = _bind(host, port)
    server = _uvicorn(state, shutdown_timeout_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="rlvr-serve-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            state.scheduler.stop(5)
            raise RuntimeError("the server thread did not start")
        time.sleep(0.01)
    return ServerHandle(server, thread, state, host if ":" not in host else f"[{host}]", sock.getsockname()[1])


def serve(cfg: ServeConfig, echo=print) -> None:
    """`rlvr serve`: load the model, listen, answer until SIGTERM or Ctrl-C (requests in flight finish first)."""
    import os

    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ValueError("rlvr serve needs its extra: pip install 'rlvr[serve]' (fastapi, uvicorn)") from None
    model, tokenizer = load_served_model(cfg.model, cfg.dtype, cfg.device)
    engine = HFEngine(model, tokenizer, batch_size=cfg.max_rows, dtype=cfg.dtype if cfg.dtype == "int8" else None,
                      prefix_cache_mib=0)
    name = cfg.served_model_name or cfg.model
    state = build_state(engine, tokenizer, name, max_rows=cfg.max_rows, max_queue=cfg.max_queue,
                        max_model_len=cfg.max_model_len, default_max_tokens=cfg.default_max_tokens,
                        max_prefill_tokens=cfg.max_prefill_tokens, max_kv_mib=cfg.max_kv_mib,
                        tool_parser=cfg.tool_parser,
                        reuse_sampled_ids=cfg.reuse_sampled_ids, api_key=cfg.api_key or os.environ.get("RLVR_API_KEY"),
                        max_body_mib=cfg.max_body_mib)
    sock = _bind(cfg.host, cfg.port)
    server = _uvicorn(state, cfg.shutdown_timeout_s)
    host = cfg.host if ":" not in cfg.host else f"[{cfg.host}]"
    echo(f"rlvr serve: {name} on http://{host}:{sock.getsockname()[1]}/v1 (max_model_len {state.max_model_len}, "
         f"{cfg.max_rows} rows, queue {cfg.max_queue}{', API key required' if state.api_key else ''})", flush=True)
    # uvicorn handles SIGTERM / SIGINT (stop accepting, finish what is in flight), then raises the signal again for
    # the handler it found: a no-op here, so that the process ends as a clean stop (status 0), not killed by it
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        state.draining = True
        state.scheduler.stop(cfg.shutdown_timeout_s)
        sock.close()
    echo("rlvr serve: stopped", flush=True)

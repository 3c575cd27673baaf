"""`rlvr serve`'s typed configuration, checked before any model loads."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from rlvr.config.base import BaseConfig, fields_help, load_config


class ServeConfig(BaseConfig):
    model: str = Field("SmolLM2-135M-Instruct", description="a run directory (its final/ model, else its latest "
                       "checkpoint), a checkpoint or model directory, a .gguf file, or a cached hub name")
    host: str = Field("127.0.0.1", description="the address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, le=65535, description="the port (0: a free one, printed at start)")
    api_key: str | None = Field(None, description="if set, every request must send `Authorization: Bearer <key>` "
                                "(or set RLVR_API_KEY)")
    served_model_name: str | None = Field(None, description="the name clients pass as `model` (default: `model` as "
                                          "given)")
    dtype: Literal["float32", "bfloat16", "float16", "int8"] = Field(
        "float32", description="the engine's weights: float32 gives log-probs equal to the policy's fp32 scoring")
    device: str = Field("cpu", description="where the engine runs (cpu, cuda, cuda:1)")
    max_rows: int = Field(64, ge=1, description="rows (choices) decoded together; requests beyond wait in the queue")
    max_queue: int = Field(256, ge=1, description="requests that may wait for a row; more are answered 429")
    max_model_len: int | None = Field(None, ge=2, description="the longest prompt + completion (default: the "
                                      "model's max_position_embeddings)")
    default_max_tokens: int | None = Field(None, ge=1, description="a completion's length when a request gives no "
                                           "max_tokens (default: what the context has left, as vLLM)")
    max_prefill_tokens: int = Field(8192, ge=1, description="prompt ids prefilled per decode step when requests "
                                    "join (longer waits for the rows running, shorter admits fewer at once)")
    max_kv_mib: float = Field(4096, gt=0, description="memory for the decoding rows' KV cache (MiB): rows are "
                              "admitted while they fit at their prompt + max_tokens; a request that alone would not "
                              "is answered 400")
    tool_parser: str = Field("hermes", description="how a model's text becomes tool_calls: hermes, none, "
                             "file.py:function or module:function (docs/serve.md)")
    reuse_sampled_ids: bool = Field(True, description="a prompt that re-renders an earlier completion holds the "
                                    "ids sampled for it, not its text tokenised again (docs/serve.md)")
    max_body_mib: float = Field(8.0, gt=0, description="the largest request body accepted (MiB)")
    shutdown_timeout_s: float = Field(30.0, ge=0, description="on SIGTERM or Ctrl-C, how long requests in flight "
                                      "may take to finish before they are cut")

    @field_validator("tool_parser")
    @classmethod
    def _parser(cls, value: str) -> str:
        from rlvr.serve.tools import load_parser

        load_parser(value)  # a name that does not resolve fails here, before the model loads
        return value


def serve_help() -> str:
    return ("Serve a model behind an OpenAI-compatible API (docs/serve.md): `rlvr serve runs/grpo` serves a finished "
            "run (its final/ model; an unfinished run's latest checkpoint), a checkpoint or a model name, on "
            "http://127.0.0.1:8000/v1 until SIGTERM or Ctrl-C.\n\n" + fields_help(ServeConfig))


def load_serve_config(path, args: list[str]) -> ServeConfig:
    """`rlvr serve`'s config from a file and the command line, where a bare argument is the model
    (`rlvr serve runs/grpo --port 8001`); ConfigError names the field."""
    overrides, after_key = [], False
    for arg in args:
        bare = not arg.startswith("--") and "=" not in arg and not after_key
        overrides.append(f"model={arg}" if bare else arg)
        after_key = arg.startswith("--") and "=" not in arg
    return load_config(ServeConfig, path, overrides)

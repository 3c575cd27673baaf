"""TRL's environment shape (`GRPOTrainer(environment_factory=...)`), trained with `env_class=path/to/env.py:Class`:
a class with `reset(**row)` and public methods that are the tools, whose JSON schemas come from their type hints
and docstrings (transformers.utils.get_json_schema, as TRL and chat templates read them). rlvr runs the tool loop:

    class Wordle:
        def reset(self, **row) -> str | None:        # a new episode; a string is appended to the last user turn
            self.secret = row["answer"]
        def guess(self, word: str) -> str:           # a tool: typed arguments, a Google-style docstring
            '''Guess the secret word.

            Args:
                word: a five-letter word
            '''
            return feedback(word, self.secret)
        def get_reward(self) -> float:              # optional: the episode's reward (else `rewards=` score it)
            return float(self.solved)

One instance per episode. A turn: the model is called with the conversation and the tools (`tools=`); each tool
call it makes runs (an exception, an unknown tool or arguments that do not fit come back as the call's error
text) and its result is sent back as a `tool` message; a turn without a tool call ends the episode, as does
`agents.max_turns`. Reward functions get the instances as `environments` (TRL's keyword), the conversation as
`completions`. Built-in tools: `env_class=calculator` and `env_class=python` (rlvr.environments.chat_tools).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
from typing import Callable

from rlvr.core.imports import import_target
from rlvr.environments.verifiers_env import VERIFIERS, VerifiersTaskset

# classes handed over in Python (rlvr.train(env_class=Cls)), by key "python:<name>"; verifiers' tasksets by name
ENV_CLASSES: dict[str, object] = {}
PYTHON = "python:"
HOOKS = ("reset", "get_reward")


def register_env_class(cls: type) -> str:
    key = f"{PYTHON}{cls.__name__}"
    check_env_class(cls, key)
    ENV_CLASSES[key] = cls
    return key


def load_env_class(name: str):
    """The class `env_class=name` names: a built-in (calculator, python), registered, or file.py:Class /
    package.module:Class; checked (a `reset`, tools whose schemas build). `verifiers:<taskset id>`: verifiers' v1
    taskset, an episode runner (rlvr.environments.verifiers_env), loaded once per process."""
    from rlvr.environments.chat_tools import CHAT_TOOLS

    if name.startswith(VERIFIERS):
        if name not in ENV_CLASSES:
            ENV_CLASSES[name] = VerifiersTaskset(name[len(VERIFIERS):])
        return ENV_CLASSES[name]
    if name in CHAT_TOOLS:
        return CHAT_TOOLS[name]
    if name in ENV_CLASSES:
        return ENV_CLASSES[name]
    if name.startswith(PYTHON):
        raise ValueError(f"env_class={name!r} was handed over in Python and lives in that process only: hand it "
                         "over again, or put it in a file (env_class=path/to/env.py:Class)")
    if ":" not in name:
        raise ValueError(f"env_class={name!r}: not a built-in ({', '.join(CHAT_TOOLS)}) nor path/to/env.py:Class "
                         "or package.module:Class")
    cls = import_target(name, field="env_class")
    check_env_class(cls, name)
    return cls


def tool_methods(cls: type) -> list[str]:
    """The names of the class's tools: its public functions other than reset and get_reward (TRL's rule)."""
    return [n for n, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not n.startswith("_") and n not in HOOKS]


def tool_schemas(cls: type) -> list[dict]:
    """The tools as the chat API offers them: {"type": "function", "function": {name, description, parameters}},
    built by transformers' get_json_schema from each method's type hints and docstring."""
    from transformers.utils import get_json_schema

    schemas = []
    for name in tool_methods(cls):
        schema = get_json_schema(getattr(cls, name))
        function = schema["function"]
        parameters = dict(function.get("parameters") or {"type": "object", "properties": {}})
        parameters["properties"] = {k: v for k, v in parameters.get("properties", {}).items() if k != "self"}
        if "required" in parameters:
            parameters["required"] = [k for k in parameters["required"] if k != "self"]
        schemas.append({"type": "function", "function": {"name": function["name"],
                                                         "description": function.get("description", ""),
                                                         "parameters": parameters}})
    return schemas


def check_env_class(cls, name: str) -> None:
    if not isinstance(cls, type):
        raise ValueError(f"env_class={name!r} is a {type(cls).__name__}, not a class")
    if not callable(getattr(cls, "reset", None)):
        raise ValueError(f"env_class={name!r}: {cls.__name__} has no reset(**row) method (TRL's environment shape: "
                         "reset, then public methods that are the tools)")
    if not tool_methods(cls):
        raise ValueError(f"env_class={name!r}: {cls.__name__} has no public method besides reset and get_reward; "
                         "its tools are its public methods")
    for method in tool_methods(cls):
        try:
            tool_schemas(type("Probe", (), {method: getattr(cls, method)}))
        except Exception as err:  # transformers' own message says what is missing (a type hint, an Args: line)
            raise ValueError(f"env_class={name!r}: the tool {cls.__name__}.{method} has no JSON schema: "
                             f"{type(err).__name__}: {err}") from None


@dataclasses.dataclass
class ToolEpisode:
    """What the tool loop did: the environment (reward functions get it), the conversation, the reward."""

    environment: object
    messages: list[dict]
    reward: float | dict | None = None
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0


async def call_tool(env, name: str, arguments: str, names: list[str]) -> tuple[str, bool]:
    """(the result as text, whether it failed). Sync tools run in a thread, so a slow one (a sandbox) does not hold
    the episode's event loop."""
    if name not in names:
        return f"error: no tool named {name!r} (tools: {', '.join(names)})", True
    try:
        args = json.loads(arguments) if isinstance(arguments, str) else dict(arguments or {})
        if not isinstance(args, dict):
            raise ValueError("the arguments are not a JSON object")
        method: Callable = getattr(env, name)
        inspect.signature(method).bind(**args)  # arguments that do not fit are the model's error, not the tool's
    except (ValueError, TypeError) as err:
        return f"error: bad arguments for {name}: {err}", True
    try:
        result = await method(**args) if inspect.iscoroutinefunction(method) else \
            await asyncio.to_thread(method, **args)
    except Exception as err:  # noqa: BLE001 -- a tool's failure is an observation for the model
        return f"error: {type(err).__name__}: {err}", True
    if isinstance(result, str):
        return result, False
    try:
        return json.dumps(result, ensure_ascii=False), False
    except TypeError:
        return str(result), False


async def run_tools(cls: type, client, row: dict, sampling: dict, max_turns: int) -> ToolEpisode:
    """One episode of TRL's tool loop through `client` (see the module)."""
    env = cls()
    observation = env.reset(**row)
    if inspect.isawaitable(observation):
        observation = await observation
    messages = [dict(m) for m in row["prompt"]]
    if observation:
        messages[-1] = {**messages[-1], "content": f"{messages[-1].get('content') or ''}{observation}"}
    names, tools = tool_methods(cls), tool_schemas(cls)
    episode = ToolEpisode(env, messages)
    while episode.turns < max_turns:
        reply = await client.chat.completions.create(messages=messages, tools=tools, **sampling)
        episode.turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            result, failed = await call_tool(env, call.function.name, call.function.arguments, names)
            episode.tool_calls += 1
            episode.tool_errors += int(failed)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    if callable(getattr(env, "get_reward", None)):
        reward = env.get_reward()
        episode.reward = await reward if inspect.isawaitable(reward) else reward
    return episode

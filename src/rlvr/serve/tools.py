"""Tool calls: the schemas a request offers (checked as JSON Schema), the text that describes them to a model whose
chat template has no tool format, and the parsers that read a model's text back into OpenAI `tool_calls`.

A parser is a function `text -> (content, calls) | None`: `calls` a list of {"name": str, "arguments": dict or
JSON string}, `content` the text outside them (None when there is none); None when the text holds no tool call.
A parser that raises, or returns calls that are not that shape, leaves the turn as plain content: a turn that fails
to parse is never an error. Choose one with `rlvr serve tool_parser=NAME`:

    hermes   (default) <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks, as Hermes, Qwen2.5 and
             rlvr's own tool prompt write them; a last block cut off by the end of the turn is read too
    none     never parse: the text is the content
    file.py:function or package.module:function   your own parser

`start_marker` (an attribute of the function, optional) is where a streamed turn's tool-call text begins: text from
there on is held back until the turn ends, then sent as tool_calls or, if it does not parse, as content.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import re
from pathlib import Path

from rlvr.serve.protocol import APIError

log = logging.getLogger(__name__)

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def parse_hermes(text: str):
    """Hermes-style <tool_call>{json}</tool_call> blocks -> (the text outside them or None, calls)."""
    if "<tool_call>" not in text:
        return None
    calls = []
    for block in _HERMES.findall(text):
        call = json.loads(block)
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ValueError("a tool call needs a string 'name'")
        calls.append({"name": call["name"], "arguments": call.get("arguments", call.get("parameters", {}))})
    content = text[: text.index("<tool_call>")].strip()
    return (content or None), calls


parse_hermes.start_marker = "<tool_call>"


def parse_none(text: str):
    return None


PARSERS = {"hermes": parse_hermes, "none": parse_none}


def load_parser(name: str):
    """A parser by name, `file.py:function` or `module:function`; a clear ValueError otherwise."""
    if name in PARSERS:
        return PARSERS[name]
    if ":" not in name:
        raise ValueError(f"tool_parser={name!r}: not one of {', '.join(PARSERS)} nor file.py:function / "
                         "module:function")
    where, _, attr = name.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ValueError(f"tool_parser={name!r}: no file {where}")
            spec = importlib.util.spec_from_file_location(f"rlvr_tool_parser_{path.stem}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
    except ImportError as err:
        raise ValueError(f"tool_parser={name!r}: cannot import {where}: {err}") from None
    parser = getattr(module, attr, None)
    if not callable(parser):
        raise ValueError(f"tool_parser={name!r}: {where} has no function {attr!r}")
    return parser


def parse_turn(parser, text: str) -> tuple[str | None, list[dict]]:
    """(content, calls with JSON-string arguments): the parser's reading of `text`, or all of it as content when
    it finds no call, raises, or returns something else than (content, calls)."""
    try:
        parsed = parser(text)
        if parsed is None:
            return text, []
        content, calls = parsed
        out = []
        for call in calls:
            arguments = call["arguments"]
            if isinstance(arguments, str):
                json.loads(arguments)  # a string must itself be JSON
            else:
                arguments = json.dumps(arguments, ensure_ascii=False)
            if not isinstance(call["name"], str) or not call["name"]:
                raise ValueError("a tool call's name must be a non-empty string")
            out.append({"name": call["name"], "arguments": arguments})
        if not out:
            return text, []
        return (content if isinstance(content, str) and content else None), out
    except Exception as err:  # noqa: BLE001 -- any failure of a (possibly user) parser leaves plain content
        log.debug("tool parser %s: %s: %s; the turn is returned as content", getattr(parser, "__name__", parser),
                  type(err).__name__, err)
        return text, []


def check_tools(tools: list[dict]) -> None:
    """Each tool's `parameters` is a JSON Schema (checked against its metaschema) describing an object; an
    APIError (400) naming the field otherwise."""
    from jsonschema import SchemaError
    from jsonschema.validators import validator_for

    names = set()
    for i, tool in enumerate(tools):
        function = tool["function"]
        field = f"tools[{i}].function.parameters"
        if function["name"] in names:
            raise APIError(400, f"tool name {function['name']!r} is given twice", f"tools[{i}].function.name")
        names.add(function["name"])
        schema = function.get("parameters")
        if schema is None:
            continue
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError as err:
            path = "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in err.path)
            raise APIError(400, f"{field}{path} is not a JSON Schema: {err.message}", field) from None
        if schema.get("type", "object") != "object":
            raise APIError(400, f"{field} must describe an object (its type is {schema.get('type')!r})", field)


def tools_prompt(tools: list[dict], tool_choice) -> str:
    """rlvr's description of the offered tools, for a chat template without a tool format (Hermes' layout: the
    schemas inside <tools>, calls answered inside <tool_call>, results given back inside <tool_response>)."""
    listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    text = ("# Tools\n\nYou can call functions to help with the request. Their signatures, as JSON Schema, are "
            f"inside <tools></tools>:\n<tools>\n{listed}\n</tools>\n\nTo call a function, write a JSON object with "
            "its name and arguments inside <tool_call></tool_call> tags, one call per block:\n<tool_call>\n"
            '{"name": "<function name>", "arguments": {<arguments as JSON>}}\n</tool_call>\nEach result comes back '
            "inside <tool_response></tool_response>.")
    if tool_choice == "required":
        text += "\nYou must call at least one function."
    elif isinstance(tool_choice, dict):
        text += f"\nYou must call the function {tool_choice['function']['name']}."
    return text


def hermes_call_text(calls: list[dict]) -> str:
    """Tool calls written as the default parser reads them (an earlier assistant turn re-rendered)."""
    blocks = []
    for call in calls:
        arguments = call["function"]["arguments"]
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                pass
        blocks.append("<tool_call>\n" + json.dumps({"name": call["function"]["name"], "arguments": arguments},
                                                    ensure_ascii=False) + "\n</tool_call>")
    return "\n".join(blocks)

"""A tool-use task the default model can learn through rlvr's server: the product of a 3-digit and a 2-digit number,
which a 135M model cannot compute in its head, with a `calculate` tool it can call. The agent is a plain
OpenAI-client program (no rlvr import): two worked examples of a tool call on "What is A * B?", the question (in
one of five phrasings: examples/agents/make_data.py), up to three turns; a turn with tool calls gets their
results, a turn without one is the answer. Before training the model copies the examples' call for the phrasings
that look like them and not for the others (docs/agents.md has the measurement).

    rlvr train --config examples/agents/multiply.yaml          # agent=examples/agents/multiply.py:run_episode

It returns its own reward (rlvr's dict): `reward` and `answer_reward` 1 when the last number of the answer is the
product, `format_reward` 1 when the calculator was called and returned the product (the tool-call success the
summary reports as the format rate).
"""

import json
import re

CALCULATE = {"type": "function", "function": {
    "name": "calculate", "description": "Compute an arithmetic expression exactly, e.g. \"48 / 2 + 48\".",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "the expression"}},
                   "required": ["expression"]}}}
SYSTEM = "Use the calculate tool for arithmetic, then answer with the result."


def shot(a: int, b: int, k: int) -> list[dict]:
    """A worked example: the question, a call of the tool, its result, the answer."""
    call = {"id": f"example_{k}", "type": "function",
            "function": {"name": "calculate", "arguments": json.dumps({"expression": f"{a} * {b}"})}}
    return [{"role": "user", "content": f"What is {a} * {b}?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": str(a * b)},
            {"role": "assistant", "content": str(a * b)}]


EXAMPLES = [{"role": "system", "content": SYSTEM}] + shot(23, 41, 0) + shot(612, 18, 1)


def calculate(expression: str) -> str:
    """The tool: + - * / and parentheses over integers, no powers (model text reaches eval only as that)."""
    if not re.fullmatch(r"[\d\s+\-*/().]{1,60}", expression) or "**" in expression:
        raise ValueError(f"not an arithmetic expression: {expression!r}")
    return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 -- digits and operators only (checked above)


async def run_episode(client, row, sampling):
    messages = EXAMPLES + [{"role": "user", "content": row["question"]}]
    right_call = False
    for _ in range(3):
        reply = (await client.chat.completions.create(messages=messages, tools=[CALCULATE], **sampling)).choices[0]
        message = reply.message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            try:
                result = calculate(json.loads(call.function.arguments)["expression"])
                right_call |= result == row["answer"]
            except Exception as err:  # a bad call is the model's mistake: its error is the result
                result = f"error: {err}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    said = re.findall(r"-?\d+", messages[-1].get("content") or "") if messages[-1]["role"] == "assistant" else []
    right = float(bool(said) and said[-1] == row["answer"])
    return {"reward": right, "answer_reward": right, "format_reward": float(right_call)}

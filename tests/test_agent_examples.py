"""The environment shapes of issue 66 and their worked examples (examples/agents/): TRL's environment class (tools
from type hints and docstrings, rlvr's tool loop through the server), rlvr's calculator and Python tools as chat
tools, the multiply agent; each example's config trains a step on a tiny chat model."""

import asyncio
import json

import pytest
from serving import CHATML, Script, chat_model, chat_tokenizer, client, start

from rlvr.environments.chat_tools import CalculatorTools
from rlvr.environments.tool_loop import call_tool, check_env_class, load_env_class, run_tools, tool_schemas

pytest.importorskip("fastapi")

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]
COUNT = json.dumps({"name": "count", "arguments": {"item": "pears"}})


def test_tool_schemas_come_from_type_hints_and_docstrings():
    shop = load_env_class(str(ROOT / "examples/agents/shop.py") + ":Shop")
    assert tool_schemas(shop) == [{"type": "function", "function": {
        "name": "count", "description": "How many of an item the shop has in stock.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string",
                                                                 "description": 'the item\'s name, e.g. "apples"'}},
                       "required": ["item"]}}}]
    assert tool_schemas(load_env_class("calculator"))[0]["function"]["parameters"]["required"] == ["expression"]

    class Undocumented:
        def reset(self, **row):
            pass

        def look(self, where):
            return where

    with pytest.raises(ValueError, match="Undocumented.look has no JSON schema"):
        check_env_class(Undocumented, "test")


def test_a_tool_call_runs_and_its_failures_are_the_models_observation():
    env, names = CalculatorTools(), ["calculate"]
    run = lambda name, args: asyncio.run(call_tool(env, name, args, names))  # noqa: E731
    assert run("calculate", '{"expression": "48 / 2 + 48"}') == ("72", False)
    assert run("calculate", '{"expression": "2 ** 999"}')[1]  # the calculator's own bounds
    assert run("calc", "{}") == ("error: no tool named 'calc' (tools: calculate)", True)
    assert run("calculate", '{"expr": "1"}')[0].startswith("error: bad arguments for calculate")
    assert run("calculate", "[1]")[0] == "error: bad arguments for calculate: the arguments are not a JSON object"


def test_the_tool_loop_calls_the_tools_the_model_asks_for():
    """TRL's loop through the served tiny model, scripted to call count(item="pears"), then to answer."""
    tokenizer = chat_tokenizer()
    tokenizer.add_tokens([COUNT, "19"])
    model = chat_model(tokenizer)
    script = Script(model)
    handle, *_ = start(tokenizer, model)
    shop = load_env_class(str(ROOT / "examples/agents/shop.py") + ":Shop")
    newline = tokenizer.convert_tokens_to_ids("Ċ")
    row = {"prompt": [{"role": "user", "content": "How many pears?"}], "stock": {"pears": 19, "plums": 2}}

    async def episode():
        import openai

        api = openai.AsyncOpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        calls = iter([["<tool_call>", COUNT, "</tool_call>"], ["19"]])

        original = api.chat.completions.create

        async def create(**kwargs):  # each turn's reply scripted before it is asked for
            script.set(tokenizer, newline, next(calls))
            try:
                return await original(**kwargs)
            finally:
                script.clear()

        api.chat.completions.create = create
        try:
            return await run_tools(shop, api, row, {"model": "tiny", "max_tokens": 8, "seed": 1}, max_turns=4)
        finally:
            await api.close()

    try:
        done = asyncio.run(episode())
    finally:
        handle.stop()
    assert done.turns == 2 and done.tool_calls == 1 and done.tool_errors == 0
    assert done.environment.looked_up == {"pears"}
    assert [m["role"] for m in done.messages] == ["user", "assistant", "tool", "assistant"]
    assert done.messages[2]["content"] == "19" and done.messages[3]["content"] == "19"


@pytest.mark.parametrize("config", ["shop.yaml", "multiply.yaml", "gsm8k_calculator.yaml"])
def test_an_example_config_trains_a_step(config, tmp_path, monkeypatch):
    import rlvr

    monkeypatch.chdir(ROOT)
    tokenizer = chat_tokenizer(CHATML)
    model = chat_model(tokenizer)
    model.config.max_position_embeddings = 4096  # multiply's worked examples are 1,200 of the byte tokenizer's ids
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    run = rlvr.train(f"examples/agents/{config}", model=str(tmp_path / "tiny"), out=str(tmp_path / "run"), steps=1,
                     rollout_batch_size=4, group_size=2, max_new_tokens=8, eval_max_new_tokens=8, eval_limit=2,
                     eval_every=0, eval_at_start=False, eval_at_end=True, precision="fp32",
                     generation_dtype="float32", tensorboard=False, train_limit=8, save_every=0)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["agent/failed"] == 0 and metrics[-1]["val/agent/failed"] == 0
    assert metrics[-1]["agent/calls"] >= 1 and (run / "final").is_dir()


def test_check_task_of_an_agent_config_checks_its_rows_not_its_rewards(monkeypatch):
    from typer.testing import CliRunner

    from rlvr.cli import app

    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, ["check-task", "--config", "examples/agents/shop.yaml"])
    assert result.exit_code == 0, result.output
    assert "rows: train 240, validation 30, test 30" in result.output
    assert "rewards not checked: an agent's episodes are scored on their conversations" in result.output

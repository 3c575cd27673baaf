"""docs/agents.md's Python examples run as written: the agent function through rlvr's server on a tiny chat model
(the runner the training loop uses), the TRL-style reward function on an episode's conversation, the environment
class's tools as schemas."""

import re
import types
from pathlib import Path

import pytest
from serving import chat_model, chat_tokenizer

pytest.importorskip("fastapi")

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "agents.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.DOTALL)


def _run(index: int) -> dict:
    scope = {"__name__": "agents_md"}
    exec(compile(BLOCKS[index], f"{GUIDE.name} example {index + 1}", "exec"), scope)
    return scope


def test_the_guide_has_its_examples():
    assert len(BLOCKS) == 3
    assert "async def run_episode(client, row, sampling)" in BLOCKS[0] and "class Shop" in BLOCKS[2]


def test_the_guides_agent_runs_through_the_server():
    from rlvr.config import AgentLimits
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.environments.agents import register_agent
    from rlvr.stages.agents import AgentRollouts
    from rlvr.tasks.prompts import get_prompt
    from rlvr.tasks.records import Example

    tokenizer = chat_tokenizer()
    engine = HFEngine(chat_model(tokenizer), tokenizer, batch_size=8)
    runner = AgentRollouts(get_prompt("chat"), AgentLimits(), agent=register_agent(_run(0)["run_episode"]))
    out = runner.generate(engine, [Example("What is 2+3?", "5", id="q")], [""], SamplingParams(max_new_tokens=6, n=2),
                          tokenizer)
    assert [c.episode["failure"] for c in out] == ["", ""] and all(c.episode["calls"] == 1 for c in out)
    assert all(c.episode["reward"]["reward"] in (0.0, 1.0) for c in out)


def test_the_guides_reward_function_reads_the_conversation_and_the_environments():
    answered = _run(1)["answered"]
    looked = types.SimpleNamespace(looked_up={"pears"})
    said = [[{"role": "assistant", "tool_calls": []}, {"role": "tool", "content": "19"},
             {"role": "assistant", "content": "There are 19."}]] * 2
    assert answered(said, [looked, types.SimpleNamespace(looked_up=set())], ["19", "19"], ["pears", "pears"]) == [1.0, 0.0]


def test_the_guides_environment_class_has_tools_from_its_docstrings():
    from rlvr.environments.tool_loop import check_env_class, tool_schemas

    shop = _run(2)["Shop"]
    check_env_class(shop, "docs")
    assert tool_schemas(shop)[0]["function"]["parameters"]["properties"]["item"]["type"] == "string"

"""Training a program that talks to the policy through rlvr's server (issue 66): a scripted agent with two chats,
tool calls and a history the chat template rewrites runs during `rlvr train` (a tiny chat model); the ids trained
are the ids the engine sampled, the masks cover exactly the ids it did not sample, the log-probs the correction
uses are the sampling ones. Then the bounds: an agent that hangs, raises or opens a thousand chats costs its
episode, never the run."""

import asyncio
import json
import logging
import math
import time
from pathlib import Path

import openai
import pytest
import torch
from serving import ADD_TOOL, PIECES, Script, chat_model, chat_tokenizer
from conftest import train_cfg

from rlvr import stages
from rlvr.stages.trajectories import build_sequences

pytest.importorskip("fastapi")

# ChatML whose assistant turns are rewritten when the last message says "compact" (as Qwen3 drops earlier <think>
# blocks): a prompt of that kind does not extend the ids of the turns before it
REWRITING = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' and "
             "messages[-1]['content'] == 'compact' %}(earlier){% else %}{{ m['content'] }}{% endif %}<eos>\n"
             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

SEEN: dict[str, list] = {}  # episode id -> what each of its calls answered: (prompt ids, sampled ids, log-probs)
SCRIPT: dict = {}


def _say(texts):
    tokenizer, script = SCRIPT["tokenizer"], SCRIPT["script"]
    script.set(tokenizer, tokenizer.convert_tokens_to_ids("Ċ"), texts)  # after the generation prompt's "\n"


async def scripted_agent(client, row, sampling):
    """Chat A: a tool call, its result, an answer; chat B: another conversation; chat A again with a message the
    template answers by rewriting the earlier assistant turns. Every reply is scripted (episodes run one at a
    time: agents.concurrency=1); the reward is the seed's parity, so that groups have spread."""
    seen = SEEN.setdefault(str(client.base_url).rstrip("/").split("/")[-2], [])  # .../episodes/<id>/v1

    async def ask(messages, texts, **extra):
        _say(texts)
        try:
            reply = await client.chat.completions.create(messages=messages, logprobs=True,
                                                         extra_body={"return_token_ids": True}, **extra, **sampling)
        finally:
            SCRIPT["script"].clear()
        choice = reply.choices[0]
        seen.append((reply.prompt_token_ids, choice.token_ids, [t.logprob for t in choice.logprobs.content]))
        return choice.message

    chat_a = [{"role": "system", "content": "A"}, {"role": "user", "content": row["question"]}]
    call = await ask(chat_a, PIECES[:3], tools=[ADD_TOOL])
    assert call.tool_calls and call.tool_calls[0].function.name == "add"
    chat_a += [call.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.tool_calls[0].id,
                                                    "content": "5"}]
    answer = await ask(chat_a, [PIECES[4]], tools=[ADD_TOOL])
    await ask([{"role": "system", "content": "B"}, {"role": "user", "content": "again"}], [PIECES[4]])
    chat_a += [answer.model_dump(exclude_none=True), {"role": "user", "content": "compact"}]
    await ask(chat_a, [PIECES[4]], tools=[ADD_TOOL])
    return float(sampling["seed"] % 2)


def test_a_scripted_agent_trains_on_exactly_the_ids_it_sampled(tmp_path, monkeypatch):
    tokenizer = chat_tokenizer(REWRITING)
    chat_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    SEEN.clear()
    SCRIPT["tokenizer"] = tokenizer
    load_policy = stages.load_policy

    def scripted_policy(*args, **kwargs):  # the script biases the policy the engine decodes with (fp32: one model)
        model, tok, state = load_policy(*args, **kwargs)
        SCRIPT["script"] = Script(model)
        return model, tok, state

    steps = []
    score, learn = stages.score_rollouts, stages.train_on_rollouts
    monkeypatch.setattr(stages, "load_policy", scripted_policy)
    monkeypatch.setattr(stages, "score_rollouts", lambda rollouts, *a, **k: steps.append(
        [rollouts, score(rollouts, *a, **k)]) or steps[-1][1])
    monkeypatch.setattr(stages, "train_on_rollouts", lambda model, opt, sched, ref, batch, *a, **k: steps[-1].append(
        batch) or learn(model, opt, sched, ref, batch, *a, **k))
    import rlvr

    run = rlvr.train(train_cfg(tmp_path / "tiny", tmp_path / "run", steps=2, eval_every=0, eval_at_start=False,
                               eval_at_end=False, agents={"concurrency": 1}).model_dump(exclude_unset=True),
                     agent=scripted_agent)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(m["agent/sequences"] == 3 and m["agent/calls"] == 4 and m["agent/failed"] == 0 for m in metrics)
    assert all("train/is_weight_mean" in m for m in metrics)  # the rollout correction ran on these log-probs
    checked = 0
    for rollouts, scored, batch in steps:
        assert len(rollouts.completions) == 8 and batch.input_ids.shape[0] == 8 * 3
        for j, c in enumerate(rollouts.completions):
            (p1, i1, l1), (p2, i2, l2), (p3, i3, l3), (p4, i4, l4) = SEEN[c.episode["id"]]
            assert p2[: len(p1) + len(i1)] == p1 + i1  # the second turn extends the first: one sequence
            assert p4[: len(p2) + len(i2)] != p2 + i2  # the rewritten history does not: a sequence of its own
            bridge = p2[len(p1) + len(i1):]
            expected = [(p1, i1 + bridge + i2, [True] * len(i1) + [False] * len(bridge) + [True] * len(i2),
                         l1 + [None] * len(bridge) + l2), (p3, i3, [True] * len(i3), l3), (p4, i4, [True] * len(i4), l4)]
            assert len(scored.rows[j]) == 3
            for row, (prompt, response, mask, logprobs) in zip(scored.rows[j], expected):
                width = len(prompt) + len(response) - 1
                trained = batch.input_ids[row, :1].tolist() + batch.labels[row, :width].tolist()
                assert trained == prompt + response  # the very ids, in order
                assert batch.labels[row, width:].eq(tokenizer.pad_token_id).all()
                assert batch.response_mask[row].tolist() == [False] * (len(prompt) - 1) + mask + [False] * (
                    batch.labels.shape[1] - width)  # exactly the sampled ids
                used = batch.rollout_log_probs[row, len(prompt) - 1:width].tolist()
                assert all(math.isnan(u) if x is None else u == pytest.approx(x, abs=1e-6)
                           for u, x in zip(used, logprobs))
                assert torch.isnan(batch.rollout_log_probs[row, : len(prompt) - 1]).all()
                # the episode's advantage on each of its sequences
                assert batch.advantages[row] == batch.advantages[scored.rows[j][0]]
            checked += 1
    assert checked == 16


def test_turns_merge_when_the_prompt_extends_and_fork_when_it_does_not():
    turns = [([1, 2], [3, 4], [-0.1, -0.2]),  # chat A
             ([1, 2, 3, 4, 9, 9], [5], [-0.3]),  # chat A again: extends (9, 9: the template and a tool result)
             ([7], [8], [-0.4]),  # chat B
             ([1, 2, 3, 4, 9, 9, 5, 6], [0], [-0.5]),  # chat A: extends the merged sequence
             ([1, 2, 3, 4, 9, 9], [6], [-0.6]),  # a second choice of an earlier prompt: forks
             ([1, 2], [], [])]  # a call aborted before its first id: nothing to train
    a, b, c = build_sequences(turns)
    assert (a.prompt_ids, a.ids, a.mask) == ([1, 2], [3, 4, 9, 9, 5, 6, 0],
                                             [True, True, False, False, True, False, True])
    assert [x if x == x else None for x in a.logprobs] == [-0.1, -0.2, None, None, -0.3, None, -0.5]
    assert (b.prompt_ids, b.ids, b.mask) == ([7], [8], [True])
    assert (c.prompt_ids, c.ids, c.mask, c.logprobs) == ([1, 2, 3, 4, 9, 9], [6], [True], [-0.6])


async def misbehaving_agent(client, row, sampling):
    """What row["question"] says: answer, raise, hang (awaiting or blocking the thread), open a thousand chats,
    leave a call running after returning, or return something that is not a reward."""
    what = row["question"]
    ask = lambda: client.chat.completions.create(  # noqa: E731
        messages=[{"role": "user", "content": what}], **sampling)
    if what == "block":
        time.sleep(30)
    if what == "hang":
        await asyncio.sleep(30)
    if what == "spam":  # a runaway loop that ignores the refusals: stopped at the budget
        for _ in range(1000):
            try:
                await ask()
            except openai.APIStatusError:
                pass
        return 1.0
    await ask()
    if what == "raise":
        raise RuntimeError("the agent's own bug")
    if what == "leave":  # a call it does not wait for: aborted (or never sent) when the episode ends
        asyncio.get_running_loop().create_task(ask())
        await asyncio.sleep(0)
        return 1.0
    if what == "text":
        return "great"
    return 1.0


def test_an_agent_that_misbehaves_costs_its_episode_not_the_run(monkeypatch, caplog):
    from rlvr.config import AgentLimits
    from rlvr.engines.base import SamplingParams
    from rlvr.engines.hf import HFEngine
    from rlvr.environments.agents import register_agent
    from rlvr.stages import agents
    from rlvr.tasks.prompts import get_prompt
    from rlvr.tasks.records import Example

    monkeypatch.setattr(agents, "GRACE_S", 0.5)
    tokenizer = chat_tokenizer()
    engine = HFEngine(chat_model(tokenizer), tokenizer, batch_size=16)
    runner = agents.AgentRollouts(get_prompt("chat"), AgentLimits(timeout_s=2, max_calls=4, failed_reward=-1.0),
                                  agent=register_agent(misbehaving_agent))
    kinds = ["ok", "raise", "hang", "block", "spam", "leave", "text"]
    questions = [Example(k, "1", id=k) for k in kinds]
    sampling = SamplingParams(max_new_tokens=6, seed=3, n=2)
    with caplog.at_level(logging.WARNING, logger="rlvr.stages.agents"):
        started = time.monotonic()
        first = runner.generate(engine, questions, [""] * len(kinds), sampling, tokenizer)
        again = runner.generate(engine, questions, [""] * len(kinds), sampling, tokenizer)
        took = time.monotonic() - started
    for out in (first, again):
        by = {kinds[c.prompt_index]: c.episode for c in out}
        assert [c.prompt_index for c in out] == [i for i in range(len(kinds)) for _ in range(2)]  # prompt-major
        assert {k: e["failure"] for k, e in by.items()} == {"ok": "", "raise": "error", "hang": "timeout",
                                                            "block": "timeout", "spam": "budget", "leave": "",
                                                            "text": "error"}
        assert by["ok"]["reward"]["reward"] == 1.0 and by["spam"]["reward"]["reward"] == -1.0
        assert by["spam"]["calls"] == 4  # the budget admitted four
        assert by["leave"]["calls"] in (1, 2)  # what it left running was aborted when its episode ended
    stats = stages.episode_metrics(first)
    assert stats["agent/failed"] == pytest.approx(5 / 7) and stats["agent/failed_timeout"] == pytest.approx(2 / 7)
    # each reason logged once, though 20 episodes failed over the two batches
    reasons = [r.getMessage() for r in caplog.records if "an agent's episode failed" in r.getMessage()]
    assert len(reasons) == 5 and took < 30


async def coin_agent(client, row, sampling):
    """One chat; the reward is the seed's parity (groups with spread, whatever the tiny model writes)."""
    await client.chat.completions.create(messages=row["prompt"], **sampling)
    return float(sampling["seed"] % 2)


def test_agents_run_with_dynamic_sampling_the_curriculum_validation_and_eval(tmp_path):
    import rlvr
    from rlvr.config import EvalConfig, load_config
    from rlvr.stages.evaluation import run_eval

    tokenizer = chat_tokenizer()
    chat_model(tokenizer).save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    run = rlvr.train(train_cfg(tmp_path / "tiny", tmp_path / "run", steps=2, dynamic_sampling=True,
                               curriculum={"enabled": True, "first_pass": 2}, prompt="chat",
                               rollout_correction={"mode": "token_mask"}).model_dump(exclude_unset=True),
                     agent=coin_agent)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "train/reward" in m]
    assert len(steps) == 2 and all(m["train/dynamic_kept_groups"] == 2 for m in steps)
    assert all(m["agent/calls"] == 1 and m["agent/failed"] == 0 for m in steps)
    first = metrics[0]  # the curriculum's first pass judged the two questions by their episodes
    assert first["curriculum/easy"] + first["curriculum/hard"] + first["curriculum/signal"] == 2
    assert "val/agent/calls" in json.dumps(metrics)
    assert all("train/is_masked_fraction" in m for m in steps)
    (tmp_path / "agent.py").write_text("async def run(client, row, sampling):\n"
                                       "    await client.chat.completions.create(messages=row['prompt'], **sampling)\n"
                                       "    return 1.0\n")
    summary = run_eval(load_config(EvalConfig, overrides=dict(
        model=str(run / "final"), dataset="arithmetic:steps=1,max=9", prompt="chat", split="test", limit=3,
        max_new_tokens=4, agent=f"{tmp_path / 'agent.py'}:run", out=str(tmp_path / "eval"))))
    assert summary["accuracy"] == 1.0 and summary["env"]["agent/calls"] == 1.0
    records = [json.loads(line) for line in (tmp_path / "eval" / "results.jsonl").read_text().splitlines()]
    assert [r["calls"] for r in records] == [1, 1, 1] and all(r["failure"] == "" for r in records)


@pytest.mark.parametrize("overrides, message", [
    ({"distributed": {"rollout_workers": 1}}, "Ray roles"),
    ({"distill": 0.5, "teacher": "x"}, "teacher would score"),
    ({"env": "gsm8k_calculator"}, "env= is a text-level environment"),
    ({"env_class": "calculator"}, "an episode is run by one of them"),
    ({"agent": "tests/test_agents.py:build_sequences"}, "not an async function"),
    ({"agent": "tests/test_agents.py:nothing"}, "has no attribute 'nothing'"),
    ({"agents": {"tool_parser": "nope"}}, "not hermes, none"),
])
def test_what_agents_cannot_run_with_is_refused_naming_the_option(overrides, message, tmp_path, monkeypatch):
    from rlvr.config import ConfigError, TrainConfig, load_config

    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    with pytest.raises(ConfigError, match=message):
        load_config(TrainConfig, overrides={"agent": "tests/test_agents.py:coin_agent", **overrides})

"""Episodes run by programs (`agent=`, `env_class=`): the rollout engine behind rlvr's OpenAI-compatible server for
the batch, each episode a program talking to it through its own URL, every call recorded and trained as sampled.

    generate   the server starts on the rollout engine (rlvr.serve.start_server, in this process); each
               episode runs in a thread of its own with an event loop of its own: the user's async function (or
               TRL's tool loop for an env_class) with an openai.AsyncOpenAI at /episodes/<id>/v1, the row, and
               the sampling settings; the server records its calls (on_record) and refuses those over budget
               (admit); the episode's turns become sequences (rlvr.stages.trajectories)
    bounds     agents.timeout_s (an async hang is cancelled, a program stuck outside the event loop is left in
               its thread and its calls aborted), agents.max_calls and agents.max_tokens (a call past them is
               refused: 403), calls after the episode ended refused; a failed episode is scored
               agents.failed_reward, counted in agent/failed_<reason>, its reason logged once; the run goes on

The episodes of a batch are one generate call for the loops (rlvr.stages.episodes.generate), so training,
validation, dynamic sampling and the curriculum run them as they run text episodes. Completions come back
prompt-major, as the engine's do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import logging
import math
import secrets
import threading
import time

from rlvr.engines.base import SamplingParams
from rlvr.environments.agents import load_agent
from rlvr.environments.tool_loop import ToolEpisode, load_env_class, run_tools
from rlvr.stages.trajectories import AgentCompletion, build_sequences
from rlvr.tasks.prompts import PromptTemplate
from rlvr.tasks.records import Example

log = logging.getLogger(__name__)

MODEL_NAME = "policy"  # the served model's name: what `sampling["model"]` says
GRACE_S = 5.0  # after its timeout, how long a stuck episode's thread is waited for, and its last records


@dataclasses.dataclass
class _Episode:
    id: str
    question: int
    sample: int
    row: dict
    name: str  # the row's id, for the log
    sampling: dict
    temperature: float
    deadline: float = 0.0
    records: list = dataclasses.field(default_factory=list)
    calls: int = 0
    recorded: set = dataclasses.field(default_factory=set)  # the calls whose records are in
    sampled: int = 0
    ended: bool = False
    done: bool = False
    result: object = None
    failure: tuple[str, str] | None = None  # (reason, message)
    stop: object = None  # cancels the agent's task from another thread (set once it runs)

    def fail(self, reason: str, message: str) -> None:
        if self.failure is None:
            self.failure = (reason, message)
        stop = self.stop
        if stop is not None:  # a failed episode is over: the agent is stopped, not left to run its course
            try:
                stop()
            except RuntimeError:  # its event loop has just closed
                pass


def prompt_messages(template: PromptTemplate, example: Example) -> list[dict]:
    """The task's prompt as chat messages: the row's conversation, or its filled template as the user turn (after
    the prompt's system message)."""
    if example.conversation is not None:
        messages = [dict(m) for m in example.conversation]
    else:
        messages = [{"role": "user", "content": template.fill(example)}]
    if template.system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": template.system})
    return messages


def episode_row(template: PromptTemplate, example: Example) -> dict:
    """What an agent (and TRL's reset) gets: every column of the row, the question and answer, and `prompt` as
    chat messages."""
    return {**example.fields, "question": example.question, "answer": example.answer,
            "prompt": prompt_messages(template, example)}


def call_settings(sampling: SamplingParams, seed: int) -> dict:
    """The keyword arguments of a chat call at the batch's settings (the agent's `sampling`)."""
    out = {"model": MODEL_NAME, "temperature": sampling.temperature, "max_tokens": sampling.max_new_tokens,
           "seed": seed}
    if sampling.top_p != 1.0:
        out["top_p"] = sampling.top_p
    if sampling.stop:
        out["stop"] = list(sampling.stop)
    extra = {k: v for k, v, neutral in (("top_k", sampling.top_k, 0), ("min_p", sampling.min_p, 0.0),
                                        ("repetition_penalty", sampling.repetition_penalty, 1.0),
                                        ("min_tokens", sampling.min_new_tokens, 0)) if v != neutral}
    if extra:
        out["extra_body"] = extra
    return out


def episode_seed(seed: int, question: int, sample: int) -> int:
    """A seed per episode (its G samples of a question must differ), a function of the batch's seed."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{question}:{sample}".encode()).digest()[:4], "big") >> 1


class AgentRollouts:
    """The episodes of `agent=` or `env_class=` (rlvr.stages.episodes.generate calls `generate`)."""

    logged: set = set()  # (reason, message) pairs already logged in this process: each failure's reason once

    def __init__(self, template: PromptTemplate, limits, agent: str | None = None, env_class: str | None = None):
        self.template, self.limits = template, limits
        self.agent = load_agent(agent) if agent is not None else None
        self.env_class = load_env_class(env_class) if env_class is not None else None
        self.lock = threading.Lock()
        self.episodes: dict[str, _Episode] = {}
        self.tokenizer_dir: str | None = None  # the tokenizer saved, for a library that renders prompts itself

    @classmethod
    def from_config(cls, cfg) -> AgentRollouts:
        from rlvr.tasks.task import task_prompt

        return cls(task_prompt(cfg), cfg.agents, cfg.agent, cfg.env_class)

    def token_budget(self, max_new_tokens: int) -> int:
        return self.limits.max_tokens or self.limits.max_calls * max_new_tokens

    # -- the server's hooks (its threads) --------------------------------------------------------------------

    def admit(self, call) -> str | None:
        with self.lock:
            ep = self.episodes.get(call.episode)
            if ep is None:
                return "this server answers the run's episodes only (/episodes/<id>/v1)"
            if ep.ended:
                return f"episode {ep.id} has ended"
            if ep.calls >= self.limits.max_calls:
                ep.fail("budget", f"a call past agents.max_calls={self.limits.max_calls}")
                return ep.failure[1]
            budget = self.token_budget(ep.sampling["max_tokens"])
            if ep.sampled + call.max_tokens * call.n > budget:
                ep.fail("budget", f"a call of max_tokens={call.max_tokens} x n={call.n} with {ep.sampled} ids "
                                  f"sampled, past agents.max_tokens={budget}")
                return ep.failure[1]
            if call.sampling is not None and call.sampling.temperature != ep.temperature:
                ep.fail("refused", f"a call at temperature {call.sampling.temperature:g}; this batch samples at "
                                   f"{ep.temperature:g} (the learner scores its tokens there)")
                return ep.failure[1]
            ep.calls += 1
        return None

    def on_record(self, record) -> None:
        with self.lock:
            ep = self.episodes.get(record.episode)
            if ep is None:
                return
            ep.records.append(record)
            ep.recorded.add(record.request_id.rpartition("-")[0])
            ep.sampled += sum(len(s.token_ids) for s in record.samples)

    # -- one episode, in its own thread --------------------------------------------------------------------

    async def _play(self, ep: _Episode, base_url: str):
        import openai

        # its own timeout past the episode's: the episode's bound is what ends a slow call
        client = openai.AsyncOpenAI(base_url=base_url, api_key="rlvr", max_retries=0,
                                    timeout=self.limits.timeout_s + GRACE_S)
        try:
            if hasattr(self.env_class, "play"):  # an episode runner of another library's (verifiers)
                return await self.env_class.play(client, ep.row, ep.sampling, self.tokenizer_dir)
            if self.env_class is not None:
                return await run_tools(self.env_class, client, ep.row, ep.sampling, self.limits.max_turns)
            return await self.agent(client, ep.row, ep.sampling)
        finally:
            await client.close()

    def _thread(self, ep: _Episode, base_url: str, finished: threading.Condition) -> None:
        async def bounded():
            loop, task = asyncio.get_running_loop(), asyncio.current_task()
            ep.stop = lambda: loop.call_soon_threadsafe(task.cancel)
            return await asyncio.wait_for(self._play(ep, base_url), self.limits.timeout_s)

        try:
            ep.result = asyncio.run(bounded())
        except asyncio.CancelledError:  # stopped: it failed (admit said why)
            ep.fail("error", "cancelled")
        except (asyncio.TimeoutError, TimeoutError):
            ep.fail("timeout", f"took over agents.timeout_s={self.limits.timeout_s:g} s")
        except BaseException as err:  # noqa: BLE001 -- the agent's failure costs its episode, never the run
            ep.fail("error", f"raised {type(err).__name__}: {str(err)[:300]}")
        finally:
            ep.stop = None
            with finished:
                ep.done = True
                finished.notify_all()

    # -- a batch ----------------------------------------------------------------------------------------

    def generate(self, engine, questions: list[Example], prompts: list[str], sampling: SamplingParams, tokenizer,
                 progress=None) -> list[AgentCompletion]:
        """len(questions) * sampling.n episodes, prompt-major (an episode's `n` is its group's index)."""
        from rlvr.serve import start_server

        # a line per call at INFO otherwise (openai 3 talks through httpx2): the run's log, not the agents' traffic
        for name in ("httpx", "httpx2", "openai"):
            if logging.getLogger(name).level == logging.NOTSET:
                logging.getLogger(name).setLevel(logging.WARNING)
        if hasattr(self.env_class, "play") and self.tokenizer_dir is None:
            import tempfile

            self._saved = tempfile.TemporaryDirectory(prefix="rlvr-tokenizer-")
            tokenizer.save_pretrained(self._saved.name)
            self.tokenizer_dir = self._saved.name
        batch = secrets.token_hex(4)
        rows = [episode_row(self.template, q) for q in questions]
        episodes = [_Episode(f"{batch}-{q}-{s}", q, s, rows[q], questions[q].id or f"question {q}",
                             call_settings(sampling, episode_seed(sampling.seed, q, s)), sampling.temperature)
                    for q in range(len(questions)) for s in range(sampling.n)]
        with self.lock:
            self.episodes = {ep.id: ep for ep in episodes}
        server = start_server(engine, tokenizer, model_name=MODEL_NAME, on_record=self.on_record,
                              admit=self.admit, tool_parser=self.limits.tool_parser,
                              default_max_tokens=sampling.max_new_tokens)
        try:
            self._run_all(episodes, server, progress)
            self._drain(episodes, server)
        finally:
            server.stop(GRACE_S)
        with self.lock:
            self.episodes = {}
        return [self._completion(ep) for ep in episodes]

    def _run_all(self, episodes: list[_Episode], server, progress) -> None:
        finished = threading.Condition()
        waiting, running = list(episodes), []
        room = self.limits.concurrency or len(episodes)
        while waiting or running:
            while waiting and len(running) < room:
                ep = waiting.pop(0)
                ep.deadline = time.monotonic() + self.limits.timeout_s + GRACE_S
                # a daemon thread: a program stuck outside its event loop must not keep the process alive
                threading.Thread(target=self._thread, args=(ep, server.episode_url(ep.id), finished),
                                 name=f"rlvr-agent-{ep.id}", daemon=True).start()
                running.append(ep)
            with finished:
                finished.wait(timeout=0.05)
            now = time.monotonic()
            for ep in list(running):
                if ep.done or now > ep.deadline:
                    if not ep.done:  # its thread is stuck outside the event loop: left there, its calls aborted
                        ep.fail("timeout", f"took over agents.timeout_s={self.limits.timeout_s:g} s (stuck outside "
                                           "its event loop)")
                    self._end(ep, server)
                    running.remove(ep)
                    if progress is not None:
                        progress(1)

    def _end(self, ep: _Episode, server) -> None:
        with self.lock:
            ep.ended = True  # admit refuses what it still tries
        server.end_episode(ep.id)  # and what it left queued or decoding is aborted (recorded as "abort")

    def _drain(self, episodes: list[_Episode], server) -> None:
        """Wait (a little) for the records of calls still in flight when their episodes ended."""
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline:
            with self.lock:
                if all(len(ep.recorded) >= ep.calls for ep in episodes):
                    return
            for ep in episodes:
                server.end_episode(ep.id)
            time.sleep(0.02)

    # -- the rollout ------------------------------------------------------------------------------------

    def _completion(self, ep: _Episode) -> AgentCompletion:
        records = list(ep.records)  # as the calls finished: a call that continues another is made after it finished
        turns = [(r.prompt_ids, s.token_ids, s.logprobs) for r in records for s in r.samples]
        sequences = build_sequences(turns)
        sampled = [t for _, ids, _ in turns for t in ids]
        logprobs = [x for _, _, lps in turns for x in lps]
        chats = [r for r in records if r.endpoint == "chat.completions"]
        last = records[-1].samples[0] if records else None
        result = ep.result
        # rlvr ran the tools of an env_class's episodes: it knows which calls failed (agent = 2)
        env, messages, reward, tool_calls, tool_errors = None, None, result, 0, 0
        kind = 2 if self.env_class is not None else 1
        if isinstance(result, ToolEpisode):
            env, messages, reward = result.environment, result.messages, result.reward
            tool_calls, tool_errors = result.tool_calls, result.tool_errors
        else:
            tool_calls = sum(len(s.tool_calls or []) for r in chats for s in r.samples)
            if chats:
                messages = list(chats[-1].request.get("messages", [])) + [_reply(chats[-1].samples[0])]
        reward = self._checked(ep, reward)
        failure = ""
        if ep.failure is not None:
            failure, message = ep.failure
            self._log_failure(ep, failure, message)
            failed = self.limits.failed_reward
            reward = {"reward": math.nan if failed is None else failed,
                      "answer_reward": math.nan if failed is None else failed, "format_reward": math.nan}
        truncated = bool(failure) or (last is not None and last.finish_reason in ("length", "abort"))
        observed = sum(not m for s in sequences for m in s.mask)
        episode = {"agent": kind, "id": ep.id, "turns": len(turns), "calls": ep.calls, "sequences": len(sequences),
                   "tool_calls": tool_calls, "tool_errors": tool_errors, "observation_tokens": observed,
                   "end": failure or "answer", "failure": failure, "turn_rewards": [], "reward": reward,
                   "error": ep.failure[1] if ep.failure else "", "tool_seconds": 0.0}
        return AgentCompletion(ep.question, ep.sample, last.text if last is not None else "", sampled,
                               "length" if truncated else "stop", logprobs, None, episode=episode,
                               sequences=sequences, messages=_after_prompt(messages), environment=env)

    @staticmethod
    def _checked(ep: _Episode, reward):
        """The agent's reward as scores (a plain number is the reward and the answer signal, as a reward function's
        is), or None (rewards= score the episode); anything else fails the episode."""
        if reward is None or isinstance(reward, bool):
            return None if reward is None else {"reward": float(reward), "answer_reward": float(reward),
                                                "format_reward": math.nan}
        try:
            if isinstance(reward, dict):
                value = float(reward["reward"])
                out = {"reward": value, "answer_reward": float(reward.get("answer_reward", value)),
                       "format_reward": math.nan if reward.get("format_reward") is None
                       else float(reward["format_reward"])}
            else:
                value = float(reward)
                out = {"reward": value, "answer_reward": value, "format_reward": math.nan}
        except (TypeError, ValueError, KeyError):
            ep.fail("error", f"returned {type(reward).__name__} {str(reward)[:80]!r}; an agent returns a number, a "
                             "dict with reward (and answer_reward, format_reward), or None")
            return None
        if not all(math.isfinite(v) for k, v in out.items() if k != "format_reward"):
            ep.fail("error", f"returned the reward {str(reward)[:80]}; rewards must be finite")
            return None
        return out

    def _log_failure(self, ep: _Episode, reason: str, message: str) -> None:
        key = (reason, message)
        if key not in AgentRollouts.logged:
            AgentRollouts.logged.add(key)
            log.warning("an agent's episode failed (%s): %s (first seen at %s, sample %d; it is scored %s and "
                        "counted in agent/failed_%s; this reason is not logged again)", reason, message, ep.name,
                        ep.sample, self.limits.failed_reward, reason)


def _reply(sample) -> dict:
    message = {"role": "assistant", "content": sample.text}
    if sample.tool_calls:
        message["tool_calls"] = sample.tool_calls
    return message


def _after_prompt(messages: list[dict] | None) -> list[dict] | None:
    """The conversation after its last user turn (worked examples and earlier exchanges are the prompt's): what
    TRL's reward functions get as a conversational completion, the replies, tool calls and results."""
    if messages is None:
        return None
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    return [dict(m) for m in messages[users[-1] + 1 if users else 0:]]


def rollout_source(cfg):
    """What a loop's episodes are: the agent runner (agent=, env_class=), a text environment's name (env=), or
    None (single turns), as rlvr.stages.episodes.generate takes them."""
    if getattr(cfg, "agentic", False):
        return AgentRollouts.from_config(cfg)
    return getattr(cfg, "env", None)

"""Multi-turn rollouts (`env=`): every episode of a step decodes together, turn by turn.

    turn 1     engine.generate(prompts, n=G): the same call, and so the same samples, as a single-turn step
    between    every episode whose turn stopped at one of the environment's stop strings gets `env.step` (all
               of them at once, in threads: a tool waits on a sandbox, not on Python), and its observation's
               ids are appended to the episode -- except after the last turn (`max_turns`, or a turn that
               filled the budget), whose step still runs (its reward, `done` and the environment's state
               count) but whose observation is dropped: no turn follows to read it
    turn k>1   engine.generate(token ids, n=1) for the episodes still going: the prompt's ids, every sampled id
               and every observation id, as they are (nothing is decoded and encoded again)

An episode comes back as one Completion: `token_ids` every response id in order, `loss_mask` True on the ids
the engine sampled and False on the observations' (the learner trains only the first: rlvr.algorithms.policy),
`logprobs` / `entropies` the sampler's, NaN on observation ids, `text` the transcript, `episode` what it did.
The ids of a turn may run a few characters past its stop string (a stop ends inside a token); the ids are what
the model saw and what is trained, the transcript is each turn's text cut at its stop.

Each episode ends (episode["end"]) at: "answer" (end-of-sequence, or a stop string of the prompt's that is not
also the environment's: an environment that lists "</answer>" in its stop sees the answer and may ask again; on
the last turn, any stop string of the prompt's), "done" (the environment said so, after the last turn too),
"max_turns" (the last allowed turn stopped at a tool call and its step did not say done), "max_tokens" (a model
turn cut by the budget of model + observation ids or by max_turn_tokens: a turn cut short is not an answer; or a
tool call's turn that filled the budget, leaving no room for its observation), "tool_timeout" or "tool_error"
(step raised). The last three and "max_tokens" count as truncated (finish_reason "length"). A turn that ends at
a stop string or end-of-sequence exactly at the budget is whole: an answer there is an answer.

Between turns the engine keeps the KV of every turn that may be continued (`SamplingParams.keep_cache`; rlvr's
engine: `env_cache_mib`), so the next turn prefills only the last sampled id and the observation, not the whole
history; the sampled ids are the same either way up to float rounding (tests/test_environments.py), and
bench/episode_cache.py measures what it saves.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent import futures

from rlvr.engines.base import Completion, RolloutEngine, SamplingParams
from rlvr.environments import Environment, Observation, environment_factory
from rlvr.stages.trajectories import agent_stats
from rlvr.tasks.records import Example

NAN = math.nan


@dataclasses.dataclass
class _Episode:
    env: Environment
    prompt_ids: list[int]
    key: str
    budget: int
    ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[bool] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    entropies: list[float] = dataclasses.field(default_factory=list)
    text: str = ""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    observation_tokens: int = 0
    turn_rewards: list[float] = dataclasses.field(default_factory=list)
    tool_seconds: float = 0.0  # its share of the wall time the rounds it was stepped in took
    end: str | None = None
    error: str = ""

    def add_turn(self, c: Completion) -> bool:
        """Append a model turn (cut at the budget); False when the budget cut it."""
        room = self.budget - len(self.ids)
        ids = list(c.token_ids[:room])
        self.ids += ids
        self.mask += [True] * len(ids)
        self.logprobs += list(c.logprobs[: len(ids)]) if c.logprobs is not None else [NAN] * len(ids)
        self.entropies += list(c.entropies[: len(ids)]) if c.entropies is not None else [NAN] * len(ids)
        self.text += c.text
        self.turns += 1
        return len(ids) == len(c.token_ids)

    def add_observation(self, obs: Observation, tokenizer) -> bool:
        ids = list(obs.ids) if obs.ids is not None else tokenizer(obs.text, add_special_tokens=False).input_ids
        room = self.budget - len(self.ids)
        self.ids += ids[:room]
        self.mask += [False] * len(ids[:room])
        self.logprobs += [NAN] * len(ids[:room])
        self.entropies += [NAN] * len(ids[:room])
        self.observation_tokens += len(ids[:room])
        self.text += obs.text
        return len(ids) < room  # room left for the model to write

    def completion(self, prompt_index: int, sample_index: int) -> Completion:
        truncated = self.end in ("max_turns", "max_tokens", "tool_timeout", "tool_error")
        reward = self.env.reward(self.text)
        return Completion(prompt_index, sample_index, self.text, self.ids, "length" if truncated else "stop",
                          self.logprobs, self.entropies, loss_mask=self.mask,
                          episode={"turns": self.turns, "tool_calls": self.tool_calls, "tool_errors": self.tool_errors,
                                   "observation_tokens": self.observation_tokens, "end": self.end,
                                   "turn_rewards": self.turn_rewards, "error": self.error, "reward": reward,
                                   "tool_seconds": self.tool_seconds})


def _steps(episodes: list[_Episode], turns: list[Completion], pool: futures.Executor):
    """Every pending env.step at once; (observation or exception) per episode, None on a timeout."""
    start = time.monotonic()
    jobs = [pool.submit(e.env.step, c.text, list(c.token_ids)) for e, c in zip(episodes, turns)]
    out = []
    for episode, job in zip(episodes, jobs):  # every step had its whole timeout from the start, side by side
        try:
            out.append(job.result(timeout=max(0.0, start + episode.env.tool_timeout_s - time.monotonic())))
        except futures.TimeoutError:
            out.append(None)
        except Exception as err:  # the environment's failure ends its episode, not the run
            out.append(err)
    return out


def generate(engine: RolloutEngine, env, questions: list[Example], prompts: list[str],
             sampling: SamplingParams, tokenizer, progress=None) -> list[Completion]:
    """len(prompts) * sampling.n completions, prompt-major: the engine's single turns, or with `env` (a name or
    import path, `env=`) one multi-turn episode each, or with a runner of programs' episodes (agent=, env_class=:
    rlvr.stages.agents, anything with this function's `generate`) theirs. Training, validation and `rlvr eval`
    all generate here."""
    if env is None:
        return engine.generate(prompts, sampling, progress=progress)
    if not isinstance(env, str):
        return env.generate(engine, questions, prompts, sampling, tokenizer, progress)
    return run_episodes(engine, environment_factory(env), questions, prompts, sampling, tokenizer, progress)


def run_episodes(engine: RolloutEngine, env_cls: type[Environment], questions: list[Example], prompts: list[str],
                 sampling: SamplingParams, tokenizer, progress=None) -> list[Completion]:
    """len(prompts) * sampling.n episodes, prompt-major as engine.generate returns completions."""
    n = sampling.n
    stops = tuple(dict.fromkeys(tuple(sampling.stop) + tuple(env_cls.stop)))
    budget = env_cls.episode_budget(sampling.max_new_tokens)
    turn_cap = min(budget, env_cls.max_turn_tokens or budget)
    encoded = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts]
    episodes = [_Episode(env_cls(questions[q]), encoded[q], f"{prompts[q]}\x00{s}", budget)
                for q in range(len(prompts)) for s in range(n)]
    first = dataclasses.replace(sampling, stop=stops, max_new_tokens=turn_cap, keep_cache=env_cls.max_turns > 1)
    turns = engine.generate(prompts, first)
    going = list(range(len(episodes)))
    pool = futures.ThreadPoolExecutor(max_workers=max(1, len(episodes)), thread_name_prefix="rlvr-env")
    try:
        while going:
            asking = []  # episodes whose turn stopped at a tool call
            for i, c in zip(going, turns):
                e = episodes[i]
                whole = e.add_turn(c)
                tool_call = any(c.text.endswith(s) for s in env_cls.stop)  # the environment's stops come first
                # a turn that ends at its stop string or end-of-sequence exactly at the budget is whole: not cut
                if not whole or c.finish_reason == "length":
                    e.end = "max_tokens"
                elif not tool_call:
                    e.end = "answer"  # end-of-sequence, or the answer's stop string
                else:  # the last allowed turn too: state and reward see every action
                    asking.append((i, c))
            going = []
            start = time.perf_counter()
            results = _steps([episodes[i] for i, _ in asking], [c for _, c in asking], pool)
            share = (time.perf_counter() - start) / max(1, len(asking))
            for (i, c), result in zip(asking, results):
                e = episodes[i]
                e.tool_seconds += share
                if result is None:
                    e.end, e.error = "tool_timeout", f"step took over {env_cls.tool_timeout_s:g} s"
                elif isinstance(result, BaseException):
                    e.end, e.error = "tool_error", f"{type(result).__name__}: {result}"
                    e.tool_errors += 1
                else:
                    e.tool_calls += result.tool_calls
                    e.tool_errors += result.tool_errors
                    if result.reward is not None:
                        e.turn_rewards.append(float(result.reward))
                    if result.done:
                        e.end = "done"
                    elif e.turns >= env_cls.max_turns or len(e.ids) >= budget:  # the last turn: its observation
                        # is dropped, no turn follows to read it
                        last = "max_turns" if e.turns >= env_cls.max_turns else "max_tokens"
                        e.end = "answer" if any(c.text.endswith(s) for s in sampling.stop) else last
                    elif not e.add_observation(result, tokenizer):
                        e.end = "max_tokens"
                    else:
                        going.append(i)
            if progress is not None:
                progress(len(turns) - len(going))  # the episodes that ended this round
            if going:
                room = min(turn_cap, max(budget - len(episodes[i].ids) for i in going))
                later = dataclasses.replace(sampling, stop=stops, max_new_tokens=room, n=1,
                                            keep_cache=episodes[going[0]].turns + 1 < env_cls.max_turns)
                turns = engine.generate([episodes[i].prompt_ids + episodes[i].ids for i in going], later,
                                        keys=[f"{episodes[i].key}\x00{episodes[i].turns}" for i in going])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a step that never returns keeps only its thread
        if hasattr(engine, "clear_cache"):  # what the finished episodes' last turns kept
            engine.clear_cache()
    return [e.completion(i // n, i % n) for i, e in enumerate(episodes)]


def episode_metrics(completions: list[Completion]) -> dict[str, float]:
    """A step's `env/*` metrics: turns, tool calls, tool errors and timeouts, observation tokens, how episodes
    ended, the per-turn rewards by turn, and the wall seconds spent in the environments' steps."""
    return episode_stats([c.episode for c in completions if c.episode is not None])


def episode_stats(episodes: list[dict]) -> dict[str, float]:
    """episode_metrics of the episodes' records (Completion.episode, or an evaluation's records of them); an
    agent's episodes (rlvr.stages.agents) add agent/*."""
    if not episodes:
        return {}
    k = len(episodes)
    m = {"env/turns": sum(e["turns"] for e in episodes) / k,
         "env/tool_calls": sum(e["tool_calls"] for e in episodes) / k,
         "env/tool_errors": float(sum(e["tool_errors"] for e in episodes)),
         "env/tool_timeouts": float(sum(e["end"] == "tool_timeout" for e in episodes)),
         "env/observation_tokens": sum(e["observation_tokens"] for e in episodes) / k,
         # wall seconds the environments' steps took between turns (time/generate less this is decoding)
         "time/env_tools": sum(e.get("tool_seconds", 0.0) for e in episodes)}
    for end in ("answer", "done", "max_turns", "max_tokens", "tool_timeout", "tool_error"):
        m[f"env/end_{end}"] = sum(e["end"] == end for e in episodes) / k
    by_turn: dict[int, list[float]] = {}
    for e in episodes:
        for t, r in enumerate(e["turn_rewards"]):
            by_turn.setdefault(t + 1, []).append(r)
    for t, rewards in sorted(by_turn.items()):
        m[f"env/reward_turn_{t}"] = sum(rewards) / len(rewards)  # over the episodes the environment rewarded
    # over every episode, 0 where turn 1 got no reward (code_feedback: the first attempts' pass rate)
    m["env/first_turn_reward"] = sum(e["turn_rewards"][0] for e in episodes if e["turn_rewards"]) / k
    m.update(agent_stats(episodes))
    return m


def apply_env_rewards(scores: list[dict], completions: list[Completion]) -> list[dict]:
    """Where an environment scored its episode (`Environment.reward` not None), its reward replaces the reward
    function's: a number replaces "reward", a dict (reward, format_reward, answer_reward) the whole score."""
    for score, c in zip(scores, completions):
        reward = c.episode.get("reward") if c.episode is not None else None
        if isinstance(reward, dict):
            score.update({k: float(v) for k, v in reward.items()})
        elif reward is not None:
            score["reward"] = float(reward)
    return scores

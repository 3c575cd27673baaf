"""An agent's calls as what the learner trains on: the token-exactness rule (docs/agents.md).

Every call an episode made is recorded by the server (rlvr.serve.records.CallRecord): the prompt ids the engine
was given, and per choice the ids it sampled with their sampling log-probs. A turn is one choice of one call. The
turns, in the order their calls finished (a call that continues another is made after that one finished), become
sequences:

    a turn whose prompt starts with a sequence's ids (its first prompt, then everything after) extends it: the
    prompt's new ids (the template's text between turns, tool results, the next user turn) are appended with
    mask False and NaN log-probs, then the sampled ids with mask True and their log-probs;
    a turn whose prompt extends no sequence (another chat; a template that rewrote history, as Qwen3 drops
    earlier <think> blocks; a second choice of the same prompt) starts a new sequence from its own prompt.

So every sampled id is trained exactly once, as the engine sampled it, after exactly the ids it was sampled
after, and nothing the model did not sample is trained. An episode's sequences all take the episode's advantage;
group statistics count episodes, not sequences (rlvr.stages.rollouts.score_rollouts).
"""

from __future__ import annotations

import dataclasses
import math

import torch

from rlvr.engines.base import Completion

NAN = math.nan


@dataclasses.dataclass
class Sequence:
    """One trained row: the prompt of its first turn (never trained), then every id after it."""

    prompt_ids: list[int]
    ids: list[int] = dataclasses.field(default_factory=list)
    mask: list[bool] = dataclasses.field(default_factory=list)  # True on the ids the engine sampled
    logprobs: list[float] = dataclasses.field(default_factory=list)  # sampling log-probs, NaN where not sampled
    turns: int = 0

    @property
    def full(self) -> list[int]:
        return self.prompt_ids + self.ids

    def extend(self, prompt_ids: list[int], sampled: list[int], logprobs: list[float]) -> None:
        bridge = prompt_ids[len(self.prompt_ids) + len(self.ids):]
        self.ids += bridge + list(sampled)
        self.mask += [False] * len(bridge) + [True] * len(sampled)
        self.logprobs += [NAN] * len(bridge) + [float(x) for x in logprobs]
        self.turns += 1


def build_sequences(turns) -> list[Sequence]:
    """Sequences from (prompt ids, sampled ids, sampling log-probs) turns in the order their calls finished (see
    the module)."""
    sequences: list[Sequence] = []
    for prompt, sampled, logprobs in turns:
        if not sampled:  # a call cut before its first id (aborted) sampled nothing to train
            continue
        prompt = list(prompt)
        extends = [s for s in sequences if len(s.full) <= len(prompt) and prompt[: len(s.full)] == s.full]
        target = max(extends, key=lambda s: len(s.full)) if extends else None
        if target is None:
            target = Sequence(list(prompt))
            sequences.append(target)
        target.extend(prompt, sampled, logprobs)
    return sequences


@dataclasses.dataclass
class AgentCompletion(Completion):
    """An agent's episode as a rollout: `token_ids` / `logprobs` every id it sampled over all its calls (what
    lengths and TRL's completion_ids count), `text` its last reply, `sequences` what the learner trains,
    `messages` the conversation reward functions see (TRL's `completions`), `environment` an env_class's
    instance (TRL's `environments`)."""

    sequences: list[Sequence] = dataclasses.field(default_factory=list)
    messages: list[dict] | None = None
    environment: object = None


def is_agentic(completions) -> bool:
    return bool(completions) and isinstance(completions[0], AgentCompletion)


def sequence_batch(completions: list[AgentCompletion], pad_id: int):
    """The rows of a batch of episodes: (input_ids, labels, response_mask, sampling log-probs, rows of each
    episode). Shifted as rlvr.algorithms.policy.tokenize_prompt_and_ids shifts: position t predicts labels[t]; the
    response mask is True exactly on the labels the engine sampled, and the log-probs are theirs there (NaN
    elsewhere). A batch whose episodes sampled nothing gets one row with nothing to train (the optimizer still
    steps on a zero gradient, as for a batch pruned to nothing)."""
    rows, owners = [], []
    for j, c in enumerate(completions):
        for s in c.sequences:
            rows.append(s)
            owners.append(j)
    width = max([len(s.full) for s in rows] + [2])
    n = max(len(rows), 1)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.bool)
    logprobs = torch.full((n, width), NAN)
    for i, s in enumerate(rows):
        full, start = s.full, len(s.prompt_ids)
        ids[i, : len(full)] = torch.tensor(full, dtype=torch.long)
        mask[i, start : len(full)] = torch.tensor(s.mask, dtype=torch.bool)
        logprobs[i, start : len(full)] = torch.tensor(s.logprobs, dtype=torch.float32)
    of = [[i for i, o in enumerate(owners) if o == j] for j in range(len(completions))]
    return ids[:, :-1], ids[:, 1:], mask[:, 1:], logprobs[:, 1:], of


def agent_stats(episodes: list[dict]) -> dict[str, float]:
    """A step's agent/* metrics from agent episodes' records (Completion.episode): calls and sequences per
    episode, tool calls the server parsed, failures by reason (fractions of the episodes), and where rlvr ran the
    tools (env_class=: agent = 2) the share of calls that ran without error and of episodes with one that did."""
    agents = [e for e in episodes if e.get("agent")]
    if not agents:
        return {}
    k = len(agents)
    m = {"agent/calls": sum(e["calls"] for e in agents) / k,
         "agent/sequences": sum(e["sequences"] for e in agents) / k,
         "agent/tool_calls": sum(e["tool_calls"] for e in agents) / k,
         "agent/failed": sum(bool(e["failure"]) for e in agents) / k}
    for kind in ("timeout", "error", "budget", "refused"):
        m[f"agent/failed_{kind}"] = sum(e["failure"] == kind for e in agents) / k
    ran = [e for e in agents if e["agent"] == 2]
    if ran:
        calls = sum(e["tool_calls"] for e in ran)
        m["agent/tool_call_success"] = (calls - sum(e["tool_errors"] for e in ran)) / calls if calls else 0.0
        m["agent/episodes_with_tool_success"] = sum(e["tool_calls"] > e["tool_errors"] for e in ran) / len(ran)
    return m

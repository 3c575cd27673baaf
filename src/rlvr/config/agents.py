"""The fields that make a run's episodes a program's (docs/agents.md): `agent=` (your async function, given an OpenAI
client pointed at the policy), `env_class=` (a TRL-style environment class whose methods are tools; rlvr runs the
tool loop) and their bounds, `agents.*`. Mixed into `rlvr train` and `rlvr eval`; checked before any model loads.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from rlvr.config.base import BaseConfig


class AgentLimits(BaseConfig):
    """`agents.*`: what one episode of `agent=` or `env_class=` may do. Past a bound the episode fails (scored
    `failed_reward`, counted in agent/failed_*, the reason logged once); the run goes on."""

    timeout_s: float = Field(600.0, gt=0, description="wall seconds one episode may take, its calls included and "
                             "their wait for the server's batch (every episode of a batch starts at once: on a CPU, "
                             "a batch of long prompts can take minutes)")
    max_calls: int = Field(16, ge=1, description="model calls one episode may make (the next is refused, 403)")
    max_tokens: int | None = Field(None, ge=1, description="ids one episode may sample over all its calls, counted "
                                   "as each call's max_tokens x n when it is admitted (None: max_calls x "
                                   "max_new_tokens)")
    max_turns: int = Field(8, ge=1, description="env_class=: model turns of the tool loop (a turn without a tool "
                           "call ends the episode first)")
    concurrency: int | None = Field(None, ge=1, description="episodes running at once (None: the whole batch)")
    tool_parser: str = Field("hermes", description="how the server reads tool calls in the model's text: hermes "
                             "(<tool_call>{json}</tool_call>), none, or file.py:function (docs/serve.md)")
    failed_reward: float | None = Field(0.0, description="the reward of an episode that failed (timed out, raised, "
                                        "went over its budget); None: left out of its group, as a row no reward "
                                        "function scored")

    @model_validator(mode="after")
    def _parser(self):
        # the server loads it (rlvr.serve.tools, above config): here the name's shape and the file
        where = self.tool_parser.rpartition(":")[0]
        if self.tool_parser not in ("hermes", "none") and not where:
            raise ValueError(f"agents.tool_parser={self.tool_parser!r}: not hermes, none, file.py:function or "
                             "module:function")
        if where.endswith(".py") and not Path(where).is_file():
            raise ValueError(f"agents.tool_parser={self.tool_parser!r}: no file {where}")
        return self


class AgentFields(BaseConfig):
    """`agent=` / `env_class=` and `agents.*` (rlvr.stages.agents runs them)."""

    agent: str | None = Field(None, description="an async function of yours that runs one episode: "
                              "path/to/agent.py:run_episode or package.module:fn; it gets an openai.AsyncOpenAI "
                              "client pointed at the policy, the row and the sampling settings, and returns its "
                              "reward or None (then the run's reward functions score the episode's messages); "
                              "docs/agents.md")
    env_class: str | None = Field(None, description="a TRL-style environment class (reset(**row), public methods "
                                  "as tools): path/to/env.py:Class, package.module:Class, or a built-in: "
                                  "calculator, python; rlvr runs the tool loop through its server")
    agents: AgentLimits = Field(default_factory=AgentLimits)

    @property
    def agentic(self) -> bool:
        """Whether this run's episodes are programs talking to the policy through rlvr's server."""
        return self.agent is not None or self.env_class is not None

    @property
    def episodes_reward(self) -> bool:
        """An agent may return each episode's reward itself, so a run of one needs no reward function."""
        return self.agentic

    @model_validator(mode="after")
    def _check_agent(self):
        if self.agent is not None and self.env_class is not None:
            raise ValueError(f"agent={self.agent} and env_class={self.env_class}: an episode is run by one of them; "
                             "remove one")
        if self.agentic and getattr(self, "env", None) is not None:
            raise ValueError(f"env={self.env} with {self._agent_field()}: env= is a text-level environment run by "
                             "rlvr's own decode loop, agent= / env_class= a program talking to the server; use one")
        if self.agent is not None:
            from rlvr.environments.agents import load_agent

            load_agent(self.agent)  # a file that does not import, a function of another shape: fails here
        if self.env_class is not None:
            from rlvr.environments.tool_loop import load_env_class

            load_env_class(self.env_class)
        return self

    def _agent_field(self) -> str:
        return f"agent={self.agent}" if self.agent is not None else f"env_class={self.env_class}"

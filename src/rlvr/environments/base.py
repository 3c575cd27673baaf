"""The environment interface: one class, one episode per instance.

An episode starts from a dataset row, the policy writes a turn, the environment answers, and so on until the
episode ends; then it is scored. A user writes one class in their own file and trains it with
`rlvr train env=path/to/my_env.py:MyEnv` (or `env=package.module:MyEnv`):

    class MyEnv(Environment):
        stop = ("</tool>",)               # a model turn ends at these (besides the prompt's own stop strings)
        max_turns = 4

        def step(self, text, ids):        # the model's turn, as text and as the ids it sampled
            if "<tool>" not in text:
                return Observation(done=True)
            return Observation(text=f"<result>{run(text)}</result>")   # tokenised alone, appended as ids

rlvr makes one instance per rollout, `MyEnv(example)`, and calls `step` after each model turn that stopped at
one of `stop` (which may include the prompt's own, such as "</answer>", for an environment that answers an
answer: "wrong, try again"), the last allowed turn's too, so the environment's state and `reward` see every
action. The last turn's observation is dropped: its text and ids are not appended (no turn follows to read
them, and the transcript and the trained ids end with the model's turn), while its `done`, `reward`,
`tool_calls` and `tool_errors` count as any turn's. The episode ends when `step` says `done`, when the model writes end-of-sequence or
one of the prompt's stop strings that is not in `stop` (the answer is written), at `max_turns` model turns,
when model and observation tokens reach `max_total_tokens` (the run's `max_new_tokens` when None), when one
model turn reaches `max_turn_tokens` (None: no limit of its own), or when `step` raises or takes longer than
`tool_timeout_s`. These numbers can be set on the command line without a subclass:
`env=code_feedback:max_turns=3,max_turn_tokens=160` (rlvr.environments.environment_factory). Its reward is `reward(transcript)`, or when that returns
None the run's reward function on the transcript (every model turn's text and every observation's, in order).

What the learner trains on is the ids the engine sampled with the observations' ids between them, never text
encoded again; observation tokens are masked out of the loss (rlvr.stages.episodes).
"""

from __future__ import annotations

import dataclasses

from rlvr.tasks.records import Example


@dataclasses.dataclass
class Observation:
    """What the environment answers a model turn with."""

    text: str = ""  # appended after the model's turn, tokenised on its own (add_special_tokens=False)
    ids: list[int] | None = None  # or the answer's token ids, used as they are (`text` then only for the transcript)
    done: bool = False  # the episode is over (nothing is appended)
    reward: float | None = None  # this turn's reward, logged by turn (the episode's reward is `reward()`)
    tool_calls: int = 0  # what the turn did, for the step's metrics
    tool_errors: int = 0


class Environment:
    """One episode. Subclass it, set the class attributes and override `step` (and `reward` if the run's reward
    function should not grade the transcript)."""

    stop: tuple[str, ...] = ()
    max_turns: int = 4
    max_total_tokens: int | None = None  # model + observation ids of the whole episode (None: max_new_tokens)
    max_turn_tokens: int | None = None  # ids one model turn may sample (None: what is left of the episode's)
    tool_timeout_s: float = 10.0
    sft_annotations: bool = False  # `rlvr sft env=...`: SFT targets keep GSM8K's calculator annotations
    runs_programs: bool = False  # its tools run model-written programs: the run checks the sandbox first
    needs_code_dataset: bool = False  # it runs each row's tests: the config refuses a dataset without them

    def __init__(self, example: Example):
        self.example = example

    @classmethod
    def episode_budget(cls, max_new_tokens: int) -> int:
        """The ids a whole episode may hold, model's and observations': `max_total_tokens`, else the run's
        `max_new_tokens`."""
        return cls.max_total_tokens or max_new_tokens

    def step(self, text: str, ids: list[int]) -> Observation:
        """The environment's answer to a model turn that stopped at one of `stop` (after the episode's last
        allowed turn too, when only `done`, `reward` and the counts of the answer are used)."""
        return Observation(done=True)

    def sft_segments(self, response: str) -> list[tuple[str, bool]]:
        """An SFT target cut into (text, written by the model) pieces: `rlvr sft env=...` tokenises each piece
        alone, as an episode's turns and observations are, and trains only the model's pieces."""
        return [(response, True)]

    def reward(self, transcript: str) -> float | dict | None:
        """The episode's reward: a number (replaces the reward function's "reward"), a dict like the reward
        functions' (reward, format_reward, answer_reward), or None: the run's reward function grades the
        transcript."""
        return None


ENVIRONMENTS: dict[str, type[Environment]] = {}


def register_environment(name: str, cls: type[Environment]) -> type[Environment]:
    """Add a named environment, so that `env=name` selects it (in this process)."""
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise TypeError(f"register_environment({name!r}, ...) needs an Environment subclass, got {cls!r}")
    ENVIRONMENTS[name] = cls
    return cls

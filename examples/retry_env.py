"""A user-written environment: a second attempt after a wrong answer.

    rlvr train env=examples/retry_env.py:RetryEnv dataset=arithmetic ...

The model answers as usual (r1_zero: `<think> ... </think> <answer> ... </answer>`). A right answer ends the
episode; a wrong one gets "That is not right." and the think tag back, and the model tries once more. The
reward is the last attempt's, halved when it needed the retry. Nothing here is part of rlvr: this file is what
a user writes (rlvr.environments.Environment is the whole interface).
"""

from rlvr import r1_zero_reward_fn
from rlvr.environments import Environment, Observation

RETRY = "\nThat is not right. Think again.\n<think>"


class RetryEnv(Environment):
    stop = ("</answer>",)  # the prompt's own stop: this environment sees every answer
    max_turns = 2

    def __init__(self, example):
        super().__init__(example)
        self.attempts = []

    def step(self, text, ids):
        self.attempts.append(text)
        right = r1_zero_reward_fn(text, self.example.answer)["answer_reward"] > 0
        return Observation(done=True) if right else Observation(text=RETRY)

    def reward(self, transcript):
        last = transcript.rsplit(RETRY, 1)[-1]  # the last attempt
        score = dict(r1_zero_reward_fn(last, self.example.answer))
        if RETRY in transcript:
            score["reward"] = 0.5 * score["reward"]
        return score

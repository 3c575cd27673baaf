"""A procedural verifiers v1 taskset (no hub download): "What is A + B?", scored by a `@vf.reward`. Trained by rlvr
through its server (docs/agents.md, "verifiers"):

    from rlvr.environments.verifiers_env import taskset_rows
    rlvr.train(model=..., env_class="verifiers:examples/agents/verifiers_sum",
               train_dataset=taskset_rows("examples/agents/verifiers_sum", 200), prompt="row", ...)
"""

import random

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData]):
    @vf.reward(weight=1.0)
    async def correct(self, trace) -> float:
        said = (trace.last_reply or "").replace(",", "").split()
        return float(bool(said) and said[-1].strip(".") == self.data.answer)


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    def load(self):
        rng = random.Random(0)
        for _ in range(200):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            yield SumTask(SumData(prompt=f"What is {a} + {b}? Answer with the number only.", answer=str(a + b)))


__all__ = ["SumTaskset"]

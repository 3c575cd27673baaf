"""The generated arithmetic task: word problems a 135M model can learn on a CPU in minutes.

    "arithmetic"                     default difficulty: 2 steps, numbers <= 20
    "arithmetic:steps=3,max=99"      the same with a difficulty knob
"""

from __future__ import annotations

import dataclasses
import random

from rlvr.tasks.records import SPLITS, DataError, Example, dataset_options

_NAMES = ["Sam", "Mia", "Ravi", "Lena", "Omar", "Kofi", "Ana", "Ben", "Yuki", "Zoe", "Ivan", "Nora"]
_ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cards", "shells", "cookies", "stamps"]


@dataclasses.dataclass(frozen=True)
class ArithmeticSpec:
    """Difficulty knob: `steps` operations on integers up to `max` (answers stay in [0, max * 10])."""

    steps: int = 2
    max: int = 20

    @classmethod
    def parse(cls, name: str) -> ArithmeticSpec:
        """"arithmetic" or "arithmetic:steps=3,max=99"."""
        values = dataset_options(name, ("steps", "max"), "options steps=<int>,max=<int>")
        spec = cls(**values)
        if not 1 <= spec.steps <= 8 or not 2 <= spec.max <= 10**6:
            raise DataError(f"dataset {name!r}: need 1 <= steps <= 8 and 2 <= max <= 1000000")
        return spec


def _arithmetic_example(rng: random.Random, spec: ArithmeticSpec, index: int) -> Example:
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    value = rng.randint(1, spec.max)
    sentences = [f"{name} has {value} {item}."]
    steps = [f"{name} starts with {value} {item}."]
    for _ in range(spec.steps):
        op = rng.choice(["add", "sub", "mul"] if value * 2 <= spec.max * 10 else ["add", "sub"])
        if op == "sub" and value < 2:
            op = "add"
        if op == "add":
            n = rng.randint(1, spec.max)
            sentences.append(rng.choice([f"Then {name} finds {n} more.", f"A friend gives {name} {n} more."]))
            steps.append(f"{value} + {n} = {value + n}.")
            value += n
        elif op == "sub":
            n = rng.randint(1, value - 1)
            sentences.append(rng.choice([f"Then {name} gives away {n}.", f"Then {name} loses {n}."]))
            steps.append(f"{value} - {n} = {value - n}.")
            value -= n
        else:
            k = rng.choice([2, 3]) if value * 3 <= spec.max * 10 else 2
            word = {2: "doubles", 3: "triples"}[k]
            sentences.append(f"Then {name} {word} the number of {item}.")
            steps.append(f"{value} * {k} = {value * k}.")
            value *= k
    question = " ".join(sentences) + f" How many {item} does {name} have now?"
    solution = "\n".join(steps)
    return Example(question, str(value), solution, id=f"arithmetic:{index}")


def arithmetic(split: str = "train", n: int | None = None, spec: ArithmeticSpec | None = None) -> list[Example]:
    """Generated problems; each split draws from its own seeded stream. A small question space can draw one
    question into two splits: rlvr.tasks.datasets.load_dataset leaves it out of the earlier split."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    spec = spec or ArithmeticSpec()
    n = n if n is not None else {"train": 20000, "validation": 500, "test": 1000}[split]
    rng = random.Random(f"rlvr-arithmetic-{split}-{spec.steps}-{spec.max}")
    return [_arithmetic_example(rng, spec, i) for i in range(n)]

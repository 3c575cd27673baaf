"""TRL's environment shape (`GRPOTrainer(environment_factory=Shop)`), trained by rlvr with
`rlvr train env_class=examples/agents/shop.py:Shop`: a class with reset(**row) and public methods that are the
tools; their schemas come from the type hints and docstrings (transformers.utils.get_json_schema). rlvr runs the
tool loop through its server: the model calls `count`, sees the number, answers.

    rlvr train --config examples/agents/shop.yaml

The reward is a TRL reward function: it gets the episode's conversation as `completions` and the Shop instances as
`environments`.
"""

import json
import random
import re
from pathlib import Path

ITEMS = ["apples", "pears", "plums", "lemons", "melons", "grapes"]


class Shop:
    def reset(self, **row):
        """A new episode: the row's own stock (what the shop holds is the row's, the question asks about it)."""
        self.stock = dict(row["stock"])
        self.looked_up = set()

    def count(self, item: str) -> int:
        """How many of an item the shop has in stock.

        Args:
            item: the item's name, e.g. "apples"
        """
        self.looked_up.add(item)
        if item not in self.stock:
            raise KeyError(f"the shop sells no {item}; it sells {', '.join(sorted(self.stock))}")
        return self.stock[item]


def answered(completions, environments, answer, item, **kwargs):
    """1 when the last reply's last number is the stock of the item asked about and the model looked it up."""
    rewards = []
    for messages, env, truth, asked in zip(completions, environments, answer, item):
        last = messages[-1] if messages else {}
        said = re.findall(r"\d+", last.get("content") or "") if last.get("role") == "assistant" else []
        rewards.append(float(bool(said) and said[-1] == truth and asked in env.looked_up))
    return rewards


def make_rows(n: int = 300, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for number in range(n):  # each row its own shop: no two questions alike (nor across the held-out splits)
        stock = {name: rng.randint(0, 40) for name in rng.sample(ITEMS, 4)}
        asked = rng.choice(sorted(stock))
        rows.append({"prompt": f"How many {asked} does shop #{number + 1} have?", "item": asked, "stock": stock,
                     "answer": str(stock[asked])})
    return rows


if __name__ == "__main__":  # how shop.jsonl was made
    out = Path(__file__).with_name("shop.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in make_rows()), encoding="utf-8")
    print(f"wrote {out}")

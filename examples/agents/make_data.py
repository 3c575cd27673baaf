"""Writes multiply.jsonl: 1,000 rows asking for the product of a 3-digit and a 2-digit number in five phrasings
("What is A * B?", "What is A times B?", "Multiply A by B.", "What is the product of A and B?", "Compute A
multiplied by B."), seeded; `kind` is the phrasing. The rows are shipped; this script is how they were made
(python examples/agents/make_data.py). Runs hold out a seeded tenth for validation and a tenth for the test split
(rlvr.tasks.tables), never trained on."""

import json
import random
from pathlib import Path

PHRASINGS = ["What is {a} * {b}?", "What is {a} times {b}?", "Multiply {a} by {b}.",
             "What is the product of {a} and {b}?", "Compute {a} multiplied by {b}."]

rng = random.Random(0)
rows = []
for i in range(1000):
    a, b = rng.randint(100, 999), rng.randint(11, 99)
    rows.append({"prompt": PHRASINGS[i % len(PHRASINGS)].format(a=a, b=b), "answer": str(a * b),
                 "kind": i % len(PHRASINGS)})
out = Path(__file__).with_name("multiply.jsonl")
out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
print(f"wrote {len(rows)} rows to {out}")

"""Writes sort_numbers.jsonl: 1,000 rows of "sort these numbers" (3 or 4 numbers below 100), seeded. The rows are
shipped; this script is how they were made (python examples/your_task/make_data.py)."""

import json
import random
from pathlib import Path

rng = random.Random(0)
rows = []
for i in range(1000):
    numbers = rng.sample(range(1, 100), rng.randint(3, 4))
    rows.append({"prompt": "Sort these numbers from smallest to largest: " + ", ".join(map(str, numbers))
                 + ". Answer with the sorted numbers only, separated by commas.",
                 "numbers": numbers, "answer": ", ".join(map(str, sorted(numbers)))})
out = Path(__file__).with_name("sort_numbers.jsonl")
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
print(f"wrote {len(rows)} rows to {out}")

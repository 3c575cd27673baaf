"""Writes largest.jsonl: 1,000 rows of "which is the largest of these numbers" (4 or 5 numbers below 100),
seeded. The rows are shipped; this script is how they were made (python examples/your_task/make_data.py)."""

import json
import random
from pathlib import Path

rng = random.Random(0)
rows = []
for i in range(1000):
    numbers = rng.sample(range(1, 100), rng.randint(4, 5))
    rows.append({"prompt": "Which is the largest of these numbers: " + ", ".join(map(str, numbers))
                 + "? Answer with the number only.", "numbers": numbers, "answer": str(max(numbers))})
out = Path(__file__).with_name("largest.jsonl")
out.write_text("".join(json.dumps(r) + "\n" for r in rows))
print(f"wrote {len(rows)} rows to {out}")

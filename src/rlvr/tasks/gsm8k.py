"""GSM8K (shipped inside the package): its splits, its answers, and the worked responses SFT trains on.

The validation split is a fixed, seeded subset of GSM8K's training set, so the test set stays untouched;
the three worked examples of the `r1_zero_three_shot` prompt are taken out of both training and validation.
"""

from __future__ import annotations

import random
import re
from importlib import resources
from pathlib import Path

from rlvr.tasks.records import SPLITS, DataError, Example, load_jsonl

GSM8K_VALIDATION_SIZE = 500
# Indices in GSM8K train.jsonl of the three worked examples used by the r1_zero_three_shot prompt.
FEW_SHOT_INDICES = (0, 1, 2)


def gsm8k_file(split: str) -> Path:
    return Path(str(resources.files("rlvr") / "data" / "gsm8k" / f"{split}.jsonl"))


def gsm8k(split: str = "train", validation_size: int = GSM8K_VALIDATION_SIZE, seed: int = 0) -> list[Example]:
    """GSM8K. "validation" is a fixed seeded subset of train; "train" is the rest, minus the few-shot examples."""
    if split not in SPLITS:
        raise DataError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    if split == "test":
        return load_jsonl(gsm8k_file("test"))
    rows = load_jsonl(gsm8k_file("train"))
    pool = [i for i in range(len(rows)) if i not in FEW_SHOT_INDICES]
    validation = set(random.Random(seed).sample(pool, validation_size))
    chosen = [i for i in pool if (i in validation) == (split == "validation")]
    return [rows[i] for i in chosen]


def few_shot_examples() -> list[Example]:
    """The worked GSM8K training examples of the r1_zero_three_shot prompt (never trained or validated on)."""
    rows = load_jsonl(gsm8k_file("train"))
    return [rows[i] for i in FEW_SHOT_INDICES]


_CALCULATOR = re.compile(r"<<[^<>]*>>")


def r1_zero_response(example: Example, annotations: bool = False) -> str:
    """The r1_zero-format response for supervised training: worked steps inside the think block, then
    the answer. GSM8K's calculator annotations (<<48/2=24>>) are removed, or kept with `annotations` (SFT for
    the calculator environment, env=gsm8k_calculator).

    >>> r1_zero_response(Example("q", "72", "48/2 = <<48/2=24>>24 clips.\\n48+24 = <<48+24=72>>72."))
    ' 48/2 = 24 clips.\\n48+24 = 72. </think> <answer> 72 </answer>'
    """
    steps = (example.solution if annotations else _CALCULATOR.sub("", example.solution)).strip()
    return f" {steps} </think> <answer> {example.answer} </answer>"

"""The tasks: each owns its rows, its prompt and the reward that checks an answer.

    records   Example, the splits, DataOrder (the seeded order of a run's questions), JSONL reading
    gsm8k     GSM8K rows (shipped with rlvr), answer parsing, the worked SFT responses
    arithmetic  generated arithmetic word problems
    code      generated Python function tasks (levels 1-3) and code JSONL files
    datasets  `dataset=` names and files -> rows of a split (load_split)
    prompts   prompt templates by name (r1_zero, question_only, code, ...)
    rewards   reward functions by name (r1_zero_reward_fn, code tests, combinations), batch scoring

May import: rlvr.core, rlvr.sandbox, rlvr.grading.
"""

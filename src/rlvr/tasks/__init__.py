"""The tasks: each owns its rows, its prompt and the reward that checks an answer, built-in or a user's.

    task      a task = rows + prompt + reward: load_task(cfg), the one reader every command calls
    tables    a user's rows: JSONL, JSON, Parquet, CSV, a saved `datasets` folder, hf:NAME; chat conversations
    reasoning_gym  reasoning-gym's generated tasks, graded by their own score_answer (an extra)
    reward_base  RewardFn (the shape of every reward), RewardContext (what it may read), score_batch
    user_rewards  a user's reward functions: file.py:fn, package.module:fn or a callable; TRL's or rlvr's signature
    records   Example, the splits, DataOrder (the seeded order of a run's questions), JSONL reading
    gsm8k     GSM8K rows (shipped with rlvr), answer parsing, the worked SFT responses
    arithmetic  generated arithmetic word problems
    code      generated Python function tasks (levels 1-3) and code JSONL files
    datasets  `dataset=` names and files -> rows of a split (load_split)
    prompts   prompt templates by name (r1_zero, question_only, code, ...)
    rewards   reward functions by name (r1_zero_reward_fn, code tests, combinations), batch scoring

May import: rlvr.core, rlvr.sandbox, rlvr.grading.
"""

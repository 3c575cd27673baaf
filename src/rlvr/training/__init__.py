"""The training loops, each a plain loop over the stages (rlvr.stages): GRPO-family RL (`rl`, which hands a
`distributed.*` run to rlvr.distributed), SFT (`sft`), DPO (`dpo`).

May import: every package below it (rlvr.core ... rlvr.stages, rlvr.distributed).
"""

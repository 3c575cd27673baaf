"""rlvr from Python, in-process: `rlvr.train` and `rlvr.evaluate` run the same loops as `rlvr train` and
`rlvr eval`, with the same config, resume, Ctrl-C and errors, and take what a notebook has in hand:

    import rlvr

    def short_answer(completions, answer, **kwargs):           # TRL's signature, or rlvr's per sample
        return [1.0 if c.strip() == a else 0.0 for c, a in zip(completions, answer)]

    run_dir = rlvr.train("configs/grpo_arithmetic.yaml", reward_funcs=[short_answer],
                         train_dataset=[{"prompt": "2+2=", "answer": "4"}, ...], prompt="row", steps=20)

    async def run_episode(client, row, sampling): ...          # an agent (docs/agents.md)
    rlvr.train("configs/grpo_arithmetic.yaml", agent=run_episode)   # or env_class=MyToolEnv (TRL's shape)

`config` is a YAML path, a dict or a TrainConfig; `reward_funcs` a callable, a list of them (weights in
`reward_weights`, 1 each by default) or {callable: weight}; the datasets lists of dicts, a `datasets.Dataset`
or a name `dataset=` takes. Rows in memory are written once to a file named by their content hash under the
cache ($RLVR_CACHE/datasets), so a resumed run reads the same rows. Callables live in this process only: a
distributed run (Ray workers) needs them in a file (`rewards={path/to/file.py:fn: 1.0}`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from rlvr.config import ConfigError, EvalConfig, TrainConfig, load_config
from rlvr.core.models import cache_dir
from rlvr.tasks.user_rewards import PYTHON, register_reward


def _rows_file(rows, what: str) -> str:
    """A dataset given in memory, as a JSONL file named by its content (the same rows: the same file)."""
    if isinstance(rows, (str, Path)):
        return str(rows)
    if hasattr(rows, "to_list"):  # datasets.Dataset
        rows = rows.to_list()
    rows = list(rows)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ConfigError(f"{what}: expected a non-empty list of dicts (one per row) or a datasets.Dataset")
    try:
        lines = [json.dumps(r, ensure_ascii=False, sort_keys=True) for r in rows]
    except TypeError as err:
        raise ConfigError(f"{what}: rows must hold JSON values (text, numbers, lists, dicts): {err}") from None
    text = "\n".join(lines) + "\n"
    path = cache_dir() / "datasets" / f"{what}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.jsonl"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    return str(path)


def _reward_terms(reward_funcs, reward_weights) -> dict[str, float]:
    """{key: weight}: a name rewards= takes as it is, a callable registered under python:<position>:<name>, so
    that TRL's list keeps each entry a term of its own ([f, f] with weights [1, 2] weighs f 3; two lambdas are two
    terms) and defining a function again (a notebook cell run twice) replaces it."""
    if reward_funcs is None:
        return {}
    if isinstance(reward_funcs, dict):
        items = list(reward_funcs.items())
    else:
        funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
        weights = list(reward_weights) if reward_weights is not None else [1.0] * len(funcs)
        if len(weights) != len(funcs):
            raise ConfigError(f"reward_weights has {len(weights)} weights for {len(funcs)} reward functions")
        items = list(zip(funcs, weights))
    terms: dict[str, float] = {}
    for position, (fn, weight) in enumerate(items):
        if isinstance(fn, str):  # a name rewards= takes (a built-in, a file.py:fn)
            terms[fn] = terms.get(fn, 0.0) + float(weight)
            continue
        name = getattr(fn, "__name__", None) or type(fn).__name__
        terms[register_reward(name, fn, position)] = float(weight)
    return terms


def _agent_overrides(overrides: dict) -> dict:
    """`agent=fn` and `env_class=Cls` handed over in Python: registered in this process, named by their key."""
    from rlvr.environments.agents import register_agent
    from rlvr.environments.tool_loop import register_env_class

    out = dict(overrides)
    if callable(out.get("agent")):
        out["agent"] = register_agent(out["agent"])
    if isinstance(out.get("env_class"), type):
        out["env_class"] = register_env_class(out["env_class"])
    return out


def _build(cls, config, reward_funcs, reward_weights, train_dataset, eval_dataset, overrides: dict,
           given: str = "rlvr.train"):
    overrides = _agent_overrides(overrides)
    terms = _reward_terms(reward_funcs, reward_weights)
    if terms:
        overrides["rewards"] = {**(overrides.get("rewards") or {}), **terms}
    if train_dataset is not None:
        overrides["dataset"] = _rows_file(train_dataset, "train")
        if cls is EvalConfig and not isinstance(train_dataset, (str, Path)):
            overrides.setdefault("split", "all")  # rows handed over to be evaluated are evaluated, every one
    if eval_dataset is not None:
        overrides["validation_dataset"] = _rows_file(eval_dataset, "eval")
    if isinstance(config, cls):
        data = config.model_dump(by_alias=True, exclude_unset=True)
        return load_config(cls, None, {**data, **overrides}, given=given)
    if isinstance(config, dict):
        return load_config(cls, None, {**config, **overrides}, given=given)
    return load_config(cls, config, overrides, given=given)


def train(config: str | Path | dict | TrainConfig | None = None, *, reward_funcs: Callable | list | dict | None = None,
          train_dataset=None, eval_dataset=None, reward_weights: list[float] | None = None, **overrides) -> Path:
    """Train as `rlvr train` does, in this process; returns the run directory (see the module docstring)."""
    from rlvr.training.rl import train_grpo

    cfg = _build(TrainConfig, config, reward_funcs, reward_weights, train_dataset, eval_dataset, overrides)
    if cfg.distributed.enabled and any(name.startswith(PYTHON) for name in cfg.rewards or {}):
        raise ConfigError("a reward function handed over in Python lives in this process only; a distributed run "
                          "needs it in a file: rewards={path/to/file.py:fn: 1.0}")
    train_grpo(cfg)
    return Path(cfg.out)


def evaluate(config: str | Path | dict | EvalConfig | None = None, *, reward_funcs: Callable | list | dict | None = None,
             dataset=None, reward_weights: list[float] | None = None, **overrides) -> dict:
    """Evaluate as `rlvr eval` does, in this process; returns the summary (accuracy: the mean reward)."""
    from rlvr.stages.evaluation import run_eval

    cfg = _build(EvalConfig, config, reward_funcs, reward_weights, dataset, None, overrides, given="rlvr.evaluate")
    return run_eval(cfg)

"""A user's reward functions, named in `rewards=` like environments and estimators: `path/to/file.py:fn` or
`package.module:fn`, or a callable handed to `rlvr.train(reward_funcs=...)` (registered here by its name).
Two signatures, told apart by the function's parameters:

    TRL's, over the whole batch (a TRL user's functions run unchanged):
        def fn(prompts, completions, completion_ids, **kwargs) -> list[float | None]
    every dataset column arrives as a keyword with one value per completion, plus `trainer_state`
    ({"global_step": step}); a conversational row's prompt is its messages and its completion
    [{"role": "assistant", "content": text}], as in TRL. Detected by a parameter named `completions`.

    rlvr's, one sample at a time:
        def fn(response, ground_truth, **row) -> float | {"reward", "format_reward", "answer_reward"} | None
    the row's columns arrive as keywords (a function without **kwargs gets only the columns it names).

`None` means "does not apply to this row": the value leaves that row's weighted sum (TRL's convention). A
plain number r scores reward r and counts as answer_reward r and format_reward r. `async def` functions run
concurrently (a remote judge). Bad output is a RewardError naming the function and the row: a wrong length, a
string, NaN or infinity, an exception; a function that does not import, is not callable or has neither
signature fails when the config is checked, before any model is loaded.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import numbers
import sys
from pathlib import Path
from typing import Callable

from rlvr.core.imports import file_module_name
from rlvr.tasks.reward_base import RewardContext, RewardFn, Scores

USER_REWARDS: dict[str, Callable] = {}  # name -> callable handed over in Python (rlvr.train(reward_funcs=...))


class RewardError(ValueError):
    """A user's reward function that cannot be loaded or gave a value that is not a reward."""


def register_reward(name: str, fn: Callable) -> str:
    """Make `fn` available as `rewards={name: w}` in this process; returns the name."""
    if not callable(fn):
        raise RewardError(f"reward function {name!r}: {fn!r} is not callable")
    signature_kind(fn, name)
    USER_REWARDS[name] = fn
    return name


def is_user_reward(name: str) -> bool:
    """Whether a `rewards=` key names a user's function (a file or module path, or a registered callable)."""
    return name in USER_REWARDS or (":" in name and not name.startswith("code_tests"))


def reward_label(name: str) -> str:
    """The name a user's function is logged under: `reward/<function name>`."""
    return name.rpartition(":")[2] if ":" in name and name not in USER_REWARDS else name


def _load_file(path: Path):
    # one name per file in every process (rlvr.core.imports): two rewards.py do not collide, and a distributed run
    # ships the file to Ray actors under this name (rlvr.distributed.placement), where it is `package.module:fn`
    key = file_module_name(path, "rewards")
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[key]
        raise RewardError(f"reward file {path}: importing it raised {type(err).__name__}: {err}") from None
    return module


def load_reward_callable(name: str) -> Callable:
    """The callable a `rewards=` key names: registered, `file.py:fn` or `package.module:fn`."""
    if name in USER_REWARDS:
        return USER_REWARDS[name]
    where, _, attr = name.rpartition(":")
    if not where or not attr.isidentifier():
        raise RewardError(f"reward function {name!r}: expected path/to/file.py:function or package.module:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward function {name!r}: no such file {path}")
        module = _load_file(path)
    else:
        try:
            module = importlib.import_module(where)
        except Exception as err:
            raise RewardError(f"reward function {name!r}: cannot import module {where!r} ({type(err).__name__}: "
                              f"{err})") from None
    fn = getattr(module, attr, None)
    if fn is None:
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardError(f"reward function {name!r}: {where} has no {attr!r} (callables there: "
                          f"{', '.join(found) or 'none'})")
    if not callable(fn):
        raise RewardError(f"reward function {name!r}: {attr} is a {type(fn).__name__}, not a function")
    signature_kind(fn, name)
    return fn


def signature_kind(fn: Callable, name: str) -> str:
    """"batch" (TRL's: a `completions` parameter) or "sample" (rlvr's: response and ground truth first)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        raise RewardError(f"reward function {name!r}: its signature cannot be read") from None
    if "completions" in params:
        return "batch"
    positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return "sample"
    raise RewardError(f"reward function {name!r} has neither signature: TRL's fn(prompts, completions, "
                      "completion_ids, **kwargs) -> list, or rlvr's fn(response, ground_truth, **row) -> float")


def _accepted(fn: Callable, kwargs: dict) -> dict:
    params = inspect.signature(fn).parameters
    if any(p.kind == p.VAR_KEYWORD for p in params.values()):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in params}


def _number(value, name: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    ok = isinstance(value, numbers.Real) or (hasattr(value, "item") and getattr(value, "ndim", 1) == 0)
    if not ok:
        raise RewardError(f"reward function {name!r} returned {type(value).__name__} {value!r:.80} for {where}; "
                          "expected a number or None")
    value = float(value.item() if hasattr(value, "item") else value)
    if not math.isfinite(value):
        raise RewardError(f"reward function {name!r} returned {value} for {where}; rewards must be finite")
    return value


def _scores(value, name: str, where: str) -> Scores:
    if isinstance(value, dict):
        if "reward" not in value:
            raise RewardError(f"reward function {name!r} returned a dict without 'reward' for {where}: "
                              f"{sorted(value)}")
        reward = _number(value["reward"], name, where)
        out = {"reward": reward}
        for key in ("format_reward", "answer_reward"):
            out[key] = _number(value[key], name, where) if key in value else reward
        return out
    reward = _number(value, name, where)
    return {"reward": reward, "format_reward": reward, "answer_reward": reward}


class UserReward(RewardFn):
    """A user's function as a RewardFn: called with the batch's context, its output checked."""

    def __init__(self, name: str, fn: Callable | None = None):
        self.name, self.fn = name, fn if fn is not None else load_reward_callable(name)
        self.kind = signature_kind(self.fn, name)
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None))

    def _where(self, context: RewardContext, k: int) -> str:
        rows = context.rows
        return f"row {rows[k].id!r}" if rows and k < len(rows) and rows[k].id else f"completion {k}"

    def _calls(self, responses, truths, context: RewardContext):
        """(callable's kwargs for one batch call) or [kwargs per row], by signature."""
        rows = context.rows or [None] * len(responses)
        fields = [dict(r.fields) if r is not None else {} for r in rows]
        if self.kind == "sample":
            return [_accepted(self.fn, {**f, "response": r, "ground_truth": t})
                    for f, r, t in zip(fields, responses, truths)]
        chat = [r is not None and r.conversation is not None for r in rows]
        prompts = context.prompts or [""] * len(responses)
        columns = {k for f in fields for k in f} - {"prompt", "completion", "completion_ids"}
        kwargs = {k: [f.get(k) for f in fields] for k in sorted(columns)}
        kwargs.update(
            prompts=[list(r.conversation) if c else p for r, c, p in zip(rows, chat, prompts)],
            completions=[[{"role": "assistant", "content": t}] if c else t for t, c in zip(responses, chat)],
            completion_ids=context.completion_ids or [[] for _ in responses],
            trainer_state={"global_step": context.step or 0},
        )
        return _accepted(self.fn, kwargs)

    def _invoke(self, kwargs, where: str):
        try:
            if self.kind == "sample":
                call = dict(kwargs)
                return self.fn(call.pop("response"), call.pop("ground_truth"), **call)
            return self.fn(**kwargs)
        except RewardError:
            raise
        except Exception as err:
            raise self._raised(err, where) from err

    def _raised(self, err: Exception, where: str) -> RewardError:
        return RewardError(f"reward function {self.name!r} raised {type(err).__name__} on {where}: {err}")

    def start(self, responses, ground_truths, context):
        if not self.is_async:
            return None
        calls = self._calls(responses, ground_truths, context)

        async def run():
            import asyncio

            async def one(kwargs, where):  # an async function raises when awaited, after _invoke returned
                try:
                    return await self._invoke(kwargs, where)
                except RewardError:
                    raise
                except Exception as err:
                    raise self._raised(err, where) from err

            if self.kind == "batch":
                return await one(calls, "the batch")
            return await asyncio.gather(*(one(kw, self._where(context, k)) for k, kw in enumerate(calls)))

        return run()

    def values(self, responses, ground_truths, context: RewardContext) -> list[Scores]:
        if id(self) in context.results:
            raw = context.results.pop(id(self))
        elif self.is_async:
            from rlvr.tasks.reward_base import run_awaitables

            raw = run_awaitables([self.start(responses, ground_truths, context)])[0]
        elif self.kind == "batch":
            raw = self._invoke(self._calls(responses, ground_truths, context), "the batch")
        else:
            raw = [self._invoke(kw, self._where(context, k))
                   for k, kw in enumerate(self._calls(responses, ground_truths, context))]
        if self.kind == "batch":
            if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
                raise RewardError(f"reward function {self.name!r} returned {type(raw).__name__}; a TRL-style "
                                  f"function returns a list of {len(responses)} floats (or None)")
            raw = list(raw)
            if len(raw) != len(responses):
                raise RewardError(f"reward function {self.name!r} returned {len(raw)} values for "
                                  f"{len(responses)} completions")
        return [_scores(v, self.name, self._where(context, k)) for k, v in enumerate(raw)]

    def plan(self, responses, ground_truths, context=None):
        scores = self.values(list(responses), list(ground_truths), context or RewardContext())
        # alone (not in a combination) a None is no reward: 0, as TRL's nansum over one function
        return [], lambda _: scores

    def __call__(self, response: str, ground_truth: str, **row) -> Scores:
        from rlvr.tasks.records import Example

        context = RewardContext(rows=[Example("", ground_truth, fields=row)], prompts=[""])
        out = self.values([response], [ground_truth], context)[0]
        return {k: (0.0 if v is None else v) for k, v in out.items()}

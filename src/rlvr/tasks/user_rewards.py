"""A user's reward functions, named in `rewards=` like environments and estimators: `path/to/file.py:fn` or
`package.module:fn`, or a callable handed to `rlvr.train(reward_funcs=...)` (registered here by its name).
Two signatures, told apart by the function's parameters:

    TRL's, over the whole batch (a TRL user's functions run unchanged):
        def fn(prompts, completions, completion_ids, **kwargs) -> list[float | None]
    every dataset column but `prompt` arrives as a keyword with one value per completion, plus `trainer_state`
    (transformers' TrainerState: `global_step` is the optimizer steps done, as in TRL; `trainer_state["global_step"]`
    works too), `log_metric(name, value)` (logged as train/<name>, the step's mean) and `log_extra(column,
    values)` (a column of rollouts.jsonl). `prompts` are the dataset's prompts as TRL passes them: the row's
    conversation, or its text prompt (the template filled in, before any chat template); a conversational row's
    completion is [{"role": "assistant", "content": text}]; an agent's episode's (agent=, env_class=) is its
    conversation after the prompt, tool calls and results included, and an env_class's instances arrive as
    `environments` (TRL's keyword; rlvr's signature gets its own as `environments` too). Detected by a parameter
    named `completions`, or by keywords only (`def fn(**kwargs)`).

    rlvr's, one sample at a time:
        def fn(response, ground_truth, **row) -> float | {"reward", "format_reward", "answer_reward"} | None
    the row's columns arrive as keywords (a function without **kwargs gets only the columns it names).

`None` means "does not apply to this row": the value leaves that row's weighted sum (TRL's convention); a row no
function applies to has no reward at all (rlvr.tasks.scoring). A plain number r scores reward r and counts as
answer_reward r and format_reward r. `async def` functions run concurrently (a remote judge). Bad output is a
RewardError naming the function and the row: a wrong length, a string, NaN or infinity, an exception,
sys.exit, no answer within `reward_timeout` seconds; a function that does not import, is not callable or has
neither signature fails when the config is checked, before any model is loaded. A function gets copies of the
rows: what it changes in them is not the dataset's.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import importlib.util
import inspect
import math
import numbers
import os
import sys
from pathlib import Path
from typing import Callable

from rlvr.core.imports import file_module_name
from rlvr.tasks.reward_base import RewardContext, RewardError, RewardFn, Scores, bounded_reward_call, run_awaitables

# callables handed over in Python (rlvr.train(reward_funcs=...)), by key "python:<position>:<name>": the position in
# the call's list keeps two lambdas, or [f, f], apart, and a cell run again (a new f) replaces the old one
USER_REWARDS: dict[str, Callable] = {}
PYTHON = "python:"


def register_reward(name: str, fn: Callable, position: int = 0) -> str:
    """Make `fn` available as `rewards={key: w}` in this process; returns the key, python:<position>:<name>."""
    if not callable(fn):
        raise RewardError(f"reward function {name!r}: {fn!r} is not callable")
    signature_kind(fn, name)
    key = f"{PYTHON}{position}:{name}"
    USER_REWARDS[key] = fn
    return key


def is_user_reward(name: str) -> bool:
    """Whether a `rewards=` key names a user's function (a file or module path, or a registered callable)."""
    return name in USER_REWARDS or (":" in name and not name.startswith("code_tests"))


def reward_label(name: str) -> str:
    """The name a user's function is logged under: `reward/<function name>`."""
    return name.rpartition(":")[2] if ":" in name else name


def _load_file(path: Path):
    # one name per file in every process (rlvr.core.imports): two rewards.py do not collide, and a distributed run
    # ships the file to Ray actors under this name (rlvr.distributed.placement), where it is `package.module:fn`
    key = file_module_name(path, "rewards")
    if key in sys.modules:
        return sys.modules[key]
    folder = path.resolve().parent
    # its siblings (a helpers.py) import as they do when the file runs as a script, folder first; a sibling's name
    # that another folder's file of that name holds in sys.modules (a second task's helpers.py) is set aside while
    # this file imports, so each file gets its own, and put back after
    names = {p.stem for p in folder.glob("*.py")} | {p.parent.name for p in folder.glob("*/__init__.py")}
    aside = {n: sys.modules.pop(n) for n in names if n in sys.modules and not _within(sys.modules[n], folder)}
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[key]
        raise RewardError(f"reward file {path}: importing it raised {type(err).__name__}: {err}") from None
    finally:
        sys.path.remove(str(folder))
        if str(folder) not in sys.path:  # an import inside a function at call time still finds the siblings;
            sys.path.append(str(folder))  # last, so that they never shadow an installed module
        sys.modules.update(aside)
    return module


def _within(module, folder: Path) -> bool:
    file = getattr(module, "__file__", None)
    return file is not None and Path(file).resolve().is_relative_to(folder)


def reward_digest(name: str) -> str | None:
    """What a user's reward function is, as a hash (rlvr.stages.validation keys its cache by it): for a file or
    module, its source and the .py files beside it (the helpers it may import); for a callable handed over in
    Python, its code, constants, closure and the globals it reads (functions among them by their own code),
    and its module's file. None when `name` is not a user's function."""
    if not is_user_reward(name):
        return None
    digest = hashlib.sha256(name.encode())
    try:
        fn = load_reward_callable(name)
    except RewardError:
        return None
    _digest_callable(fn, digest, set())
    return digest.hexdigest()


def _digest_callable(fn, digest, seen: set) -> None:
    import marshal

    fn = getattr(fn, "__func__", fn)
    target = fn if hasattr(fn, "__code__") else getattr(type(fn), "__call__", fn)
    code = getattr(target, "__code__", None)
    try:
        source = inspect.getsourcefile(target)
    except TypeError:
        source = None
    if source and Path(source).is_file() and source not in seen:
        seen.add(source)
        folder = Path(source).parent
        for file in sorted(folder.glob("*.py")):
            digest.update(file.name.encode() + b"\0" + file.read_bytes())
    if code is None or id(code) in seen:
        digest.update(repr(fn).encode()[:200])
        return
    seen.add(id(code))
    digest.update(marshal.dumps(code))
    for cell in getattr(target, "__closure__", None) or ():
        _digest_value(cell.cell_contents, digest, seen)
    globals_ = getattr(target, "__globals__", {})
    for ref in code.co_names:
        if ref in globals_:
            _digest_value(globals_[ref], digest, seen)


def _digest_value(value, digest, seen: set) -> None:
    if callable(value) and (hasattr(value, "__code__") or hasattr(value, "__func__")):
        _digest_callable(value, digest, seen)
    elif isinstance(value, (int, float, str, bytes, bool, tuple, frozenset, type(None))) or \
            isinstance(value, (list, dict, set)) and len(value) <= 10_000:
        digest.update(repr(value).encode())


def load_reward_callable(name: str) -> Callable:
    """The callable a `rewards=` key names: registered, `file.py:fn` or `package.module:fn`."""
    if name in USER_REWARDS:
        return USER_REWARDS[name]
    if name.startswith(PYTHON):
        raise RewardError(f"reward function {reward_label(name)!r} was handed over in Python (rlvr.train(reward_funcs="
                          "...)) and lives in that process only: hand it over again, or put it in a file "
                          "(rewards={path/to/file.py:fn: 1.0})")
    where, _, attr = name.rpartition(":")
    if not where or not attr.isidentifier():
        raise RewardError(f"reward function {name!r}: expected path/to/file.py:function or package.module:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_file():
            raise RewardError(f"reward function {name!r}: no such file {path}")
        module = _load_file(path)
    else:
        if os.getcwd() not in sys.path and "" not in sys.path:  # a package of the current folder, as `python -m`
            sys.path.append(os.getcwd())  # finds it (the `rlvr` command's own path starts elsewhere)
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
    required = [p for p in params.values() if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    if not required and any(p.kind == p.VAR_KEYWORD for p in params.values()) and \
            not any(p.kind == p.VAR_POSITIONAL for p in params.values()):
        return "batch"  # def fn(**kwargs): TRL calls every function with keywords only
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
    """A function's value for one row as scores: a number is the reward and the answer signal and says nothing of
    the format (None); a dict may give each (answer_reward defaults to the reward, format_reward to None)."""
    if isinstance(value, dict):
        if "reward" not in value:
            raise RewardError(f"reward function {name!r} returned a dict without 'reward' for {where}: "
                              f"{sorted(value)}")
        reward = _number(value["reward"], name, where)
        return {"reward": reward,
                "format_reward": _number(value["format_reward"], name, where) if "format_reward" in value else None,
                "answer_reward": _number(value["answer_reward"], name, where) if "answer_reward" in value else reward}
    reward = _number(value, name, where)
    return {"reward": reward, "format_reward": None, "answer_reward": reward}


DEFAULT_TIMEOUT = 300.0  # seconds a function may take on one batch (config: reward_timeout)


def trainer_state(context: RewardContext):
    """TRL's `trainer_state` for a batch: transformers' TrainerState, whose `global_step` is the optimizer steps
    done when the batch was sampled (0 on the first step, as in TRL), subscriptable as rlvr's dict was."""
    from transformers import TrainerState

    class RewardTrainerState(TrainerState):
        def __getitem__(self, key):
            return getattr(self, key)

    return RewardTrainerState(global_step=context.global_step or 0, max_steps=context.max_steps or 0,
                              epoch=context.epoch)


class UserReward(RewardFn):
    """A user's function as a RewardFn: called with copies of the batch's rows, bounded by `timeout` seconds a
    batch, its output checked."""

    def __init__(self, name: str, fn: Callable | None = None, timeout: float | None = DEFAULT_TIMEOUT,
                 label: str | None = None):
        self.name, self.fn = label or reward_label(name), fn if fn is not None else load_reward_callable(name)
        self.key, self.timeout = name, timeout
        # what messages call it: where it is defined (file.py:fn, pkg.mod:fn), or its name when handed over in Python
        self.shown = self.name if name.startswith(PYTHON) or ":" not in name else name
        self.kind = signature_kind(self.fn, name)
        self.is_async = inspect.iscoroutinefunction(self.fn) or inspect.iscoroutinefunction(
            getattr(self.fn, "__call__", None))

    def _where(self, context: RewardContext, k: int) -> str:
        rows = context.rows
        return f"row {rows[k].id!r}" if rows and k < len(rows) and rows[k].id else f"completion {k}"

    def _calls(self, responses, truths, context: RewardContext):
        """(callable's kwargs for one batch call) or [kwargs per row], by signature; the rows' values are copies,
        so a function that changes them changes nothing of the dataset's."""
        rows = context.rows or [None] * len(responses)
        fields = [copy.deepcopy(r.fields) if r is not None else {} for r in rows]
        if self.kind == "sample":
            calls = []
            for k, (f, r, t) in enumerate(zip(fields, responses, truths)):
                clash = [c for c, v in (("response", r), ("ground_truth", t)) if c in f and f[c] != v]
                if clash:
                    raise RewardError(f"reward function {self.shown!r}: {self._where(context, k)} has a column "
                                      f"{clash[0]!r}, which rlvr's signature fn(response, ground_truth, **row) "
                                      f"passes as its own argument; rename the column (or, for ground_truth, set "
                                      f"answer_field={clash[0]})")
                extra = {k: v[k] for k, v in (context.reward_kwargs or {}).items()}
                calls.append(_accepted(self.fn, {**f, **extra, "response": r, "ground_truth": t}))
            return calls
        chat = [r is not None and r.conversation is not None for r in rows]
        # TRL's `prompts`: the dataset's prompt, the conversation or the text (not the chat-rendered string)
        prompts = context.row_prompts or context.prompts or [""] * len(responses)
        columns = {k for f in fields for k in f} - {"prompt", "completion", "completion_ids"}
        kwargs = {k: [f.get(k) for f in fields] for k in sorted(columns)}
        said = context.messages or [None] * len(responses)  # an agent's conversation, where it had one
        kwargs.update(
            prompts=[copy.deepcopy(list(r.conversation)) if c else p for r, c, p in zip(rows, chat, prompts)],
            completions=[copy.deepcopy(m) if m is not None else [{"role": "assistant", "content": t}] if c else t
                         for t, c, m in zip(responses, chat, said)],
            **(context.reward_kwargs or {}),
            completion_ids=[list(ids) for ids in context.completion_ids] if context.completion_ids
            else [[] for _ in responses],
            trainer_state=trainer_state(context),
            log_metric=lambda name, value: context.metrics.setdefault(str(name), []).append(value),
            log_extra=lambda column, values: context.extras.__setitem__(str(column), list(values)),
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
        return RewardError(f"reward function {self.shown!r} raised {type(err).__name__} on {where}: {err}")

    def _bounded(self, call: Callable, where: str):
        return bounded_reward_call(call, self.timeout, f"reward function {self.shown!r} on {where}")

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
            raw = run_awaitables([self.start(responses, ground_truths, context)], self.timeout,
                                 f"reward function {self.shown!r} on the batch")[0]
        elif self.kind == "batch":
            calls = self._calls(responses, ground_truths, context)
            raw = self._bounded(lambda: self._invoke(calls, "the batch"), "the batch")
        else:
            calls = self._calls(responses, ground_truths, context)
            raw = self._bounded(lambda: [self._invoke(kw, self._where(context, k)) for k, kw in enumerate(calls)],
                                "the batch")
        if self.kind == "batch":
            if isinstance(raw, (str, bytes, dict)) or not hasattr(raw, "__len__"):
                raise RewardError(f"reward function {self.shown!r} returned {type(raw).__name__}; a TRL-style "
                                  f"function returns a list of {len(responses)} floats (or None)")
            raw = list(raw)
            if len(raw) != len(responses):
                raise RewardError(f"reward function {self.shown!r} returned {len(raw)} values for "
                                  f"{len(responses)} completions")
        return [_scores(v, self.shown, self._where(context, k)) for k, v in enumerate(raw)]

    def plan(self, responses, ground_truths, context=None):
        scores = self.values(list(responses), list(ground_truths), context or RewardContext())
        return [], lambda _: scores

    def __call__(self, response: str, ground_truth: str, **row) -> Scores:
        from rlvr.tasks.records import Example

        context = RewardContext(rows=[Example("", ground_truth, fields=row)], prompts=[""])
        out = self.values([response], [ground_truth], context)[0]
        return {k: (math.nan if v is None else v) for k, v in out.items()}

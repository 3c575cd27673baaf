"""The config machinery every command shares: BaseConfig, YAML presets plus `key=value` overrides
(`load_config`), errors that name the file and field with "did you mean", resume's comparison of a run's saved
settings, and the field list of `--help`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

C = TypeVar("C", bound="BaseConfig")


class ConfigError(ValueError):
    """A bad config file or override; the message names the file and the field."""


class SamplingMismatchWarning(UserWarning):
    """Rollouts are sampled from a distribution other than the one they are scored under."""


class BaseConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", by_alias=True), sort_keys=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_yaml(), encoding="utf-8")


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """["lr=1e-5", "--seed", "3", "--prompt=r1_zero"] -> {"lr": 1e-05, "seed": 3, "prompt": "r1_zero"}."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--"):
            body = arg[2:]
            if "=" in body:
                key, value = body.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                key, value = body, args[i + 1]
                i += 1
            else:
                key, value = body, "true"  # a bare flag
        elif "=" in arg:
            key, value = arg.split("=", 1)
        elif arg.endswith((".yaml", ".yml")):
            raise ConfigError(f"{arg!r} is not an override; to read a config file use --config {arg}")
        else:
            raise ConfigError(f"cannot read override {arg!r}: expected key=value or --key value")
        key = key.strip().replace("-", "_")
        if not key:
            raise ConfigError(f"override {arg!r} has no key")
        try:
            out[key] = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            out[key] = value
        if isinstance(out[key], str) and out[key].lower() == "null":
            out[key] = None  # ("none" is resolved per field by load_config: for some fields it is a choice)
        i += 1
    return out


# Fields for which "none" is one of the choices, not "unset" (their None means: the algorithm's value)
NONE_IS_A_CHOICE = ("baseline", "advantage_normalizer", "importance_reweighting_method")


def _field(cls: type[BaseConfig], name: str):
    """The field called `name` (or whose alias is `name`), or None."""
    return cls.model_fields.get(name) or next((f for f in cls.model_fields.values() if f.alias == name), None)


def _section(field) -> type[BaseConfig] | None:
    """The config class of a section field (`distributed`, `async`, ...), else None."""
    kind = getattr(field, "annotation", None)
    return kind if isinstance(kind, type) and issubclass(kind, BaseConfig) else None


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`; a section given in both is merged field by field (`distributed.learners=2`
    changes one field of the section)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def _none_means(cls: type[BaseConfig], extra: dict[str, Any]) -> dict[str, Any]:
    """`key=none` on the command line: the string "none" where it is one of the field's choices (a Literal with
    "none", `baseline=none`, ...), else None (unset: `teacher=none`, `baseline_dataset=none`)."""
    from typing import get_args, get_origin

    def takes_none(field) -> bool:
        kinds = [field.annotation, *get_args(field.annotation)]
        return any(get_origin(k) is Literal and "none" in get_args(k) for k in kinds)

    out: dict[str, Any] = {}
    for key, value in extra.items():
        field = _field(cls, key)
        if isinstance(value, dict) and _section(field) is not None:
            out[key] = _none_means(_section(field), value)
        elif isinstance(value, str) and value.lower() == "none":
            out[key] = "none" if field is not None and (key in NONE_IS_A_CHOICE or takes_none(field)) else None
        else:
            out[key] = value
    return out


def _describe(error: ValidationError, source: str) -> str:
    """One line per problem in rlvr's words: the source, the field (dotted, as it is typed) and what is wrong;
    the value given when it is short (never a whole section dumped), no pydantic wording."""
    lines = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"])
        message = item["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"{source}: {unknown_field(field, [])}" if "." not in field
                         else f"{source}: {field!r} is not a field of its section")
            continue
        value = item.get("input")
        shown = "" if isinstance(value, (dict, list)) or len(repr(value)) > 60 or field == "" else f" (got {value!r})"
        lines.append(f"{source}: {f'field {field!r}: ' if field else ''}{message}{shown}")
    return "\n".join(lines)


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | dict | None = None,
                given: str = "command line") -> C:
    """Build `cls` from a YAML file and overrides; errors name the file (or where the overrides were `given`:
    the command line, or a Python call such as rlvr.train) and field."""
    data: dict[str, Any] = {}
    source = given
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file {path} not found")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None) or getattr(err, "context_mark", None)
            where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
            problem = " ".join(str(part) for part in (getattr(err, "context", None), getattr(err, "problem", None))
                               if part) or str(err)
            raise ConfigError(f"{where}: not valid YAML: {problem}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of field: value, got {type(loaded).__name__}")
        data = dict(loaded or {})
        source = str(path)
    extra = overrides if isinstance(overrides, dict) else parse_overrides(overrides or [])
    extra = _none_means(cls, _nest(cls, extra, given))
    names = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
    unknown = sorted(set(data) - names) + sorted(set(extra) - names)
    if unknown:
        where = source if set(unknown) & set(data) else given
        raise ConfigError(f"{where}: " + "; ".join(unknown_field(name, _public_names(cls)) for name in unknown)
                          + " (`rlvr <command> --help` lists the fields)")
    data = _merge(data, extra)
    if data.get("resume") is True and "resume" in cls.model_fields and "out" in cls.model_fields:
        data = _resumed(cls, data, source)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source if not extra or path is None else f"{source} + overrides")) from None


# Fields a resumed run may change: none of them can change what the run computes.
RESUME_FREE = ("resume", "out", "tensorboard", "wandb_project", "log_rollouts_every", "save_every", "keep_checkpoints",
               "distributed.timeout_s", "distributed.ready_timeout_s", "examples_per_category")


def _flat(data: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same_setting(a, b) -> bool:
    """Equal values, or two spellings of one existing path (the distributed driver saves paths absolute)."""
    if a == b:
        return True
    if isinstance(a, str) and isinstance(b, str):
        head_a, sep_a, attr_a = a.rpartition(":")  # path.py:SPEC estimators
        head_b, sep_b, attr_b = b.rpartition(":")
        if sep_a and sep_b and attr_a == attr_b and head_a.endswith(".py"):
            a, b = head_a, head_b
        try:
            return Path(a).exists() and Path(a).resolve() == Path(b).resolve()
        except OSError:
            return False
    return False


def setting_changes(old: dict, new: dict, free=lambda key, old, new: False) -> list[str]:
    """"key: saved X, now Y" for each setting of two dumped configs (sections flattened to section.field) whose
    values differ, two spellings of one existing path counting as one; `free(key, old, new)` true: it may differ.
    The one wording of every "resume continues with the settings it was started with" refusal."""
    old, new = _flat(old), _flat(new)
    return [f"{key}: saved {old.get(key)!r}, now {new.get(key)!r}" for key in [*old, *(k for k in new if k not in old)]
            if not _same_setting(old.get(key), new.get(key)) and not free(key, old.get(key), new.get(key))]


def _resumed(cls: type[C], data: dict, source: str) -> dict:
    """resume=true continues the run in `out` with the settings it was started with (its config.yaml): the
    fields given now are checked against them, and one that would change the run is refused, naming its saved
    and its new value. `steps` may be raised (to extend a run); RESUME_FREE may differ."""
    run_dir = Path(str(data.get("out", cls.model_fields["out"].default)))
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return data  # nothing saved yet: a fresh start (rlvr.stages.run.start_run decides)
    try:
        saved = yaml.safe_load(saved_path.read_text(encoding="utf-8")) or {}
        before = cls.model_validate(saved)
    except (yaml.YAMLError, ValidationError) as err:
        raise ConfigError(f"{saved_path}: the run's saved settings do not load ({str(err).splitlines()[0]}); "
                          "resume cannot check what this run was") from None
    merged = _merge(saved, data)
    try:
        after = cls.model_validate(merged)
    except ValidationError as err:
        raise ConfigError(_describe(err, f"{source} + {saved_path}")) from None
    old, new = before.model_dump(mode="json", by_alias=True), after.model_dump(mode="json", by_alias=True)
    changed = setting_changes(old, new, lambda key, was, now: key in RESUME_FREE or (key == "steps" and now > was))
    if changed:
        raise ConfigError(f"resume=true continues {run_dir} with the settings it was started with ({saved_path}); "
                          f"{'this differs' if len(changed) == 1 else 'these differ'}: " + "; ".join(changed)
                          + ". Drop the override to continue that run (steps may only be raised), or choose another "
                          "out= for a new run")
    if new.get("steps", 0) > old.get("steps", 0) and (run_dir / "final" / "DONE").is_file():
        raise ConfigError(f"steps={new['steps']}: {run_dir} holds a finished run of {old['steps']} steps, whose "
                          f"optimizer state was not kept; train on from its model with model={run_dir / 'final'} "
                          "and another out=")
    return merged


def _public_names(cls: type[BaseConfig]) -> list[str]:
    return [f.alias or n for n, f in cls.model_fields.items()]


# TRL's GRPOConfig names (and a few of transformers' TrainingArguments) -> what rlvr calls the same setting: a TRL
# user's config gets the right name, not the closest spelling (num_generations is not generation_dtype)
TRL_NAMES = {
    "num_generations": "group_size", "epsilon": "cliprange", "epsilon_high": "cliprange_high",
    "max_completion_length": "max_new_tokens", "generation_batch_size": "rollout_batch_size",
    "num_iterations": "steps_per_rollout", "steps_per_generation": "steps_per_rollout", "max_steps": "steps",
    "num_train_epochs": "steps", "output_dir": "out", "save_steps": "save_every", "eval_steps": "eval_every",
    "logging_steps": "log_rollouts_every", "log_completions": "log_rollouts_every",
    "lr_scheduler_type": "lr_schedule", "bf16": "precision=bf16", "fp16": "precision", "scale_rewards":
    "advantage_normalizer (std | none)", "loss_type": "algorithm (grpo, dr_grpo, dapo, ...) or loss_normalization",
    "importance_sampling_level": "algorithm=gspo (sequence) or importance_reweighting_method",
    "per_device_train_batch_size": "rollout_batch_size (and microbatch_size for memory)",
    "gradient_accumulation_steps": "microbatch_size (rlvr accumulates a whole batch itself)",
    "reward_weights": "rewards={name: weight}", "reward_funcs": "rewards={file.py:fn: weight}",
    "vllm_importance_sampling_correction": "rollout_correction.mode", "vllm_importance_sampling_cap":
    "rollout_correction.cap", "report_to": "tensorboard / wandb_project", "max_prompt_length":
    "nothing: rlvr never cuts a prompt (check-task checks prompts against the model's context)",
    "top_k": "top_p (rlvr samples with top_p)", "use_vllm": "nothing: rlvr's engine is built in (docs/gpu.md)",
    "dataset_name": "dataset", "model_name_or_path": "model", "learning_rate_scheduler": "lr_schedule",
    "lora_r": "lora_rank", "r": "lora_rank", "sync_ref_model": "nothing: the reference is fixed (beta > 0)",
}


def unknown_field(name: str, names: list[str]) -> str:
    """"unknown field 'learnin_rate'; did you mean 'learning_rate'?" (difflib's closest, when one is close); a
    TRL GRPOConfig name gets rlvr's name for the same setting."""
    import difflib

    if name in TRL_NAMES:
        return f"unknown field {name!r} (TRL's GRPOConfig name); rlvr's is {TRL_NAMES[name]}"
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"unknown field {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


def _nest(cls: type[BaseConfig], extra: dict[str, Any], given: str = "command line") -> dict[str, Any]:
    """{"distributed.learners": 2} -> {"distributed": {"learners": 2}} for a section field (a nested config)."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        head, dot, rest = key.partition(".")
        if not dot:
            out[key] = value
            continue
        section = _section(_field(cls, head))
        if section is None:
            raise ConfigError(f"{given}: {key!r}: {head!r} is not a section of {cls.__name__} (sections: "
                              + ", ".join(f.alias or n for n, f in cls.model_fields.items() if _section(f)) + ")")
        if rest.partition(".")[0] not in section.model_fields:
            raise ConfigError(f"{given}: " + unknown_field(key, [f"{head}.{n}" for n in section.model_fields]))
        out.setdefault(head, {})[rest] = value
    return out


def fields_help(cls: type[BaseConfig]) -> str:
    """A field list for --help: name, type/default, description."""
    lines = []
    for name, field in cls.model_fields.items():
        section = _section(field)
        if section is not None:  # distributed.learners=1 ...
            lines += [f"{field.alias or name}.{line}" for line in fields_help(section).split("\n\n")]
            continue
        default = field.default if field.default is not None else "None"
        lines.append(f"{field.alias or name}={default!s}  {field.description or ''}".rstrip())
    return "\n\n".join(lines)

"""Typed configuration: one pydantic model per command, validated before any heavy work.

A config comes from a YAML preset (configs/*.yaml) and `key=value` overrides from the command line
(also accepted as `--key value` or `--key=value`). Values are parsed as YAML scalars and type-checked;
unknown keys are rejected with the list of valid ones. The full resolved config is written next to
each run's outputs.
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rlvr.rollout import SamplingParams  # torch-free: configs stay cheap to import

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


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | dict | None = None) -> C:
    """Build `cls` from a YAML file and overrides; errors name the file (or "command line") and field."""
    data: dict[str, Any] = {}
    source = "command line"
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
    extra = _none_means(cls, _nest(cls, extra))
    names = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
    unknown = sorted(set(data) - names) + sorted(set(extra) - names)
    if unknown:
        where = source if set(unknown) & set(data) else "command line"
        raise ConfigError(f"{where}: " + "; ".join(unknown_field(name, _public_names(cls)) for name in unknown)
                          + f" (`rlvr <command> --help` lists the fields)")
    data = _merge(data, extra)
    if data.get("resume") is True and "resume" in cls.model_fields and "out" in cls.model_fields:
        data = _resumed(cls, data, source)
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_describe(err, source if not extra or path is None else f"{source} + overrides")) from None


# Fields a resumed run may change: none of them can change what the run computes.
RESUME_FREE = ("resume", "out", "tensorboard", "wandb_project", "log_rollouts_every", "save_every", "keep_checkpoints",
               "distributed.timeout_s", "distributed.ready_timeout_s")


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


def _resumed(cls: type[C], data: dict, source: str) -> dict:
    """resume=true continues the run in `out` with the settings it was started with (its config.yaml): the
    fields given now are checked against them, and one that would change the run is refused, naming its saved
    and its new value. `steps` may be raised (to extend a run); RESUME_FREE may differ."""
    run_dir = Path(str(data.get("out", cls.model_fields["out"].default)))
    saved_path = run_dir / "config.yaml"
    if not saved_path.is_file():
        return data  # nothing saved yet: a fresh start (rlvr.loop_common.start_run decides)
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
    old, new = _flat(before.model_dump(mode="json", by_alias=True)), _flat(after.model_dump(mode="json", by_alias=True))
    changed = [f"{key}: saved {old.get(key)!r}, now {new.get(key)!r}" for key in old
               if not _same_setting(old.get(key), new.get(key)) and key not in RESUME_FREE
               and not (key == "steps" and new[key] > old[key])]
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


def unknown_field(name: str, names: list[str]) -> str:
    """"unknown field 'learnin_rate'; did you mean 'learning_rate'?" (difflib's closest, when one is close)."""
    import difflib

    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return f"unknown field {name!r}" + (f"; did you mean {close[0]!r}?" if close else "")


def _nest(cls: type[BaseConfig], extra: dict[str, Any]) -> dict[str, Any]:
    """{"distributed.learners": 2} -> {"distributed": {"learners": 2}} for a section field (a nested config)."""
    out: dict[str, Any] = {}
    for key, value in extra.items():
        head, dot, rest = key.partition(".")
        if not dot:
            out[key] = value
            continue
        section = _section(_field(cls, head))
        if section is None:
            raise ConfigError(f"command line: {key!r}: {head!r} is not a section of {cls.__name__} (sections: "
                              + ", ".join(f.alias or n for n, f in cls.model_fields.items() if _section(f)) + ")")
        if rest.partition(".")[0] not in section.model_fields:
            raise ConfigError("command line: " + unknown_field(key, [f"{head}.{n}" for n in section.model_fields]))
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


# ----------------------------------------------------------------------------------------------------
# Shared pieces.

Dtype = Literal["float32", "bfloat16", "float16"]
# rlvr.estimators.RolloutCorrection, spelled again here so that configs import no torch (a test keeps them equal)
RolloutCorrectionMode = Literal["none", "token_tis", "sequence_tis", "token_mask", "sequence_mask"]
DEVICE_HELP = "auto (cuda:0 when there is a GPU, else cpu) | cpu | cuda | cuda:N"


def _device_field(value, field: str):
    from rlvr.devices import check_name  # torch-free

    return check_name(value, field) if value is not None else None


class PlacementConfig(BaseConfig):
    """Seed 000's role split (`placement.*`): a device per role, the policy's layers split over a list of devices.
    A role left unset takes `device`."""

    policy: list[str] | None = Field(None, description="the trainable policy's devices, split by layers "
                                     "(embeddings, norm, lm_head on the first); the list of auto alone: every CUDA "
                                     "device no other role took (seed 000)")
    rollout: str | None = Field(None, description="the rollout engine's weight copy (refreshed after every step)")
    reference: str | None = Field(None, description="the frozen reference of the KL term")
    eval: str | None = Field(None, description="periodic validation (its own engine when not the rollout device)")
    teacher: str | None = Field(None, description="the distillation teacher (default: the reference's device)")

    @model_validator(mode="after")
    def _check(self):
        for role in ("rollout", "reference", "eval", "teacher"):
            _device_field(getattr(self, role), f"placement.{role}")
        for i, name in enumerate(self.policy or []):
            _device_field(name, f"placement.policy[{i}]")
        if self.policy is not None and not self.policy:
            raise ValueError("placement.policy is empty: name at least one device, or leave it unset")
        return self
class SandboxConfig(BaseConfig):
    """`sandbox.*`: how the programs of a code dataset run (rlvr.sandbox). `sandbox=limits_only` is short for
    `sandbox.isolation=limits_only`."""

    isolation: Literal["bwrap", "limits_only"] = Field(
        "bwrap", description="bwrap: bubblewrap namespaces, seccomp, no capabilities, tests judged out of the "
        "program's reach (refuses to start where it cannot); limits_only: resource limits and a timeout only, "
        "no isolation (programs can read your files, reach the network and forge verdicts): trusted code only")
    workers: int | None = Field(None, ge=1, description="sandboxes at once (default: 2 per CPU this process may use)")
    timeout: float = Field(5.0, gt=0, description="wall-clock seconds for a program and all its tests")
    memory_mb: int = Field(512, ge=32, description="address space of each of a sandbox's processes")
    processes: int = Field(8, ge=2, description="processes and threads a sandbox may hold (the judge's included)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"isolation": data} if isinstance(data, str) else data

    def apply(self) -> None:
        """Run programs this way from now on in this process; raises SandboxUnavailable where bwrap cannot
        isolate them here (before any heavy work)."""
        from rlvr.sandbox import SandboxLimits, configure

        configure(self.isolation, self.workers, SandboxLimits(timeout=self.timeout, cpu_seconds=max(1, int(
            self.timeout) - 1), memory_mb=self.memory_mb, processes=self.processes))


CODE_PROMPTS = ("code", "code_chat")  # the prompts of code datasets (rlvr.prompts), graded by running tests
SFT_PROMPTS = ("r1_zero", "r1_zero_three_shot") + CODE_PROMPTS  # the prompts that have an SFT target


class DataFields(BaseConfig):
    """What every command reads: the model, the dataset and how its splits are cut, the prompt."""

    model: str = Field("SmolLM2-135M-Instruct", description="hub name (cached), saved directory, .gguf, or the default")
    dataset: str = Field("gsm8k", description="math: gsm8k | arithmetic[:steps=N,max=M] | path.jsonl; code: "
                         "code[:level=N] | path.jsonl whose rows have a `tests_field` (needs a code prompt)")
    prompt: str = Field("r1_zero", description="math: question_only | r1_zero | r1_zero_three_shot | chat; "
                        "code datasets: code | code_chat")
    split_seed: int = Field(0, ge=0, description="seed of the train/validation split, kept apart from `seed` so "
                            "that every run of a sweep (and the SFT before it) holds out the same questions")
    question_field: str = Field("question", description="JSONL datasets: the question's field")
    answer_field: str = Field("answer", description="JSONL datasets: the answer's field (bare or '#### x')")
    solution_field: str | None = Field(None, description="JSONL datasets: the worked solution's field (default: "
                                       "math, the text before '####'; code, 'solution'; MBPP: code)")
    tests_field: str = Field("tests", description="code JSONL datasets: the tests' field (assert strings, test code, "
                             "or input/output pairs); a .jsonl whose first row has it is a code dataset")
    entry_point_field: str = Field("entry_point", description="code JSONL datasets: the tested function's name")
    seed: int = 0
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)

    @property
    def grades_code(self) -> bool:
        """Whether this command runs programs in the sandbox (a code prompt, or a code reward term)."""
        rewards = getattr(self, "rewards", None) or {}
        return self.prompt in CODE_PROMPTS or any(str(name).startswith("code_tests") for name in rewards)

    @model_validator(mode="after")
    def _check_dataset_prompt(self):
        from rlvr.data import DataError, is_code_dataset  # lazily: configs stay cheap to import

        try:
            code = is_code_dataset(self.dataset, self.tests_field)
        except DataError:  # a file not there yet (or unreadable): loading the data reports it
            return self
        if code and self.prompt not in CODE_PROMPTS:
            raise ValueError(f"dataset={self.dataset!r} is a code dataset, graded by running tests; "
                             f"prompt={self.prompt!r} is not a code prompt: use prompt={' or '.join(CODE_PROMPTS)}")
        if not code and self.prompt in CODE_PROMPTS:
            raise ValueError(f"prompt={self.prompt!r} is a code prompt, but dataset={self.dataset!r} is not a code "
                             f"dataset (code[:level=N], or a .jsonl whose rows have a {self.tests_field!r} field)")
        return self


class EvalConfig(DataFields):
    split: Literal["train", "validation", "test"] = "test"
    limit: int | None = Field(None, ge=1, description="first N questions")
    samples: int = Field(1, ge=1, description="completions per question (pass@k for k <= samples)")
    temperature: float | None = Field(None, ge=0, description="default: 0 (greedy) for 1 sample, else 1.0")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(512, ge=1)
    repetition_penalty: float = Field(1.0, gt=0)
    batch_size: int = Field(64, ge=1, description="rows decoded together")
    dtype: Dtype = Field("float32", description="generation dtype (bfloat16 is about 2x faster on a CPU with "
                         "AVX512-BF16 or AMX; one without native kernels runs float32)")
    device: str = Field("auto", description=DEVICE_HELP)
    out: str | None = Field(None, description="output directory (default runs/eval/<model>-<prompt>-<split>)")
    examples_per_category: int = Field(2, ge=0, description="example responses printed per category")

    @model_validator(mode="after")
    def _defaults(self):
        _device_field(self.device, "device")
        if self.temperature is None:
            object.__setattr__(self, "temperature", 0.0 if self.samples == 1 else 1.0)
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("samples > 1 with temperature 0 gives identical samples; set temperature > 0")
        return self


class TrainingFields(DataFields):
    """Fields shared by `rlvr sft` and `rlvr train`."""

    train_limit: int | None = Field(None, ge=1, description="use the first N training examples")
    out: str = Field("runs/run", description="run directory")
    # optimisation
    learning_rate: float = Field(1e-5, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    adam_beta1: float = Field(0.9, ge=0, lt=1)
    adam_beta2: float = Field(0.95, ge=0, lt=1)
    max_grad_norm: float | None = Field(1.0, gt=0, description="clip the gradient norm (None: no clipping)")
    warmup_steps: int = Field(0, ge=0)
    lr_schedule: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine decays to learning_rate * min_lr_ratio")
    precision: Literal["fp32", "bf16"] = Field("bf16", description="bf16 = autocast with fp32 master weights "
                                               "(fp32 on a CPU without native bf16 kernels)")
    microbatch_size: int = Field(8, ge=1, description="sequences per forward/backward pass")
    gradient_checkpointing: bool = False
    share_prefix: bool = Field(True, description="run a microbatch's common prompt prefix once (exact; off with "
                                                 "gradient checkpointing)")
    lora_rank: int = Field(0, ge=0, description="0 = full fine-tuning")
    lora_alpha: float | None = None
    lora_dropout: float = Field(0.0, ge=0, lt=1)
    # validation, logging, checkpoints
    eval_every: int = Field(10, ge=0, description="validate every N steps (0: never in between)")
    eval_at_start: bool = Field(True, description="validate before the first step")
    eval_start_cache: bool = Field(True, description="rlvr train: take step 0's validation from an earlier run on this "
                                   "machine (same code, start model, data, eval settings and seed) instead of "
                                   "computing it again; the runs of a sweep share it")
    eval_at_end: bool = Field(True, description="validate after the last step")
    eval_limit: int = Field(200, ge=1, description="validation questions")
    eval_max_new_tokens: int = Field(256, ge=1)
    eval_temperature: float = Field(0.0, ge=0, description="0 = greedy validation")
    eval_samples: int = Field(1, ge=1, description="completions per validation question (needs eval_temperature > 0)")
    eval_sampled_samples: int = Field(0, ge=0, description="also validate with N samples per question at "
                                      "eval_sampled_temperature (0: off): val_sampled/accuracy = sampled pass@1")
    eval_sampled_temperature: float = Field(1.0, gt=0, description="temperature of the sampled validation")
    generation_dtype: Dtype = Field("bfloat16", description="dtype of the rollout/eval engine's weight copy "
                                    "(float32 on a CPU without native kernels for it)")
    generation_batch_size: int = Field(64, ge=1, description="rows decoded together; larger pays when G samples "
                                       "share a prompt (256 at G=16: 1.6x of 64), not at one sample per prompt (0.84x)")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: only at the end)")
    keep_checkpoints: int = Field(2, ge=1)
    tensorboard: bool = True
    wandb_project: str | None = None
    resume: bool = Field(False, description="continue from the last checkpoint in `out`")
    # where the models run
    device: str = Field("auto", description=DEVICE_HELP + "; every role's device unless placement.* names one")
    placement: PlacementConfig = Field(default_factory=PlacementConfig)

    @model_validator(mode="after")
    def _check_device(self):
        _device_field(self.device, "device")
        return self


def sampling_params(cfg: BaseConfig, *, stop: tuple[str, ...], seed: int, validation: bool = False,
                    sampled: bool = False):
    """The one place a config becomes SamplingParams: `rlvr eval`'s settings, `rlvr train`'s rollouts (G
    samples each, with their entropies for the whole batch's token entropy), validation (`eval_*`), or the
    sampled validation beside it (`sampled`: `eval_sampled_*`)."""
    if validation and sampled:
        return SamplingParams(temperature=cfg.eval_sampled_temperature, max_new_tokens=cfg.eval_max_new_tokens,
                              stop=stop, seed=seed, n=cfg.eval_sampled_samples)
    if validation:
        return SamplingParams(temperature=cfg.eval_temperature, max_new_tokens=cfg.eval_max_new_tokens, stop=stop,
                              seed=seed, n=cfg.eval_samples)
    if isinstance(cfg, EvalConfig):
        return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                              repetition_penalty=cfg.repetition_penalty, stop=stop, n=cfg.samples, seed=seed)
    return SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_new_tokens=cfg.max_new_tokens,
                          min_new_tokens=cfg.min_new_tokens, repetition_penalty=cfg.repetition_penalty, stop=stop,
                          n=cfg.group_size, seed=seed, entropy=True)


def _check_eval_sampling(cfg):
    if cfg.eval_samples > 1 and cfg.eval_temperature == 0:
        raise ValueError("eval_samples > 1 with eval_temperature 0 gives identical samples; set eval_temperature > 0")


class SFTConfig(TrainingFields):
    out: str = "runs/sft"
    steps: int = Field(100, ge=1, description="optimizer steps")
    batch_size: int = Field(16, ge=1, description="sequences per optimizer step")
    learning_rate: float = Field(2e-5, gt=0)
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    warmup_steps: int = Field(5, ge=0)
    normalize_constant: float = Field(1.0, gt=0, description="divide each sequence's summed NLL by this")

    @model_validator(mode="after")
    def _check(self):
        _check_eval_sampling(self)
        if self.batch_size % self.microbatch_size:
            raise ValueError(f"batch_size={self.batch_size} is not a multiple of microbatch_size={self.microbatch_size}")
        if self.prompt not in SFT_PROMPTS:
            raise ValueError(f"prompt={self.prompt!r} has no SFT target; SFT takes prompt=r1_zero or "
                             "r1_zero_three_shot (math datasets), code or code_chat (code datasets)")
        return self


def choose_backend(requested: str, kinds: list[str], what: str) -> str:
    """The one torch.distributed backend of a group whose ranks run on `kinds` ("cpu" / "cuda"), decided once
    for all of them: NCCL when every rank is on a GPU, gloo when every rank is on the CPU. Ranks on both are
    refused (NCCL carries no CPU tensors; a gloo rank beside NCCL ones hangs), as is NCCL with a CPU rank."""
    found = sorted(set(kinds))
    if len(found) > 1:
        raise ValueError(f"{what}: its ranks would be on the CPU and on GPUs; one process group needs every rank "
                         "on the same kind of device (give every role GPUs, or none"
                         + (", or use distributed.weight_sync=object_store)" if "broadcast" in what else ")"))
    if requested == "auto":
        return "nccl" if found == ["cuda"] else "gloo"
    if requested == "nccl" and found != ["cuda"]:
        raise ValueError(f"{what}: distributed.backend=nccl needs every rank on a GPU; these are on the CPU")
    return requested


class DistributedConfig(BaseConfig):
    """`rlvr train distributed.*`: Ray roles (rlvr.cluster). rollout_workers=0 and learners=1 is the local loop."""

    rollout_workers: int = Field(0, ge=0, description="Ray actors generating rollouts (0: the local loop, no Ray)")
    learners: int = Field(1, ge=1, description="data-parallel learner actors (one torch.distributed group)")
    address: str | None = Field(None, description="Ray cluster to join (auto: the running one); None starts a "
                                "local Ray")
    rollout_num_cpus: float = Field(1.0, ge=0)
    rollout_num_gpus: float = Field(0.0, ge=0)
    learner_num_cpus: float = Field(1.0, ge=0)
    learner_num_gpus: float = Field(0.0, ge=0)
    backend: Literal["auto", "gloo", "nccl"] = Field("auto", description="the learners' and the weight-broadcast "
                                                     "groups (auto: NCCL when every rank has a GPU, gloo when none has)")
    timeout_s: float = Field(1800.0, gt=0, description="longest wait for any role before the run stops with an "
                             "error naming it")
    ready_timeout_s: float = Field(120.0, gt=0, description="longest wait for Ray to reserve the learners' "
                                   "resources (a placement group) before the run stops saying what it asked for")
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store", description="object_store: learner rank 0 puts the weights once, each worker reads them "
        "(any node); broadcast: a torch.distributed group of learner 0 and the workers (NCCL on GPUs)")

    @property
    def enabled(self) -> bool:
        return self.rollout_workers > 0 or self.learners > 1

    @property
    def learner_device(self) -> str:
        """Where each learner actor runs: on the GPU Ray gave it, and on the CPU when it asked for none (Ray >=
        2.60 no longer hides the GPUs from such an actor, so `device=auto` alone would put it on cuda:0)."""
        return "cuda" if self.learner_num_gpus > 0 else "cpu"

    @property
    def rollout_device(self) -> str:
        return "cuda" if self.rollout_num_gpus > 0 else "cpu"

    @property
    def learner_backend(self) -> str:
        return choose_backend(self.backend, [self.learner_device] * self.learners,
                              f"distributed.learners={self.learners} with distributed.learner_num_gpus="
                              f"{self.learner_num_gpus:g}")

    @property
    def weight_backend(self) -> str:
        return choose_backend(self.backend, [self.learner_device] + [self.rollout_device] * self.rollout_workers,
                              f"distributed.weight_sync=broadcast with distributed.learner_num_gpus="
                              f"{self.learner_num_gpus:g} and distributed.rollout_num_gpus={self.rollout_num_gpus:g}")

    @model_validator(mode="after")
    def _check_groups(self):
        if self.learners > 1:
            backend = self.learner_backend
            if backend == "nccl" and self.learner_num_gpus < 1:
                raise ValueError(f"distributed.learner_num_gpus={self.learner_num_gpus:g} lets two learner ranks share "
                                 "a GPU, which NCCL refuses (\"Duplicate GPU\"): give each learner a whole GPU")
        if self.weight_sync == "broadcast" and self.rollout_workers:
            backend = self.weight_backend
            if backend == "nccl" and self.rollout_num_gpus < 1:
                raise ValueError(f"distributed.rollout_num_gpus={self.rollout_num_gpus:g} with weight_sync=broadcast "
                                 "lets ranks of the NCCL weight group share a GPU, which NCCL refuses: give each "
                                 "worker a whole GPU, or use weight_sync=object_store")
        return self


class AsyncConfig(BaseConfig):
    """`rlvr train async.*`: rollouts overlap training, at most `max_staleness` policy versions old."""

    max_staleness: int | None = Field(None, ge=0, description="None: synchronous; K: train a batch only if its "
                                      "rollouts are at most K policy versions old, one version per rollout batch trained (with "
                                      "steps_per_rollout=S that is up to K x S optimizer steps; older ones are "
                                      "dropped); 0 is synchronous")
    tis_cap: float | None = Field(None, gt=0, description="deprecated: rollout_correction.cap (the correction "
                                  "now applies in every mode)")


class RolloutCorrectionConfig(BaseConfig):
    """`rlvr train rollout_correction.*`: the engine samples with its own numerics (a bf16 copy; in async mode,
    older weights), so its sampling log-probs mu differ from the trainer's pi_old. Every step logs the mismatch
    (train/mismatch_*) and weights each token's loss by rlvr.estimators.rollout_correction_weights."""

    mode: RolloutCorrectionMode = Field("token_tis", description="none | token_tis | sequence_tis | token_mask | "
                                        "sequence_mask: truncated IS min(rho, cap) or masked IS (rho outside the band "
                                        "-> 0), per token or per sequence, rho = pi_old / mu")
    cap: float = Field(2.0, ge=1, description="the truncation of the *_tis modes")
    band: tuple[float, float] = Field((0.5, 2.0), description="[low, high] of the *_mask modes, and the band whose "
                                      "leaving train/mismatch_outside_band_fraction counts")

    @model_validator(mode="after")
    def _check_band(self):
        low, high = self.band
        if not 0 < low <= 1 <= high:
            raise ValueError(f"rollout_correction.band={list(self.band)} must satisfy 0 < low <= 1 <= high")
        return self

    def spec(self):
        from rlvr.update import RolloutCorrection

        return RolloutCorrection(self.mode, self.cap, tuple(self.band))


class TrainConfig(TrainingFields):
    """`rlvr train`: the RL loop of seed 004 Algorithm 1 with any estimator of the preset table."""

    out: str = "runs/grpo"
    algorithm: str = Field("grpo", description="preset (rlvr algorithms: grpo, dr_grpo, rft, maxrl, offpolicy_clip, ...) "
                           "or an EstimatorSpec by import path: my_module:SPEC or path/to/file.py:SPEC")
    steps: int = Field(20, ge=1, description="rollout batches (GRPO steps)")
    rollout_batch_size: int = Field(32, ge=1, description="rollouts per step = questions x group_size")
    group_size: int = Field(8, ge=1)
    # sampling for rollouts
    temperature: float = Field(1.0, gt=0)
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(256, ge=1)
    min_new_tokens: int = Field(0, ge=0)
    repetition_penalty: float = Field(1.0, gt=0)
    # the estimator (rlvr.algorithms.EstimatorSpec): None takes the algorithm's value; checked by the spec
    baseline: str | None = Field(None, description="mean | none")
    advantage_normalizer: str | None = Field(None, description="std | mean | none")
    advantage: str | None = Field(None, description="advantage function: group (seed 004) or a registered one")
    advantage_eps: float | None = Field(None, ge=0)
    importance_reweighting_method: str | None = Field(
        None, description="none | noclip | clip | gspo | cispo, or a registered policy loss ('grpo': old name of clip)")
    cliprange: float | None = Field(None, ge=0)
    cliprange_high: float | None = Field(None, ge=0)
    loss_normalization: str | None = Field(None, description="sequence | sum | constant | token")
    normalization_constant: float | None = Field(None, gt=0, description="constant aggregation's Z (default train batch x max_new_tokens)")
    beta: float | None = Field(None, ge=0, description="KL penalty weight (needs a reference model)")
    kl_estimator: str | None = Field(None, description="k1 | k2 | k3 (k2: the only one whose gradient is the KL's)")
    steps_per_rollout: int | None = Field(None, ge=1, description="optimizer steps per rollout batch (> 1: off-policy)")
    mask_truncated_completions: bool | None = None
    reward_signal: str | None = Field(
        None, description="reward | correctness: what advantages are computed from (rft, maxrl: correctness)")
    distill: float | None = Field(None, ge=0, description="weight of the per-token teacher signal log p_teacher - "
                                  "log p_student (algorithm=opd: 1 with no reward advantage)")
    distill_discount: float | None = Field(None, ge=0, le=1, description="0: per-token reverse KL; 1: sequence-level")
    distill_kl: str | None = Field(None, description="sampled: the sampled token's log-ratio as its advantage; reverse "
                                   "/ forward: the exact KL(student||teacher) / KL(teacher||student) over the "
                                   "vocabulary at each visited state")
    teacher: str | None = Field(None, description="teacher model for on-policy distillation (same tokenizer)")
    # rewards: {name: weight}; names are reward functions (r1_zero, question_only, answer_tag, code_tests) or
    # "format" (the prompt's reward function's format reward)
    rewards: dict[str, float] | None = Field(None, description="weighted rewards, e.g. {r1_zero: 1.0, format: 0.2} "
                                             "or {code_tests: 1.0, format: 0.05}")
    # logging
    log_rollouts_every: int = Field(5, ge=0, description="append the batch's rollouts to rollouts.jsonl every N steps")
    learning_rate: float = Field(1e-5, gt=0)
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups without reward spread and sample new "
                                   "questions in their place (up to dynamic_sampling_rounds generations per step)")
    dynamic_sampling_rounds: int = Field(4, ge=1, description="most generations per step with dynamic_sampling")
    # verl's DAPO recipe calls this gen_batch_size: oversampling the first round fills the batch in fewer, fuller
    # generation batches when most groups have no spread (GSM8K: about 3 in 10 have one at G = 16)
    dynamic_sampling_questions: int | None = Field(None, ge=1, description="questions generated in dynamic "
                                                   "sampling's first round (default: the batch's groups, "
                                                   "rollout_batch_size / group_size); groups beyond a full batch "
                                                   "are dropped")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @model_validator(mode="after")
    def _resolve_preset(self):
        from rlvr.algorithms import CHOICES, get_preset

        _check_eval_sampling(self)
        # the algorithm's row with this config's overrides, validated once as one estimator
        overrides = {name: getattr(self, name) for name in CHOICES if getattr(self, name) is not None}
        spec = dataclasses.replace(get_preset(self.algorithm), **overrides).validate()
        for name in CHOICES:
            object.__setattr__(self, name, getattr(spec, name))
        if self.rollout_batch_size % self.group_size:
            raise ValueError(f"rollout_batch_size={self.rollout_batch_size} is not a whole number of groups of "
                             f"group_size={self.group_size}")
        if self.rollout_batch_size % self.steps_per_rollout:
            raise ValueError(f"rollout_batch_size={self.rollout_batch_size} does not split into "
                             f"steps_per_rollout={self.steps_per_rollout} equal train batches")
        if self.group_size == 1 and (self.baseline == "mean" or self.advantage_normalizer == "std"):
            raise ValueError("group_size=1 needs baseline=none and advantage_normalizer!=std (algorithm=reinforce)")
        if self.normalization_constant is None and self.loss_normalization == "constant":
            object.__setattr__(self, "normalization_constant", float(self.train_batch_size * self.max_new_tokens))
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError("min_new_tokens must not exceed max_new_tokens")
        if self.distill and not self.teacher:
            raise ValueError(f"algorithm={self.algorithm} distills from a teacher (distill={self.distill}): set "
                             "teacher=<model path or name>")
        if self.async_.tis_cap is not None:
            if self.async_.tis_cap < 1:
                raise ValueError(f"async.tis_cap={self.async_.tis_cap:g} is below 1; the cap is now "
                                 "rollout_correction.cap (>= 1)")
            if "cap" in self.rollout_correction.model_fields_set and self.rollout_correction.cap != self.async_.tis_cap:
                raise ValueError(f"async.tis_cap={self.async_.tis_cap:g} and rollout_correction.cap="
                                 f"{self.rollout_correction.cap:g} disagree; async.tis_cap is deprecated: keep only "
                                 "rollout_correction.cap")
            warnings.warn("async.tis_cap is deprecated: it is rollout_correction.cap, which applies in every mode",
                          DeprecationWarning, stacklevel=2)
            object.__setattr__(self.rollout_correction, "cap", self.async_.tis_cap)
            object.__setattr__(self.async_, "tis_cap", None)
        if self.async_.max_staleness and not self.distributed.rollout_workers:
            raise ValueError(f"async.max_staleness={self.async_.max_staleness} overlaps rollouts with training: "
                             "it needs distributed.rollout_workers >= 1")
        if self.dynamic_sampling_questions is not None:
            if not self.dynamic_sampling:
                raise ValueError("dynamic_sampling_questions sizes dynamic sampling's first round: set "
                                 "dynamic_sampling=true or remove it")
            if self.dynamic_sampling_questions < self.rollout_batch_size // self.group_size:
                raise ValueError(f"dynamic_sampling_questions={self.dynamic_sampling_questions} is fewer than the "
                                 f"batch's {self.rollout_batch_size // self.group_size} groups "
                                 f"(rollout_batch_size / group_size)")
        if self.distributed.enabled and self.dynamic_sampling:
            raise ValueError("dynamic_sampling runs in the local loop only for now; set distributed.rollout_workers=0 "
                             "distributed.learners=1")
        if self.distributed.enabled and self.placement != PlacementConfig():
            raise ValueError("placement.* splits roles over the devices of one process; with distributed.* Ray "
                             "places the roles (distributed.rollout_num_gpus, learner_num_gpus): remove placement.*")
        d = self.distributed
        if d.enabled and self.device == "cpu" and (d.learner_num_gpus or d.rollout_num_gpus):
            raise ValueError(f"device=cpu with distributed.learner_num_gpus={d.learner_num_gpus:g}, rollout_num_gpus="
                             f"{d.rollout_num_gpus:g}: the actors would hold GPUs they do not use; set the *_num_gpus "
                             "to 0, or device=auto")
        if self.distributed.enabled and self.distill:
            raise ValueError("on-policy distillation (distill > 0) runs in the local loop only; set "
                             "distributed.rollout_workers=0 distributed.learners=1")
        altered = [f"{name}={getattr(self, name)}" for name, neutral in
                   (("top_p", 1.0), ("repetition_penalty", 1.0), ("min_new_tokens", 0)) if getattr(self, name) != neutral]
        if altered:
            # the learner scores softmax(logits / temperature); these reshape what the sampler drew from
            warnings.warn(f"{', '.join(altered)}: rollouts are not sampled from the distribution the policy "
                          "gradient and importance ratios are scored under (softmax(logits / temperature))",
                          SamplingMismatchWarning, stacklevel=2)
        return self

    @property
    def train_batch_size(self) -> int:
        return self.rollout_batch_size // (self.steps_per_rollout or 1)

    @property
    def estimator(self):
        """The resolved EstimatorSpec, what the update step receives."""
        from rlvr.algorithms import CHOICES, get_preset

        return dataclasses.replace(get_preset(self.algorithm), **{name: getattr(self, name) for name in CHOICES})


class DPOConfig(TrainingFields):
    """`rlvr dpo`: DPO with a frozen reference (the starting model) on preference pairs, either built each step
    from the policy's own rollouts graded by the verifier (a right and a wrong answer to one question) or
    read from a JSONL of {question, chosen, rejected}."""

    out: str = "runs/dpo"
    steps: int = Field(20, ge=1, description="optimizer steps")
    beta: float = Field(0.1, gt=0, description="DPO's beta: the strength of the pull toward the reference")
    pairs: str = Field("rollouts", description="rollouts (built each step) | path to a JSONL with question, "
                       "chosen, rejected")
    questions_per_step: int = Field(8, ge=1, description="rollouts: questions sampled per step")
    group_size: int = Field(8, ge=2, description="rollouts: samples per question to find a right and a wrong one")
    pairs_per_question: int = Field(1, ge=1, description="rollouts: at most this many (right, wrong) pairs each")
    batch_size: int = Field(8, ge=1, description="JSONL pairs: pairs per optimizer step")
    temperature: float = Field(1.0, gt=0)
    max_new_tokens: int = Field(256, ge=1)
    learning_rate: float = Field(5e-6, gt=0)
    log_rollouts_every: int = Field(5, ge=0, description="append the step's pairs to pairs.jsonl every N steps")

    @model_validator(mode="after")
    def _check(self):
        _check_eval_sampling(self)
        if self.pairs != "rollouts" and not self.pairs.endswith(".jsonl"):
            raise ValueError(f"pairs={self.pairs!r}: expected 'rollouts' or a .jsonl path")
        return self


class DemoConfig(BaseConfig):
    """`rlvr demo`: the prompting baseline on GSM8K, then on `dataset`: baseline eval -> SFT -> GRPO -> eval ->
    before/after table with 95 % intervals. The default task is the generated arithmetic one, where a 135M
    model learns within the demo's 15 minutes (on GSM8K it does not: docs/experiment_log.md)."""

    model: str = "SmolLM2-135M-Instruct"
    dataset: str = "arithmetic"
    out: str = "runs/demo"
    seed: int = 0
    baseline_dataset: str | None = Field("gsm8k", description="a prompting-only baseline shown first (None: skip)")
    baseline_limit: int = Field(50, ge=1, description="questions of the prompting-only baseline")
    baseline_max_new_tokens: int = Field(256, ge=1)
    eval_limit: int = Field(500, ge=1, description="test questions the SFT and GRPO models are evaluated on")
    untrained_eval_limit: int | None = Field(100, ge=1, description="of those, the first N for the untrained "
                                             "model (it never writes the answer format; None: all eval_limit)")
    eval_max_new_tokens: int = Field(96, ge=1)
    sft_steps: int = Field(30, ge=1)
    sft_batch_size: int = Field(16, ge=1)
    sft_learning_rate: float = Field(1e-4, gt=0)
    grpo_steps: int = Field(20, ge=1)
    grpo_algorithm: str = "grpo"
    grpo_learning_rate: float = Field(1e-5, gt=0)
    grpo_eval_every: int = Field(5, ge=0, description="validate the GRPO policy every N steps, from step 0 (the "
                                 "figure's curve; 0: never)")
    grpo_eval_limit: int = Field(100, ge=1, description="validation questions of those checks (not the test ones)")
    rollout_batch_size: int = Field(64, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(96, ge=1)

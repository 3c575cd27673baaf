"""Typed configuration: one pydantic model per command, validated before any heavy work.

A config comes from a YAML preset (configs/*.yaml) and `key=value` overrides from the command line
(also accepted as `--key value` or `--key=value`). Values are parsed as YAML scalars and type-checked;
unknown keys are rejected with the list of valid ones. The full resolved config is written next to
each run's outputs.

May import: rlvr.core, rlvr.sandbox, rlvr.grading, rlvr.tasks, rlvr.environments, rlvr.engines, rlvr.algorithms (to
validate names and choices; lazily, so configs stay cheap to import).
"""

from __future__ import annotations

from rlvr.config.agents import AgentFields, AgentLimits
from rlvr.config.base import (
    NONE_IS_A_CHOICE,
    RESUME_FREE,
    BaseConfig,
    ConfigError,
    SamplingMismatchWarning,
    fields_help,
    load_config,
    parse_overrides,
    setting_changes,
    unknown_field,
)
from rlvr.config.commands import DemoConfig, DPOConfig, EvalConfig, SFTConfig, TrainConfig, sampling_params
from rlvr.config.sections import (
    CODE_PROMPTS,
    DEVICE_HELP,
    SFT_PROMPTS,
    AsyncConfig,
    CurriculumConfig,
    DataFields,
    DistributedConfig,
    Dtype,
    EngineDtype,
    PlacementConfig,
    RolloutCorrectionConfig,
    RolloutCorrectionMode,
    SandboxConfig,
    TrainingFields,
    choose_backend,
)

__all__ = [
    "AgentFields", "AgentLimits", "AsyncConfig", "BaseConfig", "CODE_PROMPTS", "ConfigError", "CurriculumConfig", "DEVICE_HELP", "DPOConfig",
    "DataFields",
    "DemoConfig", "DistributedConfig", "Dtype", "EngineDtype", "EvalConfig", "NONE_IS_A_CHOICE", "PlacementConfig",
    "RESUME_FREE",
    "RolloutCorrectionConfig", "RolloutCorrectionMode", "SFTConfig", "SFT_PROMPTS", "SamplingMismatchWarning",
    "SandboxConfig", "TrainConfig", "TrainingFields", "choose_backend", "fields_help", "load_config",
    "parse_overrides", "setting_changes", "sampling_params", "unknown_field",
]

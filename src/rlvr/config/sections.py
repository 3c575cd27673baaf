"""The sections and field groups the commands' configs are made of: data (`DataFields`), placement, the code
sandbox, the training fields every loop shares (`TrainingFields`, `sampling_params`), `distributed.*`, `async.*`
and `rollout_correction.*`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rlvr.config.base import BaseConfig
from rlvr.config.task import TaskFields

Dtype = Literal["float32", "bfloat16", "float16"]
# an engine's (rollouts, evaluation) may also be int8 weights, on a CPU (rlvr.engines.int8)
EngineDtype = Literal["float32", "bfloat16", "float16", "int8"]


# rlvr.algorithms.estimators.RolloutCorrection, spelled again here so that configs import no torch (a test keeps them equal)
RolloutCorrectionMode = Literal["none", "token_tis", "sequence_tis", "token_mask", "sequence_mask"]


DEVICE_HELP = "auto (cuda:0 when there is a GPU, else cpu) | cpu | cuda | cuda:N"


def device_field(value, field: str):
    from rlvr.core.devices import check_name  # torch-free

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
            device_field(getattr(self, role), f"placement.{role}")
        for i, name in enumerate(self.policy or []):
            device_field(name, f"placement.policy[{i}]")
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
    timeout: float = Field(5.0, gt=0, description="CPU seconds for a program and all its tests, every process of "
                           "its sandbox together (past them: a timeout, whatever runs beside it); one that waits "
                           "instead is stopped at 3 x this of wall clock")
    memory_mb: int = Field(512, ge=32, description="address space of each of a sandbox's processes")
    processes: int = Field(8, ge=2, description="processes a sandbox may hold, the judge's included "
                           "(16 threads more are allowed on top: the kernel counts both as tasks; memory counts "
                           "processes)")

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data):
        return {"isolation": data} if isinstance(data, str) else data

    def apply(self) -> None:
        """Run programs this way from now on in this process; raises SandboxUnavailable where bwrap cannot
        isolate them here (before any heavy work)."""
        from rlvr.sandbox import configure
        from rlvr.sandbox.records import WALL_FACTOR, SandboxLimits

        limits = SandboxLimits(timeout=WALL_FACTOR * self.timeout, cpu_seconds=self.timeout,
                               memory_mb=self.memory_mb, processes=self.processes)
        configure(self.isolation, self.workers, limits)


CODE_PROMPTS = ("code", "code_chat")  # the prompts of code datasets (rlvr.tasks.prompts), graded by running tests


SFT_PROMPTS = ("r1_zero", "r1_zero_three_shot") + CODE_PROMPTS  # the prompts that have an SFT target


class DataFields(TaskFields):
    """What every command reads: the model, the dataset and how its splits are cut, the prompt."""

    model: str = Field("SmolLM2-135M-Instruct", description="hub name (cached), saved directory, .gguf, or the default")
    dataset: str = Field("gsm8k", description="math: gsm8k | arithmetic[:steps=N,max=M] | path.jsonl; code: "
                         "code[:level=N] | path.jsonl whose rows have a `tests_field` (needs a code prompt)")
    prompt: str = Field("r1_zero", description="default by dataset: r1_zero (gsm8k, arithmetic), code (code "
                        "datasets), reasoning_gym (its tasks), row (your rows, used as they are). math: "
                        "question_only | r1_zero | r1_zero_three_shot | chat; code datasets: code | code_chat; "
                        "reasoning_gym; row (the row's own prompt column: text as it is, a conversation through "
                        "the chat template); or a template file path/to/prompt.txt with {question} or {column} "
                        "placeholders")
    split_seed: int = Field(0, ge=0, description="seed of the train/validation split, kept apart from `seed` so "
                            "that every run of a sweep (and the SFT before it) holds out the same questions")
    question_field: str | None = Field(None, description="file datasets: the question's column (text or a chat "
                                       "conversation); none: the `prompt` column (TRL's name) with prompt=row, "
                                       "else `question` (falling back to `prompt`)")
    answer_field: str = Field("answer", description="file datasets: the answer's column (bare or '#### x'; "
                              "optional when the rewards are your own functions)")
    solution_field: str | None = Field(None, description="JSONL datasets: the worked solution's field (default: "
                                       "math, the text before '####'; code, 'solution'; MBPP: code)")
    tests_field: str = Field("tests", description="code JSONL datasets: the tests' field (assert strings, test code, "
                             "or input/output pairs); a .jsonl whose first row has it is a code dataset")
    entry_point_field: str = Field("entry_point", description="code JSONL datasets: the tested function's name")
    seed: int = 0
    sandbox: SandboxConfig = Field(default_factory=SandboxConfig)
    env: str | None = Field(None, description="a multi-turn environment (rlvr.environments): gsm8k_calculator, "
                            "python_tool, code_feedback, or your own class as path/to/env.py:Class or "
                            "package.module:Class, then optionally :key=value,... for its numbers "
                            "(code_feedback:max_turns=3,max_turn_tokens=160); max_new_tokens is the whole "
                            "episode's budget; rlvr sft trains for it (its SFT targets, the model's tokens)")
    env_cache_mib: int = Field(2048, ge=0, description="env=: memory the engine keeps for the KV of episodes whose "
                               "turn ended at a tool call, so the next turn prefills only the observation (0: "
                               "every turn prefills the episode's whole history again)")

    @property
    def grades_code(self) -> bool:
        """Whether this command runs programs in the sandbox (a code prompt, a code reward term, or an
        environment that runs them: env=python_tool)."""
        rewards = self.rewards or {}
        env = getattr(self, "env", None)
        if env is not None:
            from rlvr.environments import environment_factory

            if environment_factory(env).runs_programs:
                return True
        if getattr(self, "env_class", None) is not None:  # env_class=python: its tool runs programs
            from rlvr.environments.tool_loop import load_env_class

            if getattr(load_env_class(self.env_class), "runs_programs", False):
                return True
        return self.prompt in CODE_PROMPTS or any(str(name).startswith("code_tests") for name in rewards)

    @model_validator(mode="before")
    @classmethod
    def _default_prompt(cls, data):
        """No prompt given: the dataset's own way of asking (a user's rows are used as they are)."""
        if isinstance(data, dict) and data.get("prompt") is None:
            dataset = data.get("dataset", cls.model_fields["dataset"].default)
            from rlvr.tasks.datasets import default_prompt

            data = {**data, "prompt": default_prompt(str(dataset), data.get("tests_field") or "tests")}
        return data

    @model_validator(mode="after")
    def _check_dataset_prompt(self):
        from rlvr.tasks.datasets import is_code_dataset
        from rlvr.tasks.records import DataError  # lazily: configs stay cheap to import

        env_cls = None
        if self.env is not None:
            from rlvr.environments import environment_factory

            env_cls = environment_factory(self.env)  # an unknown name or a file that does not import fails here
        self._check_task()
        if any(str(d).startswith("reasoning_gym:") for d in (self.dataset, self.validation_dataset)) and \
                not self.rewards and self.prompt != "reasoning_gym":
            raise ValueError(f"dataset={self.dataset!r}: reasoning-gym's tasks are graded by their own "
                             f"score_answer, and prompt={self.prompt} grades with a reward of its own: use "
                             "prompt=reasoning_gym, or say what grades them with rewards= (e.g. {reasoning_gym: 1.0})")
        try:
            code = is_code_dataset(self.dataset, self.tests_field)
        except DataError:  # a file not there yet (or unreadable): loading the data reports it
            return self
        if code and self.prompt not in CODE_PROMPTS:
            raise ValueError(f"dataset={self.dataset!r} is a code dataset, graded by running tests; "
                             f"prompt={self.prompt!r} is not a code prompt: use prompt={' or '.join(CODE_PROMPTS)}")
        if env_cls is not None and env_cls.needs_code_dataset and not code:
            raise ValueError(f"env={self.env} runs each row's tests, and dataset={self.dataset!r} is not a code "
                             "dataset (its rows have no tests): use a code dataset (dataset=code:level=3, or a JSONL "
                             "whose rows have tests_field) or another environment")
        if not code and self.prompt in CODE_PROMPTS:
            raise ValueError(f"prompt={self.prompt!r} is a code prompt, but dataset={self.dataset!r} is not a code "
                             f"dataset (code[:level=N], or a .jsonl whose rows have a {self.tests_field!r} field)")
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
    generation_dtype: EngineDtype = Field("bfloat16", description="dtype of the rollout/eval engine's weight copy "
                                          "(float32 on a CPU without native kernels for it); int8: int8 weights, "
                                          "CPU only, needs the rollout correction (rlvr.engines.int8)")
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
        device_field(self.device, "device")
        return self


def check_eval_sampling(cfg):
    if cfg.eval_samples > 1 and cfg.eval_temperature == 0:
        raise ValueError("eval_samples > 1 with eval_temperature 0 gives identical samples; set eval_temperature > 0")


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
    """`rlvr train distributed.*`: Ray roles (rlvr.distributed). rollout_workers=0 and learners=1 is the local loop."""

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


class CurriculumConfig(BaseConfig):
    """`rlvr train curriculum.*`: draw questions by their recent pass rate (rlvr.stages.curriculum): a floor
    share from the all-right and all-wrong pools, a share from the questions that show spread, the rest in the
    run's order without the all-right / all-wrong ones. Each share is k x fraction questions a batch in
    expectation at any batch size k (the fractional part carries to the next batch)."""

    enabled: bool = Field(False, description="draw questions by observed pass rate")
    hard_fraction: float = Field(0.1, ge=0, le=1, description="share of a batch's questions from those every "
                                 "sample in the window got wrong (re-tested: they may become learnable); k x "
                                 "fraction questions a batch in expectation, the fractional part carried over")
    easy_fraction: float = Field(0.1, ge=0, le=1, description="share from those every sample got right")
    signal_fraction: float = Field(0.5, ge=0, le=1, description="share from those with right and wrong samples")
    min_samples: int = Field(4, ge=1, description="samples before a question counts as all right / all wrong")
    window: int = Field(16, ge=1, description="the pools judge a question by its last `window` samples only "
                        "(16: its last two groups of 8), so one the policy learned or forgot moves pool; "
                        ">= min_samples")
    first_pass: int = Field(0, ge=0, description="questions sampled (group_size each, no training) before step 1 "
                            "to seed the statistics (0: none; local loop only)")

    @model_validator(mode="after")
    def _shares(self):
        total = self.hard_fraction + self.easy_fraction + self.signal_fraction
        if total > 1 + 1e-9:
            raise ValueError(f"curriculum fractions add up to {total:g} (hard + easy + signal must be <= 1)")
        if self.window < self.min_samples:
            raise ValueError(f"curriculum.window={self.window} keeps fewer samples than curriculum.min_samples="
                             f"{self.min_samples}: no question could count as all right or all wrong")
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
    (train/mismatch_*) and weights each token's loss by rlvr.algorithms.estimators.rollout_correction_weights."""

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
        from rlvr.algorithms.update import RolloutCorrection

        return RolloutCorrection(self.mode, self.cap, tuple(self.band))

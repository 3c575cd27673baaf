"""One typed, validated config per command: `rlvr eval` (EvalConfig), `sft` (SFTConfig), `train` (TrainConfig),
`dpo` (DPOConfig) and `demo` (DemoConfig), built from the sections of rlvr.config.sections.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from rlvr.config.agents import AgentFields
from rlvr.config.base import BaseConfig, SamplingMismatchWarning
from rlvr.config.sections import (
    DEVICE_HELP,
    SFT_PROMPTS,
    AsyncConfig,
    CurriculumConfig,
    DataFields,
    DistributedConfig,
    EngineDtype,
    PlacementConfig,
    RolloutCorrectionConfig,
    TrainingFields,
    check_eval_sampling,
    device_field,
)
from rlvr.engines.base import SamplingParams  # torch-free: configs stay cheap to import


class EvalConfig(DataFields, AgentFields):
    split: Literal["train", "validation", "test", "all"] = Field(
        "test", description="a dataset's own split, or one held out of a file (a seeded tenth each for validation "
        "and test, never trained on); all: every row (a test file of your own)")
    limit: int | None = Field(None, ge=1, description="first N questions")
    samples: int = Field(1, ge=1, description="completions per question (pass@k for k <= samples)")
    temperature: float | None = Field(None, ge=0, description="default: 0 (greedy) for 1 sample, else 1.0")
    top_p: float = Field(1.0, gt=0, le=1)
    max_new_tokens: int = Field(512, ge=1)
    repetition_penalty: float = Field(1.0, gt=0)
    batch_size: int = Field(64, ge=1, description="rows decoded together")
    dtype: EngineDtype = Field("float32", description="generation dtype (bfloat16 is about 2x faster on a CPU with "
                               "AVX512-BF16 or AMX; one without native kernels runs float32; int8: int8 weights, "
                               "CPU only)")
    device: str = Field("auto", description=DEVICE_HELP)
    out: str | None = Field(None, description="output directory (default runs/eval/<model>-<prompt>-<split>)")
    resume: bool = Field(False, description="continue the interrupted evaluation in `out`: the questions already "
                         "in its results.partial.jsonl are not generated again")
    examples_per_category: int = Field(2, ge=0, description="example responses printed per category")

    @model_validator(mode="after")
    def _defaults(self):
        device_field(self.device, "device")
        if self.temperature is None:
            object.__setattr__(self, "temperature", 0.0 if self.samples == 1 else 1.0)
        if self.samples > 1 and self.temperature == 0:
            raise ValueError("samples > 1 with temperature 0 gives identical samples; set temperature > 0")
        return self


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
        check_eval_sampling(self)
        if self.batch_size % self.microbatch_size:
            raise ValueError(f"batch_size={self.batch_size} is not a multiple of microbatch_size={self.microbatch_size}")
        from rlvr.tasks.prompts import PROMPTS

        user_prompt = self.prompt not in PROMPTS and self.prompt != "reasoning_gym"  # row, a template file
        if self.prompt not in SFT_PROMPTS and not (user_prompt and self.solution_field):
            raise ValueError(f"prompt={self.prompt!r} has no SFT target; SFT takes prompt=r1_zero or "
                             "r1_zero_three_shot (math datasets), code or code_chat (code datasets), or a prompt of "
                             "your own (row, a template file) with solution_field naming the rows' target column")
        return self


class TrainConfig(TrainingFields, AgentFields):
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
    # the estimator (rlvr.algorithms.spec.EstimatorSpec): None takes the algorithm's value; checked by the spec
    baseline: str | None = Field(None, description="mean | none")
    advantage_normalizer: str | None = Field(None, description="std | mean | none")
    advantage: str | None = Field(None, description="advantage function: group (seed 004) or a registered one")
    advantage_eps: float | None = Field(None, ge=0)
    importance_reweighting_method: str | None = Field(
        None, description="none | noclip | grpo | gspo (seed 004's names) | clip (rlvr's name of grpo) | cispo, or a "
        "registered policy loss")
    cliprange: float | None = Field(None, ge=0)
    cliprange_high: float | None = Field(None, ge=0)
    loss_normalization: str | None = Field(None, description="sequence | sum | constant | token")
    normalization_constant: float | None = Field(None, gt=0, description="constant aggregation's Z (default train batch x max_new_tokens)")
    beta: float | None = Field(None, ge=0, description="KL penalty weight (needs a reference model)")
    kl_estimator: str | None = Field(None, description="k1 | k2 | k3 (k2: the only one whose gradient is the KL's)")
    entropy_coef: float | None = Field(None, ge=0, description="entropy bonus: the loss subtracts entropy_coef x the "
                                       "token entropy, aggregated as the policy-gradient loss (0: off)")
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
    overlong_buffer: int | None = Field(None, ge=1, description="rewards' overlong term: the last N tokens before "
                                        "max_new_tokens (env=: the model's ids before the episode's budget), over "
                                        "which the penalty falls from 0 to -1")
    # logging
    log_rollouts_every: int = Field(5, ge=0, description="append the batch's rollouts to rollouts.jsonl every N steps")
    learning_rate: float = Field(1e-5, gt=0)
    dynamic_sampling: bool = Field(False, description="DAPO: drop groups without signal (dynamic_sampling_signal) "
                                   "and sample new questions in their place (up to dynamic_sampling_rounds "
                                   "generations per step)")
    dynamic_sampling_rounds: int = Field(4, ge=1, description="most generations per step with dynamic_sampling")
    dynamic_sampling_signal: Literal["answer", "reward"] = Field(
        "answer", description="what dynamic sampling judges a group by: answer (its correctness, answer_reward, as "
        "DAPO and verl filter on accuracy) or reward (the shaped reward, format and overlong terms included); a "
        "group is kept when the run's estimator gives it a nonzero advantage on that signal (a mean baseline: the "
        "signal varies within the group). Estimators of correctness (rft, maxrl) always judge by the answer")
    # verl's DAPO recipe calls this gen_batch_size: oversampling the first round fills the batch in fewer, fuller
    # generation batches when most groups have no spread (GSM8K: about 3 in 10 have one at G = 16)
    dynamic_sampling_questions: int | None = Field(None, ge=1, description="questions generated in dynamic "
                                                   "sampling's first round (default: the batch's groups, "
                                                   "rollout_batch_size / group_size); groups beyond a full batch "
                                                   "are dropped")
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async")
    rollout_correction: RolloutCorrectionConfig = Field(default_factory=RolloutCorrectionConfig)
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig)

    model_config = ConfigDict(extra="forbid", validate_assignment=True, populate_by_name=True)

    @model_validator(mode="after")
    def _resolve_preset(self):
        from rlvr.algorithms.spec import CHOICES, get_preset

        check_eval_sampling(self)
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
        overlong = "overlong" in (self.rewards or {})
        if overlong and self.overlong_buffer is None:
            raise ValueError("rewards has an overlong term: set overlong_buffer (tokens before max_new_tokens over "
                             "which the penalty falls to -1)")
        if self.overlong_buffer is not None and not overlong:
            raise ValueError("overlong_buffer shapes the rewards' overlong term: add `overlong: 1.0` to rewards "
                             "(with the reward it shapes, e.g. rewards={r1_zero: 1.0, overlong: 1.0}), or remove it")
        budget, budget_name = self.max_new_tokens, "max_new_tokens"
        if overlong and self.env is not None:  # an episode's penalty counts against its budget
            from rlvr.environments import environment_factory

            budget = environment_factory(self.env).episode_budget(self.max_new_tokens)
            budget_name = "the episode's budget (the environment's max_total_tokens, else max_new_tokens)"
        if overlong and self.overlong_buffer > budget:
            raise ValueError(f"overlong_buffer={self.overlong_buffer} is longer than {budget_name}={budget}")
        if overlong and set(self.rewards) == {"overlong"}:
            raise ValueError("rewards={overlong: ...} alone has no reward to shape: add one, e.g. r1_zero: 1.0")
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
        if self.async_.max_staleness and self.distributed.weight_sync == "broadcast":
            # an actor runs its calls in order: a worker joins the collective only after the batches queued on it,
            # and learner 0 and the other workers wait inside it until then (docs/cluster.md, "Weights")
            raise ValueError(f"async.max_staleness={self.async_.max_staleness} with distributed.weight_sync=broadcast "
                             "does not overlap: each worker joins the weight broadcast only after the batches queued "
                             "on it, and learner 0 and the idle workers wait inside the broadcast until then; use "
                             "distributed.weight_sync=object_store (the learner's put returns at once, each worker "
                             "reads the weights when it is free), or async.max_staleness=0")
        if self.dynamic_sampling_questions is not None:
            if not self.dynamic_sampling:
                raise ValueError("dynamic_sampling_questions sizes dynamic sampling's first round: set "
                                 "dynamic_sampling=true or remove it")
            if self.dynamic_sampling_questions < self.rollout_batch_size // self.group_size:
                raise ValueError(f"dynamic_sampling_questions={self.dynamic_sampling_questions} is fewer than the "
                                 f"batch's {self.rollout_batch_size // self.group_size} groups "
                                 f"(rollout_batch_size / group_size)")
        if self.dynamic_sampling and self.advantage == "none":
            raise ValueError(f"dynamic_sampling with algorithm={self.algorithm} (advantage=none): dynamic sampling "
                             "keeps the groups the estimator gives a nonzero reward advantage, and this one gives "
                             "none, so it would keep nothing and generate dynamic_sampling_rounds batches a step; "
                             "set dynamic_sampling=false, or use an estimator with a reward advantage (opd_grpo)")
        if self.generation_dtype == "int8":
            if self.rollout_correction.mode == "none":
                raise ValueError("generation_dtype=int8 samples from int8 weights, not the policy's: it needs the "
                                 "rollout correction (rollout_correction.mode=token_tis, the default, or another "
                                 "mode than none)")
            if self.distributed.enabled:
                raise ValueError("generation_dtype=int8 runs in the local loop only for now (Ray's rollout workers "
                                 "hold float32 or bf16 weights); use generation_dtype=float32 or bfloat16")
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
        if self.distributed.enabled and self.curriculum.first_pass:
            raise ValueError("curriculum.first_pass runs in the local loop only (the driver has no engine); the "
                             "curriculum itself works in distributed mode: set curriculum.first_pass=0")
        if self.env is not None:
            if self.distributed.enabled:
                raise ValueError(f"env={self.env}: multi-turn environments run in the local loop only (the rollout "
                                 "workers generate single turns); set distributed.rollout_workers=0 "
                                 "distributed.learners=1")
            if self.distill:
                raise ValueError(f"env={self.env} with distill > 0: the teacher would score observation tokens; "
                                 "on-policy distillation runs single-turn only")
        if self.distributed.enabled and self.distill:
            raise ValueError("on-policy distillation (distill > 0) runs in the local loop only; set "
                             "distributed.rollout_workers=0 distributed.learners=1")
        if self.agentic:
            self._check_agent_run()
        altered = [f"{name}={getattr(self, name)}" for name, neutral in
                   (("top_p", 1.0), ("repetition_penalty", 1.0), ("min_new_tokens", 0)) if getattr(self, name) != neutral]
        if altered:
            # the learner scores softmax(logits / temperature); these reshape what the sampler drew from
            warnings.warn(f"{', '.join(altered)}: rollouts are not sampled from the distribution the policy "
                          "gradient and importance ratios are scored under (softmax(logits / temperature))",
                          SamplingMismatchWarning, stacklevel=2)
        return self

    def _check_agent_run(self) -> None:
        """What runs with agent= / env_class=, and what is refused naming the option (docs/agents.md)."""
        what = self._agent_field()
        if self.distributed.enabled:
            raise ValueError(f"{what}: agents run beside the local loop's rollout engine (its server is started in "
                             "this process); Ray roles (distributed.rollout_workers, distributed.learners, and so "
                             "async.max_staleness) are not supported for them yet: set distributed.rollout_workers=0 "
                             "distributed.learners=1")
        if self.distill:
            raise ValueError(f"{what} with distill > 0: the teacher would score the template's and the tools' "
                             "ids between turns; on-policy distillation runs single-turn only")

    @property
    def train_batch_size(self) -> int:
        return self.rollout_batch_size // (self.steps_per_rollout or 1)

    @property
    def estimator(self):
        """The resolved EstimatorSpec, what the update step receives."""
        from rlvr.algorithms.spec import CHOICES, get_preset

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
        check_eval_sampling(self)
        if self.pairs != "rollouts" and not self.pairs.endswith(".jsonl"):
            raise ValueError(f"pairs={self.pairs!r}: expected 'rollouts' or a .jsonl path")
        if self.env is not None:
            raise ValueError(f"env={self.env}: rlvr dpo builds its pairs from single-turn rollouts; remove env")
        return self


class DemoConfig(BaseConfig):
    """`rlvr demo`: the prompting baseline on GSM8K, then on `dataset`: baseline eval -> SFT -> GRPO -> eval ->
    before/after table with 95 % intervals. The default task is the generated arithmetic one, where a 135M
    model learns within the demo's 10 minutes (on GSM8K it does not: docs/experiment_log.md)."""

    model: str = "SmolLM2-135M-Instruct"
    dataset: str = "arithmetic"
    out: str = "runs/demo"
    seed: int = 0
    baseline_dataset: str | None = Field("gsm8k", description="a prompting-only baseline shown first (None: skip)")
    baseline_limit: int = Field(10, ge=1, description="questions of the prompting-only baseline (it scores 0 of "
                                "50 and of 200: more questions show nothing more)")
    baseline_max_new_tokens: int = Field(96, ge=1, description="new tokens of the prompting-only baseline (its "
                                         "decode steps are most of its time; the untrained model wrote the format "
                                         "in 0 of 10 answers at 96 and at 256, 0 of 200 at 512)")
    eval_limit: int = Field(1000, ge=1, description="test questions the SFT and GRPO models are evaluated on (the "
                            "same ones: their difference is paired). 1000 is arithmetic's whole test split: the "
                            "gain GRPO reaches here (4-8 points) was resolved by 300 in some runs only (+-5 points); "
                            "by 1000 it was +-2.7 to +-3.2, resolved in 3 of 3")
    untrained_eval_limit: int | None = Field(20, ge=1, description="of those, the first N for the untrained "
                                             "model (it never writes the answer format; None: all eval_limit)")
    eval_max_new_tokens: int = Field(96, ge=1)
    sft_steps: int = Field(20, ge=1, description="SFT steps (its loss levels off by about step 10; 15 steps gave "
                           "0.597 on the test questions where 30 gave 0.630-0.653)")
    sft_batch_size: int = Field(16, ge=1)
    sft_learning_rate: float = Field(1e-4, gt=0)
    grpo_steps: int = Field(20, ge=1)
    grpo_algorithm: str = "grpo"
    grpo_learning_rate: float = Field(1e-5, gt=0)
    grpo_eval_every: int = Field(10, ge=0, description="validate the GRPO policy every N steps, from step 0 (the "
                                 "figure's curve; 0: never)")
    grpo_eval_limit: int = Field(100, ge=1, description="validation questions of those checks (not the test ones)")
    rollout_batch_size: int = Field(64, ge=1)
    group_size: int = Field(8, ge=1)
    max_new_tokens: int = Field(96, ge=1)


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

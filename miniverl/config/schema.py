"""The config file format: pydantic models with ``extra="forbid"``, one class per YAML section.

Relative paths in a config are resolved against the working directory of ``plan``/``run``. The sections live
by job in :mod:`miniverl.config.sections`, :mod:`miniverl.config.model_specs` and
:mod:`miniverl.config.algorithm_sections` (on :mod:`miniverl.config.fields`); this module assembles them into
:class:`MiniverlConfig` with the rules that span sections, and re-exports every name for its importers.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from miniverl.config.algorithm_sections import (
    AlgorithmSection,
    DistillSection,
    GrpoSection,
    OfflineSection,
    PpoSection,
    RewardTerm,
)
from miniverl.config.fields import (
    BUILTIN_MODELS,
    IMMUTABLE_REVISION,
    MAX_NEW_TOKENS,
    OFFLINE_ALGORITHMS,
    REWARD_MODEL_TERM,
    SHA256_HEX,
    KlEstimator,
    KlMode,
    Seed,
    Strict,
)
from miniverl.config.model_specs import (
    AdapterSpec,
    LoraConfig,
    ModelSpec,
    ModelsSection,
    PrivilegedContext,
    RewardModelSpec,
    TinyClassifier,
)
from miniverl.config.sections import (
    CheckpointSection,
    DataSection,
    DatasetColumn,
    MemorySection,
    RolloutSection,
    RunSection,
    TrainSection,
)

__all__ = [
    "BUILTIN_MODELS",
    "IMMUTABLE_REVISION",
    "MAX_NEW_TOKENS",
    "OFFLINE_ALGORITHMS",
    "REWARD_MODEL_TERM",
    "SHA256_HEX",
    "AdapterSpec",
    "AlgorithmSection",
    "CheckpointSection",
    "DataSection",
    "DatasetColumn",
    "DistillSection",
    "GrpoSection",
    "KlEstimator",
    "KlMode",
    "LoraConfig",
    "MemorySection",
    "MiniverlConfig",
    "ModelSpec",
    "ModelsSection",
    "OfflineSection",
    "PpoSection",
    "PrivilegedContext",
    "RewardModelSpec",
    "RewardTerm",
    "RolloutSection",
    "RunSection",
    "Seed",
    "Strict",
    "TinyClassifier",
    "TrainSection",
]


class MiniverlConfig(Strict):
    run: RunSection = Field(default_factory=RunSection, description="the run's name, seed and determinism")
    models: ModelsSection = Field(
        description="every role's model (where its weights come from) and the runtime, device and dtype they share",
    )
    data: DataSection = Field(description="the training prompts, and held-out ones for evaluation")
    rollout: RolloutSection = Field(
        default_factory=RolloutSection,
        description="how the student samples each cycle's responses (sft and kd: how many dataset rows a cycle takes)",
    )
    algorithm: AlgorithmSection = Field(
        default_factory=AlgorithmSection,
        description="which algorithm trains, its rewards and each algorithm's own settings",
    )
    train: TrainSection = Field(
        default_factory=TrainSection,
        description="the number of cycles, the optimizer, and the micro-batching and memory trade-offs of an update",
    )
    checkpoint: CheckpointSection = Field(
        default_factory=CheckpointSection, description="how often checkpoints are written and how many are kept"
    )
    memory: MemorySection = Field(
        default_factory=MemorySection, description="where frozen models live, and the hard peak-memory limit"
    )

    @property
    def trajectories_per_cycle(self) -> int:
        if self.algorithm.name in OFFLINE_ALGORITHMS:
            return self.rollout.prompts_per_cycle  # one oracle trajectory per row
        return self.rollout.prompts_per_cycle * self.rollout.samples_per_prompt

    @model_validator(mode="after")
    def _consistent(self) -> MiniverlConfig:
        per_cycle = self.trajectories_per_cycle
        if self.algorithm.name == "ppo":
            _check_ppo(self)
        elif self.algorithm.name == "grpo":
            _check_grpo_mini_batches(self)
        elif self.train.gradient_accumulation_steps is None:
            self.train.gradient_accumulation_steps = per_cycle
        elif self.train.gradient_accumulation_steps != per_cycle:
            if self.algorithm.name in OFFLINE_ALGORITHMS:
                raise ValueError(
                    f"train.gradient_accumulation_steps must equal rollout.prompts_per_cycle ({per_cycle}): "
                    f"{self.algorithm.name} makes one update per cycle from that many dataset rows"
                )
            raise ValueError(
                "train.gradient_accumulation_steps must equal rollout.prompts_per_cycle x "
                f"rollout.samples_per_prompt ({per_cycle}): strict on-policy training makes one "
                "optimizer update per cycle from that cycle's fresh trajectories"
            )
        if self.train.adapter_precision == "bf16_master" and self.models.dtype != "bfloat16":
            raise ValueError(
                f"train.adapter_precision bf16_master needs models.dtype bfloat16 (it is {self.models.dtype}); "
                "set models.dtype: bfloat16 or train.adapter_precision: fp32"
            )
        if self.algorithm.name in ("opd", "kd") and self.models.teacher is None:
            raise ValueError(f"algorithm {self.algorithm.name} needs models.teacher")
        if self.algorithm.name == "kd" and "divergence" not in self.algorithm.distill.model_fields_set:
            self.algorithm.distill.divergence = "forward_kl"  # classic KD: KL(teacher || student)
        if self.algorithm.offline.teacher_cache is not None and self.algorithm.name != "kd":
            raise ValueError("algorithm.offline.teacher_cache is for algorithm kd")
        if self.algorithm.name == "grpo" and self.algorithm.grpo.kl_coef > 0 and self.models.reference is None:
            raise ValueError("algorithm.grpo.kl_coef > 0 needs models.reference")
        uses_rm = any(t.name == REWARD_MODEL_TERM for t in self.algorithm.rewards)
        if uses_rm and self.models.reward is None:
            raise ValueError(f"algorithm.rewards names {REWARD_MODEL_TERM!r} but models.reward is not configured")
        if self.models.reward is not None and not uses_rm:
            raise ValueError(
                f"models.reward is configured but unused: add {{name: {REWARD_MODEL_TERM}, weight: ...}} "
                "to algorithm.rewards"
            )
        if self.algorithm.name != "ppo" and self.models.critic is not None:
            raise ValueError(f"models.critic is PPO's role; algorithm {self.algorithm.name} does not use it")
        if self.memory.placement == "swap" and self.models.runtime == "dual_model":
            for role in ("teacher", "reference"):
                spec = getattr(self.models, role)
                if spec is not None and spec.quantization != "none":
                    raise ValueError(
                        f"memory.placement swap is refused for the quantized models.{role}: bitsandbytes "
                        "parameters cannot be moved between devices safely; use placement resident"
                    )
        if self.models.runtime == "shared_backbone":
            _check_shared_backbone(self.models, self.memory, needs_teacher=self.algorithm.name in ("opd", "kd"))
        return self


def _check_grpo_mini_batches(config: MiniverlConfig) -> None:
    grpo, prompts = config.algorithm.grpo, config.rollout.prompts_per_cycle
    if prompts % grpo.mini_batches:
        raise ValueError(
            f"algorithm.grpo.mini_batches ({grpo.mini_batches}) must divide rollout.prompts_per_cycle ({prompts}): "
            "a GRPO mini-batch is whole prompt groups (verl's ppo_mini_batch_size counts prompts)"
        )
    per_mini = config.trajectories_per_cycle // grpo.mini_batches
    if config.train.gradient_accumulation_steps is None:
        config.train.gradient_accumulation_steps = per_mini
    elif config.train.gradient_accumulation_steps != per_mini:
        raise ValueError(
            f"train.gradient_accumulation_steps must equal the trajectories of one GRPO mini-batch ({per_mini} = "
            f"rollout.prompts_per_cycle x rollout.samples_per_prompt / algorithm.grpo.mini_batches "
            f"{grpo.mini_batches}): each mini-batch is one optimizer step on fresh trajectories"
        )


def _check_ppo(config: MiniverlConfig) -> None:
    ppo = config.algorithm.ppo
    per_cycle = config.trajectories_per_cycle
    if per_cycle % ppo.mini_batches:
        raise ValueError(
            f"algorithm.ppo.mini_batches ({ppo.mini_batches}) must divide the trajectories per cycle "
            f"({per_cycle} = rollout.prompts_per_cycle x rollout.samples_per_prompt)"
        )
    per_mini = per_cycle // ppo.mini_batches
    if config.train.gradient_accumulation_steps is None:
        config.train.gradient_accumulation_steps = per_mini
    elif config.train.gradient_accumulation_steps != per_mini:
        raise ValueError(
            f"train.gradient_accumulation_steps must equal the trajectories of one PPO mini-batch ({per_mini} = "
            f"{per_cycle} per cycle / algorithm.ppo.mini_batches {ppo.mini_batches})"
        )
    if per_cycle % ppo.critic_mini_batch_count:
        raise ValueError(
            f"algorithm.ppo.critic_mini_batches ({ppo.critic_mini_batch_count}) must divide the trajectories per "
            f"cycle ({per_cycle} = rollout.prompts_per_cycle x rollout.samples_per_prompt)"
        )
    if ppo.kl_coef > 0 and config.models.reference is None:
        raise ValueError("algorithm.ppo.kl_coef > 0 needs models.reference")
    if config.models.critic is None:
        lora = config.models.student.lora
        config.models.critic = ModelSpec(source="student", lora=lora.model_copy() if lora is not None else None)
    if config.models.runtime == "shared_backbone" and config.models.critic.source != "student":
        raise ValueError("runtime shared_backbone: models.critic must be source 'student' (an adapter on the base)")


def _check_shared_backbone(models: ModelsSection, memory: MemorySection, *, needs_teacher: bool) -> None:
    student = models.student
    for role in ("teacher", "reference"):
        spec: ModelSpec | None = getattr(models, role)
        if spec is None:
            if role == "teacher" and needs_teacher:
                raise ValueError("runtime shared_backbone needs models.teacher with a pinned adapter")
            continue
        if spec.adapter is None:
            if role == "reference" and spec.source == "student" and spec.privileged_context is None:
                continue  # the frozen base itself: every adapter disabled while the reference runs
            raise ValueError(f"runtime shared_backbone: models.{role} needs a pinned adapter")
        if spec.adapter.source == "local" and spec.adapter.sha256 is None:
            raise ValueError(f"runtime shared_backbone: models.{role}.adapter (local) needs sha256")
        same_base = spec.source == "student" or (
            (spec.source, spec.model_id, spec.revision, spec.path)
            == (student.source, student.model_id, student.revision, student.path)
        )
        if not same_base:
            raise ValueError(f"runtime shared_backbone: models.{role} must use the student's base model")
        if spec.quantization != student.quantization:
            raise ValueError(f"runtime shared_backbone: models.{role} quantization must equal the student's")
        if spec.privileged_context is not None:
            raise ValueError("runtime shared_backbone: teacher roles are adapters, not privileged_context")
    if memory.placement == "swap" and student.quantization != "none":
        raise ValueError(
            "memory.placement swap is refused for a quantized shared backbone: bitsandbytes "
            "parameters cannot be moved between devices safely; use placement resident"
        )
    if memory.placement == "swap":
        raise ValueError(
            "memory.placement swap is refused for a shared backbone: it is one resident model with "
            "nothing to swap; use placement resident (or runtime dual_model)"
        )

"""The config file format: pydantic models with ``extra="forbid"``, one class per YAML section.

Relative paths in a config are resolved against the working directory of ``plan``/``run``.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

IMMUTABLE_REVISION = re.compile(r"^[0-9a-f]{40}$")
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
BUILTIN_MODELS = ("smollm2-135m-instruct",)
KlEstimator = Literal["k1", "k2", "k3", "low_var_kl"]
KlMode = Literal["loss", "reward"]
REWARD_MODEL_TERM = "reward_model"
OFFLINE_ALGORITHMS = ("sft", "kd")
#: Upper bound on rollout.max_new_tokens whatever the model (the plan also checks it against the student's context).
MAX_NEW_TOKENS = 131_072


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


#: A seed fits torch's generator (a 64-bit seed): a larger one would fail only after the model loads.
Seed = Annotated[int, Field(ge=0, le=2**63 - 1)]


class RunSection(Strict):
    name: str = "miniverl-run"
    seed: Seed = 0
    deterministic: bool = False


class LoraConfig(Strict):
    enabled: bool = True
    r: Annotated[int, Field(ge=1)] = 16
    alpha: Annotated[float, Field(gt=0)] = 32
    dropout: Annotated[float, Field(ge=0, lt=1)] = 0.0
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class AdapterSpec(Strict):
    """A frozen PEFT adapter: hub (``path`` = repo id, 40-hex ``revision``) or a local directory.

    A local adapter is pinned by ``sha256`` of its ``adapter_model.safetensors``.
    """

    source: Literal["hub", "local"]
    path: str
    revision: str | None = None
    sha256: str | None = None
    allow_mutable_revision: bool = False

    @model_validator(mode="after")
    def _pinned(self) -> AdapterSpec:
        if self.source == "hub":
            _require_immutable(self.revision, self.allow_mutable_revision, what=f"adapter {self.path}")
        if self.sha256 is not None and not SHA256_HEX.match(self.sha256):
            raise ValueError("adapter sha256 must be 64 lowercase hex characters")
        return self


class PrivilegedContext(Strict):
    """The teacher is the frozen base that also sees a data column (e.g. the worked answer)."""

    column: str = "context"
    template: str = "{context}\n\n{prompt}"

    @model_validator(mode="after")
    def _placeholders(self) -> PrivilegedContext:
        if "{prompt}" not in self.template or "{context}" not in self.template:
            raise ValueError("privileged_context.template must contain {prompt} and {context}")
        return self


class ModelSpec(Strict):
    """Where a model's weights come from.

    - ``hub``: ``model_id`` + 40-hex ``revision`` (a branch or tag needs ``allow_mutable_revision``)
    - ``local``: ``path`` to a Hugging Face model directory
    - ``gguf``: ``path`` to a ``.gguf`` file (dequantized on load)
    - ``builtin``: ``model_id`` names an embedded model (``smollm2-135m-instruct``)
    - ``student``: the student's own base (teachers/references only)
    """

    source: Literal["hub", "local", "gguf", "builtin", "student"] = "hub"
    model_id: str | None = None
    revision: str | None = None
    path: str | None = None
    allow_mutable_revision: bool = False
    quantization: Literal["none", "nf4"] = "none"
    lora: LoraConfig | None = None
    adapter: AdapterSpec | None = None
    privileged_context: PrivilegedContext | None = None

    @model_validator(mode="after")
    def _source_fields(self) -> ModelSpec:
        if self.source == "hub":
            if not self.model_id:
                raise ValueError("source hub needs model_id")
            _require_immutable(self.revision, self.allow_mutable_revision, what=f"model {self.model_id}")
        elif self.source in ("local", "gguf"):
            if not self.path:
                raise ValueError(f"source {self.source} needs path")
        elif self.source == "builtin" and self.model_id not in BUILTIN_MODELS:
            raise ValueError(f"builtin model_id must be one of {', '.join(BUILTIN_MODELS)}")
        return self


class TinyClassifier(Strict):
    """A small Llama sequence classifier built from this config with a seeded init (tests, smoke runs).

    It uses the student's tokenizer (vocabulary size and pad token); weights depend only on these
    fields, so the plan pins it by their digest.
    """

    hidden_size: Annotated[int, Field(ge=8)] = 32
    num_hidden_layers: Annotated[int, Field(ge=1)] = 2
    num_attention_heads: Annotated[int, Field(ge=1)] = 4
    intermediate_size: Annotated[int, Field(ge=8)] = 64
    seed: Seed = 0


class RewardModelSpec(Strict):
    """The reward-model role: an ``AutoModelForSequenceClassification`` scoring ``template`` texts.

    - ``hub``: ``model_id`` + 40-hex ``revision``; ``local``: ``path`` to a model directory (with its
      tokenizer); ``tiny``: built from ``tiny`` with a seeded init on the student's tokenizer.
    - The score is the logit at ``label`` (one scalar per trajectory), scored in batches of
      ``batch_size`` in trajectory order (deterministic: same input, same score on CPU).
    - Mixed with rule rewards by the weight of the ``reward_model`` entry in ``algorithm.rewards``.
    - ``placement: offload`` keeps it on the CPU and moves it to the device only for its scoring
      phase; ``resident`` keeps it on the device.
    """

    source: Literal["hub", "local", "tiny"] = "tiny"
    model_id: str | None = None
    revision: str | None = None
    path: str | None = None
    allow_mutable_revision: bool = False
    tiny: TinyClassifier | None = None
    placement: Literal["resident", "offload"] = "resident"
    batch_size: Annotated[int, Field(ge=1)] = 8
    max_length: Annotated[int, Field(ge=8)] = 512
    label: Annotated[int, Field(ge=0)] = 0
    template: str = "{prompt}\n{response}"

    @model_validator(mode="after")
    def _source_fields(self) -> RewardModelSpec:
        if self.source == "hub":
            if not self.model_id:
                raise ValueError("models.reward source hub needs model_id")
            _require_immutable(self.revision, self.allow_mutable_revision, what=f"reward model {self.model_id}")
        elif self.source == "local" and not self.path:
            raise ValueError("models.reward source local needs path")
        elif self.source == "tiny" and self.tiny is None:
            self.tiny = TinyClassifier()
        if "{response}" not in self.template:
            raise ValueError("models.reward.template must contain {response}")
        return self


class ModelsSection(Strict):
    backend: Literal["hf"] = "hf"
    runtime: Literal["dual_model", "shared_backbone"] = "dual_model"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    attn_implementation: Literal["eager", "sdpa"] = "sdpa"  # the equivalence gate pins eager
    student: ModelSpec
    teacher: ModelSpec | None = None
    reference: ModelSpec | None = None
    reward: RewardModelSpec | None = None
    critic: ModelSpec | None = Field(
        default=None,
        description=(
            "PPO's value model: a trainable LoRA plus a scalar value head. dual_model: a separate model "
            "(any source; 'student' = a copy of the student's base). shared_backbone: a second adapter "
            "on the shared base (source must be 'student'). Defaults to source 'student' for PPO."
        ),
    )

    @model_validator(mode="after")
    def _roles(self) -> ModelsSection:
        if self.student.source == "student":
            raise ValueError("models.student cannot have source 'student'")
        if self.student.adapter is not None or self.student.privileged_context is not None:
            raise ValueError("models.student takes lora, not adapter or privileged_context")
        if self.student.lora is None:
            self.student.lora = LoraConfig()
        if self.critic is not None:
            if self.critic.adapter is not None or self.critic.privileged_context is not None:
                raise ValueError("models.critic is trained: it takes lora, not adapter or privileged_context")
            if self.critic.lora is None:
                self.critic.lora = self.student.lora.model_copy()
        for role in ("teacher", "reference"):
            spec: ModelSpec | None = getattr(self, role)
            if spec is not None and spec.lora is not None:
                raise ValueError(f"models.{role} is frozen: it takes adapter, not lora")
        if self.reference is not None and self.reference.privileged_context is not None:
            raise ValueError("models.reference cannot use privileged_context")
        return self


DatasetColumn = Literal["prompt_id", "prompt", "answer", "context", "task"]


class DataSection(Strict):
    path: str = Field(description="the training prompts: a .parquet, .jsonl or .csv file")
    shuffle: bool = True
    #: held-out prompts for ``algorithm.eval_every`` (greedy, the run's rewards; never trained on)
    eval_path: str | None = None
    columns: dict[DatasetColumn, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict,
        description="which file column holds each dataset field, e.g. {prompt: question, answer: solution} "
        "(applies to data.path and data.eval_path; an unmapped field is read from the column of its own name)",
    )


class RolloutSection(Strict):
    backend: Literal["hf", "vllm"] = Field(
        default="hf",
        description="who samples: 'hf' (the training model, in process; its log-probs are the trainer's) or "
        "'vllm' (another engine, whose log-probs a policy-gradient update may use only after the trainer "
        "recomputes old_logp; refused where vllm is not installed)",
    )
    prompts_per_cycle: Annotated[int, Field(ge=1)] = 2
    samples_per_prompt: Annotated[int, Field(ge=1)] = 4
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] = 32
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    batch_size: Annotated[int, Field(ge=1)] = 8
    use_chat_template: bool = True
    engine: Literal["auto", "fast", "hf"] = Field(
        default="auto",
        description="the rollout generator: 'fast' (folded bf16 policy copy, static KV cache, CUDA graphs on CUDA), "
        "'hf' (the transformers decode loop), 'auto' (fast when it supports the model, else hf)",
    )


class RewardTerm(Strict):
    name: str
    weight: float = 1.0
    params: dict[str, float | int | str | bool] = Field(default_factory=dict)


class GrpoSection(Strict):
    """GRPO's loss and its passes over one rollout (verl's ``ppo_epochs`` and ``ppo_mini_batch_size``).

    ``ppo_epochs`` passes over the cycle's trajectories, each split into ``mini_batches`` mini-batches of
    whole prompt groups (verl's ``train_batch_size / ppo_mini_batch_size``), one optimizer step each; the
    old log-probs are computed once before the first pass, so later steps see a ratio != 1 and the clip
    acts. ``train.gradient_accumulation_steps`` is the trajectories of one mini-batch.
    """

    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    mini_batches: Annotated[int, Field(ge=1)] = 1
    shuffle_mini_batches: bool = True
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    norm_by_std: bool = True
    eps: Annotated[float, Field(gt=0)] = 1e-6
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: KlEstimator = "k3"
    kl_mode: KlMode = Field(
        default="loss",
        description="'loss': kl_coef x KL token mean added to the loss; 'reward': kl_coef x summed KL "
        "subtracted from each trajectory's score before the group advantages",
    )


class PpoSection(Strict):
    """PPO with a critic (token-level values, GAE, clipped policy and value losses).

    Like GRPO's ``ppo_epochs``/``mini_batches`` (and unlike OPD), PPO reuses one rollout for
    ``ppo_epochs x mini_batches`` actor updates: the one-update-per-cycle on-policy rule does not apply
    (the importance ratio against the rollout policy and its clip keep those updates proximal).
    ``train.gradient_accumulation_steps`` is the trajectories of one mini-batch. The critic makes its own
    ``critic_ppo_epochs x critic_mini_batches`` steps (``None``: the actor's values, as verl defaults them).
    """

    gamma: Annotated[float, Field(ge=0, le=1)] = 1.0
    lam: Annotated[float, Field(ge=0, le=1)] = 0.95
    ppo_epochs: Annotated[int, Field(ge=1)] = 1
    mini_batches: Annotated[int, Field(ge=1)] = 1
    clip_low: Annotated[float, Field(ge=0, lt=1)] = 0.2
    clip_high: Annotated[float, Field(ge=0)] = 0.2
    value_clip: Annotated[float, Field(gt=0)] = 0.5
    whiten_advantages: bool = True
    shuffle_mini_batches: bool = True
    critic_ppo_epochs: Annotated[int, Field(ge=1)] | None = None
    critic_mini_batches: Annotated[int, Field(ge=1)] | None = None
    critic_learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    critic_max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    critic_head_seed: Seed = 0
    kl_coef: Annotated[float, Field(ge=0)] = 0.0
    kl_estimator: KlEstimator = "k1"
    kl_mode: KlMode = Field(
        default="reward",
        description="'reward': kl_coef x per-token KL subtracted from the token rewards before GAE; "
        "'loss': kl_coef x KL token mean added to the actor loss",
    )

    @property
    def critic_epoch_count(self) -> int:
        """The critic's passes per cycle: ``critic_ppo_epochs``, or the actor's ``ppo_epochs``."""
        return self.ppo_epochs if self.critic_ppo_epochs is None else self.critic_ppo_epochs

    @property
    def critic_mini_batch_count(self) -> int:
        """The critic's mini-batches per pass: ``critic_mini_batches``, or the actor's ``mini_batches``."""
        return self.mini_batches if self.critic_mini_batches is None else self.critic_mini_batches


class DistillSection(Strict):
    objective: Literal["exact", "topk_tail"] = "exact"
    divergence: Literal["reverse_kl", "forward_kl", "jsd"] = "reverse_kl"
    top_k: Annotated[int, Field(ge=1)] = 32
    beta: Annotated[float, Field(gt=0, lt=1)] = 0.5
    temperature: Annotated[float, Field(gt=0)] = 1.0


class OfflineSection(Strict):
    """SFT and offline KD: no rollout. Each update takes ``rollout.prompts_per_cycle`` dataset rows; a
    row's oracle trajectory is its prompt (rendered as for rollout) followed by the ``target_column``
    text (+ EOS with ``append_eos``). SFT: cross-entropy on those tokens. KD: the ``algorithm.distill``
    divergence to the teacher at those positions (forward KL unless ``distill.divergence`` is set).

    ``teacher_cache`` (KD only): a directory of teacher targets for every row of the dataset. It is
    reused when it matches (same rows, teacher identity and settings), built from the teacher when
    absent, and refused when stale or corrupt.
    """

    target_column: Literal["answer", "context"] = "answer"
    append_eos: bool = True
    teacher_cache: str | None = None


class AlgorithmSection(Strict):
    name: Literal["grpo", "opd", "ppo", "sft", "kd"] = "grpo"
    grpo: GrpoSection = Field(default_factory=GrpoSection)
    ppo: PpoSection = Field(default_factory=PpoSection)
    offline: OfflineSection = Field(default_factory=OfflineSection)
    distill: DistillSection = Field(default_factory=DistillSection)
    rewards: list[RewardTerm] = Field(default_factory=lambda: [RewardTerm(name="calculator_exact")])
    #: every k updates, a greedy evaluation on ``data.eval_path`` goes into the metrics line (None: off)
    eval_every: Annotated[int, Field(ge=1)] | None = None
    old_logp: Literal["recompute", "rollout"] = Field(
        default="recompute",
        description="where a policy-gradient update (grpo, ppo) takes old_logp from: 'recompute' (the training "
        "model, always sound) or 'rollout' (the rollout's sampled log-probs: only the trainer's own under plain "
        "sampling; refused with rollout.backend vllm, whose log-probs are another engine's)",
    )


class TrainSection(Strict):
    cycles: Annotated[int, Field(ge=1)] = 1
    gradient_accumulation_steps: Annotated[int, Field(ge=1)] | None = None
    trajectory_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: Annotated[float, Field(gt=0)] = 1e-8
    max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    logprob_chunk_size: Annotated[int, Field(ge=1)] = 1024
    #: recompute every n-th student decoder layer in backward (0: off); ``auto``: chosen by the memory plan
    #: from ``memory.max_peak_reserved_gib`` (off without a budget)
    activation_checkpointing: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    #: ``fp32``: PEFT's fp32 adapter; ``bf16_master``: bf16 adapter tensors in the model, fp32 masters in
    #: the optimizer, checkpoints and export; ``auto``: bf16_master for a bfloat16 student on CUDA, else fp32
    adapter_precision: Literal["auto", "fp32", "bf16_master"] = "auto"


class CheckpointSection(Strict):
    every_updates: Annotated[int, Field(ge=1)] = 1
    keep_last: Annotated[int, Field(ge=1)] = 2


class MemorySection(Strict):
    """Where frozen models live, and a hard peak-memory limit.

    - ``placement: swap`` (``dual_model``, unquantized roles only): frozen teacher/reference models
      stay on the CPU and visit the device only inside their role's phase. The student and critic
      (trained, with optimizer state) are always resident; a shared backbone is one resident model.
    - ``max_peak_reserved_gib``: the run fails (before that cycle's checkpoint) when a cycle's CUDA
      peak reserved memory exceeds it. It is measured on CUDA only: a CPU run refuses it.
    """

    placement: Literal["resident", "swap"] = "resident"
    max_peak_reserved_gib: Annotated[float, Field(gt=0)] | None = None


class MiniverlConfig(Strict):
    run: RunSection = Field(default_factory=RunSection)
    models: ModelsSection
    data: DataSection
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    train: TrainSection = Field(default_factory=TrainSection)
    checkpoint: CheckpointSection = Field(default_factory=CheckpointSection)
    memory: MemorySection = Field(default_factory=MemorySection)

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


def _require_immutable(revision: str | None, allow_mutable: bool, *, what: str) -> None:
    if revision is None:
        raise ValueError(f"{what} needs revision (a 40-hex commit)")
    if not IMMUTABLE_REVISION.match(revision) and not allow_mutable:
        raise ValueError(
            f"{what}: revision {revision!r} is mutable; pin a 40-hex commit or set allow_mutable_revision: true"
        )

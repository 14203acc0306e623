"""The typed intermediate representation (IR) of an experiment that a verl compiler emits from.

The IR says *what* the experiment is in verl's vocabulary, independent of YAML layout: the
policy model and its LoRA, the prompts, the rollout, the algorithm, the optimizer, the schedule,
the reward and the runtime bindings. A compiler turns a miniverl plan into an IR (refusing what
verl cannot express exactly, see :mod:`miniverl.handoff.rules`), then the IR into a verl 0.9
``ppo_trainer`` config (:mod:`miniverl.handoff.emit`).

``algorithm`` is a tagged union: v1 (GRPO) fills :class:`GrpoIR`; the v2 PPO compiler fills
:class:`PpoIR` (GAE, epochs and mini-batches, value clip, the critic) without touching the other
sections, and v4 (direct-config) will record the native YAML's bytes in ``source``.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from miniverl.canonical import sha256_json

CompilerId = Literal["verl-rl-v0.9-single-gpu-v1", "verl-rl-v0.9-single-gpu-v2", "verl-rl-v0.9-single-gpu-v4"]
COMPILER_V1: Final = "verl-rl-v0.9-single-gpu-v1"
COMPILER_V2: Final = "verl-rl-v0.9-single-gpu-v2"
COMPILER_V4: Final = "verl-rl-v0.9-single-gpu-v4"
VERL_VERSION: Final = "0.9.1"


class IRModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SourceIR(IRModel):
    """Where the experiment came from: the plan's resolved config and data, by content.

    The plan's own digest is not part of the IR: the plan records this IR's digest (its ``handoff``
    section), so the IR cannot depend on it; the bundle manifest names the plan digest.
    """

    kind: Literal["miniverl_plan"] = "miniverl_plan"
    config_digest: str
    data_sha256: str
    miniverl_version: str


class QuantizationIR(IRModel):
    """The base weights' quantization in miniverl (``trained``) and in verl (``handed_off``).

    verl 0.9 has no NF4 base weights: an NF4 plan or run is handed off on the same base model in
    full precision (``models.dtype``), rule ``nf4_not_carried_over``. ``carried_over`` is true iff
    the two agree; the bundle manifest, ``handoff --json`` and ``diagnose`` report this object.
    """

    trained: Literal["none", "nf4"]
    handed_off: Literal["none"] = "none"
    carried_over: bool

    @model_validator(mode="after")
    def _carried_over_iff_equal(self) -> QuantizationIR:
        if self.carried_over != (self.trained == self.handed_off):
            raise ValueError(f"carried_over must be {self.trained == self.handed_off} (trained {self.trained})")
        return self

    @classmethod
    def of(cls, trained: Literal["none", "nf4"]) -> QuantizationIR:
        return cls(trained=trained, carried_over=trained == "none")


class ModelBindingIR(IRModel):
    """How the policy's base weights reach verl.

    ``hub``: ``actor_rollout_ref.model.path`` is the hub id; ``launch.sh`` resolves the pinned
    ``revision`` with huggingface_hub (verl's HFModelConfig has no revision key).
    ``builtin``: an embedded miniverl model, resolved at launch with ``miniverl models fetch``.
    ``bundle``: the base directory is copied into the bundle as ``model/``.
    Always the unquantized base at ``dtype``; ``quantization`` says what miniverl trained over.
    """

    binding: Literal["hub", "builtin", "bundle"]
    model_id: str | None = None
    revision: str | None = None
    identity_digest: str
    dtype: Literal["float32", "bfloat16", "float16"]
    gradient_checkpointing: bool
    #: ``train.fused_kernels: liger``: verl's ``actor_rollout_ref.model.use_liger`` (the same kernels' family)
    use_liger: bool = False
    quantization: QuantizationIR


class LoraIR(IRModel):
    rank: Annotated[int, Field(ge=1)]
    alpha: Annotated[int, Field(ge=1)]
    target_modules: tuple[str, ...]
    start_adapter: Literal["fresh", "bundle"] = "fresh"


class DataIR(IRModel):
    train_file: str
    rows: Annotated[int, Field(ge=1)]
    source_sha256: str
    shuffle: bool
    seed: int
    max_prompt_length: Annotated[int, Field(ge=1)]


class RolloutIR(IRModel):
    engine: Literal["vllm"] = "vllm"
    prompts_per_step: Annotated[int, Field(ge=1)]
    samples_per_prompt: Annotated[int, Field(ge=1)]
    max_response_length: Annotated[int, Field(ge=1)]
    do_sample: bool
    temperature: float
    top_p: float
    top_k: int
    micro_batch_per_gpu: Annotated[int, Field(ge=1)]


#: verl 0.9 ``kl_penalty`` names whose formula equals miniverl's estimator of the same name (verl's
#: ``k3`` is its clamped ``low_var_kl``, so miniverl's unclamped ``k3`` has no verl name).
KlType = Literal["k1", "k2", "low_var_kl"]


class GrpoIR(IRModel):
    kind: Literal["grpo"] = "grpo"
    clip_ratio_low: float
    clip_ratio_high: float
    norm_adv_by_std: bool
    loss_agg_mode: Literal["token-mean"] = "token-mean"
    ppo_epochs: Annotated[int, Field(ge=1)]
    mini_batch_prompts: Annotated[int, Field(ge=1)]
    shuffle_mini_batches: bool
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: KlType = "low_var_kl"
    use_kl_in_reward: bool = False
    kl_reward_coef: float = 0.0
    kl_penalty: KlType = "k1"


class CriticIR(IRModel):
    """PPO's value model: a LoRA on the actor's base plus a scalar value head.

    The optimizer shares the actor's weight decay, betas and eps (miniverl's ``train.*``) and has
    its own learning rate and gradient clip. verl starts the critic from the bundle's
    ``critic_adapter/`` (``critic.model.lora_adapter_path``): a ``TOKEN_CLS`` PEFT adapter whose
    ``modules_to_save`` is the value head (``score``), so verl trains the head as miniverl does.
    ``start``: ``seeded_head`` (a plan: miniverl's seeded head, fresh LoRA) or ``run_checkpoint``
    (a run: the critic LoRA and head of its last checkpoint).
    """

    base: Literal["actor_base"] = "actor_base"
    lora_rank: Annotated[int, Field(ge=1)]
    lora_alpha: Annotated[int, Field(ge=1)]
    target_modules: tuple[str, ...]
    lr: float
    clip_grad: float
    value_head: Literal["score_modules_to_save"] = "score_modules_to_save"
    adapter_dir: Literal["critic_adapter"] = "critic_adapter"
    start: Literal["seeded_head", "run_checkpoint"] = "seeded_head"
    head_seed: int = 0
    ppo_epochs: Annotated[int, Field(ge=1)]
    mini_batch_prompts: Annotated[int, Field(ge=1)]


class PpoIR(IRModel):
    """PPO with a critic (compiler v2): verl's ``adv_estimator: gae`` with whitened advantages."""

    kind: Literal["gae"] = "gae"
    gamma: float
    lam: float
    whiten_advantages: Literal[True] = True
    ppo_epochs: Annotated[int, Field(ge=1)]
    mini_batch_prompts: Annotated[int, Field(ge=1)]
    shuffle_mini_batches: bool
    clip_ratio_low: float
    clip_ratio_high: float
    cliprange_value: float
    loss_agg_mode: Literal["token-mean"] = "token-mean"
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: KlType = "low_var_kl"
    use_kl_in_reward: bool = False
    kl_reward_coef: float = 0.0
    kl_penalty: KlType = "k1"
    critic: CriticIR


AlgorithmIR = Annotated[GrpoIR | PpoIR, Field(discriminator="kind")]


class OptimIR(IRModel):
    lr: float
    weight_decay: float
    betas: tuple[float, float]
    eps: float
    clip_grad: float


class ScheduleIR(IRModel):
    total_training_steps: Annotated[int, Field(ge=1)]
    save_freq: Annotated[int, Field(ge=1)]
    max_ckpt_to_keep: Annotated[int, Field(ge=1)]
    experiment_name: str
    seed: int


class RewardTermIR(IRModel):
    name: str
    weight: float
    params: dict[str, float | int | str | bool]


class RewardModelIR(IRModel):
    """The reward-model role, scored inside ``reward_fn.py`` by miniverl's own ``RewardModel``.

    ``spec`` is the plan's ``models.reward`` (hub@40-hex or the seeded tiny classifier on the
    actor's tokenizer), ``identity`` its content identity from the plan (checked again at launch),
    ``weight`` the ``reward_model`` term's weight.
    """

    spec: dict[str, Any]
    identity: dict[str, Any]
    weight: float


class RewardIR(IRModel):
    function_file: str = "reward_fn.py"
    function_name: Literal["compute_score"] = "compute_score"
    terms: tuple[RewardTermIR, ...]
    needs_response_token_count: bool
    reward_model: RewardModelIR | None = None


class RuntimeIR(IRModel):
    """The single-GPU target the v1..v4 compilers emit for (one node, one GPU, colocated)."""

    nnodes: Literal[1] = 1
    n_gpus_per_node: Literal[1] = 1
    device: Literal["cuda"] = "cuda"
    tensor_model_parallel_size: Literal[1] = 1


class ExperimentIR(IRModel):
    kind: Literal["miniverl.verl_ir"] = "miniverl.verl_ir"
    schema_version: Literal[1] = 1
    compiler: CompilerId
    verl_version: Literal["0.9.1"] = "0.9.1"
    source: SourceIR
    model: ModelBindingIR
    lora: LoraIR
    data: DataIR
    rollout: RolloutIR
    algorithm: AlgorithmIR
    optim: OptimIR
    schedule: ScheduleIR
    reward: RewardIR
    runtime: RuntimeIR = Field(default_factory=RuntimeIR)
    deviations: tuple[str, ...] = ()


def ir_digest(ir: ExperimentIR) -> str:
    """sha256 of the IR's canonical JSON (sorted keys, compact, UTF-8)."""
    return sha256_json(ir.model_dump(mode="json"))

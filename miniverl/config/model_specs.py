"""The ``models`` section: where each role's weights come from (student, teacher, reference, critic, reward model)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from miniverl.config.fields import BUILTIN_MODELS, SHA256_HEX, Seed, Strict, require_immutable


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
            require_immutable(self.revision, self.allow_mutable_revision, what=f"adapter {self.path}")
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
            require_immutable(self.revision, self.allow_mutable_revision, what=f"model {self.model_id}")
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
            require_immutable(self.revision, self.allow_mutable_revision, what=f"reward model {self.model_id}")
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

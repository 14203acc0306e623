"""The ``models`` section: where each role's weights come from (student, teacher, reference, critic, reward model)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from miniverl.config.fields import BUILTIN_MODELS, SHA256_HEX, Seed, Strict, require_immutable


class LoraConfig(Strict):
    enabled: bool = Field(
        default=True,
        description="must stay true: miniverl trains LoRA adapters only (false is refused when the model loads)",
    )
    r: Annotated[int, Field(ge=1)] = Field(default=16, description="the LoRA rank")
    alpha: Annotated[float, Field(gt=0)] = Field(
        default=32, description="LoRA's alpha: the adapter's update is scaled by alpha / r"
    )
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.0, description="dropout on the LoRA branch's input while training"
    )
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="the linear layers, by module name, that get a LoRA (names that do not fit the model are "
        "refused when it loads)",
    )


class AdapterSpec(Strict):
    """A frozen PEFT adapter: hub (``path`` = repo id, 40-hex ``revision``) or a local directory.

    A local adapter is pinned by ``sha256`` of its ``adapter_model.safetensors``.
    """

    source: Literal["hub", "local"] = Field(description="hub (a repo at a revision) or local (a directory)")
    path: str = Field(
        description="hub: the repo id; local: the adapter directory (adapter_config.json, adapter_model.safetensors)",
    )
    revision: str | None = Field(
        default=None, description="hub: the 40-hex commit (a branch or tag needs allow_mutable_revision)"
    )
    sha256: str | None = Field(
        default=None,
        description="local: the pinned sha256 of adapter_model.safetensors, checked against the file (required "
        "under runtime shared_backbone)",
    )
    allow_mutable_revision: bool = Field(
        default=False,
        description="hub: accept a branch or tag as revision; it is resolved to its commit, which the plan's "
        "identity records",
    )

    @model_validator(mode="after")
    def _pinned(self) -> AdapterSpec:
        if self.source == "hub":
            require_immutable(self.revision, self.allow_mutable_revision, what=f"adapter {self.path}")
        if self.sha256 is not None and not SHA256_HEX.match(self.sha256):
            raise ValueError("adapter sha256 must be 64 lowercase hex characters")
        return self


class PrivilegedContext(Strict):
    """The teacher is the frozen base that also sees a data column (e.g. the worked answer)."""

    column: str = Field(
        default="context",
        description="the dataset column the teacher also sees, e.g. context or answer (refused when empty in "
        "every row)",
    )
    template: str = Field(
        default="{context}\n\n{prompt}",
        description="the teacher's prompt: placeholders {context} and {prompt}, both required",
    )

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

    source: Literal["hub", "local", "gguf", "builtin", "student"] = Field(
        default="hub",
        description="where the weights come from: hub, local, gguf, builtin, or student (the student's own base: "
        "teacher, reference and critic only)",
    )
    model_id: str | None = Field(
        default=None, description="hub: the Hugging Face repo id; builtin: the embedded model's name"
    )
    revision: str | None = Field(
        default=None, description="hub: the 40-hex commit (a branch or tag needs allow_mutable_revision)"
    )
    path: str | None = Field(default=None, description="local: a Hugging Face model directory; gguf: a .gguf file")
    allow_mutable_revision: bool = Field(
        default=False,
        description="hub: accept a branch or tag as revision; it is resolved to its commit, which the plan's "
        "identity records",
    )
    quantization: Literal["none", "nf4"] = Field(
        default="none",
        description="'nf4': the base's linear layers in 4-bit NF4 through bitsandbytes, computing in "
        "models.dtype; 'none': the weights in models.dtype",
    )
    lora: LoraConfig | None = Field(
        default=None,
        description="the trainable LoRA (student and critic only; unset: the defaults for the student, a copy of "
        "the student's for the critic)",
    )
    adapter: AdapterSpec | None = Field(
        default=None, description="a pinned, frozen PEFT adapter on this base (teacher and reference only)"
    )
    privileged_context: PrivilegedContext | None = Field(
        default=None, description="the base also sees a data column before the prompt (teacher only)"
    )

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

    hidden_size: Annotated[int, Field(ge=8)] = Field(default=32, description="the hidden size")
    num_hidden_layers: Annotated[int, Field(ge=1)] = Field(default=2, description="the decoder layers")
    num_attention_heads: Annotated[int, Field(ge=1)] = Field(
        default=4, description="the attention heads (and as many key/value heads)"
    )
    intermediate_size: Annotated[int, Field(ge=8)] = Field(default=64, description="the MLP's intermediate size")
    seed: Seed = Field(default=0, description="the seed of the weights' initialization")


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

    source: Literal["hub", "local", "tiny"] = Field(
        default="tiny",
        description="hub (model_id at revision), local (a model directory with its tokenizer) or tiny (built "
        "from tiny with a seeded init)",
    )
    model_id: str | None = Field(default=None, description="hub: the Hugging Face repo id")
    revision: str | None = Field(
        default=None, description="hub: the 40-hex commit (a branch or tag needs allow_mutable_revision)"
    )
    path: str | None = Field(default=None, description="local: the model directory, with its tokenizer")
    allow_mutable_revision: bool = Field(
        default=False,
        description="hub: accept a branch or tag as revision; it is resolved to its commit, which the plan's "
        "identity records",
    )
    tiny: TinyClassifier | None = Field(
        default=None, description="source tiny: the classifier's shape and seed (these defaults when unset)"
    )
    placement: Literal["resident", "offload"] = Field(
        default="resident",
        description="'resident': kept on the device; 'offload': kept on the CPU and moved to the device only for "
        "its scoring phase",
    )
    batch_size: Annotated[int, Field(ge=1)] = Field(default=8, description="texts scored per forward")
    max_length: Annotated[int, Field(ge=8)] = Field(
        default=512, description="the most tokens of a scored text (longer ones are truncated)"
    )
    label: Annotated[int, Field(ge=0)] = Field(
        default=0, description="the classifier output whose logit is the score (below the model's num_labels)"
    )
    template: str = Field(
        default="{prompt}\n{response}",
        description="the scored text: placeholders {prompt} and {response} ({response} required)",
    )

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
    backend: Literal["hf"] = Field(
        default="hf", description="the model library: 'hf' (transformers with PEFT), the only one"
    )
    runtime: Literal["dual_model", "shared_backbone"] = Field(
        default="dual_model",
        description="'dual_model': each role its own loaded model; 'shared_backbone': one base with one adapter "
        "per role (teacher and reference as pinned adapters, the critic as a second trained adapter)",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="'auto': cuda when available, else cpu; 'cuda' is refused where no CUDA device is available",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        default="float32",
        description="the dtype of every model's weights (an nf4 model's compute dtype); 16-bit on CPU is allowed "
        "but slow",
    )
    # the equivalence gate pins eager
    attn_implementation: Literal["eager", "sdpa"] = Field(
        default="sdpa",
        description="transformers' attention for every model: 'sdpa' (PyTorch's scaled_dot_product_attention) or "
        "'eager'",
    )
    student: ModelSpec = Field(
        description="the trained policy: a base model and its trainable LoRA (not source student; no adapter or "
        "privileged_context)",
    )
    teacher: ModelSpec | None = Field(
        default=None,
        description="the frozen teacher of opd and kd (required by them): another model, the student's base with "
        "a pinned adapter, or the base that also sees privileged_context; takes no lora",
    )
    reference: ModelSpec | None = Field(
        default=None,
        description="the frozen reference of grpo's and ppo's KL (required when their kl_coef > 0); source "
        "student without an adapter is the student's untouched base; takes no lora or "
        "privileged_context",
    )
    reward: RewardModelSpec | None = Field(
        default=None,
        description="the reward model that scores the reward_model term of algorithm.rewards (required by that "
        "term, refused without it)",
    )
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

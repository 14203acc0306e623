"""The seam between the runtimes and model loading: base models, the student LoRA, frozen adapters.

A runtime never opens files itself; it calls a :data:`BaseLoader` (``ModelSpec`` -> weights,
tokenizer and a content identity). The default loader delegates to ``miniverl.models``; tests and
the equivalence gate inject their own (tiny in-memory models, random-init shapes).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from miniverl import bounded
from miniverl.canonical import sha256_file, sha256_json
from miniverl.config.schema import AdapterSpec, LoraConfig, ModelSpec
from miniverl.errors import ModelSourceError

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


@dataclass(frozen=True)
class LoadSettings:
    device: torch.device
    dtype: torch.dtype
    attn_implementation: str = "eager"


@dataclass
class LoadedBase:
    """A causal LM (``*ForCausalLM``), its tokenizer and its identity (content digests, no paths)."""

    model: Any
    tokenizer: Any
    identity: dict[str, Any] = field(default_factory=dict)


BaseLoader = Callable[[ModelSpec, LoadSettings], LoadedBase]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def default_loader(spec: ModelSpec, settings: LoadSettings) -> LoadedBase:
    """Load through ``miniverl.models`` (sources, GGUF/builtin, NF4, the CPU repack fix)."""
    from miniverl.models.loading import load_causal_lm
    from miniverl.models.sources import resolve

    resolved = resolve(spec)
    dtype_name = next(name for name, value in DTYPES.items() if value == settings.dtype)
    model, tokenizer = load_causal_lm(
        resolved,
        dtype=dtype_name,
        device=settings.device.type,
        attn_implementation=settings.attn_implementation,
        quantization=spec.quantization,
    )
    return LoadedBase(model=model, tokenizer=tokenizer, identity=dict(resolved.identity))


def base_spec_for(role_spec: ModelSpec, student: ModelSpec) -> ModelSpec:
    """The spec of the physical base a role runs on (``source: student`` -> the student's base)."""
    if role_spec.source != "student":
        return role_spec.model_copy(update={"lora": None, "adapter": None, "privileged_context": None})
    return student.model_copy(
        update={"quantization": role_spec.quantization, "lora": None, "adapter": None, "privileged_context": None}
    )


def attach_student_lora(model: Any, lora: LoraConfig, *, adapter_name: str = "student") -> Any:
    """Wrap ``model`` in a ``PeftModel`` with one trainable LoRA; everything else frozen."""
    from miniverl.models.loading import attach_lora

    return attach_lora(model, lora, adapter_name=adapter_name)


@dataclass(frozen=True)
class ResolvedAdapter:
    directory: Path
    provenance: dict[str, Any]  # immutable: source, repo/revision (hub) and content digests, no paths


def resolve_adapter(spec: AdapterSpec) -> ResolvedAdapter:
    """Find a frozen adapter's directory (pin checked by ``miniverl.models``) and its provenance."""
    from miniverl.models.sources import resolve_adapter as resolve_adapter_source

    directory, identity = resolve_adapter_source(spec)
    try:
        adapter_config = bounded.read_json(
            directory / ADAPTER_CONFIG, limit=bounded.MODEL_CONFIG_MAX_BYTES, what="an adapter config"
        )
    except ValueError as exc:
        raise ModelSourceError(f"adapter {ADAPTER_CONFIG} is refused: {exc}") from None
    adapter_config.pop("base_model_name_or_path", None)  # may be a local path
    provenance: dict[str, Any] = {
        "source": spec.source,
        "adapter_model_sha256": identity.get("sha256") or sha256_file(directory / ADAPTER_WEIGHTS),
        "adapter_config_sha256": sha256_json(adapter_config),
    }
    if spec.source == "hub":
        provenance.update({"repo_id": identity["repo_id"], "revision": identity["revision"]})
    return ResolvedAdapter(directory=directory, provenance=provenance)


def load_frozen_adapter(model: Any, resolved: ResolvedAdapter, *, adapter_name: str) -> Any:
    """Load a frozen adapter onto ``model`` (wrapping it in a ``PeftModel`` when it is not one)."""
    from miniverl.models.loading import attach_frozen_adapter

    return attach_frozen_adapter(model, resolved.directory, adapter_name=adapter_name, label=resolved.directory.name)


def inner_causal_lm(model: Any) -> Any:
    """The ``*ForCausalLM`` under a ``PeftModel`` (LoRA is injected in place), or ``model`` itself."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def decoder_of(model: Any) -> Any:
    """The inner transformer (``LlamaModel``/``Qwen3Model``) whose output is final-normed."""
    lm = inner_causal_lm(model)
    inner = getattr(lm, "model", None)
    if inner is not None and hasattr(inner, "layers"):
        return inner
    return lm.get_decoder()


def head_weight_of(model: Any) -> torch.Tensor:
    head = inner_causal_lm(model).get_output_embeddings()
    weight: torch.Tensor = head.weight
    return weight


def enable_activation_checkpointing(model: Any, every_n_layers: int) -> None:
    """Recompute decoder layers in backward (non-reentrant), every ``every_n_layers``-th layer.

    Only the student's training forward is affected: HF layers checkpoint only in ``train()`` mode
    with autograd on, so frozen roles (eval, ``no_grad``) run unchanged.
    """
    if every_n_layers < 1:
        raise ValueError("activation checkpointing needs every_n_layers >= 1")
    inner_causal_lm(model).gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}, every_n_layers=every_n_layers
    )

"""The seam between the runtimes and model loading: base models, the student LoRA, frozen adapters.

A runtime never opens files itself; it calls a :data:`BaseLoader` (``ModelSpec`` -> weights,
tokenizer and a content identity). The default loader delegates to ``miniverl.models``; tests and
the equivalence gate inject their own (tiny in-memory models, random-init shapes).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

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


def freeze(model: Any) -> Any:
    for param in model.parameters():
        param.requires_grad_(False)
    return model


def disable_cpu_nf4_repack(model: Any) -> int:
    """bitsandbytes 0.50 CPU hazard: stop ``Linear4bit`` repacking weights after a no-grad forward.

    The repacked AVX512-BF16 layout has no autograd, so later LoRA gradients come out wrong.
    Idempotent; applied to every model a runtime holds, whoever loaded it. Returns the count.
    """
    from miniverl.models.loading import disable_cpu_weight_repack

    return disable_cpu_weight_repack(model)


def attach_student_lora(model: Any, lora: LoraConfig, *, adapter_name: str = "student") -> Any:
    """Wrap ``model`` in a ``PeftModel`` with one trainable LoRA; everything else frozen."""
    from miniverl.models.loading import attach_lora

    return attach_lora(model, lora, adapter_name=adapter_name)


@dataclass(frozen=True)
class ResolvedAdapter:
    directory: Path
    provenance: dict[str, Any]  # immutable: source, repo/revision (hub) and content digests, no paths


def resolve_adapter(spec: AdapterSpec) -> ResolvedAdapter:
    """Find a frozen adapter's directory and check its pin (sha256 of the weights when given)."""
    directory = Path(spec.path) if spec.source == "local" else _hub_adapter_dir(spec)
    weights, config = directory / ADAPTER_WEIGHTS, directory / ADAPTER_CONFIG
    if not weights.is_file() or not config.is_file():
        raise ModelSourceError(
            f"adapter {spec.path!r} is not a PEFT adapter directory: it needs {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS}"
        )
    digest = sha256_file(weights)
    if spec.sha256 is not None and digest != spec.sha256:
        raise ModelSourceError(
            f"adapter {spec.path!r}: {ADAPTER_WEIGHTS} has sha256 {digest}, but the config pins {spec.sha256}; "
            "point at the pinned adapter or update adapter.sha256"
        )
    with open(config, encoding="utf-8") as handle:
        adapter_config = json.load(handle)
    adapter_config.pop("base_model_name_or_path", None)  # may be a local path
    provenance: dict[str, Any] = {
        "source": spec.source,
        "adapter_model_sha256": digest,
        "adapter_config_sha256": sha256_json(adapter_config),
    }
    if spec.source == "hub":
        provenance.update({"repo_id": spec.path, "revision": spec.revision})
    return ResolvedAdapter(directory=directory, provenance=provenance)


def _hub_adapter_dir(spec: AdapterSpec) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:  # pragma: no cover
        raise ModelSourceError("huggingface_hub is needed for hub adapters") from exc
    offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
    try:
        path = snapshot_download(
            repo_id=spec.path,
            revision=spec.revision,
            allow_patterns=[ADAPTER_CONFIG, ADAPTER_WEIGHTS],
            local_files_only=offline,
        )
    except Exception as exc:
        raise ModelSourceError(f"cannot fetch adapter {spec.path}@{spec.revision}: {exc}") from exc
    return Path(path)


def load_frozen_adapter(model: Any, resolved: ResolvedAdapter, *, adapter_name: str) -> Any:
    """Load a frozen adapter onto ``model`` (wrapping it in a ``PeftModel`` when it is not one)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model.load_adapter(str(resolved.directory), adapter_name=adapter_name, is_trainable=False)
        wrapped = model
    else:
        wrapped = PeftModel.from_pretrained(
            model, str(resolved.directory), adapter_name=adapter_name, is_trainable=False
        )
    for name, param in wrapped.named_parameters():
        if f".{adapter_name}." in name:
            param.requires_grad_(False)
    return wrapped


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

"""The rollout copy of a policy: its weights with the LoRA delta folded in, in one dtype, on one device.

For each linear layer ``W_eff = dequant(W_base) + sum over active adapters of scaling * B @ A``
(PEFT's ``get_delta_weight``), computed in float32 and cast once to the rollout dtype. q/k/v are
stacked into one ``[(H_q + 2 H_kv) * d, hidden]`` matrix and gate/up into one ``[2 I, hidden]``
matrix, so a decode step runs four GEMMs per layer on base-size weights and no adapter kernels.
The attention scale ``d ** -0.5`` is folded into the queries once: into the q half of the
stacked per-head norm weight ``qk_norm`` ``[H_q + H_kv, d]`` (Qwen3), else into the q rows of
``qkv`` and its bias.

:func:`fold_policy` allocates the copy; called again with the previous copy it writes the new
values into the same tensors (``copy_``), so CUDA graphs captured on them stay valid across policy
versions. Supported: Llama-family decoders (``llama``, ``qwen2``, ``qwen3``) with a static RoPE
table, SiLU MLP and full attention; :func:`unsupported_reason` says why a model is not.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3")
STATIC_ROPE = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class DecoderShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    eps: float
    qk_norm: bool
    attention_scaling: float


@dataclass
class LayerWeights:
    input_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    qk_norm: torch.Tensor | None  # [heads + kv_heads, head_dim], q rows times head_dim ** -0.5
    o: torch.Tensor
    o_bias: torch.Tensor | None
    post_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor


@dataclass
class RolloutWeights:
    shape: DecoderShape
    embed: torch.Tensor
    layers: list[LayerWeights]
    final_norm: torch.Tensor
    lm_head: torch.Tensor  # the same tensor as ``embed`` when tied and neither carries an adapter
    inv_freq: torch.Tensor  # float32 [head_dim / 2]
    tied: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def nbytes(self) -> int:
        """Bytes of distinct weight storage (what one decode step must read at least once)."""
        seen: dict[int, int] = {}
        tensors = [self.embed, self.final_norm, self.lm_head]
        for layer in self.layers:
            tensors += [t for t in vars(layer).values() if isinstance(t, torch.Tensor)]
        for t in tensors:
            seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())


def inner_model(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` under a PEFT wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def unsupported_reason(model: Any) -> str | None:
    """``None`` when the fast engine can run this model, else one line saying why not."""
    inner = inner_model(model)
    config = getattr(inner, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"model_type {kind!r} is not one of {', '.join(SUPPORTED_TYPES)}"
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        return f"hidden_act {act!r} is not silu"
    if getattr(config, "mlp_bias", False):
        return "mlp_bias is not supported"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention is not supported"
    rotary = getattr(getattr(inner, "model", None), "rotary_emb", None)
    if rotary is None or getattr(rotary, "rope_type", "default") not in STATIC_ROPE:
        return f"RoPE type {getattr(rotary, 'rope_type', None)!r} is not a static table"
    for module in model.modules():
        use_dora = getattr(module, "use_dora", None)
        if isinstance(use_dora, dict) and any(use_dora.values()):
            return "DoRA adapters are not supported"
    return None


def policy_digest(tensors: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> str:
    """sha256 hex of named tensors (the policy evidence in ``metrics.jsonl``).

    For each tensor in sorted name order: the name, the dtype (``torch.bfloat16``), the shape and
    the byte count, each followed by a NUL, then the tensor's raw bytes (contiguous, on CPU). The
    same tensors give the same digest on every device; any changed element, dtype or shape changes it.
    """
    items = dict(tensors.items() if isinstance(tensors, Mapping) else tensors)
    h = hashlib.sha256()
    for name in sorted(items):
        flat = items[name].detach().reshape(-1).contiguous().cpu()
        raw = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
        shape = ",".join(str(d) for d in items[name].shape)
        h.update(f"{name}\0{items[name].dtype}\0{shape}\0{len(raw)}\0".encode())
        h.update(raw)
    return h.hexdigest()


def _is_nf4(weight: torch.Tensor) -> bool:
    return type(weight).__name__ == "Params4bit"


def _plain_weight(module: Any) -> torch.Tensor:
    weight = module.weight
    if _is_nf4(weight):
        import bitsandbytes.functional as bnbf

        return bnbf.dequantize_4bit(weight.data, weight.quant_state).float()
    return weight.detach().float()


def effective_weight(module: Any) -> torch.Tensor:
    """float32 ``W_base + Σ_active ΔW`` of a (possibly LoRA-wrapped, possibly NF4) linear/embedding."""
    base = getattr(module, "base_layer", None)
    if base is None or not hasattr(module, "lora_A"):
        return _plain_weight(module)
    weight = _plain_weight(base)
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return weight
    known = set(getattr(module, "lora_A", {})) | set(getattr(module, "lora_embedding_A", {}))
    for name in module.active_adapters:
        if name in known:
            weight = weight + module.get_delta_weight(name).float()
    return weight


def _bias(module: Any) -> torch.Tensor | None:
    holder = getattr(module, "base_layer", module)
    bias = getattr(holder, "bias", None)
    return None if bias is None else bias.detach().float()


def _has_adapter(module: Any) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A")


def decoder_shape(config: Any, rotary: Any) -> DecoderShape:
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    return DecoderShape(
        layers=int(config.num_hidden_layers),
        hidden=int(config.hidden_size),
        heads=heads,
        kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        intermediate=int(config.intermediate_size),
        vocab=int(config.vocab_size),
        eps=float(config.rms_norm_eps),
        qk_norm=config.model_type == "qwen3",
        attention_scaling=float(getattr(rotary, "attention_scaling", 1.0)),
    )


def _put(existing: torch.Tensor | None, value: torch.Tensor | None, device: torch.device, dtype: torch.dtype) -> Any:
    """``value`` in the rollout copy: a new tensor the copy owns, or ``existing`` refilled in place.

    Always a copy: ``value`` may be the model's own parameter (``detach().float()`` of an fp32
    weight is the same storage), and a rollout tensor that aliased it would make the next in-place
    refill write into the model (e.g. ``W + ΔW`` into the frozen base weight after a fold taken with
    the adapter disabled).
    """
    if value is None:
        return None
    if existing is None:
        return value.to(device=device, dtype=dtype, copy=True).contiguous()
    existing.copy_(value)
    return existing


@torch.no_grad()
def fold_policy(
    model: Any, *, device: torch.device, dtype: torch.dtype, into: RolloutWeights | None = None
) -> RolloutWeights:
    """The folded rollout copy of ``model`` (see the module docstring); refills ``into`` in place if given."""
    inner = inner_model(model)
    body = inner.model
    shape = decoder_shape(inner.config, body.rotary_emb)
    embed_module, head_module = body.embed_tokens, inner.lm_head
    tied = (
        not _has_adapter(embed_module)
        and not _has_adapter(head_module)
        and getattr(head_module, "weight", None) is not None
        and head_module.weight.data_ptr() == embed_module.weight.data_ptr()
    )
    if into is not None and into.tied != tied:
        into = None  # the layout changed: allocate afresh (captured graphs must be rebuilt)
    old_layers: list[LayerWeights | None] = list(into.layers) if into is not None else [None] * shape.layers
    embed = _frozen_as_is(embed_module, device, dtype)
    if embed is None:
        own = _stored_weight(embed_module)
        aliased = into is not None and own is not None and into.embed.data_ptr() == own.data_ptr()
        previous = into.embed if into is not None and not aliased else None  # never refill the model's own tensor
        embed = _put(previous, effective_weight(embed_module), device, dtype)
    layers: list[LayerWeights] = []
    for decoder_layer, old in zip(body.layers, old_layers, strict=True):
        attn, mlp = decoder_layer.self_attn, decoder_layer.mlp
        qkv = torch.cat([effective_weight(attn.q_proj), effective_weight(attn.k_proj), effective_weight(attn.v_proj)])
        biases = [_bias(attn.q_proj), _bias(attn.k_proj), _bias(attn.v_proj)]
        qkv_bias = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(w) for b, w in zip(biases, _split_sizes(shape), strict=True)]
        )  # fmt: skip
        gate_up = torch.cat([effective_weight(mlp.gate_proj), effective_weight(mlp.up_proj)])
        scale = shape.head_dim**-0.5
        q_rows = shape.heads * shape.head_dim
        q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
        qk_norm = None
        if shape.qk_norm and q_norm is not None and k_norm is not None:
            qk_norm = torch.cat(
                [
                    (q_norm.weight.float() * scale).expand(shape.heads, -1),
                    k_norm.weight.float().expand(shape.kv_heads, -1),
                ]
            )
        else:
            qkv[:q_rows] *= scale
            if qkv_bias is not None:
                qkv_bias[:q_rows] *= scale
        layers.append(
            LayerWeights(
                input_norm=_put(_field(old, "input_norm"), decoder_layer.input_layernorm.weight.float(), device, dtype),
                qkv=_put(_field(old, "qkv"), qkv, device, dtype),
                qkv_bias=_put(_field(old, "qkv_bias"), qkv_bias, device, dtype),
                qk_norm=_put(_field(old, "qk_norm"), qk_norm, device, dtype),
                o=_put(_field(old, "o"), effective_weight(attn.o_proj), device, dtype),
                o_bias=_put(_field(old, "o_bias"), _bias(attn.o_proj), device, dtype),
                post_norm=_put(
                    _field(old, "post_norm"), decoder_layer.post_attention_layernorm.weight.float(), device, dtype
                ),
                gate_up=_put(_field(old, "gate_up"), gate_up, device, dtype),
                down=_put(_field(old, "down"), effective_weight(mlp.down_proj), device, dtype),
            )
        )
    final_norm = _put(into.final_norm if into else None, body.norm.weight.float(), device, dtype)
    if tied:
        lm_head = embed
    else:
        lm_head = _put(into.lm_head if into and not into.tied else None, effective_weight(head_module), device, dtype)
    inv_freq = body.rotary_emb.inv_freq.detach().float().to(device)
    return RolloutWeights(shape, embed, layers, final_norm, lm_head, inv_freq, tied=tied)


def _stored_weight(module: Any) -> torch.Tensor | None:
    """The module's own weight tensor (under a PEFT wrapper, its base layer's)."""
    return getattr(getattr(module, "base_layer", module), "weight", None)


def _frozen_as_is(module: Any, device: torch.device, dtype: torch.dtype) -> torch.Tensor | None:
    """The model's own weight of a module without an adapter when it is already what the rollout reads
    (same dtype and device, a plain tensor): no folded copy of it then. Only the embedding (and a
    tied LM head) qualify, and they are frozen, so the rollout never writes through it (a refill skips
    it); 0.29 GiB of Qwen3-0.6B's bf16 rollout copy, 0.05 GiB of SmolLM2's."""
    weight = None if _has_adapter(module) else _stored_weight(module)
    if weight is None or _is_nf4(weight) or weight.dtype != dtype or weight.device != device:
        return None
    return weight.detach()


def _field(old: LayerWeights | None, name: str) -> torch.Tensor | None:
    return None if old is None else getattr(old, name)


def _split_sizes(shape: DecoderShape) -> list[int]:
    return [shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.kv_heads * shape.head_dim]

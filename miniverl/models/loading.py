"""Load resolved models as torch modules: dtype/device/attention, NF4, LoRA, frozen adapters.

Every loaded model comes back frozen (``requires_grad_(False)``) and in eval mode; a trainable
actor gets its LoRA through :func:`attach_lora` and the trainer calls ``.train()`` itself.
Tokenizers always pad on the left (for batched generation) and always have a pad token.

NF4 on CPU (bitsandbytes 0.50.2): after any eval/no-grad forward, ``Linear4bit`` repacks its weight
into an AVX512-BF16 layout whose ops have no autograd, and every later LoRA gradient is silently
wrong. :func:`disable_cpu_weight_repack` turns that path off on every ``Linear4bit`` (and unpacks a
weight that was already repacked); :func:`load_causal_lm` always calls it.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from miniverl.config.schema import AdapterSpec, LoraConfig
from miniverl.errors import ConfigError, DependencyError, ModelSourceError
from miniverl.models.sources import ResolvedModel, resolve_adapter

if TYPE_CHECKING:
    import torch
    from peft import PeftModel
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DTypeName = Literal["float32", "bfloat16", "float16"]
DeviceName = Literal["auto", "cpu", "cuda"]

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=3)


def resolve_device(device: str) -> torch.device:
    """``auto`` -> cuda if available, else cpu."""
    import torch

    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("models.device is cuda but no CUDA device is available; use device: auto or cpu")
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"unknown device {device!r}; use auto, cpu or cuda")
    return torch.device(device)


def resolve_dtype(dtype: str) -> torch.dtype:
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise ConfigError(f"unknown dtype {dtype!r}; use float32, bfloat16 or float16")
    return table[dtype]


@contextlib.contextmanager
def _quiet_bitsandbytes_import() -> Iterator[None]:
    """bitsandbytes logs a warning at import on CPUs with AVX512-BF16 about an optional kernels package."""
    logger = logging.getLogger("bitsandbytes")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def import_bitsandbytes() -> Any:
    try:
        with _quiet_bitsandbytes_import():
            import bitsandbytes
    except ImportError:
        raise DependencyError(
            "quantization nf4 needs bitsandbytes (the [cuda] extra of this checkout or wheel, or bitsandbytes==0.50.2)"
        ) from None
    return bitsandbytes


def load_causal_lm(
    resolved: ResolvedModel,
    *,
    dtype: str = "float32",
    device: str = "auto",
    attn_implementation: str = "eager",
    quantization: str = "none",
    nf4_double_quant: bool = True,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer, frozen and in eval mode.

    ``dtype`` is the weight dtype (and the NF4 compute dtype); bf16/fp16 on CPU works but warns once.
    ``quantization="nf4"`` quantizes the linear layers with bitsandbytes on load (CUDA or CPU); a
    GGUF source is first materialized as a cached safetensors directory, since transformers refuses
    GGUF together with a bitsandbytes config. ``cache_dir`` is the miniverl cache for that.
    """
    import torch

    if resolved.path is None:
        raise ModelSourceError(f"model {resolved.label} was resolved without fetching; resolve with fetch=True")
    if quantization not in ("none", "nf4"):
        raise ConfigError(f"unknown quantization {quantization!r}; use none or nf4")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    if torch_device.type == "cpu" and torch_dtype != torch.float32:
        _warn_once(
            f"cpu-{dtype}",
            f"dtype {dtype} on CPU is slow and less precise than float32; it is allowed, but prefer float32",
        )

    model_dir = resolved.path
    if resolved.source == "gguf" and quantization == "nf4":
        from miniverl.models.gguf import materialize_gguf

        model_dir = materialize_gguf(
            resolved.path, sha256=resolved.identity["sha256"], cache_dir=cache_dir, progress=progress
        )

    if resolved.source == "gguf" and quantization == "none":
        from miniverl.models.gguf import load_gguf, repair_tokenizer

        model, tokenizer = load_gguf(
            resolved.path, dtype=torch_dtype, attn_implementation=attn_implementation, progress=progress
        )
        repair_tokenizer(tokenizer, model)
        cast(Any, model).to(torch_device)
    else:
        model = _load_from_dir(
            model_dir,
            label=resolved.label,
            dtype=torch_dtype,
            device=torch_device,
            attn_implementation=attn_implementation,
            quantization=quantization,
            nf4_double_quant=nf4_double_quant,
            progress=progress,
        )
        tokenizer = load_tokenizer(model_dir, label=resolved.label)
    _align_special_tokens(model, tokenizer)
    if quantization == "nf4":
        disable_cpu_weight_repack(model)
    model.requires_grad_(False)
    model.eval()
    return model, tokenizer


def _load_from_dir(
    model_dir: Path,
    *,
    label: str,
    dtype: torch.dtype,
    device: torch.device,
    attn_implementation: str,
    quantization: str,
    nf4_double_quant: bool,
    progress: bool,
) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    from miniverl.models.gguf import quiet_progress

    kwargs: dict[str, Any] = {"dtype": dtype, "attn_implementation": attn_implementation}
    if quantization == "nf4":
        import_bitsandbytes()
        from transformers import BitsAndBytesConfig

        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=dtype,
            bnb_4bit_use_double_quant=nf4_double_quant,
        )
        kwargs["device_map"] = {"": device.index or 0} if device.type == "cuda" else {"": "cpu"}
    try:
        with quiet_progress(not progress):
            model = AutoModelForCausalLM.from_pretrained(str(model_dir), **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        lines = str(exc).strip().splitlines()
        raise ModelSourceError(f"cannot load model {label}: {lines[0] if lines else type(exc).__name__}") from None
    if quantization != "nf4":
        cast(Any, model).to(device)
    return model


def load_tokenizer(model_dir: Path, *, label: str | None = None) -> PreTrainedTokenizerBase:
    """The directory's tokenizer, padding on the left, with a pad token (eos if it had none)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, KeyError) as exc:
        lines = str(exc).strip().splitlines()
        raise ModelSourceError(
            f"cannot load the tokenizer of {label or model_dir.name}: {lines[0] if lines else type(exc).__name__}"
        ) from None
    return prepare_tokenizer(tokenizer)


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ModelSourceError("the tokenizer has neither a pad token nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def _align_special_tokens(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Pad rows with the tokenizer's pad id; stop on the tokenizer's eos if the model names none."""
    prepare_tokenizer(tokenizer)
    for config in (model.config, getattr(model, "generation_config", None)):
        if config is None:
            continue
        config.pad_token_id = tokenizer.pad_token_id
        if getattr(config, "eos_token_id", None) is None:
            config.eos_token_id = tokenizer.eos_token_id


# ------------------------------------------------------------------------------------------------- NF4


def disable_cpu_weight_repack(model: torch.nn.Module) -> int:
    """Turn off bitsandbytes' CPU AVX512-BF16 weight repacking on every ``Linear4bit``; return the count.

    bitsandbytes 0.50.2 repacks a ``Linear4bit`` weight on the first eval/no-grad CPU forward
    (``support_avx512bf16_for_cpu``); the repacked op has no autograd, so LoRA gradients computed
    afterwards are wrong. A weight that was already repacked is converted back.
    """
    try:
        with _quiet_bitsandbytes_import():
            import bitsandbytes as bnb
            from bitsandbytes.nn import modules as bnb_modules
    except ImportError:
        return 0
    count = 0
    for module in model.modules():
        if not isinstance(module, bnb.nn.Linear4bit):
            continue
        module.support_avx512bf16_for_cpu = False
        weight: Any = module.weight
        state = getattr(weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            weight.data, weight.quant_state = bnb_modules._convert_weight_packed_for_cpu_inverse(weight.data, state)
        count += 1
    return count


def is_quantized(model: torch.nn.Module) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_quantized", False))


def prepare_kbit_for_lora(model: PreTrainedModel, *, gradient_checkpointing: bool = False) -> PreTrainedModel:
    """Light k-bit preparation: base frozen, CPU repack off, optional gradient checkpointing.

    Unlike peft's ``prepare_model_for_kbit_training`` this does not upcast every non-quantized
    parameter to fp32 (that doubles the embedding/lm_head memory in bf16) and does not enable
    gradient checkpointing unless asked.
    """
    model.requires_grad_(False)
    disable_cpu_weight_repack(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.enable_input_require_grads()
    return model


# ------------------------------------------------------------------------------------------------ LoRA


def attach_lora(
    model: PreTrainedModel,
    lora: LoraConfig,
    *,
    adapter_name: str = "default",
    gradient_checkpointing: bool = False,
) -> PeftModel:
    """Wrap ``model`` in a peft ``PeftModel`` (task CAUSAL_LM) whose only trainable tensors are LoRA's."""
    with _quiet_bitsandbytes_import():  # peft imports bitsandbytes when it is installed
        from peft import LoraConfig as PeftLoraConfig
        from peft import TaskType, get_peft_model

    if not lora.enabled:
        raise ConfigError("lora.enabled is false: full fine-tuning is not supported; enable LoRA")
    if is_quantized(model):
        prepare_kbit_for_lora(model, gradient_checkpointing=gradient_checkpointing)
    else:
        model.requires_grad_(False)
        if gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
    config = PeftLoraConfig(
        r=lora.r,
        lora_alpha=cast(int, lora.alpha),  # peft annotates int; a float alpha works (scaling = alpha / r)
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        bias="none",
        task_type=TaskType.CAUSAL_LM,
    )
    try:
        peft_model = get_peft_model(model, config, adapter_name=adapter_name)
    except ValueError as exc:
        lines = str(exc).strip().splitlines()
        raise ConfigError(
            f"lora.target_modules {lora.target_modules} do not fit this model: {lines[0] if lines else exc}"
        ) from None
    for name, param in peft_model.named_parameters():
        param.requires_grad_(f"lora_A.{adapter_name}." in name or f"lora_B.{adapter_name}." in name)
    return peft_model


def load_frozen_adapter(model: PreTrainedModel | PeftModel, adapter: AdapterSpec, adapter_name: str) -> PeftModel:
    """Load a pinned PEFT adapter as ``adapter_name``, frozen.

    Hub adapters come through ``snapshot_download`` at their revision; a local adapter's
    ``adapter_model.safetensors`` must match ``adapter.sha256`` when pinned (else ModelSourceError).
    If ``model`` is already a ``PeftModel`` the adapter is added beside the existing ones (the
    active adapter does not change); otherwise a new ``PeftModel`` is returned with it active.
    """
    folder, _identity = resolve_adapter(adapter)
    return attach_frozen_adapter(model, folder, adapter_name=adapter_name, label=adapter.path)


def attach_frozen_adapter(
    model: PreTrainedModel | PeftModel, folder: Path, *, adapter_name: str, label: str
) -> PeftModel:
    """Attach an already resolved (pin-checked) adapter directory as ``adapter_name``, frozen."""
    with _quiet_bitsandbytes_import():
        from peft import PeftModel

    try:
        if isinstance(model, PeftModel):
            model.load_adapter(str(folder), adapter_name=adapter_name, is_trainable=False)
            peft_model = model
        else:
            model.requires_grad_(False)
            peft_model = PeftModel.from_pretrained(model, str(folder), adapter_name=adapter_name, is_trainable=False)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        lines = str(exc).strip().splitlines()
        raise ModelSourceError(f"cannot load adapter {label}: {lines[0] if lines else type(exc).__name__}") from None
    for name, param in peft_model.named_parameters():
        if f".{adapter_name}." in name:
            param.requires_grad_(False)
    if not isinstance(model, PeftModel):
        peft_model.eval()
    return peft_model


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameter counts (a 4-bit weight counts its packed elements)."""
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    return trainable, total

"""What both exports (the student's adapter, a PPO run's critic) share: a checkpoint's tensors loaded into a fresh
runtime, and an exported adapter reloaded the way a user reloads it, to compare against the trained model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.errors import ExportError


def load_checkpoint_tensors(named: dict[str, Any], params: dict[str, Any], checkpoint: str, what: str) -> None:
    """Copy a checkpoint's tensors into a fresh runtime's parameters of the same names (layout checked)."""
    import torch

    if set(named) != set(params):
        raise ExportError(f"checkpoint {checkpoint} does not match the plan's {what} layout")
    with torch.no_grad():
        for name, tensor in params.items():
            named[name].copy_(tensor.to(named[name].device, named[name].dtype))


def reload_peft(config: Any, spec: Any, directory: Path, device: Any) -> Any:
    """What a user does with an exported adapter: a fresh base (of ``spec``) + ``PeftModel.from_pretrained``."""
    from peft import PeftModel

    from miniverl.runtime.loading import DTYPES, LoadSettings, base_spec_for, default_loader

    settings = LoadSettings(
        device=device, dtype=DTYPES[config.models.dtype], attn_implementation=config.models.attn_implementation
    )
    base = default_loader(base_spec_for(spec, config.models.student), settings)
    reloaded = PeftModel.from_pretrained(base.model, str(directory))
    reloaded.eval()
    return reloaded

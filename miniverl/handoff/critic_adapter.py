"""The PPO critic in the form verl 0.9.1 trains exactly: a ``TOKEN_CLS`` PEFT adapter with the value head.

verl 0.9.1 builds its critic as ``AutoModelForTokenClassification`` (``num_labels: 1``, no classifier
dropout) and, with ``critic.model.lora_rank > 0``, wraps it in ``FSDPEngine._build_lora_module``:

- without ``lora_adapter_path`` it calls ``get_peft_model`` with a ``CAUSAL_LM`` ``LoraConfig`` and no
  ``modules_to_save``: the value head (``score``) stays frozen (with peft 0.21 the wrap even fails);
- with ``critic.model.lora_adapter_path`` it calls ``PeftModel.from_pretrained(..., is_trainable=True)``
  with the adapter's own ``adapter_config.json``. A ``TOKEN_CLS`` adapter becomes peft's
  ``PeftModelForTokenClassification``, which puts the classifier (``score``) in ``modules_to_save``:
  the value head is trained, and it starts from the adapter's saved ``score`` tensors.

So the bundle carries ``critic_adapter/``: miniverl's critic LoRA (from a run's checkpoint; absent
for a fresh plan, where peft initializes it as miniverl does: A random, B zero) plus miniverl's value
head as ``score`` (``weight [1, H]``, ``bias [1]``: the same ``Linear(H, 1)`` on the same final-normed
hidden state). The critic verl trains is then miniverl's critic, head included.

A model whose token-classification class has no ``score`` head (or no such class: verl would fall
back to trl's value-head model, whose ``v_head`` the LoRA wrap does not train) is refused with
``critic_lora_value_head``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from miniverl import bounded
from miniverl.canonical import atomic_write_text
from miniverl.config.schema import MiniverlConfig
from miniverl.errors import UsageError
from miniverl.handoff.ir import COMPILER_V2, ExperimentIR, PpoIR
from miniverl.handoff.rules import refuse

CRITIC_ADAPTER_DIR = "critic_adapter"
HEAD = "score"
SCORE_KEYS = (f"base_model.model.{HEAD}.weight", f"base_model.model.{HEAD}.bias")
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"


def seeded_value_head(hidden_size: int, seed: int) -> dict[str, Any]:
    """miniverl's fresh value head for ``hidden_size`` (the runtime's own init, no model needed)."""
    import types

    import torch

    from miniverl.runtime.critic import build_value_head

    stub = types.SimpleNamespace(config=types.SimpleNamespace(hidden_size=hidden_size))
    head = build_value_head(stub, seed=seed, device=torch.device("cpu"))
    return {"weight": head.weight.detach().contiguous(), "bias": head.bias.detach().contiguous()}


def token_classification_head(model_config: dict[str, Any]) -> str | None:
    """The name of the head verl's critic class puts on this architecture, or None without a class.

    Built on the meta device from the model's own ``config.json`` (no weights are read).
    """
    import torch
    from transformers import AutoConfig, AutoModelForTokenClassification

    kind = model_config.get("model_type")
    if not isinstance(kind, str):
        return None
    fields = {k: v for k, v in model_config.items() if k not in ("model_type", "transformers_version")}
    try:
        config = AutoConfig.for_model(kind, **fields)
    except (KeyError, ValueError):
        return None
    config.num_labels = 1
    try:
        with torch.device("meta"):
            model = AutoModelForTokenClassification.from_config(config)
    except ValueError:  # no *ForTokenClassification for this model type
        return None
    for name, child in model.named_children():
        if isinstance(child, torch.nn.Linear) and child.out_features == 1:
            return name
    return None


def require_trained_head(ir: ExperimentIR, model_config: dict[str, Any]) -> int:
    """Refuse (``critic_lora_value_head``) unless verl's critic for this model has a ``score`` head.

    Returns the hidden size.
    """
    head = token_classification_head(model_config)
    if head != HEAD:
        found = "no token-classification class" if head is None else f"head {head!r}"
        raise refuse(
            "critic_lora_value_head",
            f"model_type {model_config.get('model_type')!r}: {found}; verl's LoRA critic would not train "
            "miniverl's value head",
            compiler=COMPILER_V2,
        )
    text = model_config.get("text_config")
    source = text if isinstance(text, dict) and "hidden_size" in text else model_config
    return int(source["hidden_size"])


def adapter_config(ir: ExperimentIR, base_name: str) -> dict[str, Any]:
    assert isinstance(ir.algorithm, PpoIR)
    critic = ir.algorithm.critic
    return {
        "peft_type": "LORA",
        "task_type": "TOKEN_CLS",
        "base_model_name_or_path": base_name,
        "r": critic.lora_rank,
        "lora_alpha": critic.lora_alpha,
        "lora_dropout": 0.0,
        "target_modules": sorted(critic.target_modules),
        "bias": "none",
        "modules_to_save": [HEAD],
        "inference_mode": False,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
    }


def write_critic_adapter(
    root: Path, ir: ExperimentIR, base_name: str, head: dict[str, Any], lora: dict[str, Any] | None
) -> dict[str, Any]:
    """``root/critic_adapter``: ``adapter_config.json`` (TOKEN_CLS, ``modules_to_save: [score]``) and the
    tensors (the critic's LoRA when given, ``score.weight``/``score.bias`` from ``head``)."""
    import torch

    from miniverl.outputs import write_safetensors

    target = root / CRITIC_ADAPTER_DIR
    target.mkdir()
    tensors = {key: value.detach().to("cpu").contiguous() for key, value in (lora or {}).items()}
    weight = head["weight"].detach().to("cpu", torch.float32).reshape(1, -1).contiguous()
    bias = head["bias"].detach().to("cpu", torch.float32).reshape(1).contiguous()
    tensors[SCORE_KEYS[0]], tensors[SCORE_KEYS[1]] = weight, bias
    write_safetensors(target / ADAPTER_WEIGHTS, dict(sorted(tensors.items())), metadata={"format": "pt"})
    text = json.dumps(adapter_config(ir, base_name), indent=2, sort_keys=True) + "\n"
    atomic_write_text(target / ADAPTER_CONFIG, text)
    return {"hidden_size": int(weight.shape[1]), "lora_tensors": len(tensors) - 2}


def run_critic_tensors(critic_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run's exported critic (``critic/``: PEFT adapter + ``value_head.safetensors``) as (lora, head)."""
    from safetensors.torch import load_file

    from miniverl.runtime.critic import VALUE_HEAD

    lora = load_file(str(critic_dir / ADAPTER_WEIGHTS))
    head = load_file(str(critic_dir / VALUE_HEAD))
    return lora, head


def critic_model_config(ir: ExperimentIR, config: MiniverlConfig) -> dict[str, Any] | None:
    """PPO: the base model's ``config.json`` (read without weights), after the value-head check."""
    if not isinstance(ir.algorithm, PpoIR):
        return None
    from miniverl.models.sources import resolve

    student = config.models.student
    resolved = resolve(student, fetch=False)
    model_config = dict(resolved.config) if resolved.config is not None else None
    if model_config is None and student.path is not None and (Path(student.path) / "config.json").is_file():
        model_config = bounded.read_json(
            Path(student.path) / "config.json", limit=bounded.MODEL_CONFIG_MAX_BYTES, what="a model config"
        )
    if model_config is None:
        raise UsageError(f"no config.json known for {resolved.label}: the critic's value head cannot be sized")
    require_trained_head(ir, model_config)
    return model_config

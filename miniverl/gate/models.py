"""Model choices for the equivalence gate and the runtime benchmark, with no downloads.

* ``tiny``: a random-init Qwen3 (vocab 128, hidden 64, 2 layers) built in memory (CI);
* ``qwen3-0.6b-shape``: Qwen3-0.6B's architecture from its config, random weights (throughput and
  memory do not depend on weight values);
* ``smollm2``: the embedded SmolLM2-135M-Instruct through ``miniverl.models`` (``source: builtin``).

Random models are built from a fixed seed on every load, so every role and every cell starts
from bit-identical weights. NF4 quantizes the random model through a temporary safetensors
directory (bitsandbytes quantizes on load). Teacher/reference adapters are written as standard
PEFT directories with seeded random LoRA weights (``B != 0``, so the teacher differs from the
untouched student).
"""

from __future__ import annotations

import copy
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from miniverl.canonical import sha256_file, sha256_json
from miniverl.runtime.loading import ADAPTER_CONFIG, ADAPTER_WEIGHTS, LoadedBase, LoadSettings, default_loader

MODEL_CHOICES = ("tiny", "smollm2", "qwen3-0.6b-shape")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


#: the random-weight Qwen3 shapes: a tiny one for tests, and Qwen3-0.6B's for performance work
QWEN3_SHAPES: dict[str, dict[str, Any]] = {
    "tiny": {
        "vocab_size": 128,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "intermediate_size": 128,
        "max_position_embeddings": 1024,
    },
    "qwen3-0.6b-shape": {
        "vocab_size": 151936,
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "intermediate_size": 3072,
        "max_position_embeddings": 40960,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0},
    },
}


def qwen3_config(name: str) -> Any:
    from transformers import Qwen3Config

    if name not in QWEN3_SHAPES:
        raise ValueError(f"no random-weight config named {name!r}")
    common: dict[str, Any] = {"tie_word_embeddings": True, "rms_norm_eps": 1e-6, "bos_token_id": 1, "eos_token_id": 2}
    return Qwen3Config(**copy.deepcopy(QWEN3_SHAPES[name]), **common)


def _build_random(config: Any, seed: int, attn: str) -> Any:
    from transformers import Qwen3ForCausalLM

    config._attn_implementation = attn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    return model


class RandomModelLoader:
    """A :data:`~miniverl.runtime.loading.BaseLoader` that builds the same random model on every load."""

    def __init__(self, name: str, *, seed: int = 0) -> None:
        self.name = name
        self.seed = seed
        self.config = qwen3_config(name)
        self._nf4_dir: tempfile.TemporaryDirectory[str] | None = None
        self._templates: dict[str, Any] = {}  # attention implementation -> fp32 CPU model, built once

    @property
    def identity(self) -> dict[str, Any]:
        return {"random_init": self.name, "seed": self.seed, "config_sha256": sha256_json(self.config.to_dict())}

    def __call__(self, spec: Any, settings: LoadSettings) -> LoadedBase:
        if spec.quantization == "nf4":
            model = self._load_nf4(settings)
        else:
            template = self._templates.get(settings.attn_implementation)
            if template is None:  # random init of 0.6B parameters takes seconds: do it once, copy after
                template = _build_random(qwen3_config(self.name), self.seed, settings.attn_implementation)
                self._templates[settings.attn_implementation] = template
            model = copy.deepcopy(template).to(device=settings.device, dtype=settings.dtype)
        model.eval()
        return LoadedBase(model=model, tokenizer=None, identity={**self.identity, "quantization": spec.quantization})

    def _load_nf4(self, settings: LoadSettings) -> Any:
        from transformers import AutoModelForCausalLM, BitsAndBytesConfig

        if self._nf4_dir is None:
            self._nf4_dir = tempfile.TemporaryDirectory(prefix="miniverl-nf4-")
            model = _build_random(qwen3_config(self.name), self.seed, "eager").to(settings.dtype)
            model.save_pretrained(self._nf4_dir.name)
            del model
        quant = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=settings.dtype,
            bnb_4bit_use_double_quant=False,
        )
        device_map = {"": settings.device.index or 0} if settings.device.type == "cuda" else {"": "cpu"}
        return AutoModelForCausalLM.from_pretrained(
            self._nf4_dir.name,
            quantization_config=quant,
            dtype=settings.dtype,
            attn_implementation=settings.attn_implementation,
            device_map=device_map,
        )

    def close(self) -> None:
        self._templates.clear()
        if self._nf4_dir is not None:
            self._nf4_dir.cleanup()
            self._nf4_dir = None


def smollm2_loader() -> Any:
    """The embedded SmolLM2 through the real model loader (``source: builtin``)."""
    return default_loader


def linear_shapes(config: Any) -> dict[str, tuple[int, int]]:
    """``(in_features, out_features)`` of each LoRA target in one decoder layer."""
    hidden, inter = config.hidden_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or hidden // config.num_attention_heads
    q_out, kv_out = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    return {
        "self_attn.q_proj": (hidden, q_out),
        "self_attn.k_proj": (hidden, kv_out),
        "self_attn.v_proj": (hidden, kv_out),
        "self_attn.o_proj": (q_out, hidden),
        "mlp.gate_proj": (hidden, inter),
        "mlp.up_proj": (hidden, inter),
        "mlp.down_proj": (inter, hidden),
    }


def write_random_adapter(
    config: Any, directory: str | Path, *, seed: int, r: int = 8, alpha: float = 16.0, scale: float = 0.02
) -> str:
    """Write a seeded random LoRA adapter (``A`` and ``B`` nonzero) as a standard PEFT directory.

    Returns the sha256 of ``adapter_model.safetensors`` (the pin a config records).
    """
    from peft import LoraConfig

    from miniverl.canonical import atomic_write_text
    from miniverl.outputs import write_safetensors

    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for layer in range(config.num_hidden_layers):
        for module, (fan_in, fan_out) in linear_shapes(config).items():
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (torch.randn(r, fan_in, generator=gen) * fan_in**-0.5).contiguous()
            tensors[f"{prefix}.lora_B.weight"] = (torch.randn(fan_out, r, generator=gen) * scale).contiguous()
    write_safetensors(target / ADAPTER_WEIGHTS, tensors, metadata={"format": "pt"})
    lora = LoraConfig(
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]
        lora_dropout=0.0,
        target_modules=LORA_TARGETS,
        task_type="CAUSAL_LM",
    )
    cfg = lora.to_dict()
    cfg["target_modules"] = sorted(cfg["target_modules"])
    cfg["base_model_name_or_path"] = None
    cfg = {k: (v.value if hasattr(v, "value") else v) for k, v in cfg.items()}
    atomic_write_text(target / ADAPTER_CONFIG, json.dumps(cfg, sort_keys=True, indent=2, default=sorted))
    return sha256_file(target / ADAPTER_WEIGHTS)


@dataclass
class PreparedModel:
    """What a gate/bench cell needs: a loader, the student spec, a pinned teacher adapter, the vocab."""

    name: str
    loader: Any
    student: dict[str, Any]
    adapter: dict[str, Any]
    vocab_size: int
    workload_scale: float

    def close(self) -> None:
        close = getattr(self.loader, "close", None)
        if callable(close):
            close()


def prepare_model(name: str, workdir: str | Path) -> PreparedModel:
    """Resolve a model choice and write its seeded teacher adapter under ``workdir``."""
    adapter_dir = Path(workdir) / "teacher-adapter"
    if name == "smollm2":
        from miniverl.config.schema import ModelSpec
        from miniverl.models.sources import describe_architecture, resolve

        student = {"source": "builtin", "model_id": "smollm2-135m-instruct"}
        arch = describe_architecture(resolve(ModelSpec.model_validate(student)))
        sha = write_random_adapter(SimpleNamespace(**arch), adapter_dir, seed=11)
        adapter = {"source": "local", "path": str(adapter_dir), "sha256": sha}
        return PreparedModel(name, default_loader, student, adapter, int(arch["vocab_size"]), 1.0)
    if name not in ("tiny", "qwen3-0.6b-shape"):
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODEL_CHOICES)}")
    loader = RandomModelLoader(name)
    sha = write_random_adapter(loader.config, adapter_dir, seed=11)
    adapter = {"source": "local", "path": str(adapter_dir), "sha256": sha}
    student = {"source": "local", "path": f"random-init:{name}"}
    scale = 0.125 if name == "tiny" else 1.0
    return PreparedModel(name, loader, student, adapter, int(loader.config.vocab_size), scale)

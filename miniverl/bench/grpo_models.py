"""What every cell of ``miniverl bench grpo`` builds: the seeded random model, the id tokenizer, the dual-model
role runtime (LoRA r16) and its AdamW, and the update sequences."""

from __future__ import annotations

import copy
import gc
from types import SimpleNamespace
from typing import Any

import torch

from miniverl.gate.models import LORA_TARGETS


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release(device: torch.device) -> None:
    from miniverl.rollout.engine import release_engines

    release_engines()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def random_config(name: str) -> Any:
    """The config of a model shape: Qwen3 (``tiny``, ``qwen3-0.6b-shape``) or SmolLM2-135M's Llama shape."""
    if name == "smollm2-shape":
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=49152, hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
            intermediate_size=1536, max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, bos_token_id=1, eos_token_id=2,
        )  # fmt: skip
    from miniverl.gate.models import qwen3_config

    return qwen3_config(name)


class RandomLoader:
    """A role-runtime loader: the same seeded random model (sdpa) on every load, no tokenizer."""

    def __init__(self, name: str, seed: int) -> None:
        self.name, self.seed = name, seed
        self.config = random_config(name)
        self._template: Any = None

    def model(self, device: torch.device, dtype: torch.dtype) -> Any:
        from transformers import AutoModelForCausalLM

        if self._template is None:
            config = copy.deepcopy(self.config)
            config._attn_implementation = "sdpa"
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                self._template = AutoModelForCausalLM.from_config(config)
        return copy.deepcopy(self._template).to(device=device, dtype=dtype).eval()

    def __call__(self, spec: Any, settings: Any) -> Any:
        from miniverl.runtime.loading import LoadedBase

        model = self.model(settings.device, settings.dtype)
        return LoadedBase(model=model, tokenizer=None, identity={"random_init": self.name, "seed": self.seed})


class IdTokenizer:
    """Prompts are space-separated token ids; responses decode to nothing (the bench never reads them)."""

    chat_template = None
    pad_token_id = 0
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        return {"input_ids": [int(t) for t in text.split()]}

    def decode(self, ids: Any, skip_special_tokens: bool = True) -> str:
        return ""


def role_runtime(
    loader: RandomLoader, device: torch.device, dtype_name: str, train_batch: int, checkpointing: int = 0,
    quantization: str = "none",
) -> Any:  # fmt: skip
    """A dual-model role runtime on the random model (LoRA r16, seeded init); ``.bench_config`` is what
    :func:`grpo_update` reads. ``quantization: nf4`` (a Qwen3 shape): the gate's random model, quantized by
    bitsandbytes on load, as training loads an NF4 student."""
    from miniverl.config.schema import ModelsSection
    from miniverl.gate.models import RandomModelLoader
    from miniverl.gate.workload import set_student_init
    from miniverl.runtime import build_runtime

    section = ModelsSection.model_validate(
        {
            "runtime": "dual_model",
            "dtype": dtype_name,
            "attn_implementation": "sdpa",
            "student": {"source": "local", "path": f"random-init:{loader.name}", "quantization": quantization,
                        "lora": {"r": 16, "alpha": 32, "dropout": 0.0, "target_modules": LORA_TARGETS}},
        }
    )  # fmt: skip
    load: Any = RandomModelLoader(loader.name, seed=loader.seed) if quantization == "nf4" else loader
    runtime: Any = build_runtime(section, device=device, loader=load, activation_checkpointing=checkpointing)
    set_student_init(runtime, seed=loader.seed + 1)
    runtime.bench_config = SimpleNamespace(  # what grpo_update reads
        algorithm=SimpleNamespace(grpo=grpo_section()),
        train=SimpleNamespace(logprob_chunk_size=1024, trajectory_batch_size=train_batch),
    )
    return runtime


def grpo_section() -> Any:
    from miniverl.config.schema import GrpoSection

    return GrpoSection()


class AdapterTrainer:
    """AdamW over the runtime's adapter (fp32, or bf16 with fp32 masters), clipped at 1.0 like training."""

    def __init__(self, runtime: Any, lr: float, bf16_master: bool) -> None:
        from miniverl.training.update import Bf16MasterAdapter

        params = runtime.trainable_parameters()
        self.master = Bf16MasterAdapter(params) if bf16_master else None
        self.params = self.master.masters if self.master is not None else params
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, weight_decay=0.0)
        self.model_params = params

    def step(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model_params, 1.0)
        if self.master is not None:
            self.master.step(self.optimizer)
        else:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def update_sequences(rows: list[tuple[list[int], list[int]]], advantages: list[float]) -> list[Any]:
    from miniverl.training.update import UpdateSequence

    return [
        UpdateSequence(
            student_ids=tuple(prompt + response),
            response_start=len(prompt),
            teacher_ids=None,
            teacher_response_start=None,
            response_len=len(response),
            advantage=adv,
        )
        for (prompt, response), adv in zip(rows, advantages, strict=True)
    ]

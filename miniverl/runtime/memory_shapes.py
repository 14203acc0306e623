"""What the memory plan measures with: the decoder's dimensions, one cycle's workload as far as memory goes, the
bytes per element of each dtype and the KV cache's size. Pure arithmetic (no torch, no device)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

GIB = float(1 << 30)
KV_SPAN_QUANTUM = 64  # the fast engine rounds its cache capacity up to this (rollout/decoder.py SPAN_QUANTUM)
DTYPE_BYTES = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0}
#: 4-bit weights, an 8-bit absmax per block of 64 and an fp32 absmax per 256 blocks: bitsandbytes' double
#: quantization, which miniverl's NF4 loads use (``load_causal_lm``'s ``nf4_double_quant``)
NF4_BYTES_PER_PARAM = 0.5 + 1 / 64 + 4 / (64 * 256)


@dataclass(frozen=True)
class DecoderDims:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool = True

    @classmethod
    def from_hf_config(cls, config: Any) -> DecoderDims:
        heads = int(config.num_attention_heads)
        head_dim = getattr(config, "head_dim", None) or int(config.hidden_size) // heads
        return cls(
            layers=int(config.num_hidden_layers),
            hidden=int(config.hidden_size),
            heads=heads,
            kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
            head_dim=int(head_dim),
            intermediate=int(config.intermediate_size),
            vocab=int(config.vocab_size),
            tied_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each Llama-family linear in one decoder layer."""
        h, i = self.hidden, self.intermediate
        return {
            "q_proj": (h, self.q_dim),
            "k_proj": (h, self.kv_dim),
            "v_proj": (h, self.kv_dim),
            "o_proj": (self.q_dim, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def base_params(self) -> int:
        embeddings = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return self.linear_params() + self.layers * 2 * self.hidden + embeddings + self.hidden

    def linear_params(self) -> int:
        """The decoder layers' linear weights: what an NF4 load quantizes (embeddings, LM head and norms stay in
        the model's dtype)."""
        return self.layers * sum(a * b for a, b in self.module_shapes().values())

    def base_weight_bytes(self, element_bytes: float, *, quantized: bool) -> float:
        """The base model's weights on the device: every parameter at ``element_bytes``, or with ``quantized`` the
        decoder's linears at :data:`NF4_BYTES_PER_PARAM` and the rest at ``element_bytes``."""
        if not quantized:
            return self.base_params() * element_bytes
        linears = self.linear_params()
        return linears * NF4_BYTES_PER_PARAM + (self.base_params() - linears) * element_bytes

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        shapes = self.module_shapes()
        return self.layers * sum(rank * (shapes[t][0] + shapes[t][1]) for t in targets if t in shapes)

    def lora_input_elements(self, targets: Sequence[str]) -> int:
        """Per token and layer, the elements of every LoRA target's input (PEFT casts each one)."""
        shapes = self.module_shapes()
        return sum(shapes[t][0] for t in targets if t in shapes)


@dataclass(frozen=True)
class Workload:
    """What one cycle runs, as far as memory goes."""

    dtype: Literal["float32", "bfloat16", "float16"]
    adapter_precision: Literal["fp32", "bf16_master"]
    lora_rank: int
    lora_targets: tuple[str, ...]
    row_tokens: int  # longest trajectory: prompt + new tokens
    update_rows: int  # trajectories of one optimizer step (the largest micro-batch worth having)
    logprob_chunk: int
    rollout_rows: int  # one rollout batch
    rollout_capacity: int  # its KV slots per row (prompt + new tokens)
    fast_engine: bool  # the folded copy and static cache stay resident between cycles
    extra_models: int = 0  # frozen/critic models loaded beside the student (dual_model, resident)
    quantized: bool = False  # NF4 student base
    vllm_engine: bool = False  # a colocated vLLM samples: awake in the rollout phase, asleep (level 1) in the update
    fused_kernels: bool = False  # RMSNorm and SwiGLU through fused kernels (miniverl.runtime.fused): fewer copies kept


def kv_cache_bytes(dims: DecoderDims, rows: int, capacity: int, element_bytes: float) -> float:
    """K and V of every layer for ``rows`` x ``capacity`` slots."""
    return 2.0 * dims.layers * rows * capacity * dims.kv_dim * element_bytes

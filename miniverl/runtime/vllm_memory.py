"""What the memory plan gives a colocated vLLM: the bytes it holds awake and its share of the device
(``gpu_memory_utilization``), with the limits it is built with. Pure arithmetic (no torch, no device, no vllm)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from miniverl.runtime.memory_shapes import GIB, DecoderDims, Workload, kv_cache_bytes

#: What a colocated vLLM holds beyond its weights, adapter slot and rollout KV cache while it is awake: the profile
#: run's activations at max_num_seqs rows, its sampler's buffers, CUDA graphs and the non-torch memory it counts
#: (cuBLAS, NCCL). An upper bound, not a fit: the H100 smoke ran at 0.3 of 80 GiB; each run's metrics carry the
#: share this plan gave (``rollout/vllm_memory_share``) so the bound can be fitted to measured runs.
VLLM_RUNTIME_BYTES = 3.0 * GIB
#: the KV cache vLLM must be able to hold: the rollout's rows at their full length, twice over (vLLM allocates
#: in 16-token blocks and keeps a prefix cache beside the running rows)
VLLM_KV_MARGIN = 2.0
VLLM_MAX_SHARE = 0.9  # vLLM's own default ceiling: the trainer keeps the rest


@dataclass(frozen=True)
class VllmMemory:
    """What the memory plan gives a colocated vLLM: ``gpu_memory_utilization`` and the limits it is built with."""

    share: float  # vLLM's gpu_memory_utilization: its bytes over the device's total
    need_bytes: float
    #: vLLM's KV cache, given outright (``kv_cache_memory_bytes``) rather than left to vLLM's profiling, which reads
    #: the whole device's free memory and so miscounts (or asserts) when another process allocates or frees meanwhile
    kv_cache_bytes: int
    max_model_len: int  # the longest row (prompt + new tokens): vLLM profiles and reserves for no more
    max_num_seqs: int  # one rollout batch

    def metrics(self) -> dict[str, float]:
        return {"rollout/vllm_memory_share": self.share, "rollout/vllm_planned_gib": self.need_bytes / GIB}


def vllm_kv_cache_bytes(dims: DecoderDims, *, rollout_rows: int, capacity: int) -> int:
    """vLLM's bf16 KV cache for the rollout's rows at full length, with :data:`VLLM_KV_MARGIN`."""
    return math.ceil(VLLM_KV_MARGIN * kv_cache_bytes(dims, max(1, rollout_rows), capacity, 2.0))


def vllm_need_bytes(
    dims: DecoderDims, *, rollout_rows: int, capacity: int, lora_rank: int, targets: Sequence[str]
) -> float:
    """Bytes a colocated vLLM holds awake: bf16 weights, one bf16 LoRA slot, the rollout's KV cache
    (:func:`vllm_kv_cache_bytes`) and :data:`VLLM_RUNTIME_BYTES`."""
    weights = dims.base_params() * 2.0
    adapter = dims.lora_params(lora_rank, targets) * 2.0
    kv = vllm_kv_cache_bytes(dims, rollout_rows=rollout_rows, capacity=capacity)
    return weights + adapter + kv + VLLM_RUNTIME_BYTES


def vllm_memory(
    dims: DecoderDims, work: Workload, *, device_bytes: float, lora_targets: Sequence[str] | None = None
) -> VllmMemory:
    """vLLM's share of a ``device_bytes`` GPU for ``work``'s rollout: what it needs, rounded up to a hundredth.

    Raises ``ValueError`` where that is more than :data:`VLLM_MAX_SHARE` of the device."""
    if device_bytes <= 0:
        raise ValueError("device_bytes must be positive")
    need = vllm_need_bytes(
        dims,
        rollout_rows=work.rollout_rows,
        capacity=work.rollout_capacity,
        lora_rank=work.lora_rank,
        targets=work.lora_targets if lora_targets is None else lora_targets,
    )
    share = -(-round(need / device_bytes * 1e6) // 10_000) / 100  # up to the next hundredth (1e-6 absorbs float noise)
    if share > VLLM_MAX_SHARE:
        raise ValueError(
            f"vLLM needs {need / GIB:.2f} GiB for this rollout, more than {VLLM_MAX_SHARE:.0%} of the device's "
            f"{device_bytes / GIB:.2f} GiB"
        )
    return VllmMemory(
        share=share,
        need_bytes=need,
        kv_cache_bytes=vllm_kv_cache_bytes(dims, rollout_rows=work.rollout_rows, capacity=work.rollout_capacity),
        max_model_len=work.rollout_capacity,
        max_num_seqs=max(1, work.rollout_rows),
    )

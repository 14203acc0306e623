"""Private helpers shared by the chunked log-prob and divergence functions.

The contract every chunked function keeps: the caller gathers the hidden states of the positions it
trains on (``[N, H]``), and the vocabulary projection happens here in ``[chunk, V]`` row pieces, so
no ``[B, T, V]`` (nor ``[N, V]``) logits tensor is ever alive at once. With autograd on, each piece
runs under non-reentrant activation checkpointing, so the backward pass also holds one piece at a
time (at the price of recomputing each piece's projection once).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 when any input is float64, else float32 (bf16/fp16 are upcast, never kept)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, int | float) and math.isfinite(temperature) and temperature > 0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")


def check_chunk_size(chunk_size: int) -> None:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")


def check_projection(name: str, hidden: Tensor, head_weight: Tensor) -> None:
    """``hidden`` must be ``[N, H]`` and ``head_weight`` ``[V, H]`` (an ``lm_head.weight``)."""
    if hidden.dim() != 2:
        raise ValueError(
            f"{name}: hidden states must be 2-D [N, H] (gather the trained positions first), "
            f"got shape {tuple(hidden.shape)}"
        )
    if head_weight.dim() != 2 or head_weight.shape[1] != hidden.shape[1]:
        raise ValueError(
            f"{name}: head weight must be [V, H] with H={hidden.shape[1]} matching the hidden states, "
            f"got shape {tuple(head_weight.shape)}"
        )
    if not hidden.is_floating_point() or not head_weight.is_floating_point():
        raise ValueError(f"{name}: hidden states and head weight must be floating point tensors")


def matmul_operands(hidden: Tensor, head_weight: Tensor) -> tuple[Tensor, Tensor]:
    """Bring both operands to one dtype (promoted) once, outside the chunk loop."""
    dtype = torch.promote_types(hidden.dtype, head_weight.dtype)
    return hidden.to(dtype), head_weight.to(dtype)


def tempered_logits(hidden: Tensor, head_weight: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
    """``(hidden @ head_weight^T).to(dtype) / temperature`` for one ``[chunk, H]`` piece."""
    logits = (hidden @ head_weight.t()).to(dtype)
    if temperature != 1.0:
        logits = logits / temperature
    return logits


def needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def run_chunk(fn: Callable[..., Tensor | tuple[Tensor, ...]], *args: Tensor) -> Tensor | tuple[Tensor, ...]:
    """Call ``fn(*args)``, under activation checkpointing when autograd will need the result."""
    if needs_grad(*args):
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False)
    return fn(*args)


def log1mexp(x: Tensor) -> Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, stable on both ends (Mächler 2012).

    Inputs slightly above 0 (rounding of a log-sum that should be <= 0) are clamped to 0, which
    gives ``-inf``; callers clamp the result to a floor.
    """
    x = x.clamp_max(0.0)
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def log_floor(dtype: torch.dtype) -> float:
    """Smallest log-probability a bucket may take: ``log(finfo(dtype).tiny)``.

    Used for the tail bucket of top-k objectives so that an empty tail (k = V, or a top-k that
    holds all the mass up to rounding) contributes ``tiny * 0`` instead of ``0 * inf``.
    """
    return math.log(torch.finfo(dtype).tiny)

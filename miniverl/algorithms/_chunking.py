"""Private helpers shared by the chunked log-prob and divergence functions.

The contract every chunked function keeps: the caller gathers the hidden states of the positions it
trains on (``[N, H]``), and the vocabulary projection happens here in ``[chunk, V]`` row pieces, so
no ``[B, T, V]`` (nor ``[N, V]``) logits tensor is ever alive at once. With autograd on, each piece
runs under non-reentrant activation checkpointing, so the backward pass also holds one piece at a
time (at the price of recomputing each piece's projection once).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

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


def map_row_chunks(
    fn: Callable[..., Tensor | tuple[Tensor, ...]],
    rows: Sequence[Tensor],
    shared: Sequence[Tensor],
    *,
    chunk_size: int,
    n_out: int,
    dtype: torch.dtype,
) -> tuple[Tensor, ...]:
    """``fn(*row_chunks, *shared)`` over ``[chunk_size]`` row slices of ``rows``; ``n_out`` ``[N]`` results.

    ``fn`` returns ``n_out`` per-row tensors for its slice (checkpointed when grad is needed). The
    results are written into outputs allocated *before* the loop rather than concatenated after it:
    keeping many small per-chunk tensors alive between the large ``[chunk, V]`` temporaries
    fragments the CPU heap (glibc), and peak RSS then grows with N as if ``[N, V]`` were kept.
    """
    n = rows[0].shape[0]
    device = rows[0].device
    outs = [torch.empty(n, dtype=dtype, device=device) for _ in range(n_out)]
    for start in range(0, n, chunk_size):
        sl = slice(start, start + chunk_size)
        res = run_chunk(fn, *(r[sl] for r in rows), *shared)
        for out, piece in zip(outs, res if isinstance(res, tuple) else (res,), strict=True):
            out[sl] = piece
    if n == 0 and needs_grad(*rows, *shared):  # keep an (empty) graph so callers can still backward
        anchor = sum(
            (t.sum().to(dtype) for t in (*rows, *shared) if t.requires_grad),
            torch.zeros((), dtype=dtype, device=device),
        )
        outs = [o + 0.0 * anchor for o in outs]
    return tuple(outs)


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

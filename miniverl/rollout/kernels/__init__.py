"""Triton kernels for the fast decode step, optional: miniverl imports and runs without triton.

:mod:`~miniverl.rollout.kernels.triton_ops` holds two kernels for one decode step (one new
token per row) and their launchers, :mod:`~miniverl.rollout.kernels.triton_attention` the third:

* ``qk_norm_rope_cache_write``: per-head q/k RMSNorm (Qwen3's ``qk_norm``), RoPE at each row's
  position, the K/V write into each row's cache slot, q out pre-scaled;
* ``add_rms_norm``: residual add + RMSNorm in one pass;
* ``silu_mul``: the MLP's ``silu(gate) * up``.

:mod:`~miniverl.rollout.kernels.triton_attention` holds ``decode_attention``: attention of the new
token over the first ``span`` cache slots on tensor cores (``tl.dot``), each KV head's query heads in
one tile (GQA), float32 online softmax, split over the span (flash-decoding) and combined.

:mod:`~miniverl.rollout.kernels.triton_gemm` holds the projections' GEMM for a decode step's few
rows, split over K into float32 partial sums (``skinny_linear_partials``); the kernels above take
those parts as their input and sum them first, so the split costs no extra launch.

Their references are the decoder's own torch functions (:func:`~miniverl.rollout.decoder.qk_norm_rope`,
:func:`~miniverl.rollout.decoder.attend`, :func:`~miniverl.rollout.decoder.add_rms_norm`).
triton is imported on first use only: by :func:`load_triton_ops` / :func:`load_triton_gemm`, or by
the decoder's triton step importing ``triton_attention``. On CPU the kernels run only under
triton's interpreter (``TRITON_INTERPRET=1`` before triton is first imported): that is how they are
tested without a GPU.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

KERNEL_CHOICES = ("torch", "triton")


def load_triton_ops() -> ModuleType:
    """The triton kernel module (imports triton; raises ImportError when it is not installed)."""
    return importlib.import_module("miniverl.rollout.kernels.triton_ops")


def load_triton_gemm() -> ModuleType:
    """The split-K GEMM module (imports triton; raises ImportError when it is not installed)."""
    return importlib.import_module("miniverl.rollout.kernels.triton_gemm")


def triton_unavailable_reason(device: torch.device) -> str | None:
    """``None`` when the triton kernels can run on ``device``, else one line saying why not."""
    if device.type not in ("cuda", "cpu"):
        return f"triton kernels run on CUDA (or on CPU under TRITON_INTERPRET=1), not on {device.type}"
    try:
        ops = load_triton_ops()
    except ImportError as exc:
        return f"triton is not importable ({exc}); install triton or use kernels='torch'"
    if device.type == "cpu" and not ops.INTERPRETED:
        return "triton kernels run on CPU only under the interpreter: set TRITON_INTERPRET=1 before triton is imported"
    return None


__all__ = ["KERNEL_CHOICES", "load_triton_gemm", "load_triton_ops", "triton_unavailable_reason"]

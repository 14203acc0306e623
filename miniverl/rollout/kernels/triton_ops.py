"""Triton kernels of one decode step (one new token per row) and their launchers.

Layouts are the decoder's (:mod:`miniverl.rollout.decoder`): ``mixed`` ``[B, 1, h + 2 kv, d]`` is
the stacked q/k/v projection, the caches are ``[B, kv, capacity, d]``, the RoPE tables
``[capacity, d]`` (``sin`` carries rotate_half's sign); the decode attention lives in
:mod:`~miniverl.rollout.kernels.triton_attention`. Every kernel computes in float32 and rounds once
when it stores.
Whether kernels are interpreted is fixed when they are decorated: triton's own (``tl.sum``) at
``import triton``, ours at the import of this module. :data:`INTERPRETED` says whether both were
(``TRITON_INTERPRET=1`` before triton's first import), which is what a CPU run needs.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction


@triton.jit
def _qk_norm_rope_cache_kernel(
    mixed_ptr,
    norm_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_mixed_row,
    stride_pos,
    stride_slot,
    stride_cache_row,
    stride_cache_head,
    stride_cache_slot,
    eps,
    HEADS: tl.constexpr,
    KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_NORM: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. h-1: q, h .. h+kv-1: k, then v
    offs = tl.arange(0, BLOCK_D)
    in_head = offs < HEAD_DIM
    source = mixed_ptr + row * stride_mixed_row + head * HEAD_DIM
    x = tl.load(source + offs, mask=in_head, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + row * stride_slot)
    cache_offset = row * stride_cache_row + slot * stride_cache_slot + offs
    if head >= HEADS + KV_HEADS:
        v_head = head - HEADS - KV_HEADS
        target = v_cache_ptr + cache_offset + v_head * stride_cache_head
        tl.store(target, x.to(v_cache_ptr.dtype.element_ty), mask=in_head)
    else:
        # roll(x, d/2)[i] = x[(i + d/2) % d]: the partner lane of RoPE's rotation
        partner = (offs + HEAD_DIM // 2) % HEAD_DIM
        xp = tl.load(source + partner, mask=in_head, other=0.0).to(tl.float32)
        if HAS_NORM:
            rstd = tl.rsqrt(tl.sum(x * x, axis=0) / HEAD_DIM + eps)
            weights = norm_ptr + head * HEAD_DIM
            x = x * rstd * tl.load(weights + offs, mask=in_head, other=0.0).to(tl.float32)
            xp = xp * rstd * tl.load(weights + partner, mask=in_head, other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + row * stride_pos)
        cos = tl.load(cos_ptr + pos * HEAD_DIM + offs, mask=in_head, other=0.0).to(tl.float32)
        sin = tl.load(sin_ptr + pos * HEAD_DIM + offs, mask=in_head, other=0.0).to(tl.float32)
        y = x * cos + xp * sin
        if head < HEADS:
            tl.store(q_ptr + (row * HEADS + head) * HEAD_DIM + offs, y.to(q_ptr.dtype.element_ty), mask=in_head)
        else:
            target = k_cache_ptr + cache_offset + (head - HEADS) * stride_cache_head
            tl.store(target, y.to(k_cache_ptr.dtype.element_ty), mask=in_head)


def qk_norm_rope_cache_write(
    mixed: torch.Tensor,
    qk_norm: torch.Tensor | None,
    cos_table: torch.Tensor,
    sin_table: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> torch.Tensor:
    """q ``[B, h, 1, d]`` (normed, rotated, pre-scaled); writes row ``b``'s k and v into slot ``slots[b]``.

    ``positions`` ``[B]`` index the RoPE tables; ``slots`` is ``[B]`` or ``[1]`` (one slot for all rows).
    """
    batch, seq, mixed_heads, head_dim = mixed.shape
    if seq != 1 or mixed_heads != heads + 2 * kv_heads or mixed.stride(-1) != 1 or mixed.stride(2) != head_dim:
        raise ValueError(f"mixed must be [B, 1, {heads + 2 * kv_heads}, {head_dim}] with packed heads")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k and v caches must share one layout with a contiguous last dim")
    if not (cos_table.is_contiguous() and sin_table.is_contiguous()) or cos_table.shape[-1] != head_dim:
        raise ValueError(f"RoPE tables must be contiguous [capacity, {head_dim}]")
    q = torch.empty((batch, heads, 1, head_dim), dtype=mixed.dtype, device=mixed.device)
    norm = qk_norm if qk_norm is not None else cos_table  # never read without HAS_NORM
    if qk_norm is not None and not qk_norm.is_contiguous():
        raise ValueError("qk_norm must be contiguous")
    _qk_norm_rope_cache_kernel[(batch, heads + 2 * kv_heads)](
        mixed,
        norm,
        cos_table,
        sin_table,
        positions,
        slots,
        q,
        k_cache,
        v_cache,
        mixed.stride(0),
        positions.stride(0) if positions.numel() > 1 else 0,
        slots.stride(0) if slots.numel() > 1 else 0,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        eps,
        HEADS=heads,
        KV_HEADS=kv_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=triton.next_power_of_2(head_dim),
        HAS_NORM=qk_norm is not None,
    )
    return q


@triton.jit
def _add_rms_norm_kernel(
    residual_ptr,
    update_ptr,
    weight_ptr,
    residual_out_ptr,
    normed_ptr,
    stride_residual,
    stride_update,
    eps,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_UPDATE: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < WIDTH
    x = tl.load(residual_ptr + row * stride_residual + offs, mask=inside, other=0.0).to(tl.float32)
    if HAS_UPDATE:
        added = x + tl.load(update_ptr + row * stride_update + offs, mask=inside, other=0.0).to(tl.float32)
        # the norm reads the residual as stored (rounded to its dtype), as the unfused decoder does
        stored = added.to(residual_out_ptr.dtype.element_ty)
        tl.store(residual_out_ptr + row * WIDTH + offs, stored, mask=inside)
        x = stored.to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / WIDTH + eps)
    weight = tl.load(weight_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(normed_ptr + row * WIDTH + offs, (x * rstd * weight).to(normed_ptr.dtype.element_ty), mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(-1) != 1:
        raise ValueError("the last dim must be contiguous")
    return rows


def add_rms_norm(
    residual: torch.Tensor, update: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + update, rms_norm(residual + update) * weight)``; without ``update``, ``(residual, rms_norm)``."""
    width = residual.shape[-1]
    if weight.shape != (width,) or (update is not None and update.shape != residual.shape):
        raise ValueError(f"update must match residual {tuple(residual.shape)} and weight be [{width}]")
    rows = _rows(residual)
    updates = _rows(update) if update is not None else rows
    new_residual = residual  # never written without an update
    if update is not None:
        new_residual = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    normed = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    _add_rms_norm_kernel[(rows.shape[0],)](
        rows,
        updates,
        weight,
        new_residual,
        normed,
        rows.stride(0),
        updates.stride(0),
        eps,
        WIDTH=width,
        BLOCK=triton.next_power_of_2(width),
        HAS_UPDATE=update is not None,
    )
    return new_residual, normed


INTERPRETED = isinstance(tl.sum, InterpretedFunction) and isinstance(_add_rms_norm_kernel, InterpretedFunction)

__all__ = ["INTERPRETED", "add_rms_norm", "qk_norm_rope_cache_write"]

"""Triton kernels of one decode step (one new token per row) and their launchers.

Layouts are the decoder's (:mod:`miniverl.rollout.decoder`): ``mixed`` ``[B, 1, h + 2 kv, d]`` is
the stacked q/k/v projection, the caches are ``[B, kv, capacity, d]``, the RoPE tables
``[capacity, d]`` (``sin`` carries rotate_half's sign); the decode attention lives in
:mod:`~miniverl.rollout.kernels.triton_attention`. Every kernel computes in float32 and rounds once
when it stores. A projection may come as split-K parts ``[S, rows, width]`` (float32 partial sums, from
:func:`~miniverl.rollout.kernels.triton_gemm.skinny_linear_partials`): the kernel that reads it
sums the ``S`` parts in float32 first, so the reduction costs no launch of its own.
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
def _sum_parts(ptr, PARTS: tl.constexpr, stride_part, offsets, mask):
    """float32 sum over ``PARTS`` split-K parts ``stride_part`` apart (one part: a plain load), in order."""
    total = tl.load(ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    for part in tl.static_range(1, PARTS):  # unrolled: every part's load is issued up front
        total += tl.load(ptr + part * stride_part + offsets, mask=mask, other=0.0).to(tl.float32)
    return total


@triton.jit
def _projected(source, bias, PARTS: tl.constexpr, stride_part, offsets, mask, dtype_ptr, HAS_BIAS: tl.constexpr):
    """The projection's value as the unfused path has it: parts summed (+ bias), rounded to the compute dtype."""
    x = _sum_parts(source, PARTS, stride_part, offsets, mask)
    if HAS_BIAS:
        x += tl.load(bias + offsets, mask=mask, other=0.0).to(tl.float32)
    return x.to(dtype_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _qk_norm_rope_cache_kernel(
    mixed_ptr,
    bias_ptr,
    norm_ptr,
    cos_ptr,
    sin_ptr,
    pos_ptr,
    slot_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    stride_mixed_part,
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
    PARTS: tl.constexpr,
    HAS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    head = tl.program_id(1)  # 0 .. h-1: q, h .. h+kv-1: k, then v
    offs = tl.arange(0, BLOCK_D)
    in_head = offs < HEAD_DIM
    source = mixed_ptr + row * stride_mixed_row + head * HEAD_DIM
    x = _projected(source, bias_ptr + head * HEAD_DIM, PARTS, stride_mixed_part, offs, in_head, q_ptr, HAS_BIAS)
    slot = tl.load(slot_ptr + row * stride_slot)
    cache_offset = row * stride_cache_row + slot * stride_cache_slot + offs
    if head >= HEADS + KV_HEADS:
        v_head = head - HEADS - KV_HEADS
        target = v_cache_ptr + cache_offset + v_head * stride_cache_head
        tl.store(target, x.to(v_cache_ptr.dtype.element_ty), mask=in_head)
    else:
        # roll(x, d/2)[i] = x[(i + d/2) % d]: the partner lane of RoPE's rotation
        partner = (offs + HEAD_DIM // 2) % HEAD_DIM
        xp = _projected(source, bias_ptr + head * HEAD_DIM, PARTS, stride_mixed_part, partner, in_head, q_ptr, HAS_BIAS)
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
    *,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """q ``[B, h, 1, d]`` (normed, rotated, pre-scaled); writes row ``b``'s k and v into slot ``slots[b]``.

    ``mixed`` is the stacked q/k/v projection: ``[B, 1, h + 2 kv, d]``, or split-K parts ``[S, B,
    (h + 2 kv) d]`` whose float32 sum (``+ bias`` ``[(h + 2 kv) d]`` if given) is rounded to the
    caches' dtype before the norm, as ``F.linear`` would round it; q comes out in ``mixed``'s dtype,
    or the caches' for parts. ``positions`` ``[B]`` index the RoPE tables; ``slots`` is ``[B]`` or
    ``[1]`` (one slot for all rows).
    """
    head_dim = cos_table.shape[-1]
    width = (heads + 2 * kv_heads) * head_dim
    if mixed.ndim == 3:
        parts, dtype = mixed, k_cache.dtype
        if parts.shape[2] != width or parts.stride(2) != 1:
            raise ValueError(f"split-K parts must be [S, B, {width}] with a contiguous last dim")
    else:
        packed = mixed.stride(-1) == 1 and mixed.stride(2) == head_dim
        if mixed.shape[1:] != (1, heads + 2 * kv_heads, head_dim) or not packed:
            raise ValueError(f"mixed must be [B, 1, {heads + 2 * kv_heads}, {head_dim}] with packed heads")
        parts, dtype = mixed.as_strided((1, mixed.shape[0], width), (0, mixed.stride(0), 1)), mixed.dtype
    batch = parts.shape[1]
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k and v caches must share one layout with a contiguous last dim")
    if not (cos_table.is_contiguous() and sin_table.is_contiguous()):
        raise ValueError(f"RoPE tables must be contiguous [capacity, {head_dim}]")
    if bias is not None and (bias.shape != (width,) or not bias.is_contiguous()):
        raise ValueError(f"bias must be a contiguous [{width}]")
    q = torch.empty((batch, heads, 1, head_dim), dtype=dtype, device=mixed.device)
    norm = qk_norm if qk_norm is not None else cos_table  # never read without HAS_NORM
    if qk_norm is not None and not qk_norm.is_contiguous():
        raise ValueError("qk_norm must be contiguous")
    _qk_norm_rope_cache_kernel[(batch, heads + 2 * kv_heads)](
        parts,
        bias if bias is not None else cos_table,  # never read without HAS_BIAS
        norm,
        cos_table,
        sin_table,
        positions,
        slots,
        q,
        k_cache,
        v_cache,
        parts.stride(0),
        parts.stride(1),
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
        PARTS=parts.shape[0],
        HAS_NORM=qk_norm is not None,
        HAS_BIAS=bias is not None,
    )
    return q


@triton.jit
def _add_rms_norm_kernel(
    residual_ptr,
    update_ptr,
    bias_ptr,
    weight_ptr,
    residual_out_ptr,
    normed_ptr,
    stride_residual,
    stride_update_part,
    stride_update,
    eps,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    PARTS: tl.constexpr,
    HAS_UPDATE: tl.constexpr,
    HAS_BIAS: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < WIDTH
    x = tl.load(residual_ptr + row * stride_residual + offs, mask=inside, other=0.0).to(tl.float32)
    if HAS_UPDATE:
        update = _sum_parts(update_ptr + row * stride_update, PARTS, stride_update_part, offs, inside)
        if HAS_BIAS:
            update += tl.load(bias_ptr + offs, mask=inside, other=0.0).to(tl.float32)
        # the norm reads the residual as stored (rounded to its dtype), as the unfused decoder does
        stored = (x + update).to(residual_out_ptr.dtype.element_ty)
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


def _split_parts(update: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, int, int, int]:
    """``(tensor, parts, part stride, row stride)`` of an update shaped like ``residual`` (one part) or
    split-K parts ``[S, rows, width]`` (several)."""
    if update.shape == residual.shape:
        rows = _rows(update)
        return rows, 1, 0, rows.stride(0)
    width = residual.shape[-1]
    expected = (residual.numel() // width, width)
    if update.ndim != 3 or update.shape[1:] != expected or update.stride(2) != 1:
        raise ValueError(f"update must match residual {tuple(residual.shape)} or be split-K parts [S, *{expected}]")
    return update, update.shape[0], update.stride(0), update.stride(1)


def add_rms_norm(
    residual: torch.Tensor,
    update: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    *,
    bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + update, rms_norm(residual + update) * weight)``; without ``update``, ``(residual, rms_norm)``.

    ``update`` is shaped like ``residual``, or split-K parts ``[S, rows, width]`` (float32 partial
    sums): the parts are summed in float32 (``+ bias`` ``[width]`` if given) and added to the
    residual, rounded to its dtype once when stored; the norm reads the stored residual.
    """
    width = residual.shape[-1]
    if weight.shape != (width,) or (bias is not None and (bias.shape != (width,) or update is None)):
        raise ValueError(f"weight (and bias, which needs an update) must be [{width}]")
    rows = _rows(residual)
    no_update = (rows, 1, 0, 0)  # never read without HAS_UPDATE
    updates, parts, stride_part, stride_update = no_update if update is None else _split_parts(update, residual)
    new_residual = residual  # never written without an update
    if update is not None:
        new_residual = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    normed = torch.empty(residual.shape, dtype=residual.dtype, device=residual.device)
    _add_rms_norm_kernel[(rows.shape[0],)](
        rows,
        updates,
        bias if bias is not None else weight,  # never read without HAS_BIAS
        weight,
        new_residual,
        normed,
        rows.stride(0),
        stride_part,
        stride_update,
        eps,
        WIDTH=width,
        BLOCK=triton.next_power_of_2(width),
        PARTS=parts,
        HAS_UPDATE=update is not None,
        HAS_BIAS=bias is not None,
    )
    return new_residual, normed


@triton.jit
def _silu_mul_kernel(
    parts_ptr,
    out_ptr,
    stride_part,
    stride_row,
    WIDTH: tl.constexpr,
    BLOCK: tl.constexpr,
    PARTS: tl.constexpr,
):
    """Row ``r``, columns ``c``: ``silu(gate) * up`` with gate/up the summed parts rounded to the output dtype."""
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = cols < WIDTH
    source = parts_ptr + row * stride_row
    dtype = out_ptr.dtype.element_ty
    gate = _sum_parts(source, PARTS, stride_part, cols, inside).to(dtype).to(tl.float32)
    up = _sum_parts(source + WIDTH, PARTS, stride_part, cols, inside).to(dtype).to(tl.float32)
    # torch's silu on a low-precision tensor: x / (1 + exp(-x)) in float32, rounded once
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * WIDTH + cols, (activated * up).to(dtype), mask=inside)


SILU_BLOCK = 1024  # columns per silu_mul program


def silu_mul(parts: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``silu(gate) * up`` ``[M, I]`` in ``dtype`` from the gate/up projection's split-K parts ``[S, M, 2 I]``.

    The parts are summed in float32 and gate (the first ``I`` columns) and up (the rest) rounded to
    ``dtype``, as ``F.linear`` would; then ``F.silu(gate) * up`` as torch computes it in ``dtype``.
    """
    if parts.ndim != 3 or parts.shape[2] % 2 or parts.stride(2) != 1:
        raise ValueError(f"parts must be [S, M, 2 I] with a contiguous last dim, got {tuple(parts.shape)}")
    _, rows, doubled = parts.shape
    width = doubled // 2
    out = torch.empty((rows, width), dtype=dtype, device=parts.device)
    block = min(SILU_BLOCK, triton.next_power_of_2(width))
    _silu_mul_kernel[(rows, triton.cdiv(width, block))](
        parts,
        out,
        parts.stride(0),
        parts.stride(1),
        WIDTH=width,
        BLOCK=block,
        PARTS=parts.shape[0],
    )
    return out


INTERPRETED = isinstance(tl.sum, InterpretedFunction) and isinstance(_add_rms_norm_kernel, InterpretedFunction)

__all__ = ["INTERPRETED", "add_rms_norm", "qk_norm_rope_cache_write", "silu_mul"]

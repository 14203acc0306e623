"""Decode attention on tensor cores: one new token per row over the first ``span`` cache slots.

Layouts are the decoder's (:mod:`miniverl.rollout.decoder`): q ``[B, h, 1, d]`` (pre-scaled), the
caches ``[B, kv, capacity, d]``, the bias ``[B, capacity]`` (0 on visible slots, -inf elsewhere).
Flash-decoding: one program per (row, KV head, span split) reads that KV head's K/V tiles once for
all its ``h / kv`` query heads, held as the rows of one ``tl.dot`` operand (padded to the 16 rows a
tensor-core tile needs); scores and ``P @ V`` accumulate in float32, the online softmax runs in
float32, and a second kernel combines the splits. Float32 caches multiply in IEEE float32, never
TF32. Whether the kernels are interpreted is fixed at this module's import (``TRITON_INTERPRET=1``
before triton is first imported), as for :mod:`~miniverl.rollout.kernels.triton_ops`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

BLOCK_SLOTS = 64  # cache slots per K/V tile (the decoder's SPAN_QUANTUM, so a span is whole tiles)
TARGET_PROGRAMS = 256  # split the span until about this many attention programs run (about 2 per H200 SM)
MIN_DOT_ROWS = 16  # the smallest M of a tensor-core tl.dot: the query-head block is padded to it
# H200, head_dim 128, bf16: 64-slot tiles (32 KiB of K + V) in 3 stages keep two tiles' cp.async in flight per program;
# ptxas (sm_90a) gives 96 registers at 4 warps and 70 KiB of shared memory, no spills: 3 programs per SM.
NUM_WARPS = 4
NUM_STAGES = 3


@triton.jit
def _mma(a, b, PRECISION: tl.constexpr, WIDEN: tl.constexpr):
    """``a @ b`` accumulated in float32; ``WIDEN`` multiplies in float32 (exact for bf16 products)."""
    if WIDEN:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a, b, input_precision=PRECISION)
    return product


@triton.jit
def _decode_attention_split_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    bias_ptr,
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    stride_cache_row,
    stride_cache_head,
    stride_cache_slot,
    stride_bias_row,
    span,
    num_splits,
    HEADS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT_SLOTS: tl.constexpr,
    FINAL: tl.constexpr,
    PRECISION: tl.constexpr,
    WIDEN: tl.constexpr,
):
    """One (row, KV head, span split): the GROUP query heads of that KV head, as the rows of ``q @ K^T``.

    ``SPLIT_SLOTS`` is a compile-time constant (one variant per span bucket, as the CUDA graphs are).
    Rows ``GROUP .. BLOCK_G-1`` are padding: q is 0 there and nothing of them is stored.
    """
    row = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, BLOCK_D)
    in_group = g < GROUP
    in_head = d < HEAD_DIM
    heads = kv_head * GROUP + g
    q_offsets = (row * HEADS + heads)[:, None] * HEAD_DIM + d[None, :]
    q_mask = in_group[:, None] & in_head[None, :]
    q = tl.load(q_ptr + q_offsets, mask=q_mask, other=0.0)  # [G, D], the cache dtype
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    start = split * SPLIT_SLOTS
    end = tl.minimum(start + SPLIT_SLOTS, span)
    cache = row * stride_cache_row + kv_head * stride_cache_head
    for tile in range(0, SPLIT_SLOTS, BLOCK_N):  # the last split's tiles past the span are masked
        n = start + tile + tl.arange(0, BLOCK_N)
        in_span = n < end
        kv_offsets = cache + n[:, None] * stride_cache_slot + d[None, :]
        kv_mask = in_span[:, None] & in_head[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0)  # [N, D]
        bias = tl.load(bias_ptr + row * stride_bias_row + n, mask=in_span, other=float("-inf")).to(tl.float32)
        scores = _mma(q, tl.trans(k), PRECISION, WIDEN) + bias[None, :]  # [G, N] float32
        new_max = tl.maximum(running_max, tl.max(scores, axis=1))
        # a tile (or split) with every slot masked keeps max -inf: shift by 0 there, so exp gives 0, not nan
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)
        probs = tl.exp(scores - shift[:, None])
        rescale = tl.exp(running_max - shift)
        running_sum = running_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + _mma(probs.to(v.dtype), v, PRECISION, WIDEN)
        running_max = new_max
    if FINAL:
        out = acc / running_sum[:, None]
        out_offsets = row * HEADS * HEAD_DIM + heads[:, None] * HEAD_DIM + d[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=q_mask)
    else:
        part = (row * HEADS + heads) * num_splits + split  # [G]
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], acc, mask=q_mask)
        tl.store(part_max_ptr + part, running_max, mask=in_group)
        tl.store(part_sum_ptr + part, running_sum, mask=in_group)


@triton.jit
def _decode_attention_combine_kernel(
    out_ptr,
    part_acc_ptr,
    part_max_ptr,
    part_sum_ptr,
    num_splits,
    HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SPLITS_P2: tl.constexpr,
):
    """One (row, query head): the splits' partial softmax sums rescaled to the global max and added."""
    row = tl.program_id(0)
    head = tl.program_id(1)
    s = tl.arange(0, SPLITS_P2)
    d = tl.arange(0, BLOCK_D)
    in_splits = s < num_splits
    in_head = d < HEAD_DIM
    part = (row * HEADS + head) * num_splits + s
    maxes = tl.load(part_max_ptr + part, mask=in_splits, other=float("-inf"))
    sums = tl.load(part_sum_ptr + part, mask=in_splits, other=0.0)
    overall = tl.max(maxes, axis=0)
    weights = tl.exp(maxes - tl.where(overall == float("-inf"), 0.0, overall))
    acc = tl.load(
        part_acc_ptr + part[:, None] * HEAD_DIM + d[None, :], mask=in_splits[:, None] & in_head[None, :], other=0.0
    )
    out = tl.sum(weights[:, None] * acc, axis=0) / tl.sum(weights * sums, axis=0)
    tl.store(out_ptr + (row * HEADS + head) * HEAD_DIM + d, out.to(out_ptr.dtype.element_ty), mask=in_head)


def default_split_slots(batch: int, kv_heads: int, span: int, block_n: int = BLOCK_SLOTS) -> int:
    """Slots per split: the whole span when ``batch * kv_heads`` programs already fill the GPU, else
    enough splits to reach about :data:`TARGET_PROGRAMS`, each a multiple of ``block_n``."""
    splits = max(1, -(-TARGET_PROGRAMS // (batch * kv_heads)))
    per_split = -(-span // splits)
    return max(block_n, -(-per_split // block_n) * block_n)


def dot_rows(group: int) -> int:
    """Rows of the query-head block of one program: ``group`` padded to a power of two, at least 16."""
    return max(MIN_DOT_ROWS, triton.next_power_of_2(group))


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    bias: torch.Tensor,
    span: int,
    *,
    split_slots: int | None = None,
    block_n: int = BLOCK_SLOTS,
) -> torch.Tensor:
    """Attention of ``q`` ``[B, h, 1, d]`` over cache slots ``0 .. span-1``: ``[B, 1, h * d]``.

    ``bias`` ``[B, capacity]`` (0 / -inf) masks slots; each KV head serves ``h / kv`` query heads.
    The span is cut into splits of ``split_slots`` slots (default :func:`default_split_slots`),
    each reduced with a float32 online softmax over tiles of ``block_n`` slots (a power of two,
    at least 16), then combined (flash-decoding). Buffers are sized from shapes alone, so a call
    can be captured in a CUDA graph.
    """
    batch, heads, seq, head_dim = q.shape
    kv_heads, capacity = k_cache.shape[1], k_cache.shape[2]
    if seq != 1 or heads % kv_heads or not q.is_contiguous():
        raise ValueError(f"q must be a contiguous [B, h, 1, d] with h a multiple of {kv_heads} KV heads")
    if not 0 < span <= capacity or bias.shape != (batch, capacity) or bias.stride(-1) != 1:
        raise ValueError(f"span {span} must be in 1..{capacity} and bias [B, capacity] with contiguous slots")
    if k_cache.stride() != v_cache.stride() or k_cache.stride(-1) != 1:
        raise ValueError("k and v caches must share one layout with a contiguous last dim")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(f"q {q.dtype} and the caches {k_cache.dtype}, {v_cache.dtype} must share one dtype")
    if triton.next_power_of_2(block_n) != block_n or block_n < MIN_DOT_ROWS or head_dim < MIN_DOT_ROWS:
        raise ValueError(f"block_n {block_n} must be a power of two and it and head_dim {head_dim} at least 16")
    group = heads // kv_heads
    per_split = split_slots or default_split_slots(batch, kv_heads, span, block_n)
    num_splits = -(-span // per_split)
    out = torch.empty((batch, 1, heads * head_dim), dtype=q.dtype, device=q.device)
    final = num_splits == 1
    parts = 0 if final else batch * heads * num_splits
    part_acc = torch.empty((parts, head_dim), dtype=torch.float32, device=q.device)
    part_max = torch.empty((parts,), dtype=torch.float32, device=q.device)
    part_sum = torch.empty((parts,), dtype=torch.float32, device=q.device)
    block_d = triton.next_power_of_2(head_dim)
    _decode_attention_split_kernel[(batch, kv_heads, num_splits)](
        q,
        k_cache,
        v_cache,
        bias,
        out,
        part_acc,
        part_max,
        part_sum,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        bias.stride(0),
        span,
        num_splits,
        HEADS=heads,
        GROUP=group,
        BLOCK_G=dot_rows(group),
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        BLOCK_N=block_n,
        SPLIT_SLOTS=per_split,
        FINAL=final,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # tf32 is the default, and moot for half types
        WIDEN=INTERPRETED and q.dtype == torch.bfloat16,
        num_warps=NUM_WARPS,
        num_stages=NUM_STAGES,
    )
    if not final:
        _decode_attention_combine_kernel[(batch, heads)](
            out,
            part_acc,
            part_max,
            part_sum,
            num_splits,
            HEADS=heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            SPLITS_P2=triton.next_power_of_2(num_splits),
        )
    return out


# triton's interpreter keeps bf16 as raw uint16 bits and its tl.dot multiplies those bits: interpreted, bf16
# operands are widened to float32 first, which gives the tensor cores' products (bf16 x bf16 is exact in float32)
INTERPRETED = isinstance(_decode_attention_split_kernel, InterpretedFunction)

__all__ = ["BLOCK_SLOTS", "decode_attention", "default_split_slots", "dot_rows"]

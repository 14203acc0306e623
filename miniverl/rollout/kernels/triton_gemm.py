"""A split-K GEMM for decode's few rows: ``x [M, K] @ weight[N, K].T`` as float32 partial sums.

At decode, M (the batch, <= :data:`MAX_ROWS`) is far smaller than the weight, so the GEMM is a
stream over ``weight``; a cuBLAS tile grid over ``N`` alone launches too few programs to keep the
memory system busy. Here program ``(n, s)`` multiplies the rows by one ``BLOCK_N``-column block of
the weight over the ``s``-th slice of ``K`` and stores its float32 ``[M, BLOCK_N]`` partial;
:func:`skinny_linear_partials` returns all of them as ``[S, M, N]``. The kernel that consumes the
projection sums the ``S`` partials in its prologue (``add_rms_norm``, ``qk_norm_rope_cache_write``
and ``silu_mul`` of :mod:`~miniverl.rollout.kernels.triton_ops`), so the split costs no extra launch.

The split is :func:`split_plan`, a pure function of ``(M, N, K)``; see its docstring for the rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

MAX_ROWS = 64  # rows one program holds: the whole batch of a decode step up to this size
MIN_DOT = 16  # tl.dot's smallest extent per dimension: fewer rows are masked up to it
MAX_BLOCK_N = 64
MAX_BLOCK_K = 128
MIN_K_TILES = 4  # a small K still comes in this many tiles, so it can be split
SM_COUNT = 132  # an H100/H200
PROGRAMS_PER_SM = 2
TARGET_PROGRAMS = SM_COUNT * PROGRAMS_PER_SM
# float32 partials ([S, M, N], written then read) may cost at most this share of the bf16 weight's bytes
PARTIAL_BYTES_SHARE = 0.5
WEIGHT_BYTES = 2  # bf16: the element size the partial-traffic cap assumes


@dataclass(frozen=True)
class SplitPlan:
    """How :func:`skinny_linear_partials` tiles one ``[M, K] @ [N, K].T``."""

    block_m: int
    block_n: int
    block_k: int
    tiles_per_split: int  # K tiles of BLOCK_K per split: every K-slice is a whole number of tiles
    split_k: int  # S, the number of partials

    @property
    def slice_k(self) -> int:
        return self.tiles_per_split * self.block_k


def _clamped_power_of_two(value: int, low: int, high: int) -> int:
    return max(low, min(high, triton.next_power_of_2(value)))


def split_plan(rows: int, cols: int, depth: int, split_k: int | None = None) -> SplitPlan:
    """The tiling of ``x [rows, depth] @ weight[cols, depth].T``: a pure function of its arguments.

    Tiles: ``BLOCK_M`` = ``rows`` to a power of two, at least 16 (:data:`MIN_DOT`); ``BLOCK_N`` the
    next power of two of ``cols``, between 16 and 64; ``BLOCK_K`` that of ``depth / 4``, between 16
    and 128 (a small K still comes in 4 tiles that can split). With ``nb = cdiv(cols, BLOCK_N)``
    column blocks and ``kt = cdiv(depth, BLOCK_K)`` K tiles, a split of ``t``
    tiles gives ``S = cdiv(kt, t)`` partials and ``nb * S`` programs. The rule picks the ``t`` whose
    program count is nearest :data:`TARGET_PROGRAMS` (about 2 per SM of a 132-SM GPU; ties go to
    fewer splits), among those whose float32 partials ``S * rows * cols * 4`` bytes stay within
    :data:`PARTIAL_BYTES_SHARE` of the bf16 weight's ``cols * depth * 2``. Wide weights get few
    splits (N=6144, K=1024: S=3), narrow ones many (N=1024, K=2048: S=16 at 16 rows). No split is
    empty: the last one holds between 1 and ``t`` tiles, masked past ``depth``.

    ``split_k`` forces ``S``: ``t = cdiv(kt, split_k)``, and splits past ``depth`` store zeros.
    """
    if not 0 < rows <= MAX_ROWS or cols <= 0 or depth <= 0:
        raise ValueError(f"need 1..{MAX_ROWS} rows and positive sizes, got M={rows}, N={cols}, K={depth}")
    block_m = _clamped_power_of_two(rows, MIN_DOT, MAX_ROWS)
    block_n = _clamped_power_of_two(cols, MIN_DOT, MAX_BLOCK_N)
    block_k = _clamped_power_of_two(-(-depth // MIN_K_TILES), MIN_DOT, MAX_BLOCK_K)
    k_tiles = -(-depth // block_k)
    if split_k is not None:
        if not 0 < split_k <= k_tiles:
            raise ValueError(f"split_k {split_k} must be in 1..{k_tiles} (K={depth} in tiles of {block_k})")
        return SplitPlan(block_m, block_n, block_k, -(-k_tiles // split_k), split_k)
    col_blocks = -(-cols // block_n)
    max_splits = max(1, int(PARTIAL_BYTES_SHARE * WEIGHT_BYTES * depth / (4 * rows)))
    best_tiles = k_tiles
    best_gap = abs(col_blocks - TARGET_PROGRAMS)
    for tiles in range(k_tiles, 0, -1):  # fewer splits first: a tie keeps the fewer
        splits = -(-k_tiles // tiles)
        if splits > max_splits:
            break
        gap = abs(col_blocks * splits - TARGET_PROGRAMS)
        if gap < best_gap:
            best_tiles, best_gap = tiles, gap
    return SplitPlan(block_m, block_n, block_k, best_tiles, -(-k_tiles // best_tiles))


@triton.jit
def _skinny_partials_kernel(
    x_ptr,
    weight_ptr,
    out_ptr,
    rows,
    cols,
    depth,
    stride_x,
    stride_weight,
    SLICE_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Program (n, s): ``x[:, slice s] @ weight[n-block, slice s].T`` in float32, stored as partial ``s``."""
    col_block = tl.program_id(0)
    split = tl.program_id(1)
    m = tl.arange(0, BLOCK_M)
    n = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    in_rows = m < rows
    in_cols = n < cols
    acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for tile in range(0, SLICE_K, BLOCK_K):
        k = split * SLICE_K + tile + tl.arange(0, BLOCK_K)
        in_depth = k < depth
        a = tl.load(x_ptr + m[:, None] * stride_x + k[None, :], mask=in_rows[:, None] & in_depth[None, :], other=0.0)
        b = tl.load(
            weight_ptr + n[:, None] * stride_weight + k[None, :], mask=in_cols[:, None] & in_depth[None, :], other=0.0
        )
        if UPCAST:
            # triton's interpreter multiplies bf16 tiles as their raw uint16 bits; float32 is exact for them
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        acc += tl.dot(a, tl.trans(b), input_precision="ieee")
    target = out_ptr + split * rows * cols + m[:, None] * cols + n[None, :]
    tl.store(target, acc, mask=in_rows[:, None] & in_cols[None, :])


def skinny_linear_partials(x: torch.Tensor, weight: torch.Tensor, split_k: int | None = None) -> torch.Tensor:
    """float32 partials ``[S, M, N]`` of ``x [M, K] @ weight[N, K].T``: their sum over ``S`` is the product.

    ``M`` <= :data:`MAX_ROWS`; ``S`` and the tiles come from :func:`split_plan` (``split_k`` forces
    ``S``). float32 inputs multiply in exact float32 (never TF32); bf16/fp16 ones accumulate in float32.
    """
    if x.ndim != 2 or weight.ndim != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"need x [M, K] and weight [N, K], got {tuple(x.shape)} and {tuple(weight.shape)}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise ValueError(f"x ({x.dtype}, {x.device}) and weight ({weight.dtype}, {weight.device}) must match")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("x and weight need a contiguous K dim")
    rows, depth = x.shape
    cols = weight.shape[0]
    plan = split_plan(rows, cols, depth, split_k)
    partials = torch.empty((plan.split_k, rows, cols), dtype=torch.float32, device=x.device)
    _skinny_partials_kernel[(triton.cdiv(cols, plan.block_n), plan.split_k)](
        x,
        weight,
        partials,
        rows,
        cols,
        depth,
        x.stride(0),
        weight.stride(0),
        SLICE_K=plan.slice_k,
        BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n,
        BLOCK_K=plan.block_k,
        UPCAST=INTERPRETED and x.dtype != torch.float32,
    )
    return partials


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, split_k: int | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T`` ``[M, N]`` in ``x``'s dtype: the partials summed in float32, rounded once."""
    return skinny_linear_partials(x, weight, split_k).sum(0).to(x.dtype)


INTERPRETED = isinstance(_skinny_partials_kernel, InterpretedFunction)

__all__ = [
    "INTERPRETED",
    "MAX_ROWS",
    "TARGET_PROGRAMS",
    "SplitPlan",
    "skinny_linear",
    "skinny_linear_partials",
    "split_plan",
]

"""Time the decode step's four projections: ``F.linear`` vs the split-K GEMM and the kernel that sums its parts.

At the Qwen3-0.6B shape (hidden 1024, 16 q / 8 KV heads of 128, intermediate 3072) with random
bf16 weights, for M = 16 and 64 rows, each projection is timed four ways:

* ``linear``: ``F.linear(x, W)`` alone;
* ``split``: ``skinny_linear_partials(x, W)`` alone (float32 parts ``[S, M, N]``);
* ``linear+use``: ``F.linear`` then its consumer on the plain output (the decoder before the split);
* ``split+use``: the parts then the consumer that sums them (the decoder now).

The consumers: qkv -> ``qk_norm_rope_cache_write``, o and down -> ``add_rms_norm``, gate_up ->
``silu_mul`` (``F.silu(gate) * up`` on the plain output). Each way is timed with CUDA graphs: 20
back-to-back calls captured in one graph, replayed after warm-up, the median of the replays / 20.
GB/s is the weight's bytes over that time; ``ratio`` is ``linear+use`` over ``split+use`` (above 1:
the split is faster). The split chosen for each shape (S, tiles, programs) is printed too, and the
largest difference between the two ways' outputs.

    PYTHONPATH=. python scripts/device/decode_kernel_timing.py            # on the H200
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/device/decode_kernel_timing.py --smoke   # CPU: runs, no timing

``--smoke`` uses tiny shapes, one repeat and no graphs: it checks the script runs, its times mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F
from graph_timing import graph_seconds_per_call  # this folder: the scripts run as files


@dataclass(frozen=True)
class Shape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    capacity: int


QWEN3_06B = Shape(hidden=1024, heads=16, kv_heads=8, head_dim=128, intermediate=3072, capacity=512)
TINY = Shape(hidden=64, heads=4, kv_heads=2, head_dim=16, intermediate=96, capacity=64)
EPS = 1e-6
CALLS_PER_GRAPH = 20
Timer = Callable[[Callable[[], object], int], float]  # (fn, repeats) -> seconds per call


@dataclass
class Projection:
    name: str
    weight: torch.Tensor
    x: torch.Tensor
    use_plain: Callable[[torch.Tensor], torch.Tensor]  # the consumer of F.linear's [M, N]
    use_parts: Callable[[torch.Tensor], torch.Tensor]  # the consumer of the parts [S, M, N]


def projections(shape: Shape, rows: int, device: torch.device, dtype: torch.dtype) -> list[Projection]:
    """The four projections of a layer at ``rows`` rows, with their consumers as the decoder calls them."""
    from miniverl.rollout.kernels import load_triton_ops

    ops = load_triton_ops()
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(size, generator=gen) * scale).to(device, dtype)

    heads, kv, d = shape.heads, shape.kv_heads, shape.head_dim
    cache_shape = (rows, kv, shape.capacity, d)
    k_cache = torch.zeros(cache_shape, dtype=dtype, device=device)
    v_cache = torch.zeros_like(k_cache)
    angles = torch.rand(shape.capacity, d, generator=gen) * 6.28
    cos, sin = angles.cos().to(device, dtype), angles.sin().to(device, dtype)
    qk_norm = 1 + rand(heads + kv, d, scale=0.1)
    positions = torch.randint(0, shape.capacity, (rows,), generator=gen).to(device)
    slot = torch.tensor([shape.capacity // 2], device=device)
    residual = rand(rows, 1, shape.hidden)
    norm = 1 + rand(shape.hidden, scale=0.1)
    width = (heads + 2 * kv) * d

    def rope(mixed: torch.Tensor) -> torch.Tensor:
        return ops.qk_norm_rope_cache_write(mixed, qk_norm, cos, sin, positions, k_cache, v_cache, slot, EPS, heads, kv)

    def add_norm(update: torch.Tensor) -> torch.Tensor:
        return ops.add_rms_norm(residual, update, norm, EPS)[1]

    def silu_mul_plain(y: torch.Tensor) -> torch.Tensor:
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up

    scale = shape.hidden**-0.5
    return [
        Projection(
            "qkv",
            rand(width, shape.hidden, scale=scale),
            rand(rows, shape.hidden),
            lambda y: rope(y.view(rows, 1, heads + 2 * kv, d)),
            rope,
        ),
        Projection(
            "o",
            rand(shape.hidden, heads * d, scale=(heads * d) ** -0.5),
            rand(rows, heads * d),
            lambda y: add_norm(y.view(rows, 1, shape.hidden)),
            add_norm,
        ),
        Projection(
            "gate_up",
            rand(2 * shape.intermediate, shape.hidden, scale=scale),
            rand(rows, shape.hidden),
            silu_mul_plain,
            lambda parts: ops.silu_mul(parts, dtype),
        ),
        Projection(
            "down",
            rand(shape.hidden, shape.intermediate, scale=shape.intermediate**-0.5),
            rand(rows, shape.intermediate),
            lambda y: add_norm(y.view(rows, 1, shape.hidden)),
            add_norm,
        ),
    ]


def time_graph(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call: ``CALLS_PER_GRAPH`` calls captured in one CUDA graph, median of ``repeats`` replays."""
    return graph_seconds_per_call([fn] * CALLS_PER_GRAPH, repeats)


def time_eager(fn: Callable[[], object], repeats: int) -> float:
    """Seconds per call on CPU (the smoke run: no meaning beyond 'it ran')."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(
    gemm: ModuleType, proj: Projection, timer: Callable[[Callable[[], object], int], float], repeats: int
) -> str:
    """One table row: the split chosen, the four ways' times, GB/s, the ratio and the outputs' largest difference."""
    x, weight = proj.x, proj.weight
    rows = x.shape[0]
    cols, depth = weight.shape
    plan = gemm.split_plan(rows, cols, depth)
    programs = -(-cols // plan.block_n) * plan.split_k
    linear = timer(lambda: F.linear(x, weight), repeats)
    split = timer(lambda: gemm.skinny_linear_partials(x, weight), repeats)
    linear_use = timer(lambda: proj.use_plain(F.linear(x, weight)), repeats)
    split_use = timer(lambda: proj.use_parts(gemm.skinny_linear_partials(x, weight)), repeats)
    plain_out = proj.use_plain(F.linear(x, weight)).float()
    parts_out = proj.use_parts(gemm.skinny_linear_partials(x, weight)).float()
    diff = float((plain_out - parts_out).abs().max())
    weight_bytes = weight.numel() * weight.element_size()
    row = f"{rows:>3} {proj.name:<8} {cols:>5} {depth:>5} {plan.split_k:>3} {plan.tiles_per_split:>5}"
    row += f" {programs:>5} {linear * 1e6:>10.2f} {weight_bytes / linear / 1e9:>6.0f}"
    row += f" {split * 1e6:>9.2f} {weight_bytes / split / 1e9:>6.0f}"
    return row + f" {linear_use * 1e6:>10.2f} {split_use * 1e6:>10.2f} {linear_use / split_use:>6.2f} {diff:>9.3g}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, 1 repeat, no timing claims (CPU ok)")
    parser.add_argument("--repeats", type=int, default=7, help="graph replays per measurement (median; >= 5)")
    args = parser.parse_args(argv)
    on_gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
    if not on_gpu and not (args.smoke and os.environ.get("TRITON_INTERPRET") == "1"):
        print("needs a CUDA GPU, or --smoke with TRITON_INTERPRET=1 on CPU", file=sys.stderr)
        return 2
    if not args.smoke and args.repeats < 5:
        print("--repeats must be at least 5 for a timing", file=sys.stderr)
        return 2
    from miniverl.rollout.kernels import load_triton_gemm

    gemm = load_triton_gemm()
    device = torch.device("cuda" if on_gpu else "cpu")
    shape, repeats = (TINY, 1) if args.smoke else (QWEN3_06B, args.repeats)
    timer = time_graph if on_gpu else time_eager
    dtype = torch.bfloat16
    name = torch.cuda.get_device_name() if on_gpu else "cpu (triton interpreter)"
    print(f"device {name}; {shape}; bf16; {'smoke: no timing claims' if args.smoke else f'median of {repeats}'}")
    header = f"{'M':>3} {'proj':<8} {'N':>5} {'K':>5} {'S':>3} {'tiles':>5} {'progs':>5}"
    header += f" {'linear us':>10} {'GB/s':>6} {'split us':>9} {'GB/s':>6}"
    header += f" {'lin+use us':>10} {'spl+use us':>10} {'ratio':>6} {'max diff':>9}"
    print(header)
    for rows in (16, 64):
        for proj in projections(shape, rows, device, dtype):
            print(measure(gemm, proj, timer, repeats), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode attention on the H200: the tensor-core triton kernel against the decoder's torch attention.

``PYTHONPATH=. python3 scripts/device/decode_attention_timing.py [--repeats N] [--block-n N] [--split-slots N]
[--json PATH]`` at the Qwen3-0.6B attention shape (16 query heads, 8 KV heads, head_dim 128, bf16), batch 16
and 64, span 192 and 1024 (cache capacity 1024, every slot of the span visible). Each of ``CALLS`` calls
reads its own K/V cache, as the layers of a decode step do, so the K/V bytes come from HBM rather than the
50 MB L2. The calls are captured in one CUDA graph; after warm-up replays, the median of ``--repeats``
replays divided by ``CALLS`` is the time per call. Printed per shape: us per call, TB/s of K/V bytes read
(``2 * B * kv * span * d * 2`` per call), torch / triton, and the largest |triton - torch|. The old
broadcast kernel is gone from the package, so it is not compared.

``--smoke`` runs tiny shapes on CPU under ``TRITON_INTERPRET=1``, each call once, no graph and no
timing: a check that every code path of this script runs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import torch
from graph_timing import graph_seconds_per_call  # this folder: the scripts run as files

CALLS = 20  # captured in one graph, each over its own cache


@dataclass(frozen=True)
class Shape:
    heads: int
    kv_heads: int
    head_dim: int
    capacity: int
    batches: tuple[int, ...]
    spans: tuple[int, ...]


FULL = Shape(heads=16, kv_heads=8, head_dim=128, capacity=1024, batches=(16, 64), spans=(192, 1024))
SMOKE = Shape(heads=4, kv_heads=2, head_dim=16, capacity=64, batches=(1, 3), spans=(32, 64))


@dataclass
class Row:
    batch: int
    span: int
    kv_bytes_per_call: int
    triton_us: float | None
    torch_us: float | None
    triton_tb_s: float | None
    torch_tb_s: float | None
    torch_over_triton: float | None
    max_abs_diff: float


def kv_bytes(batch: int, span: int, shape: Shape, dtype: torch.dtype) -> int:
    """Bytes of K and V one call reads: the first ``span`` slots of every row and KV head."""
    return 2 * batch * shape.kv_heads * span * shape.head_dim * torch.finfo(dtype).bits // 8


def tb_per_s(nbytes: int, microseconds: float) -> float:
    return nbytes / (microseconds * 1e-6) / 1e12


def graph_us_per_call(calls: Sequence[Callable[[], object]], repeats: int) -> float:
    """Median over ``repeats`` replays of one CUDA graph of ``calls``, divided by their number (us)."""
    return graph_seconds_per_call(calls, repeats) * 1e6


def measure(
    batch: int,
    span: int,
    shape: Shape,
    dtype: torch.dtype,
    device: torch.device,
    repeats: int,
    block_n: int,
    split_slots: int | None,
) -> Row:
    from miniverl.rollout.decoder import attend
    from miniverl.rollout.kernels.triton_attention import decode_attention

    layers = CALLS if device.type == "cuda" else 1
    gen = torch.Generator(device=device).manual_seed(0)
    cache_shape = (batch, shape.kv_heads, shape.capacity, shape.head_dim)
    q = torch.randn((batch, shape.heads, 1, shape.head_dim), generator=gen, device=device).to(dtype)
    caches = [
        (
            torch.randn(cache_shape, generator=gen, device=device).to(dtype),
            torch.randn(cache_shape, generator=gen, device=device).to(dtype),
        )
        for _ in range(layers)
    ]
    bias = torch.full((batch, shape.capacity), float("-inf"), dtype=dtype, device=device)
    bias[:, :span] = 0.0
    visible = bias[:, :span].unsqueeze(1)  # what the decoder's torch step passes
    kernel = partial(decode_attention, bias=bias, span=span, block_n=block_n, split_slots=split_slots)
    kernel_calls = [partial(kernel, q, k, v) for k, v in caches]
    torch_calls = [partial(attend, q, k, v, visible) for k, v in caches]
    diff = float((kernel_calls[0]().float() - torch_calls[0]().float()).abs().max())
    nbytes = kv_bytes(batch, span, shape, dtype)
    if device.type != "cuda":
        return Row(batch, span, nbytes, None, None, None, None, None, diff)
    triton_us = graph_us_per_call(kernel_calls, repeats)
    torch_us = graph_us_per_call(torch_calls, repeats)
    return Row(
        batch,
        span,
        nbytes,
        triton_us,
        torch_us,
        tb_per_s(nbytes, triton_us),
        tb_per_s(nbytes, torch_us),
        torch_us / triton_us,
        diff,
    )


def describe(row: Row) -> str:
    head = f"batch {row.batch:3d} span {row.span:5d} ({row.kv_bytes_per_call / 1e6:7.2f} MB K/V per call): "
    tail = f"max |triton - torch| {row.max_abs_diff:.3g}"
    if row.triton_us is None or row.torch_us is None:
        return head + "ran once, no timing (smoke); " + tail
    return head + (
        f"triton {row.triton_us:8.2f} us ({row.triton_tb_s:5.2f} TB/s), "
        f"torch {row.torch_us:8.2f} us ({row.torch_tb_s:5.2f} TB/s), "
        f"torch/triton {row.torch_over_triton:5.2f}x; " + tail
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny shapes on CPU under TRITON_INTERPRET=1")
    parser.add_argument("--repeats", type=int, default=7, help="timed graph replays per shape (median)")
    parser.add_argument("--block-n", type=int, default=None, help="K/V tile slots (default: the kernel's)")
    parser.add_argument("--split-slots", type=int, default=None, help="slots per span split (default: the kernel's)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    if args.smoke:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--smoke needs TRITON_INTERPRET=1 before triton is imported")
        os.environ["TRITON_INTERPRET"] = "1"  # read when triton and the kernels are first imported
        torch.set_num_threads(1)
        shape, device, repeats = SMOKE, torch.device("cpu"), 1
    else:
        if not torch.cuda.is_available():
            raise SystemExit("timing needs a CUDA GPU; --smoke checks the script on CPU")
        shape, device, repeats = FULL, torch.device("cuda"), max(5, args.repeats)
    dtype = torch.bfloat16
    from miniverl.rollout.kernels.triton_attention import BLOCK_SLOTS  # after TRITON_INTERPRET is settled

    block_n = args.block_n or BLOCK_SLOTS
    print(f"{shape.heads} q / {shape.kv_heads} KV heads, head_dim {shape.head_dim}, {dtype}, capacity {shape.capacity}")
    if device.type == "cuda":
        print(f"{torch.cuda.get_device_name(device)}: {CALLS} calls per graph, median of {repeats} replays")
    print(f"block_n {block_n}, split_slots {args.split_slots or 'auto'}")
    print("the old broadcast kernel is removed from the package: not compared")
    rows = []
    for batch in shape.batches:
        for span in shape.spans:
            row = measure(batch, span, shape, dtype, device, repeats, block_n, args.split_slots)
            rows.append(row)
            print(describe(row), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(row) for row in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

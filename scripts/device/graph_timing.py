"""Timing by CUDA-graph replay, shared by the device timing scripts (run as files: their folder is on sys.path)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence

import torch


def graph_seconds_per_call(calls: Sequence[Callable[[], object]], repeats: int, warmup: int = 3) -> float:
    """Median over ``repeats`` replays of one CUDA graph of ``calls``, divided by their number, in seconds.

    Each call runs once on a side stream first (triton compiles, cuBLAS picks its kernels and workspace
    outside the capture), then the graph is replayed ``warmup`` times untimed.
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(calls))
    return statistics.median(times)

"""Interleaved pairs: a speed ratio of two rollout paths that a busy neighbour cannot flip.

Timing path A's cell, then path B's, lets a burst of machine load land on one path only, and the ratio of their
medians moves with it (a CPU speed floor once failed at 0.963 against 1.0 that way). Here, after both paths' warm-up,
the two are timed in pairs, A then B, A then B (ABAB...), on the same prompts and fixed lengths, and each pair gives
its own ratio: load that lasts about as long as a pair slows both halves alike and cancels in that pair's ratio, and
the median over the pairs ignores the pairs a short burst split. Every pair's two timings are reported, so a reader
(the release harness) recomputes the ratios and their median instead of trusting them.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

MIN_SAMPLE_SECONDS = 0.2
MAX_CALLS_PER_SAMPLE = 100
RATIO = "A tokens/s over B tokens/s in each pair: B's seconds per call over A's (both generate the same tokens)"


def spread(ratios: list[float]) -> dict[str, float]:
    """Median, quartiles and range of the per-pair ratios (inclusive quartiles: they lie within the range)."""
    q1, _, q3 = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else (ratios[0],) * 3
    return {
        "median_ratio": statistics.median(ratios),
        "min_ratio": min(ratios),
        "q1_ratio": q1,
        "q3_ratio": q3,
        "max_ratio": max(ratios),
    }


def measure_pairs(
    run_a: Callable[[], int],
    run_b: Callable[[], int],
    *,
    pairs: int,
    warmup: int,
    expected_tokens: int,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Any]:
    """``warmup`` untimed calls of A, then of B (at least one each), then one more call of each, whose time sets how
    many back-to-back calls make its sample last MIN_SAMPLE_SECONDS (a first call, with its one-off setup, would
    set too few), then ``pairs`` x (one sample of A, one of B). Seconds are per call."""
    if pairs < 1:
        raise ValueError(f"pairs must be at least 1, got {pairs}")

    def timed(run: Callable[[], int], calls: int) -> float:
        sync()
        start = clock()
        tokens = [run() for _ in range(calls)]
        sync()
        seconds = (clock() - start) / calls
        if not seconds > 0:
            raise RuntimeError(f"a timed sample of {calls} calls took {seconds} s (the clock did not advance)")
        if any(t != expected_tokens for t in tokens):
            raise RuntimeError(
                f"fixed lengths broken: generated {sorted(set(tokens))}, want {expected_tokens} per call"
            )
        return seconds

    calls: list[int] = []
    for run in (run_a, run_b):
        last = 0.0
        for _ in range(max(warmup, 1) + 1):
            last = timed(run, 1)
        calls.append(min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(MIN_SAMPLE_SECONDS / max(last, 1e-9)))))
    recorded = []
    for _ in range(pairs):
        a = timed(run_a, calls[0])
        b = timed(run_b, calls[1])
        recorded.append({"a_seconds": a, "b_seconds": b, "ratio": b / a})
    return {
        "status": "measured",
        "order": "ABAB",
        "ratio": RATIO,
        "generated_tokens": expected_tokens,
        "calls_per_sample": {"a": calls[0], "b": calls[1]},
        "pairs": recorded,
        **spread([p["ratio"] for p in recorded]),
    }

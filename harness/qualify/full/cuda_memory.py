"""CUDA memory, judged from the ``cuda`` block of run summaries against the profile's thresholds (harness code):
what a run left allocated after teardown, and its peak reserved memory."""

from __future__ import annotations

from typing import Any

from harness.core.records import Profile
from harness.qualify.full.base import Judgement


def cuda_block(summary: dict[str, Any] | None) -> dict[str, int] | None:
    cuda = summary.get("cuda") if summary is not None else None
    if not isinstance(cuda, dict):
        return None
    keys = ("baseline_allocated_bytes", "final_allocated_bytes", "peak_reserved_bytes")
    values = {k: cuda.get(k) for k in keys}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
        return None
    return {k: int(v) for k, v in values.items() if isinstance(v, int)}


def judge_cuda(
    j: Judgement, profile: Profile, summaries: dict[str, dict[str, Any] | None], *, teardown: bool, peak: bool
) -> None:
    """``teardown`` and ``peak_reserved`` from every named run's summary ``cuda`` block (CUDA profiles only:
    on CPU they are not required and not judged). Thresholds are the profile's (harness code)."""
    if profile.device != "cuda":
        return
    blocks = {label: cuda_block(s) for label, s in summaries.items()}
    missing = sorted(label for label, b in blocks.items() if b is None)
    t = profile.thresholds
    if teardown:
        details, ok = [], not missing and bool(blocks)
        for label, b in blocks.items():
            if b is None:
                continue
            tol = max(
                t.teardown_tolerance_bytes_min, int(t.teardown_tolerance_fraction * b["baseline_allocated_bytes"])
            )
            left = b["final_allocated_bytes"] - b["baseline_allocated_bytes"]
            ok = ok and left <= tol
            details.append(f"{label}: {left} B above baseline (tolerance {tol} B)")
        j.check("teardown", ok, "; ".join(details) + (f"; no integer cuda block in {missing}" if missing else ""))
    if peak:
        limit = t.peak_reserved_bytes_max
        peaks = {label: b["peak_reserved_bytes"] for label, b in blocks.items() if b is not None}
        ok = not missing and bool(peaks) and limit is not None and all(0 < p <= limit for p in peaks.values())
        j.check(
            "peak_reserved",
            ok,
            f"peak reserved {peaks} B (measured > 0), limit {limit} B"
            + (f"; no integer cuda block in {missing}" if missing else ""),
        )
    for label, b in blocks.items():
        if b is not None:
            j.metrics[f"{label}_cuda_peak_reserved_bytes"] = b["peak_reserved_bytes"]
            j.metrics[f"{label}_cuda_final_allocated_bytes"] = b["final_allocated_bytes"]

"""CUDA memory after a run (or a gate) closed its runtime: back to the baseline it started from, within a tolerance."""

from __future__ import annotations

from typing import Any

from miniverl.records import CudaTeardown

# Teardown passes when allocated memory is back within max(2 MiB, 2 % of the baseline) of the baseline.
TEARDOWN_TOLERANCE_MIN_BYTES = 2 * 1024 * 1024
TEARDOWN_TOLERANCE_FRACTION = 0.02


def release_library_caches(torch: Any) -> None:
    """cuBLAS workspaces live in the caching allocator: free them (and cached blocks) around a run."""
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()


def cuda_teardown(*, baseline: int, final: int, peak_reserved: int, peak_allocated: int) -> CudaTeardown:
    """The teardown record: whether ``final`` allocated bytes are back within tolerance of ``baseline``."""
    tolerance = max(TEARDOWN_TOLERANCE_MIN_BYTES, int(TEARDOWN_TOLERANCE_FRACTION * baseline))
    return CudaTeardown(
        baseline_allocated_bytes=baseline,
        final_allocated_bytes=final,
        peak_reserved_bytes=peak_reserved,
        peak_allocated_bytes=peak_allocated,
        teardown_tolerance_bytes=tolerance,
        teardown_returned_to_baseline=final - baseline <= tolerance,
    )

"""How close a decode kernel's output must be to the decoder's torch maths (its reference)."""

from __future__ import annotations

import torch

BF16_ULP = 2.0**-7  # bf16 keeps 8 significant bits: one ulp of a value in [1, 2)


def assert_close_to_decoder(
    got: torch.Tensor, reference: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, ulps: int = 2
) -> None:
    """fp32: within 1e-5 of the torch reference. bf16: no further from the float64 evaluation ``exact``
    than the reference is at its worst, plus ``ulps`` bf16 ulps (triton's interpreter rounds float32 to
    bf16 by truncation, the GPU to nearest even)."""
    if dtype == torch.float32:
        torch.testing.assert_close(got, reference, atol=1e-5, rtol=1e-5)
        return
    err = (got.double() - exact).abs()
    bound = (reference.double() - exact).abs().max() + ulps * BF16_ULP * exact.abs().clamp(min=1.0)
    assert bool((err <= bound).all()), f"bf16 kernel error {float(err.max()):.4g} over the decoder's bound"

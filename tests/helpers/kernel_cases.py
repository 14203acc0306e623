"""What the decode-kernel tests share: where they run, their tiny inputs, and how close a kernel's output must be
to the decoder's torch maths (its reference)."""

from __future__ import annotations

import os

import pytest
import torch

from miniverl.rollout import decoder

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


HEAD_DIM, CAPACITY, EPS = 16, 48, 1e-6  # the tiny decode shape of the kernel tests


def kernel_device(test_file: str) -> torch.device:
    """Where the calling test module runs its kernels: compiled on CUDA, or on CPU under triton's interpreter
    (``TRITON_INTERPRET=1`` before triton's first import); call at module level: it skips the module otherwise."""
    pytest.importorskip("triton", reason="triton is not installed: the kernel tests need it (nox -s kernels)")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpreted and not torch.cuda.is_available():
        pytest.skip(
            "on CPU the kernels run under triton's interpreter: "
            f"TRITON_INTERPRET=1 pytest {test_file} (nox -s kernels)",
            allow_module_level=True,
        )
    return torch.device("cpu" if interpreted else "cuda")


def rand(*shape: int, seed: int, device: torch.device, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(device, dtype)


def rope_tables(dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and signed sin ``[CAPACITY, HEAD_DIM]`` as the decoder's workspace builds them."""
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM))
    emb = torch.outer(torch.arange(CAPACITY, dtype=torch.float64), inv_freq)
    emb = torch.cat((emb, emb), dim=-1)
    half = HEAD_DIM // 2
    signed = torch.cat((-emb[:, :half], emb[:, half:]), dim=-1)
    return emb.cos().to(device, dtype), signed.sin().to(device, dtype)


def norm_rope_reference(
    mixed: torch.Tensor,
    qk_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slots: torch.Tensor,
    caches: tuple[torch.Tensor, torch.Tensor],
    heads: int,
    kv: int,
) -> torch.Tensor:
    """The decoder's q/k norm + RoPE, and the K/V written into ``caches`` at each row's slot: q."""
    q, k, v = decoder.qk_norm_rope(
        mixed, qk_norm, cos[positions][:, None, None], sin[positions][:, None, None], EPS, heads, kv
    )
    for row, slot in enumerate(slots.tolist()):
        caches[0][row, :, slot] = k[row, :, 0]
        caches[1][row, :, slot] = v[row, :, 0]
    return q

"""The tensor-core decode attention kernel against the decoder's torch attention (its reference).

On CPU the kernel runs under triton's interpreter, which must be on before triton is first
imported: ``TRITON_INTERPRET=1 pytest tests/unit/test_rollout_attention_kernel.py`` (``nox -s
kernels``). On a CUDA machine without ``TRITON_INTERPRET=1`` it runs compiled on the GPU. Tiny
shapes: head_dim 16 and 32, capacity 48, GQA ratios 1, 2, 4 and 8, batch 1 and 3, masked slots
(left padding, a hole, a split with every slot masked), span < capacity, the span split several
ways. fp32 must agree within 1e-5; bf16 must be no further from a float64 evaluation than the
decoder's own bf16 maths is, plus two bf16 ulps (:func:`tests.helpers.kernel_cases.assert_close_to_decoder`).
"""

from __future__ import annotations

from types import ModuleType

import pytest
import torch

from miniverl.rollout import decoder
from tests.helpers.kernel_cases import assert_close_to_decoder, kernel_device

DEVICE = kernel_device("tests/unit/test_rollout_attention_kernel.py")

CAPACITY, BLOCK_N = 48, 16
GQA = [(4, 4), (4, 2), (8, 2), (8, 1)]  # (query heads, KV heads): ratios 1, 2, 4, 8
SPLITS = [(41, None), (41, 16), (41, 32), (48, 48), (33, 16), (40, 24)]  # (span, slots per split)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def attention() -> ModuleType:
    from miniverl.rollout.kernels import triton_unavailable_reason

    assert triton_unavailable_reason(DEVICE) is None
    from miniverl.rollout.kernels import triton_attention

    return triton_attention


def _rand(*shape: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(DEVICE, dtype)


def _bias(batch: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows with left padding, a masked hole and different lengths (0 visible, -inf masked). Row 2 sees
    slots 25..40 only: its 16-slot split 0..15 and its 16-slot tile 0..15 are masked whole."""
    visible = torch.zeros(3, CAPACITY, dtype=torch.bool)
    visible[0, 0:30] = True
    visible[1, 7:30] = True  # left padding
    visible[1, 12:15] = False  # a masked hole
    visible[2, 25:41] = True
    bias = torch.zeros(3, CAPACITY, dtype=dtype)
    bias.masked_fill_(~visible, float("-inf"))
    return bias[:batch].to(DEVICE)


def _check(
    attention: ModuleType,
    dtype: torch.dtype,
    heads: int,
    kv: int,
    head_dim: int,
    batch: int,
    span: int,
    split_slots: int | None,
) -> None:
    q = _rand(batch, heads, 1, head_dim, seed=6, dtype=dtype)
    k_cache = _rand(batch, kv, CAPACITY, head_dim, seed=7, dtype=dtype) * 2
    v_cache = _rand(batch, kv, CAPACITY, head_dim, seed=8, dtype=dtype)
    k_cache[:, :, span:] = float("nan")  # slots past the span must never be read
    v_cache[:, :, span:] = float("nan")
    bias = _bias(batch, dtype)
    got = attention.decode_attention(q, k_cache, v_cache, bias, span, split_slots=split_slots, block_n=BLOCK_N)
    visible = bias[:, :span].unsqueeze(1)
    reference = decoder.attend(q, k_cache, v_cache, visible)
    exact = decoder.attend(q.double(), k_cache.double(), v_cache.double(), visible.double())
    assert got.shape == reference.shape == (batch, 1, heads * head_dim) and got.dtype == dtype
    assert bool(got.isfinite().all())
    assert_close_to_decoder(got, reference, exact, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("heads", "kv"), GQA, ids=["gqa1", "gqa2", "gqa4", "gqa8"])
@pytest.mark.parametrize(("span", "split_slots"), SPLITS, ids=["auto", "s16", "s32", "full", "s16b", "s24"])
def test_decode_attention_equals_the_decoder(
    attention: ModuleType, dtype: torch.dtype, heads: int, kv: int, span: int, split_slots: int | None
) -> None:
    _check(attention, dtype, heads, kv, 16, 3, span, split_slots)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize(("heads", "kv"), GQA, ids=["gqa1", "gqa2", "gqa4", "gqa8"])
@pytest.mark.parametrize("batch", [1, 3])
def test_head_dim_32_and_one_row(attention: ModuleType, dtype: torch.dtype, heads: int, kv: int, batch: int) -> None:
    _check(attention, dtype, heads, kv, 32, batch, 41, 16)


def test_a_row_with_every_slot_of_a_split_masked_takes_nothing_from_it(attention: ModuleType) -> None:
    """Row 2's first split sees no slot: its partial (max -inf, sum 0) must add nothing to the combine.
    Equal to attending over the visible slots alone, which all lie in the later splits."""
    q = _rand(3, 4, 1, 16, seed=9, dtype=torch.float32)
    k_cache = _rand(3, 2, CAPACITY, 16, seed=10, dtype=torch.float32)
    v_cache = _rand(3, 2, CAPACITY, 16, seed=11, dtype=torch.float32)
    bias = _bias(3, torch.float32)
    got = attention.decode_attention(q, k_cache, v_cache, bias, 41, split_slots=16, block_n=BLOCK_N)
    later = decoder.attend(q[2:], k_cache[2:, :, 16:], v_cache[2:, :, 16:], bias[2:, 16:41].view(1, 1, 25))
    torch.testing.assert_close(got[2:], later, atol=1e-5, rtol=1e-5)


def test_default_split_fills_the_gpu_and_is_a_whole_number_of_tiles(attention: ModuleType) -> None:
    assert attention.default_split_slots(64, 8, 320) == 320  # 512 programs already: one split
    assert attention.default_split_slots(16, 8, 320) == 192  # 128 programs: two splits, rounded to 64-slot tiles
    assert attention.default_split_slots(1, 2, 64) == 64
    assert [attention.dot_rows(group) for group in (1, 2, 8, 16, 32)] == [16, 16, 16, 16, 32]


def test_bad_arguments_are_refused(attention: ModuleType) -> None:
    q = torch.zeros(1, 2, 1, 16, device=DEVICE)
    cache = torch.zeros(1, 1, 32, 16, device=DEVICE)
    bias = torch.zeros(1, 32, device=DEVICE)
    with pytest.raises(ValueError, match="span"):
        attention.decode_attention(q, cache, cache, bias, 33)
    with pytest.raises(ValueError, match="block_n"):
        attention.decode_attention(q, cache, cache, bias, 32, block_n=8)  # below a tensor-core tile
    with pytest.raises(ValueError, match="block_n"):
        attention.decode_attention(q, cache, cache, bias, 32, block_n=24)
    with pytest.raises(ValueError, match="dtype"):
        attention.decode_attention(q.bfloat16(), cache, cache, bias, 32)
    with pytest.raises(ValueError, match="multiple"):
        attention.decode_attention(
            torch.zeros(1, 3, 1, 16, device=DEVICE), *[torch.zeros(1, 2, 32, 16, device=DEVICE)] * 2, bias, 32
        )

"""The split-K decode GEMM and the kernels that sum its parts, against torch (their reference).

Runs like ``tests/unit/test_rollout_kernels.py`` (whose helpers it shares): on CPU under triton's
interpreter (``TRITON_INTERPRET=1 pytest tests/unit/test_rollout_gemm_kernels.py``, ``nox -s
kernels``), compiled on a CUDA machine. The GEMM's float32 parts must sum to ``x @ w.T`` within
1e-5 (float32 inputs) or within float32 accumulation error of the float64 product (bf16 inputs);
rounded outputs and the consumers follow the kernel tests' rule: fp32 within 1e-5 of torch, bf16
no further from float64 than torch's own bf16 maths, plus two bf16 ulps.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from tests.helpers.kernel_cases import (
    CAPACITY,
    EPS,
    HEAD_DIM,
    kernel_device,
    norm_rope_reference,
    rand,
    rope_tables,
)
from tests.helpers.kernel_cases import assert_close_to_decoder as _assert_close
from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer

DEVICE = kernel_device("tests/unit/test_rollout_gemm_kernels.py")
ON_GPU = DEVICE.type == "cuda"


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return rand(*shape, seed=seed, device=DEVICE, dtype=dtype)


def _rope_tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables(dtype, DEVICE)


_norm_rope_reference = norm_rope_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")
DTYPES = pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])


@pytest.fixture(scope="module")
def gemm() -> ModuleType:
    from miniverl.rollout.kernels import load_triton_gemm, triton_unavailable_reason

    assert triton_unavailable_reason(DEVICE) is None
    return load_triton_gemm()


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    from miniverl.rollout.kernels import load_triton_ops

    return load_triton_ops()


# -- the split rule --------------------------------------------------------------------------------
QWEN3_06B = {"qkv": (4096, 1024), "o": (1024, 2048), "gate_up": (6144, 1024), "down": (1024, 3072)}  # (N, K)


@pytest.mark.parametrize("rows", [1, 16, 33, 64])
@pytest.mark.parametrize("projection", list(QWEN3_06B))
def test_split_plan_cuts_k_into_whole_tiles_and_fills_the_gpu(gemm: ModuleType, rows: int, projection: str) -> None:
    cols, depth = QWEN3_06B[projection]
    plan = gemm.split_plan(rows, cols, depth)
    assert plan == gemm.split_plan(rows, cols, depth)  # a pure function
    assert plan.block_m == (16 if rows <= 16 else 64) and plan.block_n == 64 and plan.block_k == 128
    assert plan.slice_k == plan.tiles_per_split * plan.block_k
    assert (plan.split_k - 1) * plan.slice_k < depth <= plan.split_k * plan.slice_k  # no split is empty
    programs = -(-cols // plan.block_n) * plan.split_k
    assert 128 <= programs <= 2.2 * gemm.TARGET_PROGRAMS  # about 2 per SM of 132 (1..2.2)
    assert plan.split_k * rows * cols * 4 <= 0.5 * cols * depth * 2  # parts stay within half the bf16 weight


def test_split_plan_gives_narrow_weights_more_splits(gemm: ModuleType) -> None:
    splits = {name: gemm.split_plan(16, n, k).split_k for name, (n, k) in QWEN3_06B.items()}
    assert splits == {"qkv": 4, "o": 16, "gate_up": 3, "down": 12}
    assert gemm.split_plan(64, 1024, 2048).split_k == 8  # 64 rows: the partial-traffic cap halves o's splits
    assert gemm.split_plan(16, 151936, 1024).split_k == 1  # the LM head's 2374 column blocks need no split
    tiny = gemm.split_plan(5, 40, 300)  # one column block: as many splits as K tiles (3)
    assert (tiny.block_m, tiny.block_n, tiny.block_k, tiny.tiles_per_split, tiny.split_k) == (16, 64, 128, 1, 3)
    forced = gemm.split_plan(5, 40, 600, split_k=4)  # 5 tiles in 4 splits: 2 tiles each, the last one empty
    assert (forced.tiles_per_split, forced.split_k) == (2, 4)


def test_split_plan_refuses_what_it_cannot_tile(gemm: ModuleType) -> None:
    with pytest.raises(ValueError, match="rows"):
        gemm.split_plan(65, 1024, 1024)
    with pytest.raises(ValueError, match="split_k"):
        gemm.split_plan(16, 1024, 1024, split_k=9)  # only 8 tiles of 128
    x = torch.zeros(4, 32, device=DEVICE)
    with pytest.raises(ValueError, match="weight"):
        gemm.skinny_linear_partials(x, torch.zeros(8, 16, device=DEVICE))
    with pytest.raises(ValueError, match="must match"):
        gemm.skinny_linear_partials(x, torch.zeros(8, 32, device=DEVICE, dtype=torch.bfloat16))


# -- the GEMM --------------------------------------------------------------------------------------
def _assert_accumulated(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """``got`` is ``x @ weight.T`` up to float32 summation of exact products: ``K u sum|x w|``."""
    exact = x.double() @ weight.double().T
    scale = x.double().abs() @ weight.double().abs().T
    err = (got - exact).abs()
    bound = x.shape[1] * 2.0**-24 * scale
    assert bool((err <= bound).all()), f"accumulation error {float((err / scale).max()):.3g} of sum |x w|"


@pytest.mark.parametrize("rows", [1, 5, 16, 33])
@pytest.mark.parametrize(
    ("depth", "split_k"),
    [(40, None), (40, 1), (300, 1), (300, 2), (300, 3), (600, 4)],
    ids=["k40-auto", "k40-s1", "k300-s1", "k300-s2", "k300-s3", "empty-last-split"],
)
def test_fp32_parts_sum_to_the_product(gemm: ModuleType, rows: int, depth: int, split_k: int | None) -> None:
    cols = 40  # one column block of 64, masked past 40
    x, weight = _rand(rows, depth, seed=20), _rand(cols, depth, seed=21)
    parts = gemm.skinny_linear_partials(x, weight, split_k)
    plan = gemm.split_plan(rows, cols, depth, split_k)
    assert parts.shape == (plan.split_k, rows, cols) and parts.dtype == torch.float32
    if split_k is not None:
        assert plan.split_k == split_k
    # against float64, never against x @ weight.T: cuBLAS's own float32 sums differ from these by up to 2e-5 at
    # K = 300 and 600 (seen on the H200), both well inside the bound
    _assert_accumulated(parts.double().sum(0), x, weight)
    first = torch.arange(depth, device=DEVICE) < plan.slice_k  # part 0 is the first K-slice alone
    _assert_accumulated(parts[0].double(), x[:, first], weight[:, first])
    if depth == 600 and split_k == 4:
        assert torch.equal(parts[3], torch.zeros_like(parts[3]))  # tiles 6..7 lie past K
    _assert_accumulated(gemm.skinny_linear(x, weight, split_k).double(), x, weight)


@pytest.mark.parametrize("rows", [1, 5, 16, 33])
@pytest.mark.parametrize("split_k", [None, 1, 3])
def test_bf16_parts_accumulate_in_float32(gemm: ModuleType, rows: int, split_k: int | None) -> None:
    cols, depth = 72, 300  # two column blocks, the second masked; three K tiles, the last masked
    x = _rand(rows, depth, seed=22, dtype=torch.bfloat16)
    weight = _rand(cols, depth, seed=23, dtype=torch.bfloat16)
    _assert_accumulated(gemm.skinny_linear_partials(x, weight, split_k).double().sum(0), x, weight)
    exact = x.double() @ weight.double().T
    got = gemm.skinny_linear(x, weight, split_k)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, cols)
    _assert_close(got, F.linear(x, weight), exact, torch.bfloat16)


# -- consumers that sum the parts ------------------------------------------------------------------
def _parts(splits: int, rows: int, width: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    return _rand(splits, rows, width, seed=seed) * scale / splits


@DTYPES
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_add_rms_norm_sums_the_parts_and_rounds_once(
    ops: ModuleType, dtype: torch.dtype, splits: int, with_bias: bool
) -> None:
    width = 96
    residual = _rand(3, 1, width, seed=24, dtype=dtype) * 4
    parts = _parts(splits, 3, width, seed=25, scale=2.0)
    weight = (1 + 0.3 * _rand(width, seed=26)).to(dtype)
    bias = (0.5 * _rand(width, seed=27)).to(dtype) if with_bias else None
    new_residual, normed = ops.add_rms_norm(residual, parts, weight, EPS, bias=bias)
    update = parts.double().sum(0).view(3, 1, width) + (0.0 if bias is None else bias.double())
    exact_residual = residual.double() + update
    if dtype == torch.float32:
        torch.testing.assert_close(new_residual.double(), exact_residual, atol=1e-5, rtol=1e-6)
    else:  # one rounding of the float32 sum: within one bf16 ulp (the interpreter truncates)
        one_ulp = 2.0**-7 * exact_residual.abs() + 1e-6  # + the float32 sum's own error
        assert bool(((new_residual.double() - exact_residual).abs() <= one_ulp).all())
    reference = F.rms_norm(new_residual, (width,), weight, EPS)  # the norm reads the stored residual
    exact = F.rms_norm(new_residual.double(), (width,), weight.double(), EPS)
    _assert_close(normed, reference, exact, dtype)


def test_add_rms_norm_refuses_parts_of_another_shape(ops: ModuleType) -> None:
    residual, weight = torch.zeros(3, 1, 64, device=DEVICE), torch.ones(64, device=DEVICE)
    with pytest.raises(ValueError, match="split-K parts"):
        ops.add_rms_norm(residual, torch.zeros(2, 4, 64, device=DEVICE), weight, EPS)
    with pytest.raises(ValueError, match="bias"):
        ops.add_rms_norm(residual, None, weight, EPS, bias=weight)


@DTYPES
@pytest.mark.parametrize("splits", [1, 4])
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize("with_bias", [False, True], ids=["no_bias", "bias"])
def test_norm_rope_cache_write_sums_the_parts_as_f_linear_rounds_them(
    ops: ModuleType, dtype: torch.dtype, splits: int, qk_norm: bool, with_bias: bool
) -> None:
    heads, kv, batch = 4, 2, 3
    width = (heads + 2 * kv) * HEAD_DIM
    parts = _parts(splits, batch, width, seed=28, scale=2.0)
    bias = (0.5 * _rand(width, seed=29)).to(dtype) if with_bias else None
    norm = (1 + 0.5 * _rand(heads + kv, HEAD_DIM, seed=30)).to(dtype) if qk_norm else None
    cos, sin = _rope_tables(dtype)
    positions, slots = torch.tensor([5, 0, 37], device=DEVICE), torch.tensor([9, 47, 20], device=DEVICE)
    shape = (batch, kv, CAPACITY, HEAD_DIM)
    ref_caches = (_rand(*shape, seed=31, dtype=dtype), _rand(*shape, seed=32, dtype=dtype))
    caches = (ref_caches[0].clone(), ref_caches[1].clone())
    summed = parts.sum(0) + (0.0 if bias is None else bias.float())
    mixed = summed.to(dtype).view(batch, 1, heads + 2 * kv, HEAD_DIM)  # F.linear's output in the compute dtype
    q_ref = _norm_rope_reference(mixed, norm, cos, sin, positions, slots, ref_caches, heads, kv)
    q = ops.qk_norm_rope_cache_write(parts, norm, cos, sin, positions, *caches, slots, EPS, heads, kv, bias=bias)
    assert q.dtype == dtype
    from miniverl.rollout import decoder

    norm64 = None if norm is None else norm.double()
    cos64, sin64 = cos.double()[positions][:, None, None], sin.double()[positions][:, None, None]
    mixed64 = parts.double().sum(0) + (0.0 if bias is None else bias.double())  # before any rounding
    mixed64 = mixed64.view(batch, 1, heads + 2 * kv, HEAD_DIM)
    exact_q, exact_k, exact_v = decoder.qk_norm_rope(mixed64, norm64, cos64, sin64, EPS, heads, kv)
    _assert_close(q, q_ref, exact_q, dtype)
    for row, slot in enumerate(slots.tolist()):
        _assert_close(caches[0][row, :, slot], ref_caches[0][row, :, slot], exact_k[row, :, 0], dtype)
        _assert_close(caches[1][row, :, slot], ref_caches[1][row, :, slot], exact_v[row, :, 0], dtype)
        others = torch.arange(CAPACITY, device=DEVICE) != slot
        for cache, ref in zip(caches, ref_caches, strict=True):
            assert torch.equal(cache[row][:, others], ref[row][:, others])


@DTYPES
@pytest.mark.parametrize("splits", [1, 3])
@pytest.mark.parametrize("rows", [1, 5])
def test_silu_mul_equals_torch_on_the_rounded_projection(
    ops: ModuleType, dtype: torch.dtype, splits: int, rows: int
) -> None:
    width = 40  # I: gate is columns 0..39, up 40..79
    parts = _parts(splits, rows, 2 * width, seed=33, scale=3.0)
    gate, up = parts.sum(0).to(dtype).chunk(2, dim=-1)  # as F.linear hands them over
    got = ops.silu_mul(parts, dtype)
    assert got.shape == (rows, width) and got.dtype == dtype
    gate64, up64 = parts.double().sum(0).chunk(2, dim=-1)  # the exact projection, before any rounding
    # the interpreter truncates at each of the four bf16 roundings (gate, up, silu, product): up to 4 ulps
    _assert_close(got, F.silu(gate) * up, F.silu(gate64) * up64, dtype, ulps=2 if ON_GPU else 4)


def test_gemm_feeds_silu_mul_and_the_residual_norm(gemm: ModuleType, ops: ModuleType) -> None:
    """The MLP of a decode step through the parts equals the torch MLP (fp32)."""
    rows, hidden, inter = 5, 64, 96
    h, residual = _rand(rows, 1, hidden, seed=34), _rand(rows, 1, hidden, seed=35)
    gate_up, down = _rand(2 * inter, hidden, seed=36) * 0.2, _rand(hidden, inter, seed=37) * 0.2
    norm = 1 + 0.3 * _rand(hidden, seed=38)
    act = ops.silu_mul(gemm.skinny_linear_partials(h.view(rows, hidden), gate_up, 2), torch.float32)
    x, normed = ops.add_rms_norm(residual, gemm.skinny_linear_partials(act, down, 3), norm, EPS)
    gate, up = F.linear(h, gate_up).chunk(2, dim=-1)
    ref_x = residual + F.linear(F.silu(gate) * up, down)
    torch.testing.assert_close(x, ref_x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(normed, F.rms_norm(ref_x, (hidden,), norm, EPS), atol=1e-5, rtol=1e-5)


# -- the decode step through the engine ------------------------------------------------------------
def _greedy(model: Any, tok: Any, kernels: str) -> list[list[int]]:
    from miniverl.rollout.decoder import SamplingSpec
    from miniverl.rollout.engine import EngineRow, FastRolloutEngine

    texts = ["Mia has 7 apples.", "Sea", "Sam has 3 boxes of 4 pencils."]
    rows = [EngineRow(tok(text)["input_ids"], seed) for seed, text in enumerate(texts)]
    spec = SamplingSpec(0.0, 1.0, 0, (tok.eos_token_id,))
    engine = FastRolloutEngine(device=DEVICE, dtype=torch.float32, kernels=kernels)
    engine.sync_policy(model, 0)
    out = engine.generate(rows, batch_size=4, max_new_tokens=10, spec=spec, pad_id=tok.pad_token_id)
    return [tokens for tokens, _, _ in out]


def test_biased_projections_decode_through_the_parts_as_the_torch_path(
    gemm: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Llama with attention biases: qkv's bias added in the norm/RoPE kernel, o's in the residual norm."""
    calls = []
    split = gemm.skinny_linear_partials

    def counted(x: torch.Tensor, weight: torch.Tensor, split_k: int | None = None) -> torch.Tensor:
        calls.append(tuple(weight.shape))
        return split(x, weight, split_k)

    monkeypatch.setattr(gemm, "skinny_linear_partials", counted)
    tok = make_tiny_tokenizer()
    model = make_tiny_llama(tok, seed=2, initializer_range=0.2, attention_bias=True)
    for name, param in model.named_parameters():
        if name.endswith("proj.bias"):
            torch.nn.init.normal_(param, std=0.2, generator=torch.Generator().manual_seed(len(name)))
    torch_tokens = _greedy(model, tok, "torch")
    assert _greedy(model, tok, "triton") == torch_tokens
    assert len({tuple(t) for t in torch_tokens}) > 1
    assert {(128, 64), (64, 64), (256, 64), (64, 128)} <= set(calls)  # qkv, o, gate_up, down split over K


def test_a_batch_past_the_row_limit_decodes_through_f_linear(gemm: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(gemm, "MAX_ROWS", 2)  # the bucket of 4 rows is past it
    monkeypatch.setattr(gemm, "skinny_linear_partials", lambda *args, **kw: calls.append(args))
    tok = make_tiny_tokenizer()
    model = make_tiny_qwen3(tok, seed=1, initializer_range=0.2)
    assert _greedy(model, tok, "triton") == _greedy(model, tok, "torch")
    assert not calls

"""The decode step's triton kernels against the decoder's torch maths (their reference).

On CPU the kernels run under triton's interpreter, which must be on before triton is first
imported: ``TRITON_INTERPRET=1 pytest tests/unit/test_rollout_kernels.py`` (``nox -s kernels``).
On a CUDA machine without ``TRITON_INTERPRET=1`` they run compiled on the GPU. Tiny shapes:
head_dim 16, capacity 48, GQA ratios 1, 2 and 4, rows at different positions and slots. fp32 must
agree within 1e-5; bf16 must be no further from a float64 evaluation than the decoder's own bf16
maths is, plus two bf16 ulps (:func:`tests.helpers.kernel_cases.assert_close_to_decoder`). The
decode attention kernel's own tests are in ``test_rollout_attention_kernel.py``; the whole decode
through the engine, here, runs it too.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch

from miniverl.errors import UsageError
from miniverl.rollout import decoder
from tests.helpers.kernel_cases import CAPACITY, EPS, HEAD_DIM, kernel_device, norm_rope_reference, rand, rope_tables
from tests.helpers.kernel_cases import assert_close_to_decoder as _assert_close
from tests.helpers.tiny import make_tiny_llama, make_tiny_qwen3, make_tiny_tokenizer

DEVICE = kernel_device("tests/unit/test_rollout_kernels.py")
ON_GPU = DEVICE.type == "cuda"

GQA = [(4, 4), (4, 2), (8, 2)]  # (query heads, KV heads): ratios 1, 2, 4


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ops() -> ModuleType:
    from miniverl.rollout.kernels import load_triton_ops, triton_unavailable_reason

    assert triton_unavailable_reason(DEVICE) is None
    return load_triton_ops()


def _rand(*shape: int, seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return rand(*shape, seed=seed, device=DEVICE, dtype=dtype)


def _rope_tables(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_tables(dtype, DEVICE)


_norm_rope_reference = norm_rope_reference


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("qk_norm", [True, False], ids=["qk_norm", "no_norm"])
@pytest.mark.parametrize(("heads", "kv"), GQA, ids=["gqa1", "gqa2", "gqa4"])
def test_norm_rope_cache_write_equals_the_decoder(
    ops: ModuleType, dtype: torch.dtype, qk_norm: bool, heads: int, kv: int
) -> None:
    batch = 3
    mixed = _rand(batch, 1, heads + 2 * kv, HEAD_DIM, seed=1, dtype=dtype) * 3
    norm = (1 + 0.5 * _rand(heads + kv, HEAD_DIM, seed=2)).to(dtype) if qk_norm else None
    cos, sin = _rope_tables(dtype)
    positions = torch.tensor([5, 0, 37], device=DEVICE)  # rows at different positions
    slots = torch.tensor([9, 47, 20], device=DEVICE)  # and different slots
    shape = (batch, kv, CAPACITY, HEAD_DIM)
    ref_caches = (_rand(*shape, seed=3, dtype=dtype), _rand(*shape, seed=4, dtype=dtype))
    caches = (ref_caches[0].clone(), ref_caches[1].clone())
    q_ref = _norm_rope_reference(mixed, norm, cos, sin, positions, slots, ref_caches, heads, kv)
    q = ops.qk_norm_rope_cache_write(mixed, norm, cos, sin, positions, *caches, slots, EPS, heads, kv)
    norm64 = None if norm is None else norm.double()
    cos64, sin64 = cos.double()[positions][:, None, None], sin.double()[positions][:, None, None]
    exact_q, exact_k, _ = decoder.qk_norm_rope(mixed.double(), norm64, cos64, sin64, EPS, heads, kv)
    _assert_close(q, q_ref, exact_q, dtype)
    for row, slot in enumerate(slots.tolist()):
        _assert_close(caches[0][row, :, slot], ref_caches[0][row, :, slot], exact_k[row, :, 0], dtype)
        assert torch.equal(caches[1][row, :, slot], ref_caches[1][row, :, slot])  # v is copied as is
        others = torch.arange(CAPACITY, device=DEVICE) != slot
        for cache, ref in zip(caches, ref_caches, strict=True):  # no other slot of the row is touched
            assert torch.equal(cache[row][:, others], ref[row][:, others])


def test_one_slot_for_every_row_as_the_decoder_passes_it(ops: ModuleType) -> None:
    heads, kv, batch = 4, 2, 2
    mixed = _rand(batch, 1, heads + 2 * kv, HEAD_DIM, seed=5)
    cos, sin = _rope_tables(torch.float32)
    positions, slot = torch.tensor([3, 11], device=DEVICE), torch.tensor([17], device=DEVICE)
    caches = (
        torch.zeros(batch, kv, CAPACITY, HEAD_DIM, device=DEVICE),
        torch.zeros(batch, kv, CAPACITY, HEAD_DIM, device=DEVICE),
    )
    ref_caches = (caches[0].clone(), caches[1].clone())
    q = ops.qk_norm_rope_cache_write(mixed, None, cos, sin, positions, *caches, slot, EPS, heads, kv)
    q_ref = _norm_rope_reference(mixed, None, cos, sin, positions, slot.expand(batch), ref_caches, heads, kv)
    torch.testing.assert_close(q, q_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(caches[0], ref_caches[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(caches[1], ref_caches[1])


# -- residual + RMSNorm ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("width", [64, 96])
def test_add_rms_norm_equals_the_decoder(ops: ModuleType, dtype: torch.dtype, width: int) -> None:
    residual = _rand(3, 1, width, seed=9, dtype=dtype) * 4
    update = _rand(3, 1, width, seed=10, dtype=dtype)
    weight = (1 + 0.3 * _rand(width, seed=11)).to(dtype)
    new_residual, normed = ops.add_rms_norm(residual, update, weight, EPS)
    ref_residual, ref_normed = decoder.add_rms_norm(residual, update, weight, EPS)
    if dtype == torch.float32 or ON_GPU:
        assert torch.equal(new_residual, ref_residual)  # one rounding of the same sum
    else:  # the interpreter truncates to bf16: within one ulp
        torch.testing.assert_close(new_residual, ref_residual, atol=0, rtol=2.0**-7)
    exact = decoder.add_rms_norm(residual.double(), update.double(), weight.double(), EPS)[1]
    _assert_close(normed, ref_normed, exact, dtype)
    alone, normed_alone = ops.add_rms_norm(residual, None, weight, EPS)
    assert alone is residual
    ref_alone = torch.nn.functional.rms_norm(residual, (width,), weight, EPS)
    _assert_close(
        normed_alone, ref_alone, torch.nn.functional.rms_norm(residual.double(), (width,), weight.double(), EPS), dtype
    )


# -- the whole decode through the engine -----------------------------------------------------------
@pytest.mark.parametrize("factory", [make_tiny_qwen3, make_tiny_llama], ids=["qwen3", "llama"])
def test_greedy_decode_through_the_triton_kernels_equals_the_torch_path(ops: ModuleType, factory: Any) -> None:
    from miniverl.rollout.decoder import SamplingSpec
    from miniverl.rollout.engine import EngineRow, FastRolloutEngine

    tok = make_tiny_tokenizer()
    model = factory(tok, seed=1, initializer_range=0.2)
    rows = [
        EngineRow(tok(text)["input_ids"], seed)
        for seed, text in enumerate(["Mia has 7 apples.", "Sea", "Sam has 3 boxes of 4 pencils."])
    ]
    spec = SamplingSpec(0.0, 1.0, 0, (tok.eos_token_id,))
    outputs = {}
    for kernels in ("torch", "triton"):
        engine = FastRolloutEngine(device=DEVICE, dtype=torch.float32, kernels=kernels)
        engine.sync_policy(model, 0)
        outputs[kernels] = engine.generate(rows, batch_size=4, max_new_tokens=12, spec=spec, pad_id=tok.pad_token_id)
    assert [o[0] for o in outputs["triton"]] == [o[0] for o in outputs["torch"]]
    assert len({tuple(o[0]) for o in outputs["torch"]}) > 1  # the rows decode differently


def test_triton_on_cpu_is_refused_without_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    from miniverl.rollout.engine import FastRolloutEngine

    fake = ModuleType("compiled")
    fake.INTERPRETED = False  # type: ignore[attr-defined]
    monkeypatch.setattr("miniverl.rollout.kernels.load_triton_ops", lambda: fake)
    with pytest.raises(UsageError, match="TRITON_INTERPRET=1"):
        FastRolloutEngine(device=torch.device("cpu"), dtype=torch.float32, kernels="triton")
    with pytest.raises(UsageError, match="kernels"):
        FastRolloutEngine(device=torch.device("cpu"), dtype=torch.float32, kernels="cuda")


def _engine_rows(tok: Any) -> list[Any]:
    from miniverl.rollout.engine import EngineRow

    texts = ["Mia has 7 apples.", "Sea", "Sam has 3 boxes of 4 pencils."]
    return [EngineRow(tok(text)["input_ids"], seed) for seed, text in enumerate(texts)]


def test_bf16_sampled_logprobs_stay_within_the_decoders_bounds(ops: ModuleType) -> None:
    """bf16 rollout through the kernels vs the fp32 teacher-forced forward: the decoder's CUDA bounds."""
    from miniverl.rollout.decoder import SamplingSpec
    from miniverl.rollout.engine import FastRolloutEngine

    tok = make_tiny_tokenizer()
    model: Any = make_tiny_qwen3(tok, seed=3, initializer_range=0.2)
    model.to(DEVICE)
    rows = _engine_rows(tok)
    engine = FastRolloutEngine(device=DEVICE, dtype=torch.bfloat16, kernels="triton")
    engine.sync_policy(model, 0)
    out = engine.generate(rows, batch_size=4, max_new_tokens=12, spec=SamplingSpec(1.0, 1.0, 0, ()), pad_id=1)
    diffs = []
    for row, (tokens, logprobs, _) in zip(rows, out, strict=True):
        ids = torch.tensor([list(row.prompt_ids) + tokens], device=DEVICE)
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(row.prompt_ids) - 1 : -1].float()
        wanted = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(row.prompt_ids) :, None])[:, 0]
        diffs.append((torch.tensor(logprobs) - wanted.cpu()).abs())
    every = torch.cat(diffs)
    assert every.numel() == 3 * 12 and every.isfinite().all()
    assert float(every.mean()) < 0.05 and float(every.max()) < 0.5


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
def test_graph_replay_through_the_kernels_equals_the_eager_step(ops: ModuleType) -> None:
    from miniverl.rollout.decoder import SamplingSpec
    from miniverl.rollout.engine import FastRolloutEngine

    tok = make_tiny_tokenizer()
    model: Any = make_tiny_qwen3(tok, seed=4, initializer_range=0.2)
    model.to(DEVICE)
    rows, spec = _engine_rows(tok), SamplingSpec(1.0, 1.0, 0, ())
    outputs = []
    for graphs in (True, False):
        engine = FastRolloutEngine(device=DEVICE, dtype=torch.bfloat16, use_graphs=graphs, kernels="triton")
        engine.sync_policy(model, 0)
        outputs.append(engine.generate(rows, batch_size=4, max_new_tokens=70, spec=spec, pad_id=1))
        assert (engine.stats.captures > 1) == graphs  # 70 tokens cross a span bucket: two graphs
    for (tg, lg, _), (te, le, _) in zip(*outputs, strict=True):
        assert tg == te
        assert lg == pytest.approx(le, abs=1e-5)

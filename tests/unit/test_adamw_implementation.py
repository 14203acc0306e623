"""AdamW's implementation (issue #33): foreach off CUDA, fused on CUDA fp32/bf16; same state, resumable across."""

from __future__ import annotations

import pytest
import torch

from miniverl.training import checkpoint as ckpt
from miniverl.training.algorithms.base import TrainedParameters, adamw_implementation

SETTINGS = {"lr": 0.01, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "max_grad_norm": 1.0}


def _params(device: str = "cpu", dtype: torch.dtype = torch.float32) -> list[tuple[str, torch.nn.Parameter]]:
    g = torch.Generator().manual_seed(0)
    return [
        (f"layer.{i}.lora_A", torch.nn.Parameter(torch.randn(8, 16, generator=g).to(device, dtype))) for i in range(3)
    ]


def _steps(trained: TrainedParameters, count: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(count):
        for p in trained.params:
            p.grad = torch.randn(p.shape, generator=g).to(p.device, p.dtype)
        trained.step()


def test_cpu_takes_foreach_and_matches_the_per_tensor_loop_bitwise() -> None:
    assert adamw_implementation([p for _, p in _params()]) == {"foreach": True}
    assert adamw_implementation([]) == {"foreach": True}
    fast = TrainedParameters(_params(), **SETTINGS)
    assert fast.optimizer.param_groups[0]["foreach"] is True
    loop = TrainedParameters(_params(), **SETTINGS)
    loop.optimizer.param_groups[0]["foreach"] = False
    _steps(fast, 4)
    _steps(loop, 4)
    for a, b in zip(fast.params, loop.params, strict=True):
        assert torch.equal(a, b)


def test_a_checkpoint_of_the_per_tensor_loop_resumes_on_foreach_exactly() -> None:
    """A checkpoint written before this change (``foreach: None``) loads into the live implementation, and the
    steps after it equal those of the run that never stopped."""
    old = TrainedParameters(_params(), **SETTINGS)
    old.optimizer.param_groups[0]["foreach"] = None
    _steps(old, 1)
    saved, meta = ckpt.optimizer_to_tensors(old.optimizer)
    tensors = {k: v.clone() for k, v in saved.items()}  # as read back from the file: no storage shared with `old`
    assert meta["param_groups"][0]["foreach"] is None
    assert {k for k in tensors if k.endswith(".step")} == {f"state.{i}.step" for i in range(3)}
    assert all(tensors[f"state.{i}.step"].shape == () for i in range(3))
    resumed = TrainedParameters(_params(), **SETTINGS)
    resumed.load({n: p.detach() for n, p in zip(old.names, old.params, strict=True)})
    ckpt.optimizer_from_tensors(resumed.optimizer, tensors, meta)
    assert resumed.optimizer.param_groups[0]["foreach"] is True
    _steps(resumed, 1, seed=2)
    _steps(old, 1, seed=2)
    for a, b in zip(resumed.params, old.params, strict=True):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_takes_fused_within_float_tolerance_and_keeps_the_step_tensors(dtype: torch.dtype) -> None:
    fused = TrainedParameters(_params("cuda", dtype), **SETTINGS)
    assert fused.optimizer.param_groups[0]["fused"] is True
    foreach = TrainedParameters(_params("cuda", dtype), **SETTINGS)
    foreach.optimizer.param_groups[0]["fused"] = None
    foreach.optimizer.param_groups[0]["foreach"] = True
    _steps(fused, 3)
    _steps(foreach, 3)
    tolerance = {"atol": 1e-6, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-2, "rtol": 1e-2}
    for a, b in zip(fused.params, foreach.params, strict=True):
        torch.testing.assert_close(a, b, **tolerance)
    tensors, meta = ckpt.optimizer_to_tensors(fused.optimizer)
    steps = {k: v for k, v in tensors.items() if k.endswith(".step")}
    assert len(steps) == 3 and all(
        v.shape == () and v.dtype == torch.float32 and float(v) == 3.0 for v in steps.values()
    )
    resumed = TrainedParameters(_params("cuda", dtype), **SETTINGS)
    ckpt.optimizer_from_tensors(resumed.optimizer, tensors, meta)
    assert all(s["step"].device.type == "cuda" for s in resumed.optimizer.state.values())  # fused wants them there

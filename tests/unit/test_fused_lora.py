"""PEFT's LoRA scale-and-add fused into the B GEMM (``torch.addmm``): PEFT's output and gradients, and PEFT's own
forward wherever the fused one cannot take the call (runs on CPU without triton)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model

from miniverl.runtime.fused import _is_peft_lora_linear, _lora_linear_forward


def _student(
    dropout: float = 0.0, dtype: torch.dtype = torch.float32, adapter_in_base_dtype: bool = False, **lora: object
) -> torch.nn.Module:
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.ReLU(), torch.nn.Linear(24, 8)).to(dtype)
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=["0", "2"], **lora)  # type: ignore[arg-type]
    student = get_peft_model(base, config)
    for name, param in student.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.5)
    return student.to(dtype) if adapter_in_base_dtype else student  # PEFT alone keeps an fp32 adapter


def _fuse(student: torch.nn.Module) -> int:
    layers = [m for m in student.modules() if _is_peft_lora_linear(m)]
    for module in layers:
        module.forward = types.MethodType(_lora_linear_forward(module.forward), module)
    return len(layers)


def _run(student: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    out = student(x)
    out.square().sum().backward()
    return out.detach(), {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_lora_linear_gives_pefts_output_and_gradients(dtype: torch.dtype) -> None:
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(1)).to(dtype)
    peft_out, peft_grads = _run(_student(dtype=dtype, adapter_in_base_dtype=True), x)
    fused_student = _student(dtype=dtype, adapter_in_base_dtype=True)
    assert {p.dtype for p in fused_student.parameters()} == {dtype}  # the addmm path, as miniverl's bf16 adapter
    assert _fuse(fused_student) == 2
    fused_out, fused_grads = _run(fused_student, x)
    rel = 1e-5 if dtype == torch.float32 else 1e-2  # bf16: a rounding apart (seen: at most 0.6 % of the largest)

    def close(ours: torch.Tensor, theirs: torch.Tensor) -> bool:
        return bool((ours.float() - theirs.float()).abs().max() <= rel * theirs.float().abs().max())

    assert close(fused_out, peft_out)
    assert set(fused_grads) == set(peft_grads) and any("lora_A" in n for n in fused_grads)
    assert all(close(fused_grads[name], grad) for name, grad in peft_grads.items())


def test_the_fused_forward_is_the_addmm_and_not_pefts(monkeypatch: pytest.MonkeyPatch) -> None:
    student = _student()
    _fuse(student)
    calls: list[float] = []
    addmm = torch.addmm

    def counting_addmm(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(float(kwargs["alpha"]))
        return addmm(*args, **kwargs)

    monkeypatch.setattr(torch, "addmm", counting_addmm)
    student(torch.randn(2, 16))
    assert calls == [2.0, 2.0]  # lora_alpha / r, once per LoRA linear


def test_disabled_adapters_give_the_base_and_dropout_draws_pefts_mask() -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(2))
    student = _student(dropout=0.5)
    _fuse(student)
    base: Any = student.get_base_model()
    with student.disable_adapter():
        disabled = student(x)
    plain = base[2].base_layer(base[1](base[0].base_layer(x)))
    torch.testing.assert_close(disabled, plain)
    reference = _student(dropout=0.5)
    student.train()
    reference.train()
    torch.manual_seed(3)
    fused_train = student(x)
    torch.manual_seed(3)
    peft_train = reference(x)
    torch.testing.assert_close(fused_train, peft_train)  # the same dropout mask, drawn in PEFT's order


def test_a_dora_adapter_is_left_to_peft() -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(4))
    reference = _student(use_dora=True)
    student = _student(use_dora=True)
    _fuse(student)
    torch.testing.assert_close(student(x), reference(x))


def test_an_fp32_adapter_on_a_bf16_base_gives_pefts_sum() -> None:
    """PEFT keeps fp32 LoRA weights beside a bf16 base (autocast_adapter_dtype): the dtypes differ, so no addmm."""
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    reference = _student(dtype=torch.bfloat16)
    student = _student(dtype=torch.bfloat16)
    _fuse(student)
    assert {p.dtype for n, p in student.named_parameters() if "lora_" in n} == {torch.float32}
    torch.testing.assert_close(student(x), reference(x))

"""train.adapter_precision: what auto resolves to, and the refusal of bf16_master on a non-bfloat16 student."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from miniverl.config.schema import MiniverlConfig
from miniverl.training.algorithms.base import TrainedParameters, resolve_adapter_precision
from tests.conftest import tiny_config


def _config(dtype: str, precision: str) -> MiniverlConfig:
    raw = tiny_config(Path("/nonexistent"), algorithm="grpo")
    raw["models"]["dtype"] = dtype
    raw["train"]["adapter_precision"] = precision
    return MiniverlConfig.model_validate(raw)


@pytest.mark.parametrize(
    ("dtype", "precision", "device", "expected"),
    [
        ("bfloat16", "auto", "cuda", "bf16_master"),
        ("bfloat16", "auto", "cpu", "fp32"),
        ("float32", "auto", "cuda", "fp32"),
        ("float16", "auto", "cuda", "fp32"),
        ("bfloat16", "fp32", "cuda", "fp32"),
        ("bfloat16", "bf16_master", "cpu", "bf16_master"),
    ],
)
def test_auto_resolves_by_dtype_and_device(dtype: str, precision: str, device: str, expected: str) -> None:
    assert resolve_adapter_precision(_config(dtype, precision), torch.device(device)) == expected


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bf16_master_on_another_dtype_is_refused(dtype: str) -> None:
    with pytest.raises(ValidationError, match=r"bf16_master needs models\.dtype bfloat16"):
        _config(dtype, "bf16_master")


def test_trained_parameters_step_the_masters_and_leave_non_adapter_tensors_fp32() -> None:
    torch.manual_seed(0)
    lora = torch.nn.Parameter(torch.randn(4, 3))
    head = torch.nn.Parameter(torch.randn(1, 3))
    kwargs = {"lr": 0.1, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0, "max_grad_norm": 1.0}
    start = lora.detach().clone()
    trained = TrainedParameters(
        [("x.lora_A.student.weight", lora), ("value_head.weight", head)], bf16_master=True, **kwargs
    )
    reference = TrainedParameters(
        [("a", torch.nn.Parameter(start.clone())), ("b", torch.nn.Parameter(head.detach().clone()))], **kwargs
    )
    assert trained.precision == "bf16_master" and reference.precision == "fp32"
    assert lora.dtype == torch.bfloat16 and head.dtype == torch.float32
    assert trained.named()["x.lora_A.student.weight"].dtype == torch.float32
    assert trained.named()["value_head.weight"] is head  # its own master
    x = torch.randn(5, 3)
    for _ in range(2):
        (x.bfloat16() @ lora.t()).float().pow(2).sum().add((x @ head.t()).sum()).backward()
        masters = list(trained.named().values())
        refs = reference.params
        refs[0].grad = lora.grad.float()  # type: ignore[union-attr]
        refs[1].grad = head.grad.clone()  # type: ignore[union-attr]
        norm, delta = trained.step()
        ref_norm, ref_delta = reference.step()
        assert norm == pytest.approx(ref_norm) and delta == pytest.approx(ref_delta)
        assert masters[0].equal(refs[0]) and masters[1].equal(refs[1])
        assert lora.grad is None and lora.equal(masters[0].detach().bfloat16())
    with trained.masters_in_model():
        assert lora.dtype == torch.float32 and lora.equal(trained.named()["x.lora_A.student.weight"])
    assert lora.dtype == torch.bfloat16
    saved = {k: v.detach().clone() for k, v in trained.named().items()}
    with torch.no_grad():
        for p in trained.params:
            p.zero_()
        lora.zero_()
    trained.load(saved)
    assert trained.named()["x.lora_A.student.weight"].equal(saved["x.lora_A.student.weight"])
    assert lora.equal(saved["x.lora_A.student.weight"].bfloat16())

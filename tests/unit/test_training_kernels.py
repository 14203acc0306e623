"""The training forward's fused kernels (miniverl.runtime.fused_kernels) against HF's own modules, under triton's
interpreter on CPU (the `kernels` nox session sets TRITON_INTERPRET=1; without triton these tests skip)."""

from __future__ import annotations

import os

import pytest
import torch

triton = pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available():
    pytest.skip("triton kernels run on CPU only under TRITON_INTERPRET=1", allow_module_level=True)

from miniverl.runtime.fused import fuse_training_kernels, fused_unavailable_reason  # noqa: E402
from miniverl.runtime.fused_kernels import RmsNormFunction, SiluMulFunction  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _reference_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF Llama's RMSNorm, as written there."""
    hidden = x.to(torch.float32)
    hidden = hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + eps)
    return weight * hidden.to(x.dtype)


@pytest.mark.parametrize("width", [64, 100])
def test_rms_norm_forward_and_backward_match_hfs(width: int) -> None:
    gen = torch.Generator().manual_seed(width)
    x = torch.randn(3, 5, width, generator=gen).to(DEVICE).requires_grad_()
    weight = (torch.rand(width, generator=gen) + 0.5).to(DEVICE).requires_grad_()
    grad = torch.randn(3, 5, width, generator=gen).to(DEVICE)
    ours = RmsNormFunction.apply(x, weight, 1e-6)
    (dx, dw) = torch.autograd.grad(ours, (x, weight), grad)
    ref = _reference_norm(x, weight, 1e-6)
    (rdx, rdw) = torch.autograd.grad(ref, (x, weight), grad)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dx, rdx, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dw, rdw, rtol=1e-4, atol=1e-4)


def test_silu_mul_forward_and_backward_match_torchs() -> None:
    gen = torch.Generator().manual_seed(7)
    gate = (torch.randn(4, 3000, generator=gen) * 3).to(DEVICE).requires_grad_()  # more than one program
    up = torch.randn(4, 3000, generator=gen).to(DEVICE).requires_grad_()
    grad = torch.randn(4, 3000, generator=gen).to(DEVICE)
    ours = SiluMulFunction.apply(gate, up)
    dg, du = torch.autograd.grad(ours, (gate, up), grad)
    ref = torch.nn.functional.silu(gate) * up
    rdg, rdu = torch.autograd.grad(ref, (gate, up), grad)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dg, rdg, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(du, rdu, rtol=1e-5, atol=1e-6)


def _lora_student(fused: bool) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    from tests.helpers.tiny import make_tiny_llama, make_tiny_tokenizer

    model = make_tiny_llama(make_tiny_tokenizer(), seed=0).to(DEVICE)
    torch.manual_seed(0)  # the same LoRA A init for both students
    student = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    for name, param in student.named_parameters():
        if "lora_B" in name:
            param.data.fill_(0.1)
    if fused:
        layers = model.config.num_hidden_layers
        counts = fuse_training_kernels(student, "triton")
        assert counts == {"rms_norm": 2 * layers + 1, "swiglu": layers, "lora_linear": 3 * layers}
    return student


def test_a_fused_lora_student_computes_hfs_logits_and_lora_grads() -> None:
    ids = torch.tensor([[1, 5, 7, 9, 11, 3], [2, 4, 6, 8, 10, 12]], device=DEVICE)
    runs = {}
    for fused in (False, True):
        student = _lora_student(fused)
        logits = student(ids).logits
        logits.float().log_softmax(-1).gather(-1, ids[:, :, None]).sum().backward()
        grads = {n: p.grad for n, p in student.named_parameters() if p.requires_grad}
        runs[fused] = (logits.detach(), grads)
    torch.testing.assert_close(runs[True][0], runs[False][0], rtol=1e-4, atol=1e-5)
    assert set(runs[True][1]) == set(runs[False][1]) and runs[True][1]
    for name, grad in runs[False][1].items():
        torch.testing.assert_close(runs[True][1][name], grad, rtol=1e-3, atol=1e-5, msg=name)


def test_liger_is_refused_in_one_line_off_cuda() -> None:
    reason = fused_unavailable_reason("liger", torch.device("cpu"))
    assert reason is not None and "CUDA only" in reason and "\n" not in reason
    assert fused_unavailable_reason("triton", DEVICE) is None


def test_the_runtime_puts_the_fused_kernels_into_its_student_only() -> None:
    """``train.fused_kernels: triton`` through the role runtime: every RMSNorm and SwiGLU MLP of the student."""
    from miniverl.config.schema import ModelsSection
    from miniverl.gate.models import RandomModelLoader
    from miniverl.runtime import build_runtime

    models = ModelsSection.model_validate({"student": {"source": "local", "path": "tiny", "lora": {"r": 4}}})
    runtime = build_runtime(models, device=DEVICE, loader=RandomModelLoader("tiny"))
    counts = runtime.fuse_training_kernels("triton")
    layers = int(runtime.student_config().num_hidden_layers)
    qk_norms = 2 * layers if runtime.student_config().model_type == "qwen3" else 0  # Qwen3's per-head q/k norms
    lora_linears = sum(isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict) for m in runtime._student.modules())
    assert lora_linears and counts == {
        "rms_norm": 2 * layers + 1 + qk_norms,
        "swiglu": layers,
        "lora_linear": lora_linears,
    }

"""Fused training kernels put into a loaded model, module by module (issue #33).

``fuse_training_kernels(model, "triton")`` gives every RMSNorm of a Llama-family decoder (the layers' two norms,
the final norm, Qwen3's per-head q/k norms) and every SwiGLU MLP a forward through
:mod:`miniverl.runtime.fused_kernels` (one kernel each way instead of HF's chain); ``"liger"`` through
liger-kernel's Triton ops, which run on CUDA only (their kernels do not run under triton's interpreter). Only this
model's instances change: no class or module-level function of transformers is patched, so another model in the
same process (a benchmark's baseline) keeps HF's code. LoRA layers stay as PEFT wraps them: the MLP's projections
are called as modules.

Either kind also fuses PEFT's LoRA scale-and-add into the B projection's GEMM: PEFT computes
``base(x) + lora_B(lora_A(x)) * scaling``, a multiply and an add over ``[rows, out]`` after the B GEMM, and the
multiply again in the backward; ``torch.addmm(base(x), lora_A(x), B.T, alpha=scaling)`` lets the GEMM's epilogue do
both (cuBLAS's alpha and beta), with no ``[rows, out]`` temporary. liger-kernel has no LoRA op, so this is ours
under both kinds. A layer the fused forward cannot take at a call (adapters disabled, merged or mixed, DoRA or
another variant, a bias on B, mismatched dtypes) goes through PEFT's own forward.

The kernels are optional: :func:`fused_unavailable_reason` says in one line why they cannot run here.
"""

from __future__ import annotations

import importlib
import types
from typing import Any, Literal

import torch

from miniverl.errors import DependencyError

FusedKernels = Literal["triton", "liger"]
FUSED_CHOICES: tuple[FusedKernels, ...] = ("triton", "liger")


def fused_unavailable_reason(kind: FusedKernels, device: torch.device) -> str | None:
    """``None`` when ``kind``'s kernels can run on ``device``, else one line saying why not."""
    if kind == "liger":
        if device.type != "cuda":
            return "liger-kernel's kernels run on CUDA only (not under triton's interpreter)"
        try:
            importlib.import_module("liger_kernel.ops.rms_norm")
        except ImportError as exc:
            return f"liger-kernel is not importable ({exc})"
        return None
    try:
        kernels = importlib.import_module("miniverl.runtime.fused_kernels")
    except ImportError as exc:
        return f"triton is not importable ({exc})"
    if device.type == "cpu" and not kernels.INTERPRETED:
        return "triton kernels run on CPU only under the interpreter: set TRITON_INTERPRET=1 before triton is imported"
    return None


def check_fused_kernels(kind: FusedKernels, device: torch.device) -> None:
    """``train.fused_kernels``: one line (:class:`DependencyError`) where ``kind`` cannot run on ``device``."""
    why = fused_unavailable_reason(kind, device)
    if why is not None:
        raise DependencyError(f"train.fused_kernels {kind}: {why}")


def _is_rms_norm(module: Any) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def _is_swiglu(module: Any) -> bool:
    act = getattr(module, "act_fn", None)  # torch's SiLU, or transformers' SiLUActivation (``hidden_act: silu``)
    silu = isinstance(act, torch.nn.SiLU) or type(act).__name__ == "SiLUActivation"
    return silu and all(hasattr(module, n) for n in ("gate_proj", "up_proj", "down_proj"))


def _is_peft_lora_linear(module: Any) -> bool:
    lora_a = getattr(module, "lora_A", None)
    return (
        isinstance(lora_a, torch.nn.ModuleDict)
        and isinstance(getattr(module, "base_layer", None), torch.nn.Module)
        and isinstance(getattr(module, "scaling", None), dict)
        and type(module).__name__ == "Linear"
    )


def _lora_linear_forward(peft_forward: Any) -> Any:
    def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        adapters = self.active_adapters
        name = adapters[0] if len(adapters) == 1 else None
        if args or kwargs or self.disable_adapters or self.merged or name not in self.lora_A:
            return peft_forward(x, *args, **kwargs)
        lora_b = self.lora_B[name]
        if (
            name in getattr(self, "lora_variant", {})
            or getattr(self, "use_dora", {}).get(name)
            or lora_b.bias is not None
        ):
            return peft_forward(x)
        result = self.base_layer(x)
        lora_a = self.lora_A[name]
        down = lora_a(self.lora_dropout[name](x.to(lora_a.weight.dtype)))
        if down.dtype != result.dtype or lora_b.weight.dtype != result.dtype:  # PEFT's own sum, no second pass
            return (result + lora_b(down) * self.scaling[name]).to(result.dtype)
        out = result.shape[-1]
        fused = torch.addmm(
            result.reshape(-1, out), down.reshape(-1, down.shape[-1]), lora_b.weight.t(), alpha=self.scaling[name]
        )
        return fused.view(result.shape)

    return forward


def _ops(kind: FusedKernels) -> tuple[Any, Any]:
    """``(rms_norm(x, weight, eps), silu_mul(gate, up))`` of ``kind``."""
    if kind == "liger":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction

        def liger_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
            return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", False)

        return liger_norm, LigerSiLUMulFunction.apply
    kernels = importlib.import_module("miniverl.runtime.fused_kernels")
    return kernels.rms_norm, kernels.silu_mul


def fuse_training_kernels(model: Any, kind: FusedKernels) -> dict[str, int]:
    """Give ``model``'s RMSNorm and SwiGLU MLP instances ``kind``'s fused forward, and its PEFT LoRA linears the
    scale-and-add in the B GEMM; returns how many of each."""
    norm_op, silu_mul_op = _ops(kind)

    def norm_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        return norm_op(hidden_states, self.weight, self.variance_epsilon)

    def mlp_forward(self: Any, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_mul_op(self.gate_proj(x), self.up_proj(x)))

    counts = {"rms_norm": 0, "swiglu": 0, "lora_linear": 0}
    for module in model.modules():
        if _is_peft_lora_linear(module):
            module.forward = types.MethodType(_lora_linear_forward(module.forward), module)
            counts["lora_linear"] += 1
        elif _is_rms_norm(module):
            module.forward = types.MethodType(norm_forward, module)
            counts["rms_norm"] += 1
        elif _is_swiglu(module):
            module.forward = types.MethodType(mlp_forward, module)
            counts["swiglu"] += 1
    return counts


__all__ = ["FUSED_CHOICES", "FusedKernels", "check_fused_kernels", "fuse_training_kernels", "fused_unavailable_reason"]

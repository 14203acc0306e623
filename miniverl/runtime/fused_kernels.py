"""Triton kernels for the training forward and backward: RMSNorm and the MLP's ``silu(gate) * up`` (issue #33).

The update's element-wise work (HF's float32 RMSNorm and its casts, SiLU and the product) is launched by HF as a
chain of small torch kernels, each of which reads and writes the whole activation and several of which autograd
keeps for backward. Here each is one kernel forward and one backward, as autograd Functions that keep only their
inputs (and one float32 ``rstd`` per row for the norm):

* :class:`RmsNormFunction`: ``weight * (x * rsqrt(mean(x²) + eps)).to(x.dtype)``, HF Llama/Qwen3's order of
  roundings, computed in float32; backward ``dx = rstd * (g - n * mean(g * n))`` with ``g = dy * weight`` and
  ``n = x * rstd``; the weight's grad (a frozen base weight never asks for it) by torch from the same terms;
* :class:`SiluMulFunction`: ``silu(gate) * up`` rounded as torch rounds ``F.silu(gate)`` then the product;
  backward ``d_up = dh * silu(gate)``, ``d_gate = dh * up * s * (1 + gate * (1 - s))`` with ``s = sigmoid(gate)``.

triton is imported with this module; :mod:`miniverl.runtime.fused` loads it on first use. On CPU the kernels run
only under triton's interpreter (``TRITON_INTERPRET=1`` before triton's first import), which is how they are tested
without a GPU; :data:`INTERPRETED` says whether they are.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

ELEMENTWISE_BLOCK = 1024  # elements per program of the silu-mul kernels


@triton.jit
def _rms_norm_forward_kernel(x_ptr, weight_ptr, out_ptr, rstd_ptr, stride, eps, WIDTH: tl.constexpr,
                             BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < WIDTH
    x = tl.load(x_ptr + row * stride + offs, mask=inside, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / WIDTH + eps)
    dtype = out_ptr.dtype.element_ty
    normed = (x * rstd).to(dtype).to(tl.float32)  # HF rounds the normed row to the input dtype, then scales
    weight = tl.load(weight_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * WIDTH + offs, (normed * weight).to(dtype), mask=inside)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def _rms_norm_backward_kernel(grad_ptr, x_ptr, weight_ptr, rstd_ptr, dx_ptr, stride_grad, stride_x,
                              WIDTH: tl.constexpr, BLOCK: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    inside = offs < WIDTH
    x = tl.load(x_ptr + row * stride_x + offs, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(grad_ptr + row * stride_grad + offs, mask=inside, other=0.0).to(tl.float32)
    weight = tl.load(weight_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    rstd = tl.load(rstd_ptr + row)
    normed = x * rstd
    g = dy * weight
    dx = rstd * (g - normed * (tl.sum(g * normed, axis=0) / WIDTH))
    tl.store(dx_ptr + row * WIDTH + offs, dx.to(dx_ptr.dtype.element_ty), mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


class RmsNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rows = _rows(x)
        width = rows.shape[1]
        out = torch.empty(rows.shape, dtype=x.dtype, device=x.device)
        rstd = torch.empty(rows.shape[0], dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(width)
        _rms_norm_forward_kernel[(rows.shape[0],)](rows, weight, out, rstd, rows.stride(0), eps, WIDTH=width,
                                                  BLOCK=block)  # fmt: skip
        ctx.save_for_backward(rows, weight, rstd)
        ctx.shape = x.shape
        return out.view(x.shape)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None]:
        rows, weight, rstd = ctx.saved_tensors
        width = rows.shape[1]
        grad_rows = _rows(grad)
        dx = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
        _rms_norm_backward_kernel[(rows.shape[0],)](grad_rows, rows, weight, rstd, dx, grad_rows.stride(0),
                                                   rows.stride(0), WIDTH=width,
                                                   BLOCK=triton.next_power_of_2(width))  # fmt: skip
        dweight = None
        if ctx.needs_input_grad[1]:
            normed = (rows.float() * rstd[:, None]).to(rows.dtype).float()
            dweight = (grad_rows.float() * normed).sum(0).to(weight.dtype)
        return dx.view(ctx.shape), dweight, None


@triton.jit
def _silu_mul_forward_kernel(gate_ptr, up_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    gate = tl.load(gate_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    activated = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)  # torch's silu, rounded once
    tl.store(out_ptr + offs, (activated * up).to(dtype), mask=inside)


@triton.jit
def _silu_mul_backward_kernel(grad_ptr, gate_ptr, up_ptr, dgate_ptr, dup_ptr, numel, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < numel
    dh = tl.load(grad_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    gate = tl.load(gate_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    sig = 1.0 / (1.0 + tl.exp(-gate))
    dtype = dgate_ptr.dtype.element_ty
    activated = (gate * sig).to(dtype).to(tl.float32)
    tl.store(dup_ptr + offs, (dh * activated).to(dtype), mask=inside)
    tl.store(dgate_ptr + offs, (dh * up * sig * (1.0 + gate * (1.0 - sig))).to(dtype), mask=inside)


class SiluMulFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        if gate.shape != up.shape:
            raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
        gate, up = gate.contiguous(), up.contiguous()
        out = torch.empty_like(gate)
        numel = gate.numel()
        _silu_mul_forward_kernel[(triton.cdiv(numel, ELEMENTWISE_BLOCK),)](gate, up, out, numel,
                                                                            BLOCK=ELEMENTWISE_BLOCK)  # fmt: skip
        ctx.save_for_backward(gate, up)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        gate, up = ctx.saved_tensors
        grad = grad.contiguous()
        dgate, dup = torch.empty_like(gate), torch.empty_like(up)
        numel = gate.numel()
        _silu_mul_backward_kernel[(triton.cdiv(numel, ELEMENTWISE_BLOCK),)](grad, gate, up, dgate, dup, numel,
                                                                             BLOCK=ELEMENTWISE_BLOCK)  # fmt: skip
        return dgate, dup


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return RmsNormFunction.apply(x, weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return SiluMulFunction.apply(gate, up)


INTERPRETED = isinstance(tl.sum, InterpretedFunction) and isinstance(_silu_mul_forward_kernel, InterpretedFunction)

__all__ = ["INTERPRETED", "RmsNormFunction", "SiluMulFunction", "rms_norm", "silu_mul"]

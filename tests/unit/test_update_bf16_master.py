"""Bf16MasterAdapter: bf16 tensors in the model, fp32 masters stepped by the optimizer."""

from __future__ import annotations

import torch

from miniverl.training.update import Bf16MasterAdapter


def test_masters_are_exact_and_the_model_gets_their_rounding() -> None:
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8, bias=False)
    start = layer.weight.detach().clone()
    adapter = Bf16MasterAdapter([layer.weight])
    assert layer.weight.dtype == torch.bfloat16 and adapter.masters[0].dtype == torch.float32
    assert torch.equal(adapter.masters[0], start)  # taken before the cast: nothing lost
    reference = torch.nn.Parameter(start.clone())
    opt_ref = torch.optim.SGD([reference], lr=0.1)
    optimizer = torch.optim.SGD(adapter.masters, lr=0.1)
    x = torch.randn(4, 16)
    for _ in range(3):
        layer(x.bfloat16()).float().pow(2).sum().backward()
        grad = layer.weight.grad
        assert grad is not None and grad.dtype == torch.bfloat16
        reference.grad = grad.float()
        opt_ref.step()
        adapter.step(optimizer)
        assert layer.weight.grad is None  # consumed
        assert torch.equal(adapter.masters[0], reference.detach())  # the fp32 update, unrounded
        assert torch.equal(layer.weight.detach(), reference.detach().bfloat16())  # the model holds its bf16 copy
    assert not torch.equal(adapter.masters[0], start)


def test_a_parameter_without_grad_is_left_alone() -> None:
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.full((3,), 2.0))
    adapter = Bf16MasterAdapter([a, b])
    optimizer = torch.optim.SGD(adapter.masters, lr=1.0)
    (a * 3).sum().backward()
    adapter.step(optimizer)
    assert torch.equal(adapter.masters[0], torch.full((3,), -2.0)) and torch.equal(b.detach(), torch.full((3,), 2.0))

"""PPO clip loss, k3 KL, masked means, diagnostics and value loss against float64 brute force."""

from __future__ import annotations

import pytest
import torch

from miniverl.algorithms import (
    approx_kl,
    clip_fraction,
    k3_kl,
    masked_sequence_mean,
    masked_token_mean,
    ppo_clip_loss,
    ppo_clip_token_losses,
    value_clip_loss,
)

D = torch.float64


def ppo_brute_force(logp, old_logp, adv, mask, clip_low, clip_high):
    """Python loop over the selected tokens only."""
    total, count = 0.0, 0
    n, t_len = logp.shape
    for i in range(n):
        for t in range(t_len):
            if mask[i, t]:
                a = adv[i] if adv.dim() == 1 else adv[i, t]
                ratio = torch.exp(logp[i, t] - old_logp[i, t])
                clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
                total = total - torch.minimum(ratio * a, clipped * a)
                count += 1
    return total / max(count, 1)


def make(n=5, t_len=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t_len, generator=g, dtype=D) * 3
    logp = old + torch.randn(n, t_len, generator=g, dtype=D) * 0.4  # ratios on both sides of the clip range
    adv = torch.randn(n, generator=g, dtype=D)
    mask = torch.rand(n, t_len, generator=g) > 0.3
    mask[0, 0] = True
    return logp, old, adv, mask


@pytest.mark.parametrize(("clip_low", "clip_high"), [(0.2, 0.2), (0.1, 0.28), (0.0, 0.0)])
@pytest.mark.parametrize("per_token_adv", [False, True])
def test_ppo_clip_loss_values_and_grads_match_brute_force(clip_low, clip_high, per_token_adv):
    logp, old, adv, mask = make(seed=int(per_token_adv))
    if per_token_adv:
        adv = torch.randn(logp.shape, dtype=D)
    a = logp.clone().requires_grad_()
    loss = ppo_clip_loss(a, old, adv, mask, clip_low=clip_low, clip_high=clip_high)
    loss.backward()
    b = logp.clone().requires_grad_()
    ref = ppo_brute_force(b, old, adv, mask, clip_low, clip_high)
    ref.backward()
    assert loss.dtype == D and loss.dim() == 0
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14)
    # float 0/1 mask gives the same as bool
    torch.testing.assert_close(
        ppo_clip_loss(logp, old, adv, mask.to(D), clip_low=clip_low, clip_high=clip_high), loss.detach()
    )


def test_ppo_clip_region_gradients():
    """Gradient is zero exactly where the clipped term is active, nonzero elsewhere."""
    old = torch.zeros(1, 4, dtype=D)
    logp = torch.tensor([[2.0, 2.0, -2.0, -2.0]], dtype=D, requires_grad=True)  # ratio e^2 or e^-2
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0]], dtype=D)
    mask = torch.ones(1, 4, dtype=torch.bool)
    ppo_clip_loss(logp, old, adv, mask).backward()
    g = logp.grad[0]
    assert g[0] == 0  # ratio >> 1 + clip_high, A > 0: clipped, no push further
    assert g[2] == 0  # ratio << 1 - clip_low, A < 0: clipped
    assert g[1] > 0  # ratio >> 1, A < 0: unclipped -rho*A, gradient pulls logp down (grad of loss > 0)
    assert g[3] < 0  # ratio << 1, A > 0: unclipped, pushes logp up
    torch.testing.assert_close(g[1], torch.tensor(torch.e**2 / 4, dtype=D))
    assert float(clip_fraction(logp, old, adv, mask)) == 0.5


def test_ppo_on_policy_gradient_is_policy_gradient():
    """At ratio 1 the gradient is -A / count per selected token (REINFORCE with a baseline)."""
    logp = torch.tensor([[-1.0, -2.0, -3.0], [-0.5, -0.7, -0.9]], dtype=D, requires_grad=True)
    adv = torch.tensor([2.0, -1.0], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    loss = ppo_clip_loss(logp, logp.detach(), adv, mask)
    loss.backward()
    expected = torch.tensor([[-2.0, -2.0, 0.0], [1.0, 0.0, 0.0]], dtype=D) / 3
    torch.testing.assert_close(logp.grad, expected)
    torch.testing.assert_close(loss, torch.tensor(-(2 + 2 - 1) / 3, dtype=D))


def test_padding_garbage_changes_nothing():
    logp, old, _, mask = make(seed=3)
    adv2 = torch.randn(logp.shape, dtype=D)
    clean_a = logp.clone().requires_grad_()
    clean = ppo_clip_loss(clean_a, old, adv2, mask)
    clean.backward()
    big = torch.full_like(logp, 1e6)
    dirty_logp = torch.where(mask, logp, big).requires_grad_()
    dirty_old = torch.where(mask, old, -big)
    dirty_adv = torch.where(mask, adv2, big)
    dirty = ppo_clip_loss(dirty_logp, dirty_old, dirty_adv, mask)
    dirty.backward()
    assert torch.isfinite(dirty) and torch.isfinite(dirty_logp.grad).all()
    torch.testing.assert_close(dirty, clean, rtol=0, atol=0)
    torch.testing.assert_close(dirty_logp.grad, clean_a.grad, rtol=0, atol=0)
    assert bool((dirty_logp.grad[~mask] == 0).all())
    tok = ppo_clip_token_losses(dirty_logp, dirty_old, dirty_adv, mask)
    assert bool((tok[~mask] == 0).all())


def test_all_zero_mask_gives_zero_with_grad_path():
    logp = torch.randn(3, 4, dtype=D, requires_grad=True)
    old = logp.detach() + 1e6
    loss = ppo_clip_loss(logp, old, torch.ones(3, dtype=D), torch.zeros(3, 4))
    assert loss.requires_grad and float(loss.detach()) == 0.0
    loss.backward()
    assert torch.equal(logp.grad, torch.zeros(3, 4, dtype=D))


def test_old_logp_and_advantages_are_constants():
    logp, old, adv, mask = make(seed=4)
    old = old.clone().requires_grad_()
    adv = adv.clone().requires_grad_()
    ppo_clip_loss(logp.requires_grad_(), old, adv, mask).backward()
    assert old.grad is None and adv.grad is None


def test_ppo_validates_shapes_and_clip():
    logp, old, adv, mask = make()
    with pytest.raises(ValueError, match="advantages"):
        ppo_clip_loss(logp, old, adv[:2], mask)
    with pytest.raises(ValueError, match="mask"):
        ppo_clip_loss(logp, old, adv, mask[:, :2])
    with pytest.raises(ValueError, match=r"\[N, T\]"):
        ppo_clip_loss(logp[0], old[0], adv, mask[0])
    with pytest.raises(ValueError, match="clip_low"):
        ppo_clip_loss(logp, old, adv, mask, clip_low=1.0)


# --------------------------------------------------------------------------- k3
def test_k3_matches_formula_is_nonnegative_and_grads():
    g = torch.Generator().manual_seed(5)
    logp = (-torch.rand(4, 5, generator=g, dtype=D) * 4).requires_grad_()
    ref = -torch.rand(4, 5, generator=g, dtype=D) * 4
    out = k3_kl(logp, ref)
    x = ref - logp
    brute = torch.exp(x) - x - 1
    torch.testing.assert_close(out, brute, rtol=1e-12, atol=1e-14)
    assert bool((out >= 0).all())
    (out * torch.arange(20, dtype=D).reshape(4, 5)).sum().backward()
    torch.testing.assert_close(logp.grad, (1 - torch.exp(x.detach())) * torch.arange(20, dtype=D).reshape(4, 5))
    same = k3_kl(ref, ref)
    assert torch.equal(same, torch.zeros_like(same))
    tiny = k3_kl(torch.tensor([0.0], dtype=D), torch.tensor([1e-9], dtype=D))
    torch.testing.assert_close(tiny, torch.tensor([5e-19], dtype=D), rtol=1e-6, atol=0)  # expm1 keeps precision


def test_k3_mean_is_unbiased_kl_estimate():
    """E_{x~p}[k3(log p(x), log q(x))] = KL(p||q) for discrete p, q (checked exactly by summing)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=D)
    q = torch.tensor([0.2, 0.2, 0.6], dtype=D)
    expectation = (p * k3_kl(p.log(), q.log())).sum()
    torch.testing.assert_close(expectation, (p * (p / q).log()).sum(), rtol=1e-12, atol=0)
    # approx_kl estimates KL(old || new) on old samples: same identity with old = p, new = q
    est = approx_kl(q.log().unsqueeze(0), p.log().unsqueeze(0), torch.ones(1, 3))
    torch.testing.assert_close(est, k3_kl(p.log(), q.log()).mean())


# --------------------------------------------------------------------------- masked means
def test_masked_means_brute_force_and_empty_rows():
    values = torch.tensor([[1.0, 2.0, 3.0, 1e6], [10.0, 1e6, 1e6, 1e6], [1e6, 1e6, 1e6, 1e6]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    torch.testing.assert_close(masked_token_mean(values, mask), torch.tensor(16.0 / 4, dtype=D))
    # rows: mean(1,2,3)=2, mean(10)=10, empty row skipped -> (2 + 10) / 2
    torch.testing.assert_close(masked_sequence_mean(values, mask), torch.tensor(6.0, dtype=D))
    v = values.clone().requires_grad_()
    masked_sequence_mean(v, mask).backward()
    expected = torch.tensor([[1 / 6, 1 / 6, 1 / 6, 0], [0.5, 0, 0, 0], [0, 0, 0, 0]], dtype=D)
    torch.testing.assert_close(v.grad, expected)
    zero = masked_sequence_mean(v, torch.zeros_like(mask))
    assert float(zero.detach()) == 0.0 and zero.requires_grad


def test_sequence_mean_is_invariant_to_padding_length():
    a = torch.tensor([[1.0, 2.0], [5.0, 0.0]], dtype=D)
    ma = torch.tensor([[1, 1], [1, 0]])
    b = torch.cat([a, torch.full((2, 3), 7.0, dtype=D)], dim=1)
    mb = torch.cat([ma, torch.zeros(2, 3, dtype=ma.dtype)], dim=1)
    torch.testing.assert_close(masked_sequence_mean(a, ma), masked_sequence_mean(b, mb))
    torch.testing.assert_close(masked_sequence_mean(a, ma), torch.tensor((1.5 + 5.0) / 2, dtype=D))
    assert not torch.allclose(masked_token_mean(a, ma), masked_sequence_mean(a, ma))


# --------------------------------------------------------------------------- value loss
def test_value_clip_loss_brute_force():
    g = torch.Generator().manual_seed(6)
    values = torch.randn(3, 5, generator=g, dtype=D, requires_grad=True)
    old = values.detach() + torch.randn(3, 5, generator=g, dtype=D) * 0.6
    returns = torch.randn(3, 5, generator=g, dtype=D)
    mask = torch.rand(3, 5, generator=g) > 0.3
    loss = value_clip_loss(values, old, returns, mask, clip_range=0.3)
    loss.backward()
    v2 = values.detach().clone().requires_grad_()
    terms = []
    for i in range(3):
        for t in range(5):
            if mask[i, t]:
                clipped = old[i, t] + torch.clamp(v2[i, t] - old[i, t], -0.3, 0.3)
                terms.append(0.5 * torch.maximum((v2[i, t] - returns[i, t]) ** 2, (clipped - returns[i, t]) ** 2))
    ref = torch.stack(terms).mean()
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(values.grad, v2.grad, rtol=1e-12, atol=1e-14)

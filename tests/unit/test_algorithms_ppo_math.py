"""PPO math against float64 brute force, and against verl 0.9's conventions.

The ``verl_*`` helpers below restate, element by element, the formulas of verl 0.9's
``verl/trainer/ppo/core_algos.py`` (``compute_gae_advantage_return``, ``kl_penalty_forward``,
``compute_value_loss``, ``compute_policy_loss_vanilla``) and ``metric_utils.compute_data_metrics``
(``critic/vf_explained_var``), read from the source; no verl code is imported or copied. Where the
conventions differ (verl leaves carried values at masked positions and applies low_var_kl's guards
to k3), the tests say so and compare only where they agree.
"""

from __future__ import annotations

import math

import pytest
import torch

from miniverl.algorithms import (
    KL_KINDS,
    explained_variance,
    gae_advantages,
    kl_penalty,
    masked_whiten,
    policy_loss_metrics,
    ppo_clip_loss,
    value_clip_fraction,
    value_clip_loss,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MASKS = {
    "unmasked": [[1] * 6] * 3,
    "masked": [[1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 1, 1], [1, 0, 0, 0, 0, 0]],
}


def _inputs(seed: int, mask_name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(3, 6, generator=g, dtype=torch.float64)
    b = torch.randn(3, 6, generator=g, dtype=torch.float64)
    return a, b, torch.tensor(MASKS[mask_name], dtype=torch.bool)


def verl_gae(rewards, values, mask, gamma, lam):
    """verl's recursion, row by row: values and the running GAE pass through masked positions."""
    n, t_len = len(rewards), len(rewards[0])
    adv = [[0.0] * t_len for _ in range(n)]
    for i in range(n):
        next_v, last = 0.0, 0.0
        for t in reversed(range(t_len)):
            m = float(mask[i][t])
            delta = float(rewards[i][t]) + gamma * next_v - float(values[i][t])
            new = delta + gamma * lam * last
            next_v = float(values[i][t]) * m + (1 - m) * next_v
            last = new * m + (1 - m) * last
            adv[i][t] = last
    adv_t = torch.tensor(adv, dtype=torch.float64)
    returns = adv_t + values
    return adv_t, returns


@pytest.mark.parametrize("mask_name", sorted(MASKS))
@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_agrees_with_verl_on_selected_positions(mask_name, gamma, lam):
    rewards, values, mask = _inputs(3, mask_name)
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    ref_adv, ref_ret = verl_gae(rewards.tolist(), values, mask.tolist(), gamma, lam)
    torch.testing.assert_close(adv[mask], ref_adv[mask], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ret[mask], ref_ret[mask], rtol=1e-12, atol=1e-12)
    # verl whitens with its masked_whiten (unbiased var, eps 1e-8): ours with whiten=True is the same
    white, _ = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam, whiten=True)
    sel = ref_adv[mask]
    torch.testing.assert_close(white[mask], (sel - sel.mean()) * torch.rsqrt(sel.var() + 1e-8), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(masked_whiten(adv, mask)[mask], white[mask])


def test_gae_public_contract_is_unwhitened_and_shapes():
    rewards, values, mask = _inputs(4, "masked")
    adv, ret = gae_advantages(rewards, values, mask, gamma=1.0, lam=1.0)
    assert adv.shape == ret.shape == (3, 6)
    torch.testing.assert_close(ret[mask], (adv + values)[mask])
    assert abs(float(adv[mask].mean())) > 1e-3  # not whitened


def verl_kl(d: float, kind: str) -> float:
    """Element formula of verl's kl_penalty_forward for d = logp - ref_logp."""
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d * d
    x = max(-20.0, min(20.0, -d))
    return max(-10.0, min(10.0, math.exp(x) - x - 1.0))


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_penalty_brute_force_and_verl(kind):
    logp, ref, _ = _inputs(5, "unmasked")
    logp = logp.clone().requires_grad_(True)
    out = kl_penalty(logp, ref, kind)
    d = (logp - ref).detach()
    exact = {
        "k1": d,
        "k2": 0.5 * d**2,
        "k3": torch.exp(-d) + d - 1,
        "low_var_kl": torch.exp(-d) + d - 1,
    }[kind]
    torch.testing.assert_close(out.detach(), exact, rtol=1e-12, atol=1e-12)  # |d| small: guards idle
    brute = torch.tensor([[verl_kl(float(x), kind) for x in row] for row in d], dtype=torch.float64)
    torch.testing.assert_close(out.detach(), brute, rtol=1e-12, atol=1e-12)
    out.sum().backward()
    grad = {"k1": torch.ones_like(d), "k2": d, "k3": 1 - torch.exp(-d), "low_var_kl": 1 - torch.exp(-d)}[kind]
    torch.testing.assert_close(logp.grad, grad, rtol=1e-10, atol=1e-12)


def test_kl_penalty_guards_differ_from_k3_only_far_out():
    logp = torch.tensor([[-30.0, 0.0, -1.0]], dtype=torch.float64)
    ref = torch.zeros_like(logp)
    k3 = kl_penalty(logp, ref, "k3")
    low = kl_penalty(logp, ref, "low_var_kl")
    assert float(low[0, 0]) == 10.0 and float(k3[0, 0]) > 1e12
    torch.testing.assert_close(low[0, 1:], k3[0, 1:])
    with pytest.raises(ValueError, match="valid kinds"):
        kl_penalty(logp, ref, "k4")


def test_kl_estimators_are_unbiased_where_theory_says():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), 0)
    q = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), 0)
    true_kl = float((p * (p.log() - q.log())).sum())
    for kind in ("k1", "k3"):  # expectation under p equals KL(p||q) exactly
        est = float((p * kl_penalty(p.log()[None], q.log()[None], kind)[0]).sum())
        assert est == pytest.approx(true_kl, rel=1e-10)


def verl_value_loss(vpreds, returns, values, mask, clip):
    loss_terms, clipped, count = 0.0, 0, 0
    for vp, r, v, m in zip(vpreds.flatten().tolist(), returns.flatten().tolist(), values.flatten().tolist(),
                           mask.flatten().tolist(), strict=True):  # fmt: skip
        if not m:
            continue
        vc = min(max(vp, v - clip), v + clip)
        l1, l2 = (vp - r) ** 2, (vc - r) ** 2
        loss_terms += max(l1, l2)
        clipped += l2 > l1
        count += 1
    return 0.5 * loss_terms / count, clipped / count


@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_value_loss_and_clip_fraction_match_verl(mask_name):
    vpreds, returns, mask = _inputs(7, mask_name)
    old = vpreds + 0.4 * torch.randn(3, 6, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    loss = value_clip_loss(vpreds, old, returns, mask, clip_range=0.2)
    frac = value_clip_fraction(vpreds, old, returns, mask, clip_range=0.2)
    ref_loss, ref_frac = verl_value_loss(vpreds, returns, old, mask, 0.2)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-12)
    assert float(frac) == pytest.approx(ref_frac, abs=1e-12)
    assert 0 < ref_frac < 1


def verl_policy(logp, old, adv, mask, lo, hi):
    terms, clipped, kl, count = 0.0, 0, 0.0, 0
    for lp, ol, a, m in zip(logp.flatten().tolist(), old.flatten().tolist(), adv.flatten().tolist(),
                            mask.flatten().tolist(), strict=True):  # fmt: skip
        if not m:
            continue
        ratio = math.exp(lp - ol)
        l1, l2 = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
        terms += max(l1, l2)
        clipped += l2 > l1
        kl += ol - lp
        count += 1
    return terms / count, clipped / count, kl / count


@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_policy_loss_and_metrics_match_verl(mask_name):
    old, adv, mask = _inputs(9, mask_name)
    old = -old.abs()
    logp = old + 0.3 * torch.randn(3, 6, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    loss = ppo_clip_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.28)
    ent = torch.rand(3, 6, generator=torch.Generator().manual_seed(11), dtype=torch.float64)
    metrics = policy_loss_metrics(logp, old, adv, mask, clip_low=0.2, clip_high=0.28, entropy=ent)
    ref_loss, ref_frac, ref_kl = verl_policy(logp, old, adv, mask, 0.2, 0.28)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-12)
    assert metrics["pg_clipfrac"] == pytest.approx(ref_frac, abs=1e-12)
    assert metrics["ppo_kl"] == pytest.approx(ref_kl, rel=1e-12)
    assert metrics["entropy"] == pytest.approx(float(ent[mask].mean()), rel=1e-12)
    d = (logp - old)[mask]
    assert metrics["approx_kl"] == pytest.approx(float((torch.exp(d) - d - 1).mean()), rel=1e-10)


@pytest.mark.parametrize("mask_name", sorted(MASKS))
def test_explained_variance_brute_force(mask_name):
    values, returns, mask = _inputs(12, mask_name)
    ev = float(explained_variance(values, returns, mask))
    r = [x for x, m in zip(returns.flatten().tolist(), mask.flatten().tolist(), strict=True) if m]
    v = [x for x, m in zip(values.flatten().tolist(), mask.flatten().tolist(), strict=True) if m]
    diff = [a - b for a, b in zip(r, v, strict=True)]

    def var(xs):
        mu = sum(xs) / len(xs)
        return sum((x - mu) ** 2 for x in xs) / (len(xs) - 1)

    assert ev == pytest.approx(1 - var(diff) / (var(r) + 1e-5), rel=1e-12)
    assert float(explained_variance(returns, returns, mask)) == pytest.approx(1.0)
    assert math.isnan(float(explained_variance(values[:1, :1], returns[:1, :1], mask[:1, :1])))

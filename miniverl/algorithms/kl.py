"""KL-to-reference estimators and the PPO diagnostics verl logs (value and policy side).

All inputs are per-token ``[N, T]`` tensors on the policy's own samples; reductions are masked
token means (:func:`~miniverl.algorithms.masking.masked_token_mean`).
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
from torch import Tensor

from miniverl.algorithms.masking import as_bool_mask, masked_token_mean

__all__ = [
    "KL_KINDS",
    "KlKind",
    "explained_variance",
    "kl_penalty",
    "policy_loss_metrics",
    "value_clip_fraction",
]

KlKind = Literal["k1", "k2", "k3", "low_var_kl"]
KL_KINDS: tuple[str, ...] = get_args(KlKind)

# low_var_kl's guards, the same numbers as verl 0.9's ``kl_penalty_forward``
_LOG_RATIO_CLAMP = 20.0
_LOW_VAR_KL_CLAMP = 10.0


def kl_penalty(logp: Tensor, ref_logp: Tensor, kind: str) -> Tensor:
    r"""Per-token estimate of :math:`\mathrm{KL}(\pi_\theta \| \pi_{ref})` from sampled tokens.

    With :math:`d = \log\pi_\theta(y) - \log\pi_{ref}(y)` (J. Schulman, "Approximating KL
    Divergence", 2020):

    * ``k1``: :math:`d` (unbiased, can be negative);
    * ``k2``: :math:`\tfrac12 d^2` (biased, >= 0; its gradient is the KL gradient's estimate);
    * ``k3``: :math:`e^{-d} + d - 1` (unbiased, >= 0), computed as ``expm1(-d) + d`` and clamped
      at 0 against rounding;
    * ``low_var_kl``: k3 with verl's guards: :math:`-d` clamped to :math:`[-20, 20]`, the result to
      :math:`[-10, 10]`.

    Same names and formulas as verl 0.9's ``kl_penalty`` (``k1``/``kl``, ``k2``/``mse``,
    ``k3``/``low_var_kl``); verl applies the low_var_kl guards to ``k3`` as well, which only differs
    for :math:`|d| > 2.3` (``tests/unit/test_algorithms_ppo_math.py``). ``ref_logp`` is detached.
    Returns ``[N, T]`` (``logp``'s shape and dtype); gradients flow to ``logp``.
    """
    if ref_logp.shape != logp.shape:
        raise ValueError(
            f"kl_penalty: ref_logp must have logp's shape {tuple(logp.shape)}, got {tuple(ref_logp.shape)}"
        )
    d = logp - ref_logp.detach().to(logp.dtype)
    if kind == "k1":
        return d
    if kind == "k2":
        return 0.5 * d.square()
    if kind == "k3":
        return (torch.expm1(-d) + d).clamp_min(0.0)
    if kind == "low_var_kl":
        x = torch.clamp(-d, min=-_LOG_RATIO_CLAMP, max=_LOG_RATIO_CLAMP)
        return torch.clamp(torch.exp(x) - x - 1.0, min=-_LOW_VAR_KL_CLAMP, max=_LOW_VAR_KL_CLAMP)
    raise ValueError(f"kl_penalty: unknown kind {kind!r}; valid kinds: {', '.join(KL_KINDS)}")


@torch.no_grad()
def explained_variance(values: Tensor, returns: Tensor, mask: Tensor, *, eps: float = 1e-5) -> Tensor:
    r"""Value explained variance over the selected tokens (a scalar, no grad).

    .. math::
        \mathrm{EV} = 1 - \frac{\mathrm{Var}_m[R - V]}{\mathrm{Var}_m[R] + \epsilon}

    with unbiased variances over the selected tokens, as verl's ``critic/vf_explained_var``
    (``eps = 1e-5``). 1 is a perfect critic, 0 no better than a constant. Fewer than 2 selected
    tokens give ``nan`` (an undefined variance, never a made-up number).
    """
    m = as_bool_mask(mask, values)
    if returns.shape != values.shape:
        raise ValueError("explained_variance: values and returns must share one shape")
    v = values[m].to(torch.float64)
    r = returns[m].to(torch.float64)
    if v.numel() < 2:
        return torch.tensor(float("nan"), dtype=torch.float64)
    return 1.0 - torch.var(r - v) / (torch.var(r) + eps)


@torch.no_grad()
def value_clip_fraction(
    values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor, *, clip_range: float
) -> Tensor:
    r"""Fraction of selected tokens where the clipped value error is the larger one (no grad).

    With :math:`V^{clip} = V_{old} + \mathrm{clip}(V - V_{old}, -c, c)`: the token mean of
    :math:`[(V^{clip} - R)^2 > (V - R)^2]` (verl's ``critic/vf_clipfrac``), i.e. where
    :func:`~miniverl.algorithms.policy_loss.value_clip_loss` has no gradient.
    """
    m = as_bool_mask(mask, values)
    clipped = old_values + torch.clamp(values - old_values, -clip_range, clip_range)
    active = ((clipped - returns) ** 2 > (values - returns) ** 2) & m
    return masked_token_mean(active.to(values.dtype), m)


@torch.no_grad()
def policy_loss_metrics(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float,
    clip_high: float,
    entropy: Tensor | None = None,
) -> dict[str, float]:
    r"""The actor diagnostics verl logs for a PPO-clip step, as plain floats.

    * ``pg_clipfrac``: :func:`~miniverl.algorithms.policy_loss.clip_fraction`;
    * ``ppo_kl``: :math:`\mathrm{mean}_m(\log\pi_{old} - \log\pi_\theta)` (verl's ``actor/ppo_kl``, k1);
    * ``approx_kl``: :math:`\mathrm{mean}_m\,k_3` (:func:`~miniverl.algorithms.policy_loss.approx_kl`);
    * ``entropy``: :math:`\mathrm{mean}_m H_t` when per-token ``entropy`` is given.
    """
    from miniverl.algorithms.policy_loss import approx_kl, clip_fraction

    m = as_bool_mask(mask, logp)
    out = {
        "pg_clipfrac": float(clip_fraction(logp, old_logp, advantages, m, clip_low=clip_low, clip_high=clip_high)),
        "ppo_kl": float(masked_token_mean(old_logp.to(logp.dtype) - logp, m)),
        "approx_kl": float(approx_kl(logp, old_logp, m)),
    }
    if entropy is not None:
        out["entropy"] = float(masked_token_mean(entropy, m))
    return out

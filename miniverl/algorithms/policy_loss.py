"""Policy-gradient losses, the reference KL penalty, and their diagnostics.

Shapes: ``logp``, ``old_logp``, ``ref_logp``, ``mask`` are ``[N, T]`` per-token tensors (``mask`` bool or
0/1); advantages are ``[N]`` (one per sequence, broadcast over T) or ``[N, T]``. Masked-out
positions may hold any finite garbage: they are replaced before any arithmetic, so they change
neither the loss nor the gradients. ``old_logp``, ``ref_logp`` and advantages are constants (detached).
"""

from __future__ import annotations

import torch
from torch import Tensor

from miniverl.algorithms.masking import as_bool_mask, masked_token_mean

__all__ = ["approx_kl", "clip_fraction", "k3_kl", "ppo_clip_loss", "ppo_clip_token_losses", "value_clip_loss"]


def _check_clip(clip_low: float, clip_high: float) -> None:
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low must be in [0, 1), got {clip_low!r}")
    if clip_high < 0.0:
        raise ValueError(f"clip_high must be >= 0, got {clip_high!r}")


def _ratio_inputs(
    logp: Tensor, old_logp: Tensor, advantages: Tensor, mask: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor, Tensor]:
    """Return ``(mask bool, ratio, advantages [N, T])``, masked-out positions at ratio 1 and advantage 0."""
    _check_clip(clip_low, clip_high)
    if logp.dim() != 2 or old_logp.shape != logp.shape:
        raise ValueError(f"logp and old_logp must both be [N, T], got {tuple(logp.shape)} and {tuple(old_logp.shape)}")
    m = as_bool_mask(mask, logp)
    if advantages.shape == logp.shape[:1]:
        adv = advantages.unsqueeze(-1).expand_as(logp)
    elif advantages.shape == logp.shape:
        adv = advantages
    else:
        raise ValueError(
            f"advantages must be [N]={tuple(logp.shape[:1])} or [N, T]={tuple(logp.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    log_ratio = torch.where(m, logp - old_logp.detach().to(logp.dtype), zero)
    adv = torch.where(m, adv.detach().to(logp.dtype), zero)
    return m, torch.exp(log_ratio), adv


def ppo_clip_token_losses(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Tensor:
    r"""Per-token PPO clipped surrogate loss ``[N, T]`` (0 at masked-out positions).

    .. math::
        \rho_t = e^{\log\pi_\theta - \log\pi_{old}}, \qquad
        \ell_t = -\min\bigl(\rho_t A_t,\; \mathrm{clip}(\rho_t, 1-\epsilon_{low}, 1+\epsilon_{high}) A_t\bigr)

    (Schulman et al. 2017, "Proximal Policy Optimization Algorithms"; asymmetric ``clip_high`` as
    in DAPO, Yu et al. 2025). Pick the reduction yourself (:func:`masked_token_mean`,
    :func:`masked_sequence_mean`); :func:`ppo_clip_loss` uses the token mean.
    """
    m, ratio, adv = _ratio_inputs(logp, old_logp, advantages, mask, clip_low, clip_high)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = -torch.minimum(unclipped, clipped)
    return torch.where(m, loss, torch.zeros_like(loss))


def ppo_clip_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Tensor:
    r"""PPO clipped surrogate, token mean over the mask (a scalar to minimize).

    .. math::
        L = \frac{\sum_{n,t} m_{nt}\,\ell_{nt}}{\max(1, \sum_{n,t} m_{nt})}, \quad
        \ell_{nt} = -\min\bigl(\rho_{nt} A_{nt},\;
            \mathrm{clip}(\rho_{nt}, 1-\epsilon_{low}, 1+\epsilon_{high}) A_{nt}\bigr),\;
        \rho_{nt} = e^{\log\pi_\theta - \log\pi_{old}}

    (Schulman et al. 2017). The ratio is not clamped otherwise (no dual clip). An all-zero mask
    gives exactly 0, still attached to ``logp``'s graph (zero gradient, not NaN). Gradients flow
    only to ``logp``. Result dtype follows ``logp``.
    """
    losses = ppo_clip_token_losses(logp, old_logp, advantages, mask, clip_low=clip_low, clip_high=clip_high)
    return masked_token_mean(losses, mask)


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    r"""Per-token k3 estimator of :math:`\mathrm{KL}(\pi_\theta \| \pi_{ref})`, on samples of the policy.

    With :math:`x = \log\pi_{ref} - \log\pi_\theta`:  :math:`k_3 = e^{x} - x - 1 \ge 0`
    (J. Schulman, "Approximating KL Divergence", 2020; GRPO's KL term). Computed as
    ``expm1(x) - x`` (accurate near 0) and clamped at 0 against rounding. ``ref_logp`` is detached;
    the result keeps ``logp``'s shape and dtype. Reduce it with a masked mean.
    """
    if ref_logp.shape != logp.shape:
        raise ValueError(f"k3_kl: ref_logp must have logp's shape {tuple(logp.shape)}, got {tuple(ref_logp.shape)}")
    x = ref_logp.detach().to(logp.dtype) - logp
    return (torch.expm1(x) - x).clamp_min(0.0)


@torch.no_grad()
def clip_fraction(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
) -> Tensor:
    """Fraction of selected tokens where the clipped term is the active one (its gradient is 0).

    That is ``clip(rho) * A < rho * A`` strictly: ``rho > 1 + clip_high`` with ``A > 0`` or
    ``rho < 1 - clip_low`` with ``A < 0``. A diagnostic scalar, no grad.
    """
    m, ratio, adv = _ratio_inputs(logp, old_logp, advantages, mask, clip_low, clip_high)
    active = (torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv < ratio * adv) & m
    return masked_token_mean(active.to(logp.dtype), m)


@torch.no_grad()
def approx_kl(logp: Tensor, old_logp: Tensor, mask: Tensor) -> Tensor:
    r"""Diagnostic :math:`\mathrm{KL}(\pi_{old}\|\pi_\theta)` on old-policy samples: token mean of k3.

    With :math:`x = \log\pi_\theta - \log\pi_{old}`, :math:`k_3 = e^x - x - 1` (unbiased, >= 0). No grad.
    """
    m = as_bool_mask(mask, logp)
    zero = torch.zeros((), dtype=logp.dtype, device=logp.device)
    return masked_token_mean(k3_kl(torch.where(m, old_logp.to(logp.dtype), zero), torch.where(m, logp, zero)), m)


def value_clip_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range: float = 0.5,
) -> Tensor:
    r"""PPO clipped value loss for the critic, token mean over the mask (a scalar).

    .. math::
        V^{clip} = V_{old} + \mathrm{clip}(V - V_{old}, -c, c), \qquad
        L = \tfrac12\,\mathrm{mean}_{m}\,\max\bigl((V - R)^2, (V^{clip} - R)^2\bigr)

    (the value clipping of OpenAI baselines' PPO2 and verl's critic). ``old_values`` and ``returns``
    are detached; gradients reach only ``values``. Same formula and token-mean aggregation as verl
    0.9's ``compute_value_loss``; its ``vf_clipfrac`` is :func:`~miniverl.algorithms.kl.value_clip_fraction`
    (both checked in ``tests/unit/test_algorithms_ppo_math.py``).
    """
    if values.shape != old_values.shape or values.shape != returns.shape:
        raise ValueError(
            "value_clip_loss: values, old_values and returns must share one shape, got "
            f"{tuple(values.shape)}, {tuple(old_values.shape)}, {tuple(returns.shape)}"
        )
    if clip_range < 0:
        raise ValueError(f"value_clip_loss: clip_range must be >= 0, got {clip_range!r}")
    m = as_bool_mask(mask, values)
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    v = torch.where(m, values, zero)
    old = torch.where(m, old_values.detach().to(values.dtype), zero)
    ret = torch.where(m, returns.detach().to(values.dtype), zero)
    v_clipped = old + torch.clamp(v - old, -clip_range, clip_range)
    losses = 0.5 * torch.maximum((v - ret) ** 2, (v_clipped - ret) ** 2)
    return masked_token_mean(losses, m)

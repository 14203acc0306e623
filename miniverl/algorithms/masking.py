"""Masked reductions. Masked-out positions never enter a value, and never put NaN into a gradient.

A mask is ``bool`` or a 0/1 float/int tensor of the same shape as the values. Every reduction first
replaces masked-out values by 0 with ``torch.where`` (so ``inf``/garbage padding cannot leak through
``0 * inf``), then divides by a count clamped to at least 1, so an all-zero mask gives 0, not NaN.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["as_bool_mask", "masked_sequence_mean", "masked_token_mean", "masked_whiten"]


def as_bool_mask(mask: Tensor, like: Tensor, name: str = "mask") -> Tensor:
    """Validate ``mask`` against ``like``'s shape and return it as ``bool``."""
    if mask.shape != like.shape:
        raise ValueError(f"{name} must have the values' shape {tuple(like.shape)}, got {tuple(mask.shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def masked_token_mean(values: Tensor, mask: Tensor) -> Tensor:
    r"""Token mean: :math:`\sum_{n,t} m_{nt} x_{nt} / \max(1, \sum_{n,t} m_{nt})`, a scalar.

    Every selected token weighs the same, so long sequences weigh more than short ones.
    """
    m = as_bool_mask(mask, values)
    total = torch.where(m, values, torch.zeros_like(values)).sum()
    return total / m.sum().clamp_min(1).to(total.dtype)


def masked_sequence_mean(values: Tensor, mask: Tensor) -> Tensor:
    r"""Sequence mean: each row's own token mean, then the mean over rows with at least one token.

    .. math::
        \bar x_n = \frac{\sum_t m_{nt} x_{nt}}{\sum_t m_{nt}}, \qquad
        \text{result} = \frac{1}{|R|} \sum_{n \in R} \bar x_n, \quad R = \{n : \textstyle\sum_t m_{nt} \ge 1\}

    "Each trajectory keeps its own objective normalization": a row's weight does not depend on its
    length nor on how it was padded or batched. ``values``/``mask`` are ``[N, T]``; result is a scalar
    (0 when no row has a token).
    """
    m = as_bool_mask(mask, values)
    if values.dim() != 2:
        raise ValueError(f"masked_sequence_mean expects [N, T] values, got shape {tuple(values.shape)}")
    row_sum = torch.where(m, values, torch.zeros_like(values)).sum(dim=1)
    row_count = m.sum(dim=1)
    has = row_count > 0
    row_mean = row_sum / row_count.clamp_min(1).to(row_sum.dtype)
    return torch.where(has, row_mean, torch.zeros_like(row_mean)).sum() / has.sum().clamp_min(1).to(row_sum.dtype)


def masked_whiten(values: Tensor, mask: Tensor, *, shift_mean: bool = True, eps: float = 1e-8) -> Tensor:
    r"""Whiten over the masked tokens: :math:`(x - \mu) / \sqrt{\sigma^2 + \epsilon}`, masked-out → 0.

    :math:`\mu` and the *unbiased* variance :math:`\sigma^2` are taken over all selected tokens (as in
    PPO implementations that whiten GAE advantages per batch). With ``shift_mean=False`` the mean is
    added back. With fewer than 2 tokens the variance is taken as 0.
    """
    m = as_bool_mask(mask, values)
    x = torch.where(m, values, torch.zeros_like(values))
    count = m.sum().to(x.dtype)
    mean = x.sum() / count.clamp_min(1)
    centered = torch.where(m, values - mean, torch.zeros_like(values))
    var = (centered**2).sum() / (count - 1).clamp_min(1)
    out = centered * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(m, out, torch.zeros_like(out))

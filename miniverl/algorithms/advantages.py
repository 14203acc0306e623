"""Advantage estimators: GRPO (outcome, group-relative) and GAE (PPO with a critic).

Both are computed without autograd: advantages are constants of the policy loss.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from miniverl.algorithms.masking import as_bool_mask, masked_whiten

__all__ = ["gae_advantages", "grpo_advantages"]


def _group_index(group_ids: Sequence[Hashable] | Tensor, n: int, device: torch.device) -> tuple[Tensor, int]:
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != n:
        raise ValueError(
            f"grpo_advantages: got {n} scores but {len(ids)} group ids; pass one group id per score "
            "(e.g. the prompt uid each response was sampled from)"
        )
    index: dict[Hashable, int] = {}
    codes = [index.setdefault(g, len(index)) for g in ids]
    return torch.tensor(codes, dtype=torch.long, device=device), len(index)


@torch.no_grad()
def grpo_advantages(
    scores: Tensor,
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    r"""GRPO outcome advantages (Shao et al. 2024, "DeepSeekMath", §4.1.2), one value per response.

    Responses sharing a group id (the prompt they were sampled for) form a group :math:`G`:

    .. math::
        A_i = \frac{r_i - \mathrm{mean}_{j \in G} r_j}{\mathrm{std}_{j \in G} r_j + \epsilon}
        \quad (\texttt{norm\_by\_std=True}), \qquad A_i = r_i - \mathrm{mean}_{j \in G} r_j
        \quad (\texttt{norm\_by\_std=False}),

    with the **unbiased** std (``torch.std``'s default, divisor :math:`|G|-1`), as verl v0.9's
    ``compute_grpo_outcome_advantage``. A **singleton group** follows verl: its mean is taken as 0
    and its std as 1, so :math:`A_i = r_i / (1 + \epsilon)` (or :math:`r_i` without std
    normalization) — the raw score, not 0. A group whose scores are all equal gets 0.

    Args:
        scores: ``[N]`` one scalar score (summed reward) per response.
        group_ids: ``N`` hashable ids (str, int, ...; a 1-D tensor or array also works), compared by value.
        norm_by_std: divide by the group std (Dr. GRPO-style ``False`` only centres).
        eps: added to the std.

    Returns:
        ``[N]`` advantages, float (float64 for float64 scores, else float32). Broadcast over the
        response tokens (``[N, 1]``) in the policy loss.
    """
    if scores.dim() != 1:
        raise ValueError(f"grpo_advantages: scores must be 1-D [N], got shape {tuple(scores.shape)}")
    x = scores.detach().to(torch.float64 if scores.dtype == torch.float64 else torch.float32)
    codes, n_groups = _group_index(group_ids, x.shape[0], x.device)
    count = torch.zeros(n_groups, dtype=x.dtype, device=x.device).index_add_(0, codes, torch.ones_like(x))
    total = torch.zeros_like(count).index_add_(0, codes, x)
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, codes, (x - mean[codes]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp_min(1))
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    centered = x - mean[codes]
    return centered / (std[codes] + eps) if norm_by_std else centered


@torch.no_grad()
def gae_advantages(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = False,
) -> tuple[Tensor, Tensor]:
    r"""Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional Continuous Control
    Using Generalized Advantage Estimation"), token level, for PPO with a critic.

    Per row, over the *selected* positions :math:`t_1 < \dots < t_m` only (masked-out positions,
    e.g. padding or tool-observation tokens, are skipped: value and advantage pass through them):

    .. math::
        \delta_i = r_{t_i} + \gamma V_{t_{i+1}} - V_{t_i} \;(V_{t_{m+1}} = 0), \qquad
        A_{t_i} = \sum_{l \ge 0} (\gamma\lambda)^l \delta_{i+l}, \qquad R_{t_i} = A_{t_i} + V_{t_i}

    Args:
        rewards: ``[N, T]`` per-token rewards (an outcome reward sits on the last response token;
            a KL-in-reward penalty on every token).
        values: ``[N, T]`` critic values :math:`V_t` of the same positions.
        mask: ``[N, T]`` selected (response) tokens, bool or 0/1.
        whiten: whiten the advantages over all selected tokens (:func:`masked_whiten`). Off by
            default (the public contract is *unwhitened*); PPO whitens the advantages of a whole
            rollout batch itself. Returns are always computed from the unwhitened advantages.

    Returns:
        ``(advantages[N, T], returns[N, T])``; masked-out positions hold 0.

    Agreement with verl 0.9's ``compute_gae_advantage_return``: the same recursion, with values
    and the running GAE carried unchanged through masked-out positions; verl always whitens (here
    ``whiten=True``) and leaves the carried values at masked-out positions, where this function
    writes 0. On every selected position the two agree (``tests/unit/test_algorithms_ppo_math.py``).
    """
    if rewards.dim() != 2 or values.shape != rewards.shape:
        raise ValueError(
            "gae_advantages: rewards and values must both be [N, T], got "
            f"{tuple(rewards.shape)} and {tuple(values.shape)}"
        )
    m = as_bool_mask(mask, values)
    dtype = torch.float64 if torch.float64 in (rewards.dtype, values.dtype) else torch.float32
    zero = torch.zeros((), dtype=dtype, device=values.device)
    r = torch.where(m, rewards.detach().to(dtype), zero)
    v = torch.where(m, values.detach().to(dtype), zero)
    n, t_len = v.shape
    adv = torch.zeros_like(v)
    next_value = torch.zeros(n, dtype=dtype, device=v.device)
    last_gae = torch.zeros_like(next_value)
    for t in reversed(range(t_len)):
        mt = m[:, t]
        gae = r[:, t] + gamma * next_value - v[:, t] + gamma * lam * last_gae
        last_gae = torch.where(mt, gae, last_gae)
        next_value = torch.where(mt, v[:, t], next_value)
        adv[:, t] = torch.where(mt, gae, zero)
    returns = torch.where(m, adv + v, zero)
    if whiten:
        adv = masked_whiten(adv, m)
    return adv, returns

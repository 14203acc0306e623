"""Name → implementation registries. Configs name an algorithm; the controller looks it up here."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from miniverl.algorithms.advantages import gae_advantages, grpo_advantages
from miniverl.algorithms.divergences import forward_kl, jsd, reverse_kl
from miniverl.algorithms.policy_loss import ppo_clip_loss, value_clip_loss

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DISTILL_OBJECTIVES",
    "DIVERGENCES",
    "POLICY_LOSSES",
    "VALUE_LOSSES",
    "DistillObjective",
    "get",
]

T = TypeVar("T")

#: ``"grpo"``: ``grpo_advantages(scores[N], group_ids, *, norm_by_std, eps) -> [N]``;
#: ``"gae"``: ``gae_advantages(rewards[N,T], values[N,T], mask, *, gamma, lam, whiten=False)``
#: ``-> (advantages, returns)``.
ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Any]] = {
    "grpo": grpo_advantages,
    "gae": gae_advantages,
}

#: ``ppo_clip_loss(logp, old_logp, advantages, mask, *, clip_low, clip_high) -> scalar``.
POLICY_LOSSES: dict[str, Callable[..., Any]] = {"ppo_clip": ppo_clip_loss}

#: ``value_clip_loss(values, old_values, returns, mask, *, clip_range) -> scalar`` (PPO critic).
VALUE_LOSSES: dict[str, Callable[..., Any]] = {"clipped_mse": value_clip_loss}

#: Divergences on log-prob tensors over the last dim: ``fn(student_logprobs, teacher_logprobs) -> [...]``
#: (``jsd`` also takes ``beta``). The chunked functions take the same names as ``kind=``.
DIVERGENCES: dict[str, Callable[..., Any]] = {
    "forward_kl": forward_kl,
    "reverse_kl": reverse_kl,
    "jsd": jsd,
}


DEFAULT_TOPK = 64
TOPK_SUPPORTS = frozenset({"topk_tail", "topk"})


@dataclass(frozen=True)
class DistillObjective:
    """What a distillation/SFT objective computes at each selected position.

    * ``divergence``: ``"forward_kl"`` / ``"reverse_kl"`` / ``"jsd"``, or ``"nll"`` for SFT.
    * ``support``: ``"exact"`` (full vocabulary, :func:`chunked_divergence`), ``"topk_tail"`` (teacher
      top-k + one tail bucket, :func:`chunked_topk_tail_divergence`), ``"topk"`` (teacher top-k
      renormalized, no tail, :func:`forward_kl_topk`) or ``"token"`` (the oracle token only,
      :func:`sft_token_nll`).
    * ``on_policy``: positions come from student-sampled rollouts (``True``) or oracle/offline
      trajectories (``False``).
    * ``default_k`` (derived): :data:`DEFAULT_TOPK` for the top-k supports, ``None`` otherwise.
    """

    name: str
    divergence: Literal["forward_kl", "reverse_kl", "jsd", "nll"]
    support: Literal["exact", "topk_tail", "topk", "token"]
    default_k: int | None = field(init=False)
    on_policy: bool
    description: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "default_k", DEFAULT_TOPK if self.support in TOPK_SUPPORTS else None)


_OPD = "strict on-policy distillation"
DISTILL_OBJECTIVES: dict[str, DistillObjective] = {
    o.name: o
    for o in (
        DistillObjective("opd_exact", "reverse_kl", "exact", True,
                         f"{_OPD}: exact reverse KL(student||teacher) on student samples"),
        DistillObjective("opd_topk_tail", "reverse_kl", "topk_tail", True,
                         f"{_OPD}: reverse KL over the teacher's top-k plus a tail bucket"),
        DistillObjective("kd_exact", "forward_kl", "exact", False,
                         "offline KD: exact forward KL(teacher||student) on oracle trajectories"),
        DistillObjective("kd_topk_tail", "forward_kl", "topk_tail", False,
                         "offline KD: forward KL over the teacher's top-k plus a tail bucket"),
        DistillObjective("sft", "nll", "token", False, "supervised fine-tuning: cross-entropy on the oracle tokens"),
        DistillObjective("gkd_forward_kl_topk", "forward_kl", "topk", True,
                         "GKD: forward KL over the teacher's renormalized top-k (no tail) on student samples"),
    )
}  # fmt: skip


def get(registry: Mapping[str, T], name: str) -> T:
    """``registry[name]``, or a ``ValueError`` that lists the valid names."""
    try:
        return registry[name]
    except (KeyError, TypeError):
        valid = ", ".join(sorted(registry))
        raise ValueError(f"unknown name {name!r}; valid names: {valid}") from None

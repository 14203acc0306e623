"""Pure tensor math for miniverl: chunked log-probs, divergences, advantages, losses, registries.

No I/O and no model objects: every function takes tensors and returns tensors, with its formula
(and paper) in its docstring. Importing this package imports torch; importing ``miniverl`` does not.
"""

from miniverl.algorithms.advantages import gae_advantages, grpo_advantages
from miniverl.algorithms.divergences import (
    DIVERGENCE_KINDS,
    DivergenceKind,
    chunked_divergence,
    chunked_topk_tail_divergence,
    forward_kl,
    forward_kl_topk,
    jsd,
    reverse_kl,
    teacher_topk_targets,
)
from miniverl.algorithms.kl import (
    KL_KINDS,
    KlKind,
    explained_variance,
    kl_penalty,
    policy_loss_metrics,
    value_clip_fraction,
)
from miniverl.algorithms.logprobs import chunked_token_logprobs, sft_token_nll
from miniverl.algorithms.masking import masked_sequence_mean, masked_token_mean, masked_whiten
from miniverl.algorithms.policy_loss import (
    approx_kl,
    clip_fraction,
    k3_kl,
    ppo_clip_loss,
    ppo_clip_token_losses,
    value_clip_loss,
)
from miniverl.algorithms.registry import (
    ADVANTAGE_ESTIMATORS,
    DISTILL_OBJECTIVES,
    DIVERGENCES,
    POLICY_LOSSES,
    VALUE_LOSSES,
    DistillObjective,
    get,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "DISTILL_OBJECTIVES",
    "DIVERGENCES",
    "DIVERGENCE_KINDS",
    "KL_KINDS",
    "POLICY_LOSSES",
    "VALUE_LOSSES",
    "DistillObjective",
    "DivergenceKind",
    "KlKind",
    "approx_kl",
    "chunked_divergence",
    "chunked_token_logprobs",
    "chunked_topk_tail_divergence",
    "clip_fraction",
    "explained_variance",
    "forward_kl",
    "forward_kl_topk",
    "gae_advantages",
    "get",
    "grpo_advantages",
    "jsd",
    "k3_kl",
    "kl_penalty",
    "masked_sequence_mean",
    "masked_token_mean",
    "masked_whiten",
    "policy_loss_metrics",
    "ppo_clip_loss",
    "ppo_clip_token_losses",
    "reverse_kl",
    "sft_token_nll",
    "teacher_topk_targets",
    "value_clip_fraction",
    "value_clip_loss",
]

"""GRPO: group-relative outcome advantages and a token-mean PPO-clip loss, one update per cycle.

Roles: student; a reference when ``algorithm.grpo.kl_coef > 0``. The KL to the reference uses
``kl_estimator`` (k1/k2/k3/low_var_kl) either as a loss term (``kl_mode: loss``, the default, k3 as
in DeepSeekMath) or as a penalty on each trajectory's score before the group advantages
(``kl_mode: reward``: the score minus ``kl_coef`` times the trajectory's summed KL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from miniverl.algorithms import chunked_token_logprobs, grpo_advantages, kl_penalty, ppo_clip_token_losses
from miniverl.config.schema import MiniverlConfig
from miniverl.rollout.backends import OLD_LOGP_RECOMPUTED, old_logp_origin, plain_sampling
from miniverl.runtime.base import RoleName, RoleRuntime
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch
from miniverl.training.update import UpdateSequence, UpdateStats, physical_batches, rows_of, targets_of


class Grpo(Algorithm):
    name = "grpo"
    #: ``old_logp`` from the training model's own forward (always, in miniverl); ``False`` takes the rollout's
    #: ``sampled_logprobs`` instead, which :func:`old_logp_origin` refuses unless the trainer computed them
    recompute_old_logp: ClassVar[bool] = True

    def required_roles(self, config: MiniverlConfig) -> tuple[RoleName, ...]:
        return ("reference",) if config.algorithm.grpo.kl_coef > 0 else ()

    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        g = self.config.algorithm.grpo
        origin = old_logp_origin(
            batch.logprob_source,
            recompute=self.recompute_old_logp,
            algorithm=self.name,
            plain_sampling=plain_sampling(self.config.rollout),
        )
        scores = list(batch.rewards)
        metrics: dict[str, float] = {OLD_LOGP_RECOMPUTED: 1.0 if origin == "trainer" else 0.0}
        if g.kl_coef > 0 and g.kl_mode == "reward":
            kl_per_traj = sequence_kl(self.runtime, batch.sequences(), self.config)
            scores = [s - g.kl_coef * k for s, k in zip(scores, kl_per_traj, strict=True)]
            metrics["kl_reward_penalty_mean"] = g.kl_coef * sum(kl_per_traj) / len(kl_per_traj)
        adv = grpo_advantages(
            torch.tensor(scores, dtype=torch.float64),
            [t.group_id for t in batch.trajectories],
            norm_by_std=g.norm_by_std,
            eps=g.eps,
        )
        advantages = [float(a) for a in adv]
        rollout_logp = [t.sampled_logprobs for t in batch.trajectories] if origin == "rollout" else None
        stats = grpo_update(self.runtime, batch.sequences(advantages), self.config, rollout_logp=rollout_logp)
        steps_before = self.actor.steps_taken
        grad_norm, delta = self.actor.step()
        # verl's names; actor/updates counts the optimizer steps of this update (PPO: epochs x mini-batches).
        # Strict on-policy: the ratio is exactly 1, so the clip fraction is 0 by construction and not logged;
        # the loss is the policy-gradient surrogate, not a learning curve.
        metrics["actor/pg_loss"] = stats.loss
        metrics["actor/updates"] = float(self.actor.steps_taken - steps_before)
        metrics["response_length/mean"] = stats.tokens / len(batch.trajectories)
        if stats.entropy is not None:
            metrics["actor/entropy"] = stats.entropy
        return AlgorithmStep(
            loss=stats.loss,
            kl=stats.kl,
            tokens=stats.tokens,
            grad_norm=grad_norm,
            adapter_delta_norm=delta,
            advantages=advantages,
            metrics=metrics,
        )


@torch.no_grad()
def sequence_kl(runtime: RoleRuntime, sequences: Sequence[UpdateSequence], config: MiniverlConfig) -> list[float]:
    """Per trajectory, the summed ``kl_estimator`` KL(student || reference) over its response tokens."""
    kind = config.algorithm.grpo.kl_estimator
    chunk = config.train.logprob_chunk_size
    out = [0.0] * len(sequences)
    for index_list in physical_batches(runtime, sequences, config.train.trajectory_batch_size):
        part = [sequences[i] for i in index_list]
        rows = rows_of(part, teacher=False)
        targets = targets_of(part, runtime.device)
        with runtime.use("reference") as ref:
            hidden = ref.selected_hidden(rows, trajectory_batch_size=len(part))
            ref_logp, _ = chunked_token_logprobs(hidden, ref.head_weight, targets, chunk_size=chunk)
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(part))
            logp, _ = chunked_token_logprobs(hidden, student.head_weight, targets, chunk_size=chunk)
        per_token = kl_penalty(logp, ref_logp, kind)
        for i, piece in zip(index_list, per_token.split([s.response_len for s in part]), strict=True):
            out[i] = float(piece.sum())
    return out


def grpo_update(
    runtime: RoleRuntime,
    sequences: Sequence[UpdateSequence],
    config: MiniverlConfig,
    *,
    rollout_logp: Sequence[Sequence[float]] | None = None,
) -> UpdateStats:
    """GRPO: token-mean PPO-clip loss over the group (+ optional KL loss to the reference), backpropagated.

    Strict on-policy: the group was sampled by the current weights and no optimizer step happens
    before this backward, so ``old_logp`` is the current log-prob detached (ratio exactly 1; the
    clip only matters for later epochs, which strict on-policy training never runs). This saves a
    second student forward per physical batch. ``rollout_logp`` (one list per sequence) replaces
    ``old_logp`` with the rollout's own log-probs (only where :func:`old_logp_origin` allowed it).
    With ``kl_mode: reward`` the KL is already in the advantages and the loss has no KL term (the
    reported ``kl`` is then ``None``).
    """
    grpo = config.algorithm.grpo
    chunk = config.train.logprob_chunk_size
    total_tokens = sum(s.response_len for s in sequences)
    loss_sum = 0.0
    kl_sum = 0.0
    entropy_sum = 0.0
    use_kl = grpo.kl_coef > 0 and grpo.kl_mode == "loss"
    for index_list in physical_batches(runtime, sequences, config.train.trajectory_batch_size):
        part = [sequences[i] for i in index_list]
        rows = rows_of(part, teacher=False)
        targets = targets_of(part, runtime.device)
        ref_logp = None
        if use_kl:
            with runtime.use("reference") as ref, torch.no_grad():
                hidden = ref.selected_hidden(rows, trajectory_batch_size=len(part))
                ref_logp, _ = chunked_token_logprobs(hidden, ref.head_weight, targets, chunk_size=chunk)
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(part))
            logp, entropy = chunked_token_logprobs(
                hidden, student.head_weight, targets, chunk_size=chunk, with_entropy=True
            )
        if entropy is not None:
            entropy_sum += float(entropy.detach().sum())
        if rollout_logp is None:
            old_logp = logp.detach()
        else:
            flat = [lp for i in index_list for lp in rollout_logp[i]]
            old_logp = torch.tensor(flat, dtype=logp.dtype, device=logp.device)
        advantages = torch.tensor(
            [s.advantage for s in part for _ in range(s.response_len)], dtype=logp.dtype, device=logp.device
        )
        ones = torch.ones_like(logp, dtype=torch.bool)[None]
        token_losses = ppo_clip_token_losses(
            logp[None], old_logp[None], advantages[None], ones, clip_low=grpo.clip_low, clip_high=grpo.clip_high
        )[0]
        loss = token_losses.sum() / total_tokens
        if ref_logp is not None:
            kl_tokens = kl_penalty(logp, ref_logp, grpo.kl_estimator)
            loss = loss + grpo.kl_coef * kl_tokens.sum() / total_tokens
            kl_sum += float(kl_tokens.detach().sum())
        loss.backward()
        loss_sum += float(loss.detach())
    return UpdateStats(
        loss=loss_sum,
        kl=kl_sum / total_tokens if use_kl else None,
        tokens=total_tokens,
        entropy=entropy_sum / total_tokens,
    )

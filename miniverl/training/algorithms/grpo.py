"""GRPO: group-relative outcome advantages and a token-mean PPO-clip loss.

One update per cycle by default. ``algorithm.grpo.ppo_epochs`` x ``mini_batches`` (verl's
``ppo_epochs`` and ``ppo_mini_batch_size``) makes that many optimizer steps instead: the old
log-probs (and the reference's, for a KL loss) are computed once with the rollout weights, then each
pass splits the cycle's prompt groups into mini-batches (order reshuffled per pass from (run seed,
update, pass), so resume replays it) and takes one step per mini-batch, its physical batches
accumulated. The ratio then moves off 1 and the clip, ``actor/pg_clipfrac`` and ``actor/ppo_kl``
measure the drift.

Roles: student; a reference when ``algorithm.grpo.kl_coef > 0``. The KL to the reference uses
``kl_estimator`` (k1/k2/k3/low_var_kl) either as a loss term (``kl_mode: loss``, the default, k3 as
in DeepSeekMath) or as a penalty on each trajectory's score before the group advantages
(``kl_mode: reward``: the score minus ``kl_coef`` times the trajectory's summed KL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from miniverl.algorithms import (
    chunked_token_logprobs,
    clip_fraction,
    grpo_advantages,
    kl_penalty,
    ppo_clip_token_losses,
)
from miniverl.config.schema import MiniverlConfig
from miniverl.rollout.agreement import agreement_metrics
from miniverl.rollout.backends import OLD_LOGP_RECOMPUTED, old_logp_origin, plain_sampling
from miniverl.runtime.base import RoleName, RoleRuntime, SequenceRows
from miniverl.runtime.batching import to_device
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch
from miniverl.training.update import (
    UpdateSequence,
    UpdateStats,
    host_logprobs,
    mini_batches,
    pass_order_seed,
    physical_batches,
    rollout_token_logprobs,
    rows_of,
    targets_of,
)


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
            recompute=self.recompute_old_logp and self.config.algorithm.old_logp == "recompute",
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
        sampled_logp = [t.sampled_logprobs for t in batch.trajectories]
        rollout_logp = sampled_logp if origin == "rollout" else None
        sequences = batch.sequences(advantages)
        self.actor.begin_update()
        if g.ppo_epochs * g.mini_batches == 1:
            stats = grpo_update(self.runtime, sequences, self.config, rollout_logp=rollout_logp)
            grad_norm, delta = self.actor.step()
            if stats.trainer_logp is not None:  # one step on fresh trajectories: the loss's forward is the old_logp
                metrics.update(agreement_metrics(sampled_logp, stats.trainer_logp))
            # One step on fresh trajectories: the ratio is exactly 1, so the clip fraction is 0 by
            # construction and not logged; the loss is the policy-gradient surrogate, not a learning curve.
        else:
            stats, grad_norm, delta = self._passes(batch, sequences, rollout_logp, step=step, metrics=metrics)
        # verl's names; actor/updates counts the optimizer steps of this update (epochs x mini-batches).
        metrics["actor/pg_loss"] = stats.loss
        metrics.update(self.actor.update_counts("actor"))
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

    def _passes(
        self,
        batch: CycleBatch,
        sequences: list[UpdateSequence],
        rollout_logp: Sequence[Sequence[float]] | None,
        *,
        step: int,
        metrics: dict[str, float],
    ) -> tuple[UpdateStats, float, float]:
        """``ppo_epochs`` passes of ``mini_batches`` steps; returns the mean stats, mean grad norm and the change."""
        g = self.config.algorithm.grpo
        old_logp, ref_logp = rollout_token_logprobs(
            self.runtime, sequences, self.config, with_reference=g.kl_coef > 0 and g.kl_mode == "loss"
        )
        metrics.update(agreement_metrics([t.sampled_logprobs for t in batch.trajectories], host_logprobs(old_logp)))
        if rollout_logp is not None:
            old_logp = [
                torch.tensor(lp, dtype=o.dtype, device=o.device) for lp, o in zip(rollout_logp, old_logp, strict=True)
            ]
        groups: dict[str, list[int]] = {}  # prompt-major: insertion order is the rollout order
        for i, t in enumerate(batch.trajectories):
            groups.setdefault(t.group_id, []).append(i)
        start = [p.detach().clone() for p in self.actor.params]
        per_step: dict[str, list[float]] = {}
        for epoch in range(g.ppo_epochs):
            self.actor.begin_pass()
            seed = pass_order_seed("grpo", self.config.run.seed, step, epoch)
            for mini in mini_batches(list(groups.values()), g.mini_batches, seed, shuffle=g.shuffle_mini_batches):
                part = [sequences[i] for i in mini]
                stats = grpo_update(
                    self.runtime,
                    part,
                    self.config,
                    old_logp=[old_logp[i] for i in mini],
                    ref_logp=[ref_logp[i] for i in mini] if ref_logp is not None else None,
                )
                grad_norm, _ = self.actor.step()
                per_step.setdefault("loss", []).append(stats.loss)
                per_step.setdefault("grad_norm", []).append(grad_norm)
                per_step.setdefault("entropy", []).append(stats.entropy or 0.0)
                per_step.setdefault("pg_clipfrac", []).append(stats.clip_fraction or 0.0)
                per_step.setdefault("ppo_kl", []).append(stats.ppo_kl or 0.0)
                if stats.kl is not None:
                    per_step.setdefault("kl", []).append(stats.kl)
        mean = {k: sum(v) / len(v) for k, v in per_step.items()}
        metrics["actor/pg_clipfrac"] = mean["pg_clipfrac"]
        metrics["actor/ppo_kl"] = mean["ppo_kl"]
        metrics["actor/grad_norm"] = mean["grad_norm"]
        delta = sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(self.actor.params, start, strict=True)) ** 0.5
        stats = UpdateStats(
            loss=mean["loss"],
            kl=mean.get("kl"),
            tokens=sum(s.response_len for s in sequences),
            entropy=mean["entropy"],
        )
        return stats, mean["grad_norm"], delta


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
    old_logp: Sequence[torch.Tensor] | None = None,
    ref_logp: Sequence[torch.Tensor] | None = None,
) -> UpdateStats:
    """GRPO: token-mean PPO-clip loss over ``sequences`` (+ optional KL loss to the reference), backpropagated.

    Without ``old_logp`` (one step on fresh trajectories): the group was sampled by the current weights
    and no optimizer step happens before this backward, so ``old_logp`` is the current log-prob
    detached (ratio exactly 1). This saves a second student forward per physical batch.
    ``rollout_logp`` (one list per sequence) replaces it with the rollout's own log-probs (only where
    :func:`old_logp_origin` allowed it). With ``old_logp`` (one mini-batch of several passes: per
    sequence, computed before the first step) the ratio measures the drift, and the stats carry its
    clip fraction and ``ppo_kl``; ``ref_logp`` (per sequence) then saves the reference's forward.
    The token mean is over ``sequences`` (one mini-batch, as verl's ``token-mean``). With
    ``kl_mode: reward`` the KL is already in the advantages and the loss has no KL term (the reported
    ``kl`` is then ``None``).
    """
    grpo = config.algorithm.grpo
    chunk = config.train.logprob_chunk_size
    total_tokens = sum(s.response_len for s in sequences)
    use_kl = grpo.kl_coef > 0 and grpo.kl_mode == "loss"
    batches = physical_batches(runtime, sequences, config.train.trajectory_batch_size)
    # Every host-to-device copy happens here, before any GPU work is queued, and the statistics stay
    # on the device (float64: the same sums Python's floats made) until one read at the end: the
    # loop below never waits for the GPU, so the host keeps launching the next forward.
    inputs = [_batch_inputs([sequences[i] for i in index_list], runtime.device) for index_list in batches]
    sums = torch.zeros(5, dtype=torch.float64, device=runtime.device)  # loss, kl, entropy, clipped, drift
    trainer_logp: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for index_list, (rows, targets, advantages_per_token) in zip(batches, inputs, strict=True):
        part_ref = None
        if use_kl and ref_logp is not None:
            part_ref = torch.cat([ref_logp[i] for i in index_list])
        elif use_kl:
            with runtime.use("reference") as ref, torch.no_grad():
                hidden = ref.selected_hidden(rows, trajectory_batch_size=len(index_list))
                part_ref, _ = chunked_token_logprobs(hidden, ref.head_weight, targets, chunk_size=chunk)
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(index_list))
            logp, entropy = chunked_token_logprobs(
                hidden, student.head_weight, targets, chunk_size=chunk, with_entropy=True
            )
        if entropy is not None:
            sums[2] += entropy.detach().sum().double()
        if old_logp is None:  # no step yet: this forward is the trainer's log-prob under the rollout's weights
            sizes = [sequences[i].response_len for i in index_list]
            for i, piece in zip(index_list, logp.detach().split(sizes), strict=True):
                trainer_logp[i] = piece
        if old_logp is not None:
            part_old = torch.cat([old_logp[i] for i in index_list]).to(logp.dtype)
        elif rollout_logp is None:
            part_old = logp.detach()
        else:
            flat = [lp for i in index_list for lp in rollout_logp[i]]
            part_old = to_device(torch.tensor(flat, dtype=logp.dtype), logp.device)
        advantages = advantages_per_token.to(logp.dtype)
        ones = torch.ones_like(logp, dtype=torch.bool)[None]
        token_losses = ppo_clip_token_losses(
            logp[None], part_old[None], advantages[None], ones, clip_low=grpo.clip_low, clip_high=grpo.clip_high
        )[0]
        if old_logp is not None:
            tokens = logp.shape[0]
            fraction = clip_fraction(
                logp.detach()[None],
                part_old[None],
                advantages[None],
                ones,
                clip_low=grpo.clip_low,
                clip_high=grpo.clip_high,
            )
            sums[3] += tokens * fraction.detach().double()
            sums[4] += (part_old - logp.detach()).sum().double()
        loss = token_losses.sum() / total_tokens
        if part_ref is not None:
            kl_tokens = kl_penalty(logp, part_ref, grpo.kl_estimator)
            loss = loss + grpo.kl_coef * kl_tokens.sum() / total_tokens
            sums[1] += kl_tokens.detach().sum().double()
        loss.backward()
        sums[0] += loss.detach().double()
    loss_sum, kl_sum, entropy_sum, clipped, drift_sum = sums.tolist()  # the one device read
    return UpdateStats(
        loss=loss_sum,
        kl=kl_sum / total_tokens if use_kl else None,
        tokens=total_tokens,
        entropy=entropy_sum / total_tokens,
        clip_fraction=clipped / total_tokens if old_logp is not None else None,
        ppo_kl=drift_sum / total_tokens if old_logp is not None else None,
        trainer_logp=host_logprobs(trainer_logp) if old_logp is None else None,
    )


def _batch_inputs(
    part: Sequence[UpdateSequence], device: torch.device
) -> tuple[SequenceRows, torch.Tensor, torch.Tensor]:
    """One physical batch's rows, target ids and per-token advantages (float64), already on ``device``."""
    advantages = torch.tensor([s.advantage for s in part for _ in range(s.response_len)], dtype=torch.float64)
    return rows_of(part, teacher=False), targets_of(part, device), to_device(advantages, device)

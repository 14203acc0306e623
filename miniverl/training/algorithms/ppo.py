"""PPO with a critic: token-level values, GAE, clipped policy and value losses, several updates per rollout.

Roles: student (the actor), critic (LoRA + scalar value head, its own AdamW at
``algorithm.ppo.critic_learning_rate``), and a reference when ``kl_coef > 0``. One cycle:

1. with the rollout weights, under ``no_grad``: the actor's log-probs :math:`\\log\\pi_{old}`, the
   reference's (KL), the critic's values :math:`V_{old}` at every response token;
2. token rewards: the trajectory's score on its last response token, minus
   ``kl_coef * kl_penalty(old, ref, kl_estimator)`` on every token with ``kl_mode: reward``;
3. :func:`~miniverl.algorithms.gae_advantages` (gamma, lam) in float64, whitened over the rollout batch
   (``whiten_advantages``), returns = advantages + values (unwhitened); each trajectory record keeps its row
   of those inputs and outputs (:class:`~miniverl.rollout.records.TokenGae`), so GAE can be recomputed from
   the run directory alone;
4. ``ppo_epochs`` passes (each begins with an ``actor_pass`` progress phase; ``critic_pass`` in 5) over
   ``mini_batches`` mini-batches (order reshuffled per epoch from a generator seeded by (run seed, update,
   epoch), so resume replays it): one actor step on the token-mean PPO-clip loss (+ the KL loss with
   ``kl_mode: loss``) per mini-batch;
5. the critic's own ``critic_ppo_epochs`` passes over ``critic_mini_batches`` mini-batches (default:
   the actor's; the same seeded orders): one critic step on verl's clipped value loss per mini-batch.
   The actor's steps never change the critic's inputs (old values, returns), so the order of 4 and 5
   does not matter.

The strict one-update OPD rule does not apply: the ratio to the rollout policy and its clip are
what keep the later updates proximal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from miniverl import progress
from miniverl.algorithms import (
    chunked_token_logprobs,
    explained_variance,
    gae_advantages,
    kl_penalty,
    masked_whiten,
    policy_loss_metrics,
    ppo_clip_token_losses,
    value_clip_fraction,
    value_clip_loss,
)
from miniverl.config.schema import MiniverlConfig
from miniverl.rollout.agreement import agreement_metrics
from miniverl.rollout.backends import OLD_LOGP_RECOMPUTED, old_logp_origin, plain_sampling
from miniverl.rollout.records import TokenGae
from miniverl.runtime.base import RoleName, RoleRuntime
from miniverl.runtime.critic import values_from_hidden
from miniverl.training import checkpoint as ckpt
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch, TrainedParameters
from miniverl.training.update import (
    UpdateSequence,
    host_logprobs,
    mini_batches,
    pass_order_seed,
    physical_batches,
    rollout_token_logprobs,
    rows_of,
    targets_of,
)

CRITIC_PARAMS = "critic_params.safetensors"
CRITIC_OPTIMIZER = "critic_optimizer.safetensors"


class Ppo(Algorithm):
    name = "ppo"
    roles = ("critic",)
    #: ``old_logp`` recomputed by the training model (step 1 above); ``False`` takes the rollout's
    #: ``sampled_logprobs``, which :func:`old_logp_origin` refuses unless the trainer computed them
    recompute_old_logp: ClassVar[bool] = True

    def __init__(self, config: MiniverlConfig, runtime: RoleRuntime, actor: TrainedParameters) -> None:
        super().__init__(config, runtime, actor)
        train = config.train
        ppo = config.algorithm.ppo
        self.critic = TrainedParameters(
            list(runtime.named_critic_parameters()),
            lr=ppo.critic_learning_rate,
            betas=train.adam_betas,
            eps=train.adam_eps,
            weight_decay=train.weight_decay,
            max_grad_norm=ppo.critic_max_grad_norm,
            bf16_master=actor.precision == "bf16_master",
        )

    def required_roles(self, config: MiniverlConfig) -> tuple[RoleName, ...]:
        return ("critic", "reference") if config.algorithm.ppo.kl_coef > 0 else ("critic",)

    # ------------------------------------------------------------------ checkpoint state
    def state_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        opt_tensors, _ = ckpt.optimizer_to_tensors(self.critic.optimizer)
        params = {n: p.detach().cpu().contiguous() for n, p in self.critic.named().items()}
        return {CRITIC_PARAMS: params, CRITIC_OPTIMIZER: opt_tensors}

    def state_json(self) -> dict[str, Any]:
        _, meta = ckpt.optimizer_to_tensors(self.critic.optimizer)
        return {"critic_optimizer": meta}

    def load_state(self, tensors: Mapping[str, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None:
        params = tensors[CRITIC_PARAMS]
        if set(params) != set(self.critic.named()):
            raise ValueError("checkpoint critic tensors do not match this plan's critic")
        self.critic.load(params)
        ckpt.optimizer_from_tensors(self.critic.optimizer, dict(tensors[CRITIC_OPTIMIZER]), meta["critic_optimizer"])

    def trained(self) -> list[TrainedParameters]:
        return [self.actor, self.critic]

    def release(self) -> None:
        self.critic.release()

    # ------------------------------------------------------------------ one cycle
    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        ppo = self.config.algorithm.ppo
        origin = old_logp_origin(
            batch.logprob_source,
            recompute=self.recompute_old_logp and self.config.algorithm.old_logp == "recompute",
            algorithm=self.name,
            plain_sampling=plain_sampling(self.config.rollout),
        )
        seqs = batch.sequences()
        if any(s.response_len < 1 for s in seqs):
            raise ValueError("PPO needs at least one response token per trajectory")
        old_logp, ref_logp, old_values = self._rollout_tensors(seqs)
        sampled_logp = [t.sampled_logprobs for t in batch.trajectories]
        agreement = agreement_metrics(sampled_logp, host_logprobs(old_logp))  # the trainer's, before any swap
        if origin == "rollout":
            old_logp = [
                torch.tensor(t.sampled_logprobs, dtype=lp.dtype, device=lp.device)
                for t, lp in zip(batch.trajectories, old_logp, strict=True)
            ]
        n, t_len = len(seqs), max(s.response_len for s in seqs)
        dev = old_logp[0].device
        mask = torch.zeros(n, t_len, dtype=torch.bool, device=dev)
        # GAE in float64: the trajectory records keep its inputs and outputs, and a reader recomputing it in
        # double precision must find the same numbers; the losses then take them in float32
        rewards = torch.zeros(n, t_len, dtype=torch.float64, device=dev)
        values = torch.zeros_like(rewards)
        for i, s in enumerate(seqs):
            mask[i, : s.response_len] = True
            rewards[i, s.response_len - 1] = batch.rewards[i]
            values[i, : s.response_len] = old_values[i]
        metrics: dict[str, float] = {OLD_LOGP_RECOMPUTED: 1.0 if origin == "trainer" else 0.0, **agreement}
        if ppo.kl_coef > 0 and ppo.kl_mode == "reward":
            assert ref_logp is not None
            kl_tok = torch.zeros_like(rewards)
            for i, s in enumerate(seqs):
                kl_tok[i, : s.response_len] = kl_penalty(old_logp[i], ref_logp[i], ppo.kl_estimator)
            rewards = rewards - ppo.kl_coef * kl_tok
            metrics["actor/reward_kl_penalty"] = float(kl_tok[mask].mean())
        gae, returns = gae_advantages(rewards, values, mask, gamma=ppo.gamma, lam=ppo.lam)
        metrics.update(_data_metrics(gae, returns, values, mask))
        whitened = masked_whiten(gae, mask) if ppo.whiten_advantages else None
        records = _gae_records(mask, rewards, values, gae, returns, whitened)
        adv = (whitened if whitened is not None else gae).to(torch.float32)
        returns = returns.to(torch.float32)
        per_traj_adv = [float(adv[i, : s.response_len].mean()) for i, s in enumerate(seqs)]
        start = [p.detach().clone() for p in self.actor.params]
        critic_start = [p.detach().clone() for p in self.critic.params]
        sums: dict[str, list[float]] = {}
        trajectories = [[i] for i in range(n)]

        def mini_tensors(mini: list[int]) -> dict[str, Any]:
            return {
                "old": torch.cat([old_logp[i] for i in mini]),
                "ref": torch.cat([ref_logp[i] for i in mini]) if ref_logp is not None else None,
                "adv": torch.cat([adv[i, : seqs[i].response_len] for i in mini]),
                "ret": torch.cat([returns[i, : seqs[i].response_len] for i in mini]),
                "val": torch.cat([old_values[i] for i in mini]),
            }

        for role, trained, epochs, count, take_step in (
            ("actor", self.actor, ppo.ppo_epochs, ppo.mini_batches, self._actor_step),
            ("critic", self.critic, ppo.critic_epoch_count, ppo.critic_mini_batch_count, self._critic_step),
        ):
            trained.begin_update()
            for epoch in range(epochs):
                # observable from outside (a progress line on stderr): where a SIGTERM lands in a qualification
                progress.phase(f"{role}_pass", f"{epoch + 1}/{epochs} ({count} mini-batch(es))")
                trained.begin_pass()
                seed = pass_order_seed("ppo", self.config.run.seed, step, epoch)
                for mini in mini_batches(trajectories, count, seed, shuffle=ppo.shuffle_mini_batches):
                    for key, value in take_step([seqs[i] for i in mini], mini_tensors(mini)).items():
                        sums.setdefault(key, []).append(value)
        for key, values_list in sums.items():
            metrics[key] = sum(values_list) / len(values_list)
        metrics.update(self.actor.update_counts("actor"))
        metrics.update(self.critic.update_counts("critic"))
        metrics["critic/delta_norm"] = _delta(self.critic.params, critic_start)
        return AlgorithmStep(
            loss=metrics["actor/pg_loss"],
            kl=metrics.get("actor/kl_loss", metrics.get("actor/reward_kl_penalty")),
            tokens=int(mask.sum()),
            grad_norm=metrics["actor/grad_norm"],
            adapter_delta_norm=_delta(self.actor.params, start),
            advantages=per_traj_adv,
            metrics=metrics,
            gae=records,
        )

    @torch.no_grad()
    def _rollout_tensors(
        self, seqs: Sequence[UpdateSequence]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor] | None, list[torch.Tensor]]:
        """Per trajectory: the rollout actor's log-probs, the reference's (if KL) and the critic's values."""
        rt = self.runtime
        old, ref = rollout_token_logprobs(rt, seqs, self.config, with_reference=self.config.algorithm.ppo.kl_coef > 0)
        vals: list[torch.Tensor] = [torch.empty(0)] * len(seqs)
        for index_list in physical_batches(rt, seqs, self.config.train.trajectory_batch_size):
            part = [seqs[i] for i in index_list]
            with rt.use("critic") as critic:
                value = values_from_hidden(
                    rt.value_head, critic.selected_hidden(rows_of(part, teacher=False), trajectory_batch_size=len(part))
                )
            for i, v in zip(index_list, value.split([s.response_len for s in part]), strict=True):
                vals[i] = v
        return old, ref, vals

    def _actor_step(self, part: list[UpdateSequence], tok: dict[str, Any]) -> dict[str, float]:
        ppo, rt, chunk = self.config.algorithm.ppo, self.runtime, self.config.train.logprob_chunk_size
        total = sum(s.response_len for s in part)
        offsets = _offsets(part)
        loss_sum = kl_sum = 0.0
        logps, ents = [], []
        use_kl_loss = ppo.kl_coef > 0 and ppo.kl_mode == "loss"
        for index_list in physical_batches(rt, part, self.config.train.trajectory_batch_size):
            sub = [part[i] for i in index_list]
            sel = torch.cat([torch.arange(offsets[i], offsets[i] + part[i].response_len) for i in index_list])
            sel = sel.to(tok["old"].device)
            with rt.use("student") as student:
                hidden = student.selected_hidden(rows_of(sub, teacher=False), trajectory_batch_size=len(sub))
                logp, entropy = chunked_token_logprobs(
                    hidden, student.head_weight, targets_of(sub, rt.device), chunk_size=chunk, with_entropy=True
                )
            ones = torch.ones(1, logp.shape[0], dtype=torch.bool, device=logp.device)
            losses = ppo_clip_token_losses(
                logp[None], tok["old"][sel][None], tok["adv"][sel][None], ones,
                clip_low=ppo.clip_low, clip_high=ppo.clip_high,
            )  # fmt: skip
            loss = losses.sum() / total
            if use_kl_loss:
                kl_tokens = kl_penalty(logp, tok["ref"][sel], ppo.kl_estimator)
                loss = loss + ppo.kl_coef * kl_tokens.sum() / total
                kl_sum += float(kl_tokens.detach().sum())
            loss.backward()
            loss_sum += float(losses.detach().sum()) / total
            logps.append((sel, logp.detach()))
            ents.append((sel, entropy.detach() if entropy is not None else None))
        logp_all = torch.empty_like(tok["old"])
        ent_all = torch.empty_like(tok["old"])
        for (sel, lp), (_, ent) in zip(logps, ents, strict=True):
            logp_all[sel] = lp.to(logp_all.dtype)
            if ent is not None:
                ent_all[sel] = ent.to(ent_all.dtype)
        stats = policy_loss_metrics(
            logp_all[None], tok["old"][None], tok["adv"][None], torch.ones_like(logp_all, dtype=torch.bool)[None],
            clip_low=ppo.clip_low, clip_high=ppo.clip_high, entropy=ent_all[None],
        )  # fmt: skip
        grad_norm, _ = self.actor.step()
        out = {f"actor/{k}": v for k, v in stats.items()}
        out.update({"actor/pg_loss": loss_sum, "actor/grad_norm": grad_norm})
        if use_kl_loss:
            out["actor/kl_loss"] = kl_sum / total
        return out

    def _critic_step(self, part: list[UpdateSequence], tok: dict[str, Any]) -> dict[str, float]:
        ppo, rt = self.config.algorithm.ppo, self.runtime
        total = sum(s.response_len for s in part)
        offsets = _offsets(part)
        loss_sum = 0.0
        preds = torch.empty_like(tok["val"])
        for index_list in physical_batches(rt, part, self.config.train.trajectory_batch_size):
            sub = [part[i] for i in index_list]
            sel = torch.cat([torch.arange(offsets[i], offsets[i] + part[i].response_len) for i in index_list])
            sel = sel.to(tok["val"].device)
            with rt.use("critic") as critic:
                hidden = critic.selected_hidden(rows_of(sub, teacher=False), trajectory_batch_size=len(sub))
                vpred = values_from_hidden(rt.value_head, hidden)
            ones = torch.ones(1, vpred.shape[0], dtype=torch.bool, device=vpred.device)
            count = float(vpred.shape[0])
            loss = value_clip_loss(
                vpred[None], tok["val"][sel][None], tok["ret"][sel][None], ones, clip_range=ppo.value_clip
            ) * (count / total)
            loss.backward()
            loss_sum += float(loss.detach())
            preds[sel] = vpred.detach()
        ones = torch.ones_like(preds, dtype=torch.bool)[None]
        clipfrac = value_clip_fraction(preds[None], tok["val"][None], tok["ret"][None], ones, clip_range=ppo.value_clip)
        grad_norm, _ = self.critic.step()
        return {"critic/vf_loss": loss_sum, "critic/vf_clipfrac": float(clipfrac), "critic/grad_norm": grad_norm}


def _gae_records(
    mask: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    whitened: torch.Tensor | None,
) -> list[TokenGae]:
    """Each trajectory's row of the update's ``[N, T]`` GAE inputs and outputs, as its record keeps them."""

    def rows(t: torch.Tensor) -> list[list[float]]:
        return [[float(x) for x in row] for row in t.detach().cpu().tolist()]

    white = rows(whitened) if whitened is not None else None
    columns = zip(mask.to(torch.int64).cpu().tolist(), rows(rewards), rows(values), rows(advantages), rows(returns),
                  strict=True)  # fmt: skip
    return [
        TokenGae(
            mask=m, rewards=r, values=v, advantages=a, returns=ret, whitened_advantages=white[i] if white else None
        )
        for i, (m, r, v, a, ret) in enumerate(columns)
    ]


def _offsets(part: Sequence[UpdateSequence]) -> list[int]:
    out, acc = [], 0
    for s in part:
        out.append(acc)
        acc += s.response_len
    return out


def _delta(params: Sequence[torch.Tensor], before: Sequence[torch.Tensor]) -> float:
    return math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(params, before, strict=True)))


@torch.no_grad()
def _data_metrics(
    adv: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """verl's ``compute_data_metrics`` critic side, on the rollout batch (before whitening)."""
    a, r, v = adv[mask], returns[mask], values[mask]
    return {
        "critic/advantages/mean": float(a.mean()),
        "critic/advantages/max": float(a.max()),
        "critic/advantages/min": float(a.min()),
        "critic/returns/mean": float(r.mean()),
        "critic/values/mean": float(v.mean()),
        "critic/vf_explained_var": float(explained_variance(values, returns, mask)),
    }

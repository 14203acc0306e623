"""miniverl's PPO update sequence against verl 0.9.1's ``core_algos`` (run by ``nox -s verl``).

One fixed problem (8 responses of 2-5 tokens, a linear softmax policy and a linear critic over fixed
float64 features) is trained twice with the same SGD steps in the same order: 2 epochs x 2
mini-batches, the order miniverl's PPO draws. One arm uses miniverl's pure functions as
``miniverl/training/algorithms/ppo.py`` does (KL-in-reward, GAE, whitening, PPO-clip, value clip);
the other uses verl's ``compute_rewards``, ``compute_gae_advantage_return``, the registered
``vanilla`` policy loss, ``agg_loss`` and ``compute_value_loss`` as verl's ``ppo_loss``/``value_loss``
call them, with ``loss_agg_mode: token-mean`` (the aggregation miniverl implements). The per-mini-batch
pg_loss, pg_clipfrac, ppo_kl, vf_loss and vf_clipfrac must agree to 1e-12. Since every step's
parameters come from the previous step's gradients, a later step only agrees when the earlier
gradients did too. No verl code is copied: verl is imported and called.

Domain: verl's vanilla loss also applies dual-clip (``clip_ratio_c`` 3.0: for A < 0 the loss is capped at
3|A|), which miniverl does not implement; the sequence below keeps every ratio under 3 (checked), and
``test_dual_clip_is_verl_only`` pins the difference outside that domain.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
import torch

pytest.importorskip("verl", reason="verl 0.9.1 lives in its own venv: nox -s verl")

from verl.trainer.ppo import core_algos
from verl.workers.config.actor import ActorConfig

from miniverl.algorithms import (
    gae_advantages,
    kl_penalty,
    masked_whiten,
    policy_loss_metrics,
    ppo_clip_loss,
    ppo_clip_token_losses,
    value_clip_fraction,
    value_clip_loss,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

LENGTHS = (5, 3, 4, 5, 2, 4, 5, 3)
T, FEATURES, VOCAB = 5, 6, 7
EPOCHS, MINI_BATCHES = 2, 2
CLIP, VALUE_CLIP = 0.2, 0.05
GAMMA, LAM, KL_COEF = 0.99, 0.95, 0.05
ACTOR_LR, CRITIC_LR = 2.0, 0.5
RUN_SEED = 7
KEYS = ("pg_loss", "pg_clipfrac", "ppo_kl", "vf_loss", "vf_clipfrac")
TOL = 1e-12
# Relative tolerance per key, from verl's own rounding: its masked_mean divides by (mask.sum() + 1e-8), so
# its whitened advantages (hence the losses) and ppo_kl sit about 1e-8 / tokens off the exact token mean
# miniverl takes; its clip fractions are float32 (``torch.gt(...).float()``), about 6e-8 relative.
RTOL = {"pg_loss": 1e-8, "ppo_kl": 1e-8, "vf_loss": 1e-8, "pg_clipfrac": 2e-7, "vf_clipfrac": 2e-7}

Order = list[list[list[int]]]  # epochs -> mini-batches -> trajectory indices


@dataclass(frozen=True)
class Problem:
    features: torch.Tensor  # [N, T, F]
    targets: torch.Tensor  # [N, T] sampled token ids
    mask: torch.Tensor  # [N, T] bool, response tokens
    scores: torch.Tensor  # [N] outcome score
    actor: torch.Tensor  # [F, V] rollout (old) policy weights
    reference: torch.Tensor  # [F, V]
    critic: torch.Tensor  # [F] value weights


def make_problem() -> Problem:
    g = torch.Generator().manual_seed(0)
    n = len(LENGTHS)
    mask = torch.tensor([[t < length for t in range(T)] for length in LENGTHS])
    return Problem(
        features=torch.randn(n, T, FEATURES, generator=g, dtype=torch.float64),
        targets=torch.randint(0, VOCAB, (n, T), generator=g),
        mask=mask,
        scores=torch.tensor([1.0, 0.0, 1.0, 0.0, 1.0, 1.0, 0.0, 0.0], dtype=torch.float64),
        actor=0.3 * torch.randn(FEATURES, VOCAB, generator=g, dtype=torch.float64),
        reference=0.3 * torch.randn(FEATURES, VOCAB, generator=g, dtype=torch.float64),
        critic=0.1 * torch.randn(FEATURES, generator=g, dtype=torch.float64),
    )


def token_logp(weights: torch.Tensor, p: Problem, rows: torch.Tensor) -> torch.Tensor:
    logits = p.features[rows] @ weights
    return torch.log_softmax(logits, dim=-1).gather(-1, p.targets[rows].unsqueeze(-1)).squeeze(-1)


def token_values(weights: torch.Tensor, p: Problem, rows: torch.Tensor) -> torch.Tensor:
    return p.features[rows] @ weights


def miniverl_order(n: int, per_mini: int, epochs: int) -> Order:
    """The mini-batch order miniverl's PPO draws for update 0 of a run seeded RUN_SEED (one unit per trajectory)."""
    from miniverl.training.update import mini_batches, pass_order_seed

    units = [[i] for i in range(n)]
    seeds = [pass_order_seed("ppo", RUN_SEED, 0, epoch) for epoch in range(epochs)]
    return [mini_batches(units, n // per_mini, seed, shuffle=True) for seed in seeds]


def split(rows: Sequence[int], parts: int) -> list[list[int]]:
    size = len(rows) // parts
    return [list(rows[i : i + size]) for i in range(0, len(rows), size)]


def miniverl_sequence(
    p: Problem,
    order: Order,
    *,
    clip_high: float = CLIP,
    value_clip: float = VALUE_CLIP,
    refresh_old_each_epoch: bool = False,
    micro_batches: int = 1,
) -> list[dict[str, float]]:
    """miniverl's PPO cycle on the problem: rollout tensors once, then one actor and one critic step per mini-batch."""
    everyone = torch.arange(len(LENGTHS))
    with torch.no_grad():
        old = token_logp(p.actor, p, everyone)
        ref = token_logp(p.reference, p, everyone)
        old_values = token_values(p.critic, p, everyone)
    rewards = torch.zeros_like(old)
    rewards[everyone, torch.tensor(LENGTHS) - 1] = p.scores
    rewards = rewards - KL_COEF * torch.where(p.mask, kl_penalty(old, ref, "k1"), torch.zeros_like(old))
    adv, returns = gae_advantages(rewards, old_values, p.mask, gamma=GAMMA, lam=LAM)
    adv = masked_whiten(adv, p.mask)
    actor = p.actor.clone().requires_grad_(True)
    critic = p.critic.clone().requires_grad_(True)
    actor_opt = torch.optim.SGD([actor], lr=ACTOR_LR)
    critic_opt = torch.optim.SGD([critic], lr=CRITIC_LR)
    out = []
    for epoch, minis in enumerate(order):
        if refresh_old_each_epoch and epoch > 0:
            with torch.no_grad():
                old = token_logp(actor, p, everyone)
        for mini in minis:
            rows = torch.tensor(mini)
            m = p.mask[rows]
            total = int(m.sum())
            pg_loss = vf_loss = 0.0
            logp_all = torch.empty_like(old[rows])
            vpred_all = torch.empty_like(old_values[rows])
            actor_opt.zero_grad()
            critic_opt.zero_grad()
            # micro-batches are gradient accumulation: each part's token sum over the mini-batch's tokens
            for part in split(range(len(mini)), micro_batches):
                sub = rows[part]
                logp = token_logp(actor, p, sub)
                if micro_batches == 1:
                    loss = ppo_clip_loss(logp, old[sub], adv[sub], p.mask[sub], clip_low=CLIP, clip_high=clip_high)
                else:
                    losses = ppo_clip_token_losses(
                        logp, old[sub], adv[sub], p.mask[sub], clip_low=CLIP, clip_high=clip_high
                    )
                    loss = losses.sum() / total
                loss.backward()
                pg_loss += float(loss.detach())
                logp_all[part] = logp.detach()
                vpred = token_values(critic, p, sub)
                count = int(p.mask[sub].sum())
                vloss = value_clip_loss(vpred, old_values[sub], returns[sub], p.mask[sub], clip_range=value_clip) * (
                    count / total
                )
                vloss.backward()
                vf_loss += float(vloss.detach())
                vpred_all[part] = vpred.detach()
            stats = policy_loss_metrics(logp_all, old[rows], adv[rows], m, clip_low=CLIP, clip_high=clip_high)
            vf_clipfrac = value_clip_fraction(vpred_all, old_values[rows], returns[rows], m, clip_range=value_clip)
            actor_opt.step()
            critic_opt.step()
            out.append(
                {
                    "pg_loss": pg_loss,
                    "pg_clipfrac": stats["pg_clipfrac"],
                    "ppo_kl": stats["ppo_kl"],
                    "vf_loss": vf_loss,
                    "vf_clipfrac": float(vf_clipfrac),
                }
            )
    return out


def verl_sequence(p: Problem, order: Order, *, micro_batches: int = 1) -> list[dict[str, float]]:
    """The same cycle with verl 0.9.1's functions, composed as verl's ``ppo_loss`` and ``value_loss`` compose them."""
    everyone = torch.arange(len(LENGTHS))
    mask = p.mask.to(torch.float64)
    with torch.no_grad():
        old = token_logp(p.actor, p, everyone)
        ref = token_logp(p.reference, p, everyone)
        old_values = token_values(p.critic, p, everyone)
    scores = torch.zeros_like(old)
    scores[everyone, torch.tensor(LENGTHS) - 1] = p.scores
    rewards = core_algos.compute_rewards(scores, old, ref, KL_COEF)
    adv, returns = core_algos.compute_gae_advantage_return(rewards, old_values, mask, GAMMA, LAM)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_mini_batch_size=len(LENGTHS) // MINI_BATCHES, ppo_epochs=EPOCHS,
        clip_ratio=CLIP, clip_ratio_low=CLIP, clip_ratio_high=CLIP, loss_agg_mode="token-mean",
        ppo_micro_batch_size_per_gpu=len(LENGTHS) // MINI_BATCHES // micro_batches,
    )  # fmt: skip
    policy_loss = core_algos.get_policy_loss_fn("vanilla")
    actor = p.actor.clone().requires_grad_(True)
    critic = p.critic.clone().requires_grad_(True)
    actor_opt = torch.optim.SGD([actor], lr=ACTOR_LR)
    critic_opt = torch.optim.SGD([critic], lr=CRITIC_LR)
    out = []
    for minis in order:
        for mini in minis:
            rows = torch.tensor(mini)
            batch_num_tokens = int(p.mask[rows].sum())
            config.global_batch_info.update(
                dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=len(mini), loss_scale_factor=None
            )
            actor_opt.zero_grad()
            critic_opt.zero_grad()
            step: dict[str, list[float]] = {key: [] for key in (*KEYS, "pg_clipfrac_lower")}
            for sub in (rows[part] for part in split(range(len(mini)), micro_batches)):
                pg_loss, pg_metrics = policy_loss(
                    old_log_prob=old[sub], log_prob=token_logp(actor, p, sub), advantages=adv[sub],
                    response_mask=p.mask[sub], loss_agg_mode="token-mean", config=config,
                )  # fmt: skip
                pg_loss.backward()
                vf_loss, vf_clipfrac = core_algos.compute_value_loss(
                    vpreds=token_values(critic, p, sub), returns=returns[sub], values=old_values[sub],
                    response_mask=p.mask[sub], cliprange_value=VALUE_CLIP, loss_agg_mode="token-mean",
                    dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=len(mini),
                )  # fmt: skip
                vf_loss.backward()
                step["pg_loss"].append(float(pg_loss.detach()))
                step["vf_loss"].append(float(vf_loss.detach()))
                step["vf_clipfrac"].append(float(vf_clipfrac))
                for key in ("pg_clipfrac", "ppo_kl", "pg_clipfrac_lower"):
                    step[key].append(pg_metrics[f"actor/{key}"])
            actor_opt.step()
            critic_opt.step()
            # verl's metric aggregation: losses normalized by the global mini-batch are summed over
            # micro-batches, the per-micro-batch fractions and ppo_kl averaged
            summed = {"pg_loss", "vf_loss"}
            out.append({k: sum(v) if k in summed else sum(v) / len(v) for k, v in step.items()})
    return out


def mismatches(ours: list[dict[str, float]], verl: list[dict[str, float]], keys: Sequence[str] = KEYS) -> list[str]:
    assert len(ours) == len(verl) == EPOCHS * MINI_BATCHES
    return [
        f"step {i} {key}: miniverl {a[key]!r} verl {b[key]!r}"
        for i, (a, b) in enumerate(zip(ours, verl, strict=True))
        for key in keys
        if abs(a[key] - b[key]) > TOL + RTOL[key] * abs(b[key])
    ]


@pytest.fixture(scope="module")
def problem() -> Problem:
    return make_problem()


@pytest.fixture(scope="module")
def order() -> Order:
    return miniverl_order(len(LENGTHS), len(LENGTHS) // MINI_BATCHES, EPOCHS)


def test_order_is_two_epochs_of_two_reshuffled_mini_batches(order: Order) -> None:
    assert len(order) == EPOCHS and all(len(minis) == MINI_BATCHES for minis in order)
    for minis in order:
        assert sorted(i for mini in minis for i in mini) == list(range(len(LENGTHS)))
    assert order[0] != order[1]  # reshuffled per epoch: the bad-order test below relies on it
    assert order == miniverl_order(len(LENGTHS), len(LENGTHS) // MINI_BATCHES, EPOCHS)  # seeded: resume replays it


def test_sequence_matches_verl_core_algos(problem: Problem, order: Order) -> None:
    ours = miniverl_sequence(problem, order)
    verl = verl_sequence(problem, order)
    assert mismatches(ours, verl) == []
    # the comparison means something: the first step is on-policy (ratio 1), later steps drift until
    # both clips act, and every ratio stays inside the domain where verl's dual clip is idle
    assert ours[0]["pg_clipfrac"] == 0.0 and abs(ours[0]["ppo_kl"]) < TOL
    assert max(step["pg_clipfrac"] for step in ours[1:]) > 0.1
    assert max(step["vf_clipfrac"] for step in ours[1:]) > 0.1
    assert all(abs(step["ppo_kl"]) > 1e-4 for step in ours[1:])
    assert all(step["pg_clipfrac_lower"] == 0.0 for step in verl)  # dual clip idle (A < 0 and ratio > 3: none)


def test_gradient_accumulation_over_micro_batches_matches_verl(problem: Problem, order: Order) -> None:
    """Two micro-batches of unequal token counts per mini-batch: the same losses (hence gradients) as verl.

    A finding, pinned: verl reports pg_clipfrac, ppo_kl and vf_clipfrac as the plain mean of the
    micro-batches' values, miniverl as the token mean over the mini-batch; they differ when the
    micro-batches hold different token counts (the losses do not: both normalize by the mini-batch's tokens).
    """
    ours = miniverl_sequence(problem, order, micro_batches=2)
    verl = verl_sequence(problem, order, micro_batches=2)
    assert mismatches(ours, verl, ("pg_loss", "vf_loss")) == []
    # accumulation is exact: the same sequence as one micro-batch per mini-batch, metrics included
    assert mismatches(ours, miniverl_sequence(problem, order), KEYS) == []
    assert mismatches(ours, verl, ("pg_clipfrac", "ppo_kl", "vf_clipfrac")) != []


@pytest.mark.parametrize(
    "perturb",
    [
        pytest.param(lambda p, o: miniverl_sequence(p, [o[0], o[0]]), id="epoch-2-not-reshuffled"),
        pytest.param(lambda p, o: miniverl_sequence(p, [o[0], o[1][::-1]]), id="epoch-2-mini-batches-swapped"),
        pytest.param(lambda p, o: miniverl_sequence(p, o, clip_high=0.25), id="clip-high-0.25"),
        pytest.param(lambda p, o: miniverl_sequence(p, o, value_clip=0.1), id="value-clip-0.1"),
        pytest.param(lambda p, o: miniverl_sequence(p, o, refresh_old_each_epoch=True), id="old-logp-per-epoch"),
    ],
)
def test_comparison_fails_when_miniverl_is_perturbed(
    problem: Problem, order: Order, perturb: Callable[[Problem, Order], list[dict[str, float]]]
) -> None:
    assert mismatches(perturb(problem, order), verl_sequence(problem, order)) != []


def test_dual_clip_is_verl_only() -> None:
    """A finding, pinned: for A < 0 and a ratio above clip_ratio_c (3), verl's vanilla loss is 3|A|, miniverl's r|A|."""
    old = torch.zeros(1, 2, dtype=torch.float64)
    logp = torch.log(torch.tensor([[4.0, 2.0]], dtype=torch.float64))
    adv = torch.tensor([[-1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 2, dtype=torch.bool)
    config = ActorConfig(
        strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=CLIP, loss_agg_mode="token-mean"
    )
    verl_loss, metrics = core_algos.get_policy_loss_fn("vanilla")(
        old_log_prob=old, log_prob=logp, advantages=adv, response_mask=mask, loss_agg_mode="token-mean", config=config
    )
    ours = ppo_clip_loss(logp, old, adv, mask, clip_low=CLIP, clip_high=CLIP)
    assert float(verl_loss) == pytest.approx((3.0 + 2.0) / 2, abs=TOL)
    assert float(ours) == pytest.approx((4.0 + 2.0) / 2, abs=TOL)
    assert metrics["actor/pg_clipfrac_lower"] == 0.5
    # verl's ppo_kl (k1, old - new) is miniverl's ppo_kl
    stats = policy_loss_metrics(logp, old, adv, mask, clip_low=CLIP, clip_high=CLIP)
    assert stats["ppo_kl"] == pytest.approx(metrics["actor/ppo_kl"], abs=TOL)

"""Compiler ``verl-rl-v0.9-single-gpu-v2``: a miniverl PPO plan (critic, GAE) -> :class:`ExperimentIR`.

Every decision follows a rule of ``rules_v2.json``. The policy side (model, LoRA, rollout, data,
optimizer, schedule, rule rewards) is compiled as in v1; the algorithm becomes a :class:`PpoIR`:
verl's ``adv_estimator: gae`` with ``gamma``/``lam``, whitened advantages, ``ppo_epochs`` passes
over mini-batches of whole prompt groups for the actor and the critic, the PPO-clip bounds, the
value clip, the critic's learning rate and gradient clip, and the KL to the reference.

One refusal applies to every PPO plan of this miniverl: verl 0.9.1 builds a LoRA critic
(``critic.model.lora_rank > 0``) as a ``*ForTokenClassification`` model wrapped with a
``CAUSAL_LM`` ``LoraConfig`` and no ``modules_to_save``, so its value head is never trained (with
peft 0.21 the wrap fails outright), while miniverl trains the value head with the critic's LoRA
and has no full-parameter critic. :func:`compile_v2` therefore raises ``critic_lora_value_head``
after the plan-specific refusals; :func:`ppo_ir` is the IR that v2 emits once that refusal can be
lifted (tested, digests in ``tests/golden/handoff-v2.json``).
"""

from __future__ import annotations

from miniverl.config.schema import MiniverlConfig
from miniverl.handoff.compiler import build_ir, common_refusals, kl_fields, kl_refusals
from miniverl.handoff.ir import COMPILER_V2, CriticIR, ExperimentIR, PpoIR
from miniverl.handoff.rules import refuse
from miniverl.records import PlanRecord


def compile_v2(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    refusals(config)
    raise refuse("critic_lora_value_head", "models.critic.lora", compiler=COMPILER_V2)


def refusals(config: MiniverlConfig) -> None:
    """Every v2 refusal that depends on the plan (the critic's LoRA refusal comes after these)."""
    common_refusals(config, COMPILER_V2)
    ppo, models = config.algorithm.ppo, config.models
    critic = models.critic
    if critic is not None and critic.source != "student":
        raise refuse("critic_other_base", f"models.critic source {critic.source}", compiler=COMPILER_V2)
    if not ppo.whiten_advantages:
        raise refuse("unwhitened_gae", compiler=COMPILER_V2)
    if config.rollout.prompts_per_cycle % ppo.mini_batches:
        raise refuse(
            "mini_batch_splits_groups",
            f"{config.rollout.prompts_per_cycle} prompts per cycle, {ppo.mini_batches} mini-batches",
            compiler=COMPILER_V2,
        )
    if ppo.critic_max_grad_norm is None:
        raise refuse("no_critic_grad_clip", compiler=COMPILER_V2)
    kl_refusals(config, ppo, COMPILER_V2)


def ppo_ir(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    """The v2 IR of a PPO plan that passes :func:`refusals` (the critic's LoRA refusal aside)."""
    refusals(config)
    ppo, critic = config.algorithm.ppo, config.models.critic
    assert critic is not None and critic.lora is not None  # the config fills a PPO critic in
    assert ppo.critic_max_grad_norm is not None  # refused above otherwise
    algorithm = PpoIR(
        gamma=ppo.gamma,
        lam=ppo.lam,
        ppo_epochs=ppo.ppo_epochs,
        mini_batch_prompts=config.rollout.prompts_per_cycle // ppo.mini_batches,
        shuffle_mini_batches=ppo.shuffle_mini_batches,
        clip_ratio_low=ppo.clip_low,
        clip_ratio_high=ppo.clip_high,
        cliprange_value=ppo.value_clip,
        critic=CriticIR(
            lora_rank=critic.lora.r,
            lora_alpha=int(critic.lora.alpha),
            target_modules=tuple(critic.lora.target_modules),
            lr=ppo.critic_learning_rate,
            clip_grad=ppo.critic_max_grad_norm,
        ),
        **kl_fields(ppo),
    )
    return build_ir(plan, config, COMPILER_V2, algorithm, start_adapter=start_adapter)

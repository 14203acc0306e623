"""Compiler ``verl-rl-v0.9-single-gpu-v2``: a miniverl PPO plan (critic, GAE) -> :class:`ExperimentIR`.

Every decision follows a rule of ``rules_v2.json``. The policy side (model, LoRA, rollout, data,
optimizer, schedule, rule rewards) is compiled as in v1; the algorithm becomes a :class:`PpoIR`:
verl's ``adv_estimator: gae`` with ``gamma``/``lam``, whitened advantages, ``ppo_epochs`` passes
over mini-batches of whole prompt groups for the actor and the critic, the PPO-clip bounds, the
value clip, the critic's learning rate and gradient clip, and the KL to the reference.

The critic: verl 0.9.1 builds a LoRA critic (``critic.model.lora_rank > 0``) as a
``*ForTokenClassification`` model. Wrapped fresh (``get_peft_model`` with a ``CAUSAL_LM`` config and
no ``modules_to_save``) its value head is never trained; loaded from ``critic.model.lora_adapter_path``
(``PeftModel.from_pretrained`` with the adapter's own config) a ``TOKEN_CLS`` adapter trains the head
(``score`` in ``modules_to_save``). v2 therefore always emits ``lora_adapter_path: critic_adapter``
and the bundle writes that adapter with miniverl's value head
(:mod:`miniverl.handoff.critic_adapter`). A model whose token-classification head is not ``score``
is still refused, ``critic_lora_value_head`` (checked when the bundle is written: it needs the
model's ``config.json``).
"""

from __future__ import annotations

from miniverl.config.schema import MiniverlConfig
from miniverl.handoff.compiler_base import build_ir, common_refusals, kl_fields, kl_refusals
from miniverl.handoff.ir import COMPILER_V2, CriticIR, ExperimentIR, PpoIR
from miniverl.handoff.rules import refuse
from miniverl.records import PlanRecord


def compile_v2(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    return ppo_ir(plan, config, start_adapter=start_adapter)


def refusals(config: MiniverlConfig) -> None:
    """Every v2 refusal that depends on the plan alone (the model's head is checked by the bundle)."""
    common_refusals(config, COMPILER_V2)
    ppo, models = config.algorithm.ppo, config.models
    critic = models.critic
    if critic is not None and critic.source != "student":
        raise refuse("critic_other_base", f"models.critic source {critic.source}", compiler=COMPILER_V2)
    lora = critic.lora if critic is not None else None
    if lora is not None and lora.dropout != 0:
        raise refuse("critic_lora_dropout", f"models.critic.lora.dropout {lora.dropout}", compiler=COMPILER_V2)
    if lora is not None and float(lora.alpha) != int(lora.alpha):
        raise refuse("critic_lora_alpha_not_integer", f"models.critic.lora.alpha {lora.alpha}", compiler=COMPILER_V2)
    if not ppo.whiten_advantages:
        raise refuse("unwhitened_gae", compiler=COMPILER_V2)
    if config.rollout.prompts_per_cycle % ppo.mini_batches:
        raise refuse(
            "mini_batch_splits_groups",
            f"{config.rollout.prompts_per_cycle} prompts per cycle, {ppo.mini_batches} mini-batches",
            compiler=COMPILER_V2,
        )
    if config.rollout.prompts_per_cycle % ppo.critic_mini_batch_count:
        raise refuse(
            "critic_mini_batch_splits_groups",
            f"{config.rollout.prompts_per_cycle} prompts per cycle, {ppo.critic_mini_batch_count} critic mini-batches",
            compiler=COMPILER_V2,
        )
    if ppo.critic_max_grad_norm is None:
        raise refuse("no_critic_grad_clip", compiler=COMPILER_V2)
    kl_refusals(config, ppo, COMPILER_V2)


def ppo_ir(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    """The v2 IR of a PPO plan that passes :func:`refusals`."""
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
            start="run_checkpoint" if start_adapter else "seeded_head",
            head_seed=ppo.critic_head_seed,
            ppo_epochs=ppo.critic_epoch_count,
            mini_batch_prompts=config.rollout.prompts_per_cycle // ppo.critic_mini_batch_count,
        ),
        **kl_fields(ppo),
    )
    return build_ir(plan, config, COMPILER_V2, algorithm, start_adapter=start_adapter)

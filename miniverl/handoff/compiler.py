"""Compiler ``verl-rl-v0.9-single-gpu-v1``: a miniverl GRPO plan -> :class:`ExperimentIR`.

Every decision here follows a rule of ``rules_v1.json``; a field verl cannot express exactly
raises the rule's :class:`~miniverl.handoff.rules.HandoffRefusal` (never an approximation), except
where a ``drop_with_note`` rule compiles it and records what is not carried over (NF4 base weights:
verl trains on the full-precision base; ``model.quantization`` and a deviation say so).
PPO plans go to compiler ``-v2`` (:mod:`miniverl.handoff.compiler_v2`); ``-v4`` (direct-config,
:mod:`miniverl.handoff.native`) imports a native verl YAML into a plan that v1 then exports. What v1 and v2
share (policy-side refusals, KL fields, the IR around the algorithm) is :mod:`miniverl.handoff.compiler_base`.
"""

from __future__ import annotations

from typing import Any

from miniverl.config.schema import MiniverlConfig
from miniverl.errors import UsageError
from miniverl.handoff.compiler_base import build_ir, common_refusals, kl_fields, kl_refusals
from miniverl.handoff.compiler_v2 import compile_v2
from miniverl.handoff.ir import COMPILER_V1, COMPILER_V2, COMPILER_V4, ExperimentIR, GrpoIR
from miniverl.handoff.rules import refuse
from miniverl.records import PlanRecord

#: verl's compute_grpo_outcome_advantage epsilon (fixed in verl 0.9).
VERL_GRPO_EPS = 1e-6
RESERVED: dict[str, str] = {}
AVAILABLE = (COMPILER_V1, COMPILER_V2, COMPILER_V4)


def compile_plan_ir(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    """The IR of a plan, choosing the compiler from the algorithm."""
    name = str(config.algorithm.name)
    if name == "opd":
        raise refuse("strict_opd_reverse_kl", "algorithm.name: opd")
    if name == "ppo":  # PPO with a critic belongs to compiler v2
        return compile_v2(plan, config, start_adapter=start_adapter)
    if name in ("sft", "kd"):
        raise refuse("offline_algorithm", name)
    if name != "grpo":
        raise UsageError(f"no verl compiler for algorithm {name!r}")
    return compile_v1(plan, config, start_adapter=start_adapter)


def require_compiler(compiler_id: str) -> None:
    if compiler_id in RESERVED:
        raise UsageError(f"compiler {compiler_id} ({RESERVED[compiler_id]}) is not available in this miniverl")
    if compiler_id not in AVAILABLE:
        raise UsageError(f"unknown compiler {compiler_id!r}; available: {', '.join(AVAILABLE)}")


def compile_v1(plan: PlanRecord, config: MiniverlConfig, *, start_adapter: bool = False) -> ExperimentIR:
    _refusals(config)
    grpo = config.algorithm.grpo
    algorithm = GrpoIR(
        clip_ratio_low=grpo.clip_low,
        clip_ratio_high=grpo.clip_high,
        norm_adv_by_std=grpo.norm_by_std,
        ppo_epochs=grpo.ppo_epochs,
        mini_batch_prompts=config.rollout.prompts_per_cycle // grpo.mini_batches,
        shuffle_mini_batches=grpo.shuffle_mini_batches,
        **_grpo_kl(config),
    )
    return build_ir(plan, config, COMPILER_V1, algorithm, start_adapter=start_adapter)


def _refusals(config: MiniverlConfig) -> None:
    if config.algorithm.name == "ppo":
        raise refuse("ppo_compiler_v2", "ppo")
    common_refusals(config, COMPILER_V1)
    models = config.models
    if models.critic is not None:
        raise refuse("critic_compiler_v2")
    kl_refusals(config, config.algorithm.grpo, COMPILER_V1)
    if config.algorithm.grpo.eps != VERL_GRPO_EPS:
        raise refuse("grpo_eps", f"eps {config.algorithm.grpo.eps}")


def _grpo_kl(config: MiniverlConfig) -> dict[str, Any]:
    return kl_fields(config.algorithm.grpo)

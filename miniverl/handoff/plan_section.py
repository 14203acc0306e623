"""The hand-off verdict of a plan: which compiler applies (or the named refusal), the IR and rules digests.

``miniverl plan`` reports it (``--json``: key ``handoff``); a bundle made from the same plan carries the
same ``compiler``, ``ir_digest`` and ``rules_digest`` in its manifest (``miniverl handoff`` of a run
compiles ``lora.start_adapter: bundle``, so its IR digest is the run's, not the plan's). The IR does
not contain the plan's digest, so the section can be recorded inside the plan without a cycle.
"""

from __future__ import annotations

from typing import Literal

from miniverl.config.schema import MiniverlConfig
from miniverl.errors import MiniverlError
from miniverl.handoff.critic_adapter import critic_model_config
from miniverl.handoff.ir import COMPILER_V1, COMPILER_V2, COMPILER_V4, ir_digest
from miniverl.handoff.rules import HandoffRefusal, rules_digest
from miniverl.records import PlanHandoff, PlanHandoffRefusal, PlanRecord


def _compiler_for(config: MiniverlConfig) -> str:
    return COMPILER_V2 if config.algorithm.name == "ppo" else COMPILER_V1


def _not_compiled(
    config: MiniverlConfig, imported_by: str | None, status: Literal["refused", "unchecked"], code: str, message: str
) -> PlanHandoff:
    compiler = _compiler_for(config)
    return PlanHandoff(
        status=status,
        compiler=compiler,
        imported_by=imported_by,
        ir_digest=None,
        rules_digest=rules_digest(compiler),
        refusal=PlanHandoffRefusal(code=code, message=message),
    )


def handoff_section(plan: PlanRecord, config: MiniverlConfig) -> PlanHandoff:
    """Compile ``plan`` as ``miniverl handoff plan.json`` would (fresh LoRA), without writing a bundle."""
    from miniverl.handoff.compiler import compile_plan_ir

    imported_by = COMPILER_V4 if plan.direct_config is not None else None
    try:
        ir = compile_plan_ir(plan, config)
        if config.algorithm.name == "ppo":  # the critic's value-head check reads the model's config.json
            critic_model_config(ir, config)
    except HandoffRefusal as refusal:
        return _not_compiled(config, imported_by, "refused", refusal.code, str(refusal))
    except MiniverlError as exc:  # e.g. a hub model's config.json not reachable: the plan itself stands
        return _not_compiled(config, imported_by, "unchecked", "model_config_unavailable", str(exc))
    return PlanHandoff(
        status="compiles",
        compiler=ir.compiler,
        imported_by=imported_by,
        ir_digest=ir_digest(ir),
        rules_digest=rules_digest(ir.compiler),
    )

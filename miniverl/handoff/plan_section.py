"""The hand-off verdict of a plan: which compiler applies (or the named refusal), the IR and rules digests.

``miniverl plan`` reports it (``--json``: key ``handoff``); a bundle made from the same plan carries the
same ``compiler``, ``ir_digest`` and ``rules_digest`` in its manifest (``miniverl handoff`` of a run
compiles ``lora.start_adapter: bundle``, so its IR digest is the run's, not the plan's). The IR does
not contain the plan's digest, so the section can be recorded inside the plan without a cycle.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from miniverl.config.schema import MiniverlConfig
from miniverl.errors import MiniverlError
from miniverl.handoff.ir import COMPILER_V1, COMPILER_V2, COMPILER_V4, ir_digest
from miniverl.handoff.rules import HandoffRefusal, rules_digest
from miniverl.records import PlanRecord

SHA256 = Field(pattern=r"^[0-9a-f]{64}$")


class HandoffRefusalRecord(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    message: str


class HandoffSection(BaseModel):
    """``status: compiles`` with ``compiler`` and ``ir_digest``, or ``refused`` with the rule's ``refusal``
    (``unchecked`` when the model's ``config.json`` could not be read here; ``refusal.code`` is then
    ``model_config_unavailable``).

    ``compiler`` is the compiler that compiles (or refused) the plan's experiment; ``imported_by`` is
    ``verl-rl-v0.9-single-gpu-v4`` for a direct-config plan (its import rules digest is the plan's
    ``direct_config.rules_digest``). ``rules_digest`` is the digest of ``compiler``'s rules table.
    """

    model_config = ConfigDict(extra="forbid")

    status: Literal["compiles", "refused", "unchecked"]
    compiler: str
    imported_by: str | None = None
    ir_digest: str | None = SHA256
    rules_digest: str = SHA256
    refusal: HandoffRefusalRecord | None = None


def _compiler_for(config: MiniverlConfig) -> str:
    return COMPILER_V2 if config.algorithm.name == "ppo" else COMPILER_V1


def _not_compiled(
    config: MiniverlConfig, imported_by: str | None, status: Literal["refused", "unchecked"], code: str, message: str
) -> HandoffSection:
    compiler = _compiler_for(config)
    return HandoffSection(
        status=status,
        compiler=compiler,
        imported_by=imported_by,
        ir_digest=None,
        rules_digest=rules_digest(compiler),
        refusal=HandoffRefusalRecord(code=code, message=message),
    )


def handoff_section(plan: PlanRecord, config: MiniverlConfig) -> HandoffSection:
    """Compile ``plan`` as ``miniverl handoff plan.json`` would (fresh LoRA), without writing a bundle."""
    from miniverl.handoff.compiler import compile_plan_ir

    imported_by = COMPILER_V4 if plan.direct_config is not None else None
    try:
        ir = compile_plan_ir(plan, config)
        if config.algorithm.name == "ppo":  # the critic's value-head check reads the model's config.json
            from miniverl.handoff.bundle import critic_model_config

            critic_model_config(ir, config)
    except HandoffRefusal as refusal:
        return _not_compiled(config, imported_by, "refused", refusal.code, str(refusal))
    except MiniverlError as exc:  # e.g. a hub model's config.json not reachable: the plan itself stands
        return _not_compiled(config, imported_by, "unchecked", "model_config_unavailable", str(exc))
    return HandoffSection(
        status="compiles",
        compiler=ir.compiler,
        imported_by=imported_by,
        ir_digest=ir_digest(ir),
        rules_digest=rules_digest(ir.compiler),
    )

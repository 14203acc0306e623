"""``miniverl plan``: compile a config (or a native verl YAML) into ``plan.json``, with its verl handoff verdict."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from miniverl.cli.output import emit, writable_out_file
from miniverl.errors import UsageError


def cmd_plan(args: argparse.Namespace) -> int:
    from miniverl.canonical import atomic_write_json
    from miniverl.config.plan import compile_plan

    writable_out_file(args, suffix=".json", why="a plan is JSON")
    if args.verl_config:  # direct-config (compiler v4): --set holds runtime bindings only
        from miniverl.handoff.native import import_native

        if args.config:
            raise UsageError("give either CONFIG.yaml or --verl-config, not both")
        bindings = Path(args.bindings) if args.bindings else None
        plan = import_native(Path(args.verl_config), list(args.set or []), bindings)
    elif args.bindings:
        raise UsageError("--bindings applies to --verl-config only; give --verl-config NATIVE.yaml, or drop --bindings")
    elif not args.config:
        raise UsageError("plan needs CONFIG.yaml (or --verl-config NATIVE.yaml)")
    else:
        plan = compile_plan(Path(args.config), list(args.set or []))
    atomic_write_json(args.out, plan.model_dump(mode="json"), pretty=True)
    payload = {
        "path": args.out,
        "plan_digest": plan.plan_digest,
        "config_digest": plan.config_digest,
        "data_sha256": plan.data.sha256,
        "models": plan.models,
        "placement": plan.placement.model_dump(mode="json"),
    }
    human = f"plan {plan.plan_digest[:16]} written to {args.out}: {plan.updates} update(s), " + (
        f"{plan.trajectories_per_cycle} trajectories per cycle, runtime {plan.placement.runtime}"
    )
    if plan.direct_config is not None:
        payload |= {"compiler": plan.direct_config.compiler, "native_sha256": plan.direct_config.native.sha256}
        human += f"; {plan.direct_config.compiler}, native sha256 {plan.direct_config.native.sha256}"
    handoff = _handoff_section(plan)
    payload["handoff"] = handoff
    if handoff["status"] == "compiles":
        digests = f"IR {handoff['ir_digest'][:16]}, rules {handoff['rules_digest'][:16]}"
        human += f"\nhandoff: {handoff['compiler']} ({digests})"
        if plan.config.get("models", {}).get("student", {}).get("quantization") == "nf4":
            human += "; NF4 not carried over: verl trains on the full-precision base (nf4_not_carried_over)"
    else:
        human += "\n" + _handoff_notice(handoff)
    emit(args, payload, human)
    return 0


def _handoff_notice(handoff: dict[str, Any]) -> str:
    """Why ``miniverl handoff`` would not take a valid plan, worded as a notice: the plan itself is fine."""
    code, why = handoff["refusal"]["code"], handoff["refusal"]["message"]
    why = why.split(": ", 1)[1] if why.startswith("handoff refused (") else why
    if handoff["status"] == "refused":
        return (
            f"notice: the plan is valid and runs here; only a verl handoff is unavailable for it "
            f"({code}, {handoff['compiler']}: {why})"
        )
    return f"notice: the plan is valid and runs here; its verl handoff could not be checked ({code}: {why})"


def _handoff_section(plan: Any) -> dict[str, Any]:
    """Which verl compiler takes this plan (or its named refusal), with the IR and rules digests."""
    from miniverl.config.loader import validate_config
    from miniverl.handoff.plan_section import handoff_section

    recorded = getattr(plan, "handoff", None)
    if recorded is not None:  # recorded in plan.json
        return dict(recorded.model_dump(mode="json"))
    config = validate_config(dict(plan.config), origin="the plan")
    return handoff_section(plan, config).model_dump(mode="json")

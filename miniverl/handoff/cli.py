"""The ``handoff`` and ``diagnose`` subcommands (registered in :mod:`miniverl.cli`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

Emit = Callable[[argparse.Namespace, dict[str, Any], str], None]


def run_handoff(args: argparse.Namespace, emit: Emit) -> int:
    from miniverl.handoff.bundle import handoff
    from miniverl.handoff.manifest import quantization_note, read_manifest

    result = handoff(Path(args.source), Path(args.out))
    human = (
        f"bundle written to {args.out} ({result['compiler']}): IR {result['ir_digest'][:16]}, "
        f"rules {result['rules_digest'][:16]}; check it with `miniverl diagnose {args.out}` where verl is installed"
    )
    manifest = read_manifest(Path(args.out))
    note = quantization_note(manifest.quantization, manifest.model.dtype)
    emit(args, result, human + (f"\n{note}" if note else ""))
    return 0


def run_diagnose(args: argparse.Namespace, emit: Emit) -> int:
    from miniverl.handoff.diagnose import diagnose
    from miniverl.handoff.ir import QuantizationIR
    from miniverl.handoff.manifest import quantization_note

    report = diagnose(Path(args.bundle))
    if report["launch_status"] == "ready":
        # "ready" means verl accepts the config; whether this machine can launch it is said apart
        lines = [f"{report['checked']}: composed, validate_config passed, reward and dataset checked "
                 "(launch_status: ready)"]  # fmt: skip
    else:
        lines = [f"launch_status: {report['launch_status']}"]
    lines += [f"  blocker {b['code']}: {b['detail']}" for b in report["blockers"]]
    if report["launch_missing"]:
        lines.append(
            "  to launch it (launch.sh), this machine lacks: "
            + "; ".join(report["launch_missing"])
            + ". Run launch.sh where they are."
        )
    if report["checks"].get("stand_ins"):
        lines.append(f"  vLLM stand-ins: {', '.join(report['checks']['stand_ins'])}")
    note = quantization_note(QuantizationIR.model_validate(report["quantization"]), report["checks"]["model"]["dtype"])
    if note:
        lines.append(note)
    emit(args, report, "\n".join(lines))
    return 0 if report["launch_status"] == "ready" else 1

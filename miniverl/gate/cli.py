"""``miniverl gate equivalence``: argument adapter between the CLI and :mod:`miniverl.gate.equivalence`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from miniverl.errors import UsageError

MODEL_ALIASES = {"smollm2-135m-instruct": "smollm2", "smollm2": "smollm2", "tiny": "tiny"}
MODEL_ALIASES["qwen3-0.6b-shape"] = "qwen3-0.6b-shape"


def model_choice(name: str) -> str:
    try:
        return MODEL_ALIASES[name]
    except KeyError:
        raise UsageError(f"unknown model {name!r}; use tiny, smollm2-135m-instruct or qwen3-0.6b-shape") from None


def report_path(out: str, default_name: str) -> Path:
    """``--out`` names a ``.json`` file, or a directory that receives ``default_name``."""
    path = Path(out)
    return path if path.suffix == ".json" else path / default_name


def run_gate_command(args: argparse.Namespace) -> dict[str, Any]:
    from miniverl.gate.equivalence import run_equivalence_gate

    if getattr(args, "dtype", "float32") != "float32":
        raise UsageError("the equivalence gate runs in float32 compute (NF4 weights allowed); drop --dtype")
    out = report_path(args.out, "equivalence-report.json")
    report = run_equivalence_gate(
        model=model_choice(args.model), device=args.device, quantization=args.quantization, out=out
    )
    passed, declared = report["passed_comparisons"], report["declared_comparisons"]
    report["message"] = f"equivalence gate {report['status']}: {passed}/{declared} comparisons passed; report {out}"
    return report

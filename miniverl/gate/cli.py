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


OBJECTIVE_NAMES = ("sft", "kd", "opd")  # miniverl.gate.equivalence.OBJECTIVES (this module stays torch-free)


def objectives_choice(text: str | None) -> list[str]:
    """``--objectives sft,kd,opd``: distinct known names (default: ``opd``, the 8-cell gate)."""
    if text is None:
        return ["opd"]
    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = [n for n in names if n not in OBJECTIVE_NAMES]
    if not names or unknown or len(set(names)) != len(names):
        raise UsageError(
            f"--objectives {text!r}: give distinct names from {','.join(OBJECTIVE_NAMES)}, e.g. --objectives sft,kd,opd"
        )
    return names


def run_gate_command(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "dtype", "float32") != "float32":
        raise UsageError("the equivalence gate runs in float32 compute (NF4 weights allowed); drop --dtype")
    objectives = objectives_choice(getattr(args, "objectives", None))
    model = model_choice(args.model)
    from miniverl.gate.equivalence import run_equivalence_gate

    out = report_path(args.out, "equivalence-report.json")
    report = run_equivalence_gate(
        model=model, device=args.device, quantization=args.quantization, objectives=objectives, out=out
    )
    passed, declared = report["passed_comparisons"], report["declared_comparisons"]
    cells = len(report["cells"])
    report["message"] = (
        f"equivalence gate {report['status']}: {cells} cells ({','.join(report['objectives'])}), "
        f"{passed}/{declared} comparisons passed; report {out}"
    )
    return report

"""The cost of a full qualification, per workload and per CLI invocation, from the transcripts the harness kept.

    python scripts/device/cost_table.py QUALIFICATION_DIR [--phases phase-costs.json] [--before DIR ...]

QUALIFICATION_DIR is a qualification directory (its ``evidence/`` holds each workload's ``transcript.json``). With
``--phases`` (``phase_costs.py``'s output on the same machine), each invocation's seconds are split into what
every process pays before its work (start + imports + CUDA context; commands that never import torch pay only the
CLI import) and the rest (model loads and the work). ``--before DIR`` adds a column per workload from an earlier
run's transcripts (``<workload>.json`` files, as docs/measurements/2026-12-01-h200-full-attempt/attempt2 keeps them).
Prints Markdown.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

TORCH_FREE = {"plan", "init", "inspect", "report", "dry_run", "models_fetch"}


def _transcripts(qualification: Path) -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(qualification.glob("evidence/**/transcript.json")):
        parts = path.relative_to(qualification / "evidence").parts
        workload = parts[-2] if len(parts) > 1 else "release-smoke"
        found[workload] = json.loads(path.read_text())["invocations"]
    return found


def _is_torch_free(invocation: dict[str, Any]) -> bool:
    step = invocation["step"]
    return any(step == name or step.endswith("_" + name) for name in TORCH_FREE) or "plan" in step.split("_")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("qualification", type=Path)
    p.add_argument("--phases", type=Path)
    p.add_argument("--before", type=Path)
    args = p.parse_args()
    now = _transcripts(args.qualification)
    before = {}
    if args.before:
        before = {f.stem: json.loads(f.read_text())["invocations"] for f in sorted(args.before.glob("*.json"))}
    phases = json.loads(args.phases.read_text())["median_seconds"] if args.phases else None
    print("| workload | invocations | CLI seconds before | CLI seconds now |")
    print("|---|---:|---:|---:|")
    for name, invs in now.items():
        was = before.get(name)
        was_s = f"{sum(i['duration_seconds'] for i in was):.1f}" if was else "—"
        print(f"| {name} | {len(invs)} | {was_s} | {sum(i['duration_seconds'] for i in invs):.1f} |")
    print()
    head = "| workload | step | exit | seconds |"
    if phases:
        head += " before its work (start, imports, CUDA) | model loads + work |"
    print(head)
    print("|---|---|---:|---:|" + ("---:|---:|" if phases else ""))
    for name, invs in now.items():
        for inv in invs:
            row = f"| {name} | {inv['step']} | {inv['exit_code']} | {inv['duration_seconds']:.1f} |"
            if phases:
                fixed = phases["cli_import"] if _is_torch_free(inv) else phases.get("cuda_init", phases["torch_stack"])
                fixed = min(fixed, inv["duration_seconds"])
                row += f" {fixed:.1f} | {inv['duration_seconds'] - fixed:.1f} |"
            print(row)


if __name__ == "__main__":
    main()

"""Reading a run directory: its plan, manifest, summary, metrics and checkpoints."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl.errors import UsageError
from miniverl.records import MetricsLine, PlanRecord, RunManifest, RunSummary


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UsageError(f"{path} is not valid JSON") from None


def require_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise UsageError(f"run directory not found: {run_dir}")
    if not (run_dir / "run.json").is_file():
        raise UsageError(f"{run_dir} is not a miniverl run directory (no run.json)")


def read_manifest(run_dir: Path) -> RunManifest:
    try:
        return RunManifest.model_validate(_read_json(run_dir / "run.json"))
    except ValidationError:
        raise UsageError(f"{run_dir / 'run.json'} does not match the run manifest schema") from None


def read_plan(run_dir: Path) -> PlanRecord:
    try:
        return PlanRecord.model_validate(_read_json(run_dir / "plan.json"))
    except (ValidationError, FileNotFoundError):
        raise UsageError(f"{run_dir} has no valid plan.json") from None


def read_summary(run_dir: Path) -> RunSummary | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        return RunSummary.model_validate(_read_json(path))
    except ValidationError:
        raise UsageError(f"{path} does not match the run summary schema") from None


def read_metrics(run_dir: Path) -> list[MetricsLine]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    lines = []
    for number, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if text.strip():
            try:
                lines.append(MetricsLine.model_validate_json(text))
            except ValidationError:
                raise UsageError(f"{path} line {number} does not match the metrics schema") from None
    return lines

"""JSON Schemas of every miniverl file format, generated from the pydantic models."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from miniverl import records
from miniverl.canonical import atomic_write_text
from miniverl.config.schema import MiniverlConfig
from miniverl.evaluation.record import EvalRecord
from miniverl.models.pinned import HubPin
from miniverl.rollout.records import TrajectoryRecord

MODELS: dict[str, type[BaseModel]] = {
    "config": MiniverlConfig,
    "plan": records.PlanRecord,
    "run": records.RunManifest,
    "run-summary": records.RunSummary,
    "metrics-line": records.MetricsLine,
    "checkpoint": records.CheckpointRecord,
    "adapter-export": records.ExportManifest,
    "trajectory": TrajectoryRecord,
    "eval": EvalRecord,
    "hub-pin": HubPin,
}


def schema_texts() -> dict[str, str]:
    texts = {}
    for name, model in MODELS.items():
        schema: dict[str, Any] = model.model_json_schema()
        schema["$id"] = f"https://miniverl.invalid/schemas/{name}.schema.json"
        texts[f"{name}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return texts


def write_schemas(directory: Path) -> list[str]:
    texts = schema_texts()
    for filename, text in texts.items():
        atomic_write_text(directory / filename, text)
    return sorted(texts)

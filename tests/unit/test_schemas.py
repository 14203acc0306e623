"""The committed JSON Schemas are exactly what the pydantic models generate."""

from __future__ import annotations

from pathlib import Path

from miniverl.schemas import schema_texts

COMMITTED = Path(__file__).resolve().parents[2] / "manifests" / "miniverl"


def test_schemas_have_not_drifted() -> None:
    generated = schema_texts()
    committed = {p.name: p.read_text() for p in COMMITTED.glob("*.schema.json")}
    assert set(committed) == set(generated), "run `miniverl schemas --out manifests/miniverl`"
    for name, text in generated.items():
        assert committed[name] == text, f"{name} drifted: run `miniverl schemas --out manifests/miniverl`"


def test_every_object_schema_forbids_extra_keys() -> None:
    import json

    for name, text in schema_texts().items():
        schema = json.loads(text)
        objects = [schema, *schema.get("$defs", {}).values()]
        for obj in objects:
            if obj.get("type") == "object" and "properties" in obj:
                assert obj.get("additionalProperties") is False, f"{name}: {obj.get('title')} allows extra keys"

"""Reading and writing records: strict parse (one-line errors), canonical bytes, atomic writes, schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from harness.core.errors import RecordError
from harness.core.jsonio import atomic_write_json, canonical_bytes, loads_strict
from harness.core.records import Record
from harness.core.safeio import RECORD_MAX_BYTES, read_regular

M = TypeVar("M", bound=Record)


def parse_record(model: type[M], data: bytes, what: str, *, check: str = "record_schema") -> M:
    """Validate JSON bytes against ``model``; one-line ``RecordError`` naming the first problem.

    Malformed JSON fails ``record_schema``/``json_limits``/``finite_numbers``; a well-formed record that does
    not validate fails ``check`` (so an auditor can say which record was refused)."""
    raw = loads_strict(data, what)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(part) for part in first["loc"]) or "$"
        failed = "no_local_paths" if "local path" in first["msg"] else check
        raise RecordError(f"{what} fails its schema at {loc}: {first['msg']}", check=failed) from None


def load_record(model: type[M], path: Path, what: str | None = None, *, check: str = "record_schema") -> M:
    """Parse a record file: a regular file (never a link, FIFO or directory) of bounded size, strict JSON."""
    label = what or path.name
    data = read_regular(path, label, max_bytes=RECORD_MAX_BYTES, check=check, error=RecordError)
    return parse_record(model, data, label, check=check)


def record_bytes(record: Record) -> bytes:
    return canonical_bytes(record.model_dump(mode="json")) + b"\n"


def write_record(path: Path, record: Record) -> bytes:
    """Atomically write ``record`` as canonical JSON; returns the bytes (hash them for bindings)."""
    return atomic_write_json(path, record.model_dump(mode="json"))


def json_schema(model: type[Record]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema

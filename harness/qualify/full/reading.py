"""Bounded, strict readers for workload evidence: a judge must survive any file it is handed (the auditor
re-judges archived evidence), so nothing here raises on bad content; it returns None instead."""

from __future__ import annotations

import hashlib
import math
import stat
from pathlib import Path
from typing import Any

from harness.core.errors import RecordError
from harness.core.jsonio import loads_strict

FILE_LIMIT_BYTES = 16 << 20


def _bytes(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > FILE_LIMIT_BYTES:
            return None
        return path.read_bytes()
    except OSError:
        return None


def file_sha256(path: Path | None) -> str | None:
    """sha256 of a regular file of at most FILE_LIMIT_BYTES, or None."""
    data = _bytes(path)
    return hashlib.sha256(data).hexdigest() if data is not None else None


def read_text(path: Path | None) -> str | None:
    """A regular file of at most FILE_LIMIT_BYTES as UTF-8 text, or None."""
    data = _bytes(path)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_json(path: Path | None) -> dict[str, Any] | None:
    """One strict JSON object (duplicate keys, NaN, huge integers refused), or None."""
    data = _bytes(path)
    if data is None:
        return None
    try:
        value = loads_strict(data, path.name if path else "evidence")
    except (RecordError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def read_jsonl(path: Path | None) -> list[dict[str, Any]] | None:
    """Every line one strict JSON object, or None (an empty file is an empty list)."""
    data = _bytes(path)
    if data is None:
        return None
    rows: list[dict[str, Any]] = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            value = loads_strict(line, f"line {number}")
        except (RecordError, ValueError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        rows.append(value)
    return rows


def finite(value: Any) -> float | None:
    """A finite number (booleans are not numbers), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def count(value: Any) -> int | None:
    """A non-negative integer count (booleans are not counts), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def transcript_steps(path: Path | None) -> dict[str, list[int]] | None:
    """Step name -> exit codes of every invocation of that step, from a workload transcript."""
    doc = read_json(path)
    if doc is None or not isinstance(doc.get("invocations"), list):
        return None
    steps: dict[str, list[int]] = {}
    for inv in doc["invocations"]:
        if not isinstance(inv, dict) or not isinstance(inv.get("step"), str) or count(inv.get("exit_code")) is None:
            return None
        steps.setdefault(inv["step"], []).append(inv["exit_code"])
    return steps

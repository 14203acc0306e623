"""The canonical prompt dataset: a Parquet file with five string columns.

=========== ============================================================
``prompt_id`` unique, non-empty
``prompt``    the user message, non-empty
``answer``    reference answer for verifiers (may be empty)
``context``   privileged context a teacher may see (may be empty)
``task``      task name, non-empty (e.g. ``calculator``)
=========== ============================================================

Files are written deterministically (same rows and same pyarrow version → same bytes): no
pandas metadata, no timestamps, fixed compression, one row group. This module needs pyarrow only
(never torch), so ``plan`` can describe a dataset cheaply.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from miniverl import bounded
from miniverl.canonical import atomic_write_bytes, sha256_bytes, sha256_file
from miniverl.errors import DataError

COLUMNS: tuple[str, ...] = ("prompt_id", "prompt", "answer", "context", "task")
NON_EMPTY_COLUMNS: tuple[str, ...] = ("prompt_id", "prompt", "task")
SCHEMA = pa.schema([pa.field(name, pa.string(), nullable=False) for name in COLUMNS])
_STRING_TYPES = (pa.string(), pa.large_string())
_MAX_SHOWN = 5


@dataclass(frozen=True, slots=True)
class PromptRow:
    """One prompt of a dataset (immutable; the five canonical columns, nothing else)."""

    prompt_id: str
    prompt: str
    answer: str
    context: str
    task: str

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def _sample(values: Iterable[Any]) -> str:
    items = list(values)
    shown = ", ".join(repr(v) for v in items[:_MAX_SHOWN])
    return shown + (f" (+{len(items) - _MAX_SHOWN} more)" if len(items) > _MAX_SHOWN else "")


def validate_rows(rows: Iterable[PromptRow | Mapping[str, Any]], *, source: str = "dataset") -> list[PromptRow]:
    """Rows as PromptRows, checked: no nulls, required fields non-empty, prompt_id unique, ≥ 1 row."""
    out: list[PromptRow] = []
    seen: dict[str, int] = {}
    duplicates: list[str] = []
    for index, raw in enumerate(rows):
        values = raw.to_dict() if isinstance(raw, PromptRow) else dict(raw)
        if set(values) != set(COLUMNS):
            _raise_columns(list(values), source)
        for name in COLUMNS:
            value = values[name]
            if value is None:
                raise DataError(f"{source}: row {index} has a null {name!r}; every column must hold a string")
            if not isinstance(value, str):
                raise DataError(f"{source}: row {index} {name!r} is {type(value).__name__}, expected a string")
            if name in NON_EMPTY_COLUMNS and not value.strip():
                raise DataError(
                    f"{source}: row {index} (prompt_id {values['prompt_id']!r}) has an empty {name!r}; "
                    f"{', '.join(NON_EMPTY_COLUMNS)} must be non-empty"
                )
        row = PromptRow(**values)
        if row.prompt_id in seen:
            duplicates.append(row.prompt_id)
        seen.setdefault(row.prompt_id, index)
        out.append(row)
    if duplicates:
        raise DataError(f"{source}: duplicate prompt_id {_sample(dict.fromkeys(duplicates))}; ids must be unique")
    if not out:
        raise DataError(f"{source}: the dataset is empty; it needs at least one row")
    return out


def _raise_columns(found: list[str], source: str) -> None:
    missing = [c for c in COLUMNS if c not in found]
    extra = [c for c in found if c not in COLUMNS]
    repeated = sorted({c for c in found if found.count(c) > 1})
    parts = []
    if repeated:
        parts.append(f"repeated columns {', '.join(repeated)}")
    if missing:
        parts.append(f"missing columns {', '.join(missing)}")
    if extra:
        parts.append(f"unexpected columns {', '.join(extra)}")
    raise DataError(f"{source}: {'; '.join(parts)}; expected exactly: {', '.join(COLUMNS)}")


def parquet_bytes(rows: Iterable[PromptRow | Mapping[str, Any]]) -> bytes:
    """Deterministic Parquet bytes for validated rows (columns in canonical order)."""
    checked = validate_rows(rows, source="rows to write")
    table = pa.table({name: [getattr(r, name) for r in checked] for name in COLUMNS}, schema=SCHEMA)
    sink = io.BytesIO()
    pq.write_table(
        table,
        sink,
        compression="zstd",
        compression_level=3,
        use_dictionary=False,
        write_statistics=False,
        version="2.6",
        data_page_version="1.0",
        row_group_size=max(1, table.num_rows),
        store_schema=True,
        write_page_index=False,
        write_page_checksum=False,
    )
    return sink.getvalue()


def write_prompts(path: str | os.PathLike[str], rows: Iterable[PromptRow | Mapping[str, Any]]) -> str:
    """Write rows atomically (temp + fsync + rename); returns the file's sha256."""
    data = parquet_bytes(rows)
    atomic_write_bytes(path, data)
    return sha256_bytes(data)


def _open(path: str | os.PathLike[str]) -> pq.ParquetFile:
    target = Path(path)
    if not target.exists():
        raise DataError(
            f"dataset not found: {os.fspath(path)} "
            "(create one with `miniverl data sample --task calculator --rows 16 --out <file>.parquet`)"
        )
    if not target.is_file():
        raise DataError(f"dataset {os.fspath(path)} is not a file; give the path of a .parquet file")
    bounded.check_regular(target, limit=bounded.PARQUET_MAX_BYTES, what="a prompts dataset")
    try:
        return pq.ParquetFile(target)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{os.fspath(path)} is not a readable Parquet file ({first})") from None


def _check_schema(schema: pa.Schema, source: str) -> None:
    names = list(schema.names)
    if sorted(names) != sorted(COLUMNS) or len(set(names)) != len(names):
        _raise_columns(names, source)
    for field in schema:
        if field.type not in _STRING_TYPES:
            raise DataError(f"{source}: column {field.name!r} has type {field.type}; expected string")


def describe_dataset(path: str | os.PathLike[str]) -> dict[str, Any]:
    """``{"rows", "sha256", "columns"}`` from the Parquet footer alone (no row data read, no torch).

    Checks what the footer can show: the file exists and is Parquet, the columns are exactly the
    canonical five (all strings), and there is at least one row. :func:`load_prompts` checks the rest.
    """
    source = os.fspath(path)
    parquet = _open(path)
    schema = parquet.schema_arrow
    _check_schema(schema, source)
    rows = parquet.metadata.num_rows
    if rows < 1:
        raise DataError(f"{source}: the dataset is empty; it needs at least one row")
    return {"rows": rows, "sha256": sha256_file(path), "columns": list(schema.names)}


def load_prompts(path: str | os.PathLike[str]) -> list[PromptRow]:
    """Every row of a prompt dataset, validated; a one-line :class:`DataError` says what is wrong."""
    source = os.fspath(path)
    parquet = _open(path)
    _check_schema(parquet.schema_arrow, source)
    try:
        table = parquet.read()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{source}: cannot read the Parquet data ({str(exc).splitlines()[0]})") from None
    try:
        columns = {name: table.column(name).to_pylist() for name in COLUMNS}
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{source}: a string column holds bytes that are not UTF-8 ({exc.reason}); re-encode the file as UTF-8"
        ) from None
    rows = [{name: columns[name][i] for name in COLUMNS} for i in range(table.num_rows)]
    return validate_rows(rows, source=source)

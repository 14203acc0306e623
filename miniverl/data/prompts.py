"""Prompt datasets: five string fields per row, read from Parquet, JSON Lines or CSV.

=============== ====================================================================================
``prompt_id``   unique, non-empty; derived when the file has no such column (see :func:`derive_ids`)
``prompt``      the user message, non-empty (the only column a file must have)
``answer``      reference answer for verifiers (may be empty; ``""`` when the file has no such column)
``context``     privileged context a teacher may see (may be empty; ``""`` when absent)
``task``        task name, non-empty (e.g. ``calculator``; :data:`DEFAULT_TASK` when absent)
=============== ====================================================================================

``data.columns`` maps a field to the file column that holds it (``{prompt: question}``); a field it does
not map is read from the column of its own name. Columns that map to no field are ignored, with one
notice on stderr. Every value must be a string (a JSON number is refused: quote it).

Files miniverl writes are Parquet, written deterministically (same rows and same pyarrow version →
same bytes): no pandas metadata, no timestamps, fixed compression, one row group. This module
needs pyarrow only (never torch), so ``plan`` can describe a dataset cheaply.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from miniverl.canonical import atomic_write_bytes, sha256_bytes, sha256_file
from miniverl.data.readers import check_file, dataset_format, parquet_columns, parquet_file, read_columns
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
                hint = ""
                if isinstance(value, bool):
                    hint = f': quote it ("{name}": "{str(value).lower()}")'
                elif isinstance(value, int | float):
                    hint = f': quote it ("{name}": "{value}")'
                raise DataError(f"{source}: row {index} {name!r} is {type(value).__name__}, expected a string{hint}")
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


#: the task of every row of a file without a ``task`` column
DEFAULT_TASK = "default"
#: the fields a file may leave out, and what they become (``prompt_id`` is derived instead)
_OPTIONAL = {"answer": "", "context": "", "task": DEFAULT_TASK}
_noticed: set[tuple[str, tuple[str, ...]]] = set()


def derive_ids(prompts: Sequence[str]) -> list[str]:
    """Stable ids for a file without ``prompt_id``: the first 16 hex digits of the prompt's sha256.

    A prompt that repeats gets ``-2``, ``-3``, ... in file order, so ids stay unique; an id depends on
    the prompt text (and its repeats before it), not on where the row sits in the file.
    """
    seen: dict[str, int] = {}
    ids = []
    for prompt in prompts:
        base = sha256_bytes(prompt.encode("utf-8"))[:16]
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return ids


#: Where a column mapping comes from, as messages name it: the option, and how to write one mapping.
MAPPED_BY: dict[str, tuple[str, str]] = {
    "config": ("data.columns", "`columns: {prompt: question}`"),
    "eval": ("--columns", "`--columns prompt=question,answer=solution`"),
}


def _sources(columns: Mapping[Any, str] | None, mapped_by: str = "config") -> dict[str, str]:
    """Dataset field → the file column that holds it."""
    mapping = dict(columns or {})
    unknown = sorted(set(mapping) - set(COLUMNS))
    if unknown:
        option = MAPPED_BY[mapped_by][0]
        raise DataError(f"{option}: unknown field {', '.join(unknown)}; fields: {', '.join(COLUMNS)}")
    return {name: mapping.get(name, name) for name in COLUMNS}


def _chooser(
    source: str, columns: Mapping[Any, str] | None, mapped_by: str = "config"
) -> Callable[[list[str]], list[str]]:
    """From the file's columns, the ones to read (a DataError when a needed one is missing; a notice for extras)."""
    sources = _sources(columns, mapped_by)
    option, example = MAPPED_BY[mapped_by]

    def choose(found: list[str]) -> list[str]:
        mapped = {name: column for name, column in sources.items() if name in (columns or {})}
        for name, column in mapped.items():
            if column not in found:
                raise DataError(
                    f"{source}: {option} maps {name} to {column!r}, which is not a column of this file; "
                    f"its columns: {', '.join(found)}"
                )
        if sources["prompt"] not in found:
            raise DataError(
                f"{source}: no 'prompt' column; its columns: {', '.join(found)} "
                f"(name the prompt column with {option}, e.g. {example})"
            )
        used = [column for column in dict.fromkeys(sources.values()) if column in found]
        extra = tuple(c for c in found if c not in used)
        if extra and (source, extra) not in _noticed:
            _noticed.add((source, extra))
            sys.stderr.write(
                f"miniverl: notice: {source}: ignoring column(s) {', '.join(extra)} "
                f"(miniverl reads {', '.join(COLUMNS)}; map others with {option})\n"
            )
        return used

    return choose


def describe_dataset(
    path: str | os.PathLike[str], columns: Mapping[Any, str] | None = None, *, mapped_by: str = "config"
) -> dict[str, Any]:
    """``{"rows", "sha256", "columns"}`` (``columns``: the file's own column names).

    A Parquet file is described from its footer alone (no row data read, no torch): it exists, the
    needed columns are there and hold strings, and it has at least one row. JSON Lines and CSV have
    no footer, so they are read and checked whole; for Parquet, :func:`load_prompts` checks the rest.
    """
    source = os.fspath(path)
    target = check_file(path)
    if dataset_format(target) == "parquet":
        parquet = parquet_file(target)
        found = parquet_columns(parquet, source)
        wanted = _chooser(source, columns, mapped_by)(found)
        schema = parquet.schema_arrow
        for name in wanted:
            if schema.field(name).type not in _STRING_TYPES:
                raise DataError(
                    f"{source}: column {name!r} has type {schema.field(name).type}; expected string "
                    f"(write it as text, e.g. pandas: df[{name!r}] = df[{name!r}].astype(str))"
                )
        rows = parquet.metadata.num_rows
    else:  # no footer: the whole file is read, so it is checked whole
        found, loaded = _load(target, source, columns, mapped_by)
        rows = len(loaded)
    if rows < 1:
        raise DataError(f"{source}: the dataset is empty; it needs at least one row")
    return {"rows": rows, "sha256": sha256_file(path), "columns": found}


def load_prompts(
    path: str | os.PathLike[str], columns: Mapping[Any, str] | None = None, *, mapped_by: str = "config"
) -> list[PromptRow]:
    """Every row of a prompt dataset, validated; a one-line :class:`DataError` says what is wrong.

    ``columns`` is the config's ``data.columns`` (dataset field → file column); ``mapped_by`` (a key of
    :data:`MAPPED_BY`) is where the mapping came from, for the messages.
    """
    source = os.fspath(path)
    return _load(check_file(path), source, columns, mapped_by)[1]


def _load(
    target: Path, source: str, columns: Mapping[Any, str] | None, mapped_by: str = "config"
) -> tuple[list[str], list[PromptRow]]:
    """The file's column names and its validated rows."""
    table = read_columns(target, _chooser(source, columns, mapped_by), source)
    sources = _sources(columns, mapped_by)
    rows = [{name: raw.get(column, _OPTIONAL.get(name)) for name, column in sources.items()} for raw in table.rows]
    if sources["prompt_id"] not in table.columns and rows:
        prompts = [r["prompt"] if isinstance(r["prompt"], str) else "" for r in rows]  # validate_rows names a bad one
        for row, derived in zip(rows, derive_ids(prompts), strict=True):
            row["prompt_id"] = derived
    return table.columns, validate_rows(rows, source=source)

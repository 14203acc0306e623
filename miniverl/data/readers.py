"""Read a prompts file of any accepted format into named columns (pyarrow and the stdlib only, never torch).

A reader returns a :class:`RawTable`: the file's column names in file order and, per row, a dict of the
columns it was asked for. Nothing here knows the canonical dataset columns or the ``data.columns``
mapping; :mod:`miniverl.data.prompts` applies those. Every file is read through :mod:`miniverl.bounded`
(regular files only, size-capped), and every problem is one :class:`DataError` line.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from miniverl import bounded
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import DataError

#: file suffix → format; anything else is refused by name
FORMATS: dict[str, str] = {".parquet": "parquet", ".jsonl": "jsonl", ".csv": "csv"}
_STRING_TYPES = (pa.string(), pa.large_string())
_WHAT = "a prompts dataset"
_PARQUET_BATCH_ROWS = 1024


@dataclass(frozen=True, slots=True)
class RawTable:
    """The file's columns (file order) and its rows, each restricted to the columns asked for."""

    columns: list[str]
    rows: list[dict[str, Any]]


def dataset_format(path: str | os.PathLike[str]) -> str:
    """``parquet``, ``jsonl`` or ``csv`` from the file's suffix (case-insensitive); a DataError otherwise."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise DataError(
            f"{os.fspath(path)}: unknown dataset format {suffix or '(no suffix)'!r}; give a {', '.join(FORMATS)} file"
        )
    return FORMATS[suffix]


def check_file(path: str | os.PathLike[str]) -> Path:
    """``path`` when it is an existing regular file of an accepted format within the size bound."""
    target = Path(path)
    if not target.exists():
        raise DataError(
            f"dataset not found: {os.fspath(path)} "
            "(create one with `miniverl data sample --task calculator --rows 16 --out <file>.parquet`)"
        )
    if not target.is_file():
        raise DataError(f"dataset {os.fspath(path)} is not a file; give the path of a {', '.join(FORMATS)} file")
    dataset_format(target)
    bounded.check_regular(target, limit=bounded.PARQUET_MAX_BYTES, what=_WHAT)
    return target


def repeated(names: Sequence[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


def _refuse_repeated(names: Sequence[str], source: str) -> None:
    twice = repeated(names)
    if twice:
        raise DataError(f"{source}: repeated columns {', '.join(twice)}; every column name must be unique")


# --- Parquet -----------------------------------------------------------------------------------------------------


def parquet_file(path: Path) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataError(f"{os.fspath(path)} is not a readable Parquet file ({first})") from None


def parquet_columns(parquet: pq.ParquetFile, source: str) -> list[str]:
    names = list(parquet.schema_arrow.names)
    _refuse_repeated(names, source)
    return names


def _check_rows(rows: int, source: str) -> None:
    if rows > bounded.DATASET_MAX_ROWS:
        raise DataError(
            f"{source}: {rows:,} rows, over the limit of {bounded.DATASET_MAX_ROWS:,} for a prompts dataset; "
            "keep a sample of at most that many rows"
        )


def _check_parquet_footer(parquet: pq.ParquetFile, wanted: Sequence[str], source: str) -> None:
    """Refuse, from the footer alone, a file whose wanted columns claim to decode past the budget."""
    budget = bounded.DATASET_DECODED_MAX_BYTES
    metadata = parquet.metadata
    _check_rows(metadata.num_rows, source)
    indices = [parquet.schema_arrow.get_field_index(name) for name in wanted]
    claimed = metadata.num_rows * bounded.DATASET_ROW_OVERHEAD
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        claimed += sum(row_group.column(i).total_uncompressed_size for i in indices)
    if claimed > budget:
        raise DataError(
            f"{source}: its columns decode to {bounded.size_text(claimed)}, over the "
            f"{bounded.limit_text(budget)} limit for a prompts dataset; split it into smaller files"
        )


def _read_parquet(path: Path, wanted: Sequence[str], source: str) -> RawTable:
    """The wanted columns, decoded batch by batch under :data:`~miniverl.bounded.DATASET_DECODED_MAX_BYTES`
    (a small file whose pages or dictionaries expand to gigabytes is refused before it gets there)."""
    parquet = parquet_file(path)
    names = parquet_columns(parquet, source)
    schema = parquet.schema_arrow
    for name in wanted:
        field = schema.field(name)
        if field.type not in _STRING_TYPES:
            raise DataError(
                f"{source}: column {name!r} has type {field.type}; expected string "
                f"(write it as text, e.g. pandas: df[{name!r}] = df[{name!r}].astype(str))"
            )
    _check_parquet_footer(parquet, wanted, source)
    budget, decoded = bounded.DATASET_DECODED_MAX_BYTES, 0
    columns: dict[str, list[Any]] = {name: [] for name in wanted}
    try:
        for batch in parquet.iter_batches(batch_size=_PARQUET_BATCH_ROWS, columns=list(wanted), use_threads=False):
            decoded += batch.nbytes + batch.num_rows * bounded.DATASET_ROW_OVERHEAD
            if decoded > budget:
                raise DataError(
                    f"{source}: its columns decode to more than the {bounded.limit_text(budget)} limit for a "
                    "prompts dataset; split it into smaller files"
                )
            for name in wanted:
                columns[name].extend(batch.column(name).to_pylist())
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{source}: cannot read the Parquet data ({str(exc).splitlines()[0]})") from None
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{source}: a string column holds bytes that are not UTF-8 ({exc.reason}); re-encode the file as UTF-8"
        ) from None
    count = len(columns[wanted[0]]) if wanted else 0
    rows = [{name: columns[name][i] for name in wanted} for i in range(count)]
    return RawTable(names, rows)


# --- JSON Lines --------------------------------------------------------------------------------------------------


def _text(path: Path, source: str) -> str:
    data = bounded.read_bytes(path, limit=bounded.TEXT_DATASET_MAX_BYTES, what=_WHAT)
    try:
        return data.decode("utf-8-sig")  # a byte-order mark some editors write is not part of the first column
    except UnicodeDecodeError as exc:
        raise DataError(f"{source}: not UTF-8 text ({exc.reason} at byte {exc.start}); re-encode it as UTF-8") from None


def _read_jsonl(path: Path, source: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    names: dict[str, None] = {}
    records: list[tuple[int, dict[str, Any]]] = []
    text = _text(path, source)
    _check_rows(text.count("\n"), source)
    # lines end at "\n" only (JSON Lines): U+2028, U+0085 and the like are characters inside a string
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line.strip():
            continue
        try:
            value = loads_json(line)
        except StrictFormatError as exc:
            raise DataError(f"{source}: line {number}: {exc}") from None
        if not isinstance(value, dict):
            kind = "array" if isinstance(value, list) else type(value).__name__
            raise DataError(f"{source}: line {number} is a JSON {kind}; each line must be an object")
        names.update(dict.fromkeys(value))
        records.append((number, value))
    return list(names), records


# --- CSV ---------------------------------------------------------------------------------------------------------


def _read_csv(path: Path, source: str) -> tuple[list[str], list[tuple[int, dict[str, Any]]]]:
    if csv.field_size_limit() < bounded.FIELD_MAX_CHARS + 1:  # the same field limit as every format (checked below)
        csv.field_size_limit(bounded.FIELD_MAX_CHARS + 1)
    reader = csv.reader(io.StringIO(_text(path, source), newline=""), strict=True)
    records: list[tuple[int, dict[str, Any]]] = []
    try:
        header = next(reader, None)
        if not header:
            raise DataError(f"{source}: no header row; the first line names the columns (e.g. prompt,answer)")
        _refuse_repeated(header, source)
        for fields in reader:
            if not fields:  # a blank line
                continue
            if len(fields) != len(header):
                raise DataError(
                    f"{source}: line {reader.line_num} has {len(fields)} fields, the header has {len(header)}"
                )
            records.append((reader.line_num, dict(zip(header, fields, strict=True))))
            if len(records) > bounded.DATASET_MAX_ROWS:
                _check_rows(len(records), source)
    except csv.Error as exc:
        if "field larger than field limit" in str(exc):
            raise DataError(
                f"{source}: line {reader.line_num} has a field longer than {bounded.FIELD_MAX_CHARS:,} characters, "
                "the limit for one field (in every format): shorten it"
            ) from None
        raise DataError(f"{source}: line {reader.line_num}: {exc}") from None
    return list(header), records


def read_columns(path: Path, choose: Callable[[list[str]], list[str]], source: str) -> RawTable:
    """The rows of ``path`` restricted to ``choose(file_columns)``, a list of columns the file has."""
    kind = dataset_format(path)
    if kind == "parquet":
        parquet = parquet_file(path)
        return check_field_lengths(_read_parquet(path, choose(parquet_columns(parquet, source)), source), source)
    names, records = (_read_jsonl if kind == "jsonl" else _read_csv)(path, source)
    wanted = choose(names)
    rows = []
    for number, record in records:
        missing = [name for name in wanted if name not in record]
        if missing:  # only JSON Lines can lack a key another line has
            raise DataError(f"{source}: line {number} has no {', '.join(map(repr, missing))}; every line needs it")
        rows.append({name: record[name] for name in wanted})
    return check_field_lengths(RawTable(names, rows), source)


def check_field_lengths(table: RawTable, source: str) -> RawTable:
    """One field-length limit for every format: a value longer than :data:`~miniverl.bounded.FIELD_MAX_CHARS`
    characters is a DataError naming its row and column."""
    limit = bounded.FIELD_MAX_CHARS
    for number, row in enumerate(table.rows, start=1):
        for name, value in row.items():
            if isinstance(value, str) and len(value) > limit:
                raise DataError(
                    f"{source}: row {number}, column {name!r} has {len(value):,} characters; the limit for one field "
                    f"is {limit:,} (in every format): shorten it"
                )
    return table

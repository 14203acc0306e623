"""Canonical JSON, digests, atomic writes and the local-path guard for every record the harness writes."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from harness.core.errors import RecordError, UsageError

CHUNK = 1 << 20

# Strings in records must not look like a path of the machine that wrote them.
_ABSOLUTE = re.compile(
    r"""(?x)
    (?:^|[\s"'=(:,])(?:/(?:home|root|Users|tmp|var|private|opt|usr|mnt|srv|etc|work|data|scratch|runner|github)(?:/|$))
    | ^/[^\s]*
    | ^~(?:[\w.-]*)(?:/|$)
    | (?:^|[\s"'=(])[A-Za-z]:[\\/]
    | ^\\\\
    """
)


def looks_like_local_path(text: str) -> bool:
    """True for strings such as ``/home/x``, ``~/.cache``, ``~alice/x``, ``C:\\Users``, ``\\\\server\\share``; not
    for a version specifier such as ``~=3.9`` (pip inspect's ``requires_python``)."""
    return bool(_ABSOLUTE.search(text))


def refuse_local_paths(value: Any, where: str = "$") -> None:
    """Raise ``RecordError`` (check ``no_local_paths``) if any string key or value looks like a local path."""
    if isinstance(value, str):
        if looks_like_local_path(value):
            raise RecordError(
                f"{where} holds a local path; records use relative paths and digests", check="no_local_paths"
            )
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_local_paths(str(key), f"{where}.<key>")
            refuse_local_paths(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            refuse_local_paths(item, f"{where}[{index}]")


def refuse_non_finite(value: Any, where: str = "$") -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(f"{where} is {value!r}; records hold finite numbers only", check="finite_numbers")
    if isinstance(value, dict):
        for key, item in value.items():
            refuse_non_finite(item, f"{where}.{key}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            refuse_non_finite(item, f"{where}[{index}]")


def canonical_bytes(value: Any) -> bytes:
    """Sorted keys, compact separators, UTF-8; NaN and infinity refused."""
    refuse_non_finite(value)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8")


MAX_JSON_DEPTH = 64
MAX_INT_DIGITS = 40
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKET = re.compile(rb"[\[\]{}]")


def _reject_constant(name: str) -> Any:
    raise RecordError(f"JSON holds {name}; records hold finite numbers only", check="finite_numbers")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise RecordError(
            f"JSON holds an integer of {len(text)} digits; the limit is {MAX_INT_DIGITS}", check="json_limits"
        )
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise RecordError(f"JSON number {text[:20]} overflows to {value}", check="finite_numbers")
    return value


def _depth(data: bytes) -> int:
    """Nesting depth of JSON bytes, measured before parsing so that deep input cannot exhaust the stack."""
    depth = deepest = 0
    for match in _BRACKET.finditer(_STRING.sub(b'""', data)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        deepest = max(deepest, depth)
    return deepest


def loads_strict(data: bytes, what: str) -> Any:
    """Parse JSON bytes with limits: depth, integer digits; NaN/Infinity, overflow and duplicate keys refused."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, item in items:
            if key in out:
                raise RecordError(f"duplicate key {key[:40]!r}", check="record_schema")
            out[key] = item
        return out

    if _depth(data) > MAX_JSON_DEPTH:
        raise RecordError(f"{what} nests deeper than {MAX_JSON_DEPTH} levels", check="json_limits")
    try:
        text = data.decode("utf-8")
        return json.loads(
            text,
            parse_constant=_reject_constant,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            object_pairs_hook=pairs,
        )
    except RecordError as exc:
        raise RecordError(f"{what}: {exc}", check=exc.check) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise RecordError(f"{what} is not valid UTF-8 JSON: {exc.__class__.__name__}", check="record_schema") from None


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def atomic_file(path: Path) -> Iterator[BinaryIO]:
    """A temp file beside ``path`` to write; on a clean exit it is fsynced, made 0644, renamed into place and the
    directory fsynced, so ``path`` holds either its old bytes or all the new ones. On an error it is removed.

    The one writer of the harness: ``path`` is checked with ``lstat`` first and again before the rename
    (:func:`~harness.core.safeio.check_output_file`): a device, FIFO, socket or directory is never replaced."""
    from harness.core.safeio import check_output_file

    check_output_file(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_name, 0o644)
        check_output_file(path)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path) as handle:
        handle.write(data)


def atomic_write_json(path: Path, value: Any) -> bytes:
    """Write canonical JSON plus a final newline; returns the bytes written."""
    data = canonical_bytes(value) + b"\n"
    atomic_write_bytes(path, data)
    return data


def fsync_tree(root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for directory in sorted({root, *(p for p in root.rglob("*") if p.is_dir() and not p.is_symlink())}):
        fsync_dir(directory)


def replace_dir(staging: Path, target: Path) -> None:
    """Move a finished ``staging`` directory onto ``target``; the old one is removed only afterwards."""
    from harness.core.safeio import check_output_dir

    old = None
    if target.is_symlink() or target.is_file():
        raise UsageError(f"{target.name} exists and is not a directory; remove it first", check="output")
    check_output_dir(target)
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old)


def publish_dir(staging: Path, target: Path) -> None:
    """A finished ``staging`` directory made 0755, fsynced whole, then moved onto ``target``."""
    os.chmod(staging, 0o755)
    fsync_tree(staging)
    replace_dir(staging, target)

"""The one reader for every file miniverl reads whole: regular files only, size-capped, depth-limited.

A FIFO, a device or a socket is refused from ``stat`` before anything is opened, so nothing can block on it; the
file is then opened non-blocking and ``fstat`` must agree (a file swapped for a FIFO in between is refused too).
A file larger than its bound is refused before a byte is read, and at most ``limit + 1`` bytes are ever read.
``nofollow=True`` (files inside a run directory) also refuses a symlink as the file itself.

Missing files and directories raise the usual :class:`FileNotFoundError` / :class:`IsADirectoryError`, so callers
keep their own messages for those; everything else this module refuses is an :class:`InputBoundError` (exit 2)
whose message names the file and the bound.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from miniverl.config.strict import MAX_DEPTH, loads_json, loads_yaml, nesting_depth
from miniverl.errors import UsageError
from miniverl.outputs import kind_of

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30

# Bounds on the inputs read whole. Each is far above any real file of its kind.
CONFIG_MAX_BYTES = 4 * MIB  # a config YAML, a native verl YAML, --bindings
PLAN_MAX_BYTES = 16 * MIB  # plan.json, run.json, checkpoint.json, a bundle's manifest
MODEL_CONFIG_MAX_BYTES = 4 * MIB  # a model's config.json, adapter_config.json
METRICS_MAX_BYTES = 1 * GIB  # metrics.jsonl (one line per update)
PARQUET_MAX_BYTES = 4 * GIB  # a prompts dataset in Parquet (compressed; what it decodes to is bounded below)
TEXT_DATASET_MAX_BYTES = 256 * MIB  # a prompts dataset in JSON Lines or CSV (read whole)
DATASET_DECODED_MAX_BYTES = 256 * MIB  # the decoded strings of a prompts dataset, whatever its format
FIELD_MAX_CHARS = 1_000_000  # one field of a dataset row (a prompt, an answer...), in every format
DATASET_MAX_ROWS = 500_000  # rows of a prompts dataset, in every format (about 650 MB once loaded)
DATASET_ROW_OVERHEAD = 512  # bytes a decoded row costs beyond its strings (Python objects), counted in the budget
WEIGHTS_MAX_BYTES = 64 * GIB  # a safetensors file (an adapter's, a cached model's): only devices and FIFOs are kept out

_READ_CHUNK = 1 * MIB
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class InputBoundError(UsageError):
    """An input that is not a regular file, is larger than its bound, or nests too deeply."""


def size_text(size: int) -> str:
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def limit_text(limit: int) -> str:
    for unit, scale in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if limit >= scale and limit % scale == 0:
            return f"{limit // scale} {unit}"
    return f"{limit} bytes"


def _refuse_kind(path: Path, mode: int, what: str) -> None:
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(21, "Is a directory", os.fspath(path))
    if not stat.S_ISREG(mode):
        raise InputBoundError(f"{path}: {what} must be a regular file; this is {kind_of(mode)}")


def _refuse_size(path: Path, size: int, limit: int, what: str) -> None:
    if size > limit:
        raise InputBoundError(f"{path}: {size_text(size)} exceeds the {limit_text(limit)} limit for {what}")


def check_regular(path: Path, *, limit: int, what: str, nofollow: bool = False) -> int:
    """The size of ``path`` when it is a regular file within ``limit`` bytes (for files opened by a library)."""
    st = os.lstat(path) if nofollow else os.stat(path)
    _refuse_kind(path, st.st_mode, what)
    _refuse_size(path, st.st_size, limit, what)
    return st.st_size


def read_bytes(path: Path, *, limit: int, what: str, nofollow: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them (``what`` names it in errors)."""
    path = Path(path)
    check_regular(path, limit=limit, what=what, nofollow=nofollow)
    flags = os.O_RDONLY | _NONBLOCK | _CLOEXEC | (_NOFOLLOW if nofollow else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if nofollow and exc.errno == 40:  # ELOOP: became a symlink after lstat
            raise InputBoundError(f"{path}: {what} must be a regular file; this is a symlink") from None
        raise
    with os.fdopen(fd, "rb", buffering=0) as handle:
        st = os.fstat(handle.fileno())
        _refuse_kind(path, st.st_mode, what)
        _refuse_size(path, st.st_size, limit, what)
        # the buffer grows with what is there: never ``limit`` bytes reserved up front for a small file
        data: bytes = handle.read(min(st.st_size, limit) + 1) or b""
        if st.st_size < len(data) <= limit:  # it grew while being read: go on in chunks, up to the limit
            grown = bytearray(data)
            while len(grown) <= limit and (block := handle.read(min(_READ_CHUNK, limit + 1 - len(grown)))):
                grown += block
            data = bytes(grown)
    _refuse_size(path, len(data), limit, what)  # a file that grew while being read
    return data


def read_text(path: Path, *, limit: int, what: str, nofollow: bool = False) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a :class:`UnicodeDecodeError` otherwise, for the caller to name)."""
    return read_bytes(path, limit=limit, what=what, nofollow=nofollow).decode("utf-8")


def check_depth(value: Any, *, origin: str) -> Any:
    """``value`` when it nests at most :data:`MAX_DEPTH` deep; an :class:`InputBoundError` naming ``origin``."""
    if nesting_depth(value) > MAX_DEPTH:
        raise InputBoundError(f"{origin}: nested more than {MAX_DEPTH} levels deep (the limit for any input)")
    return value


def _document_text(path: Path, *, limit: int, what: str, nofollow: bool) -> str:
    try:
        return read_text(path, limit=limit, what=what, nofollow=nofollow)
    except IsADirectoryError:
        raise InputBoundError(f"{path}: {what} must be a regular file; this is a directory") from None


def read_json(path: Path, *, limit: int, what: str, nofollow: bool = False) -> Any:
    """A JSON file parsed strictly (:func:`~miniverl.config.strict.loads_json`, depth-limited).

    Unlike :func:`read_text`, a directory is an :class:`InputBoundError` too; a missing file is a
    :class:`FileNotFoundError`; text that is not UTF-8 or not JSON a :class:`ValueError`.
    """
    return loads_json(_document_text(Path(path), limit=limit, what=what, nofollow=nofollow))


def read_yaml(path: Path, *, limit: int, what: str, nofollow: bool = False) -> Any:
    """A YAML file safe-loaded strictly (:func:`~miniverl.config.strict.loads_yaml`), as :func:`read_json`."""
    return loads_yaml(_document_text(Path(path), limit=limit, what=what, nofollow=nofollow))

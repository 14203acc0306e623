"""Canonical JSON, content digests and atomic file writes: the I/O edge every record goes through."""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

CHUNK = 1 << 20


def canonical_json(value: Any) -> str:
    """Sorted keys, compact separators, UTF-8, and no NaN or infinity (refused, not written)."""
    _refuse_non_finite(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_bytes(value: Any) -> bytes:
    return canonical_json(value).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_json(value: Any) -> str:
    return sha256_bytes(canonical_bytes(value))


def sha256_file(path: str | os.PathLike[str]) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def tree_digest(root: Path, names: Iterable[str] | None = None) -> dict[str, str]:
    """sha256 of each regular file under ``root`` (relative POSIX names, sorted)."""
    if names is None:
        names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    return {name: sha256_file(root / name) for name in sorted(names)}


def _fsync_dir(directory: Path) -> None:
    from miniverl.outputs import fsync_dir

    fsync_dir(directory)


def umask_mode(*, directory: bool) -> int:
    """The mode ``open``/``mkdir`` give under the process umask (``mkstemp``/``mkdtemp`` force 0600/0700)."""
    umask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    return (0o777 if directory else 0o666) & ~umask


def temp_dir_beside(target: Path, prefix: str) -> Path:
    """A new private directory in ``target``'s parent for building ``target``; renamed into place, it keeps the
    mode an ordinary ``mkdir`` would have given (the user's umask), not mkdtemp's 0700."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir=target.parent))
    os.chmod(tmp, umask_mode(directory=True))
    return tmp


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` through the one output writer (:func:`miniverl.outputs.write_file`): the target is checked
    with ``lstat`` first (a device, FIFO, socket or directory is refused), then temp file, fsync, rename."""
    from miniverl.outputs import write_file

    write_file(path, data)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike[str], value: Any, *, pretty: bool = False) -> None:
    """Canonical JSON (or indented, still sorted and NaN-free, when ``pretty``) with a final newline."""
    if pretty:
        _refuse_non_finite(value)
        text = json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False)
    else:
        text = canonical_json(value)
    atomic_write_text(path, text + "\n")


def fsync_tree(root: Path) -> None:
    """fsync every file and directory under ``root`` (used before a directory rename, so before it is published).

    Each also gets the mode a plain ``open``/``mkdir`` would have given under the user's umask (an executable
    keeps its x bits): safetensors, ``mkstemp`` and ``mkdtemp`` create 0600/0700 whatever the umask.
    """
    files, directories = umask_mode(directory=False), umask_mode(directory=True)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.stat().st_mode & 0o111
            os.chmod(path, directories if executable else files)
    for path in sorted(root.rglob("*")):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
    for directory in sorted({root, *(p for p in root.rglob("*") if p.is_dir())}):
        _fsync_dir(directory)


def _refuse_non_finite(value: Any) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"non-finite number {value!r} cannot be written to a record")
    if isinstance(value, dict):
        for item in value.values():
            _refuse_non_finite(item)
    elif isinstance(value, list | tuple):
        for item in value:
            _refuse_non_finite(item)

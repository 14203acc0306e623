"""The verified model cache: safetensors directories built once, recorded, and checked on every use.

Layout: ``$MINIVERL_CACHE/models/<name>/<gguf_sha256[:16]>/`` (default ``~/.cache/miniverl``).
Each directory holds a ``miniverl-model.json`` record: the pinned digests it was built from, the
dtype, and the sha256 of every other file in the directory. A directory is built in a temp
directory beside its final place, fsynced, then renamed; a directory whose files no longer match
its record is never used (the caller rebuilds it). Torch-free.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miniverl import bounded
from miniverl.canonical import atomic_write_json, fsync_tree, tree_digest
from miniverl.outputs import check_dir_target

RECORD_NAME = "miniverl-model.json"
DEFAULT_CACHE = Path("~/.cache/miniverl")


class TokenizerFix(BaseModel):
    """What was changed in a GGUF tokenizer, and why (kept in the record for provenance)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    eos_token: str
    eos_token_id: int
    pad_token: str
    pad_token_id: int
    notes: list[str] = Field(default_factory=list)


class CachedModelRecord(BaseModel):
    """``miniverl-model.json``: what a cached model directory was built from and what it holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["miniverl-model/1"] = "miniverl-model/1"
    source: Literal["builtin", "gguf"]
    name: str
    wheel_sha256: str | None = None
    gguf_sha256: str
    gguf_size: int
    dtype: Literal["bfloat16", "float16", "float32"]
    recipe: int
    """Version of the conversion code that wrote the directory (a newer one rebuilds it)."""
    tokenizer: TokenizerFix
    converted_with: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str]


class CacheMismatch(Exception):
    """A cached directory does not match its record (or has none); the message says how."""


def cache_root(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir`` if given, else ``$MINIVERL_CACHE``, else ``~/.cache/miniverl``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MINIVERL_CACHE")
    return Path(env).expanduser() if env else DEFAULT_CACHE.expanduser()


def model_cache_dir(name: str, gguf_sha256: str, cache_dir: str | os.PathLike[str] | None = None) -> Path:
    return cache_root(cache_dir) / "models" / name / gguf_sha256[:16]


def _ordinary_permissions(root: Path) -> None:
    """mkdtemp/mkstemp create 0700/0600; give the cache the permissions of ordinary files."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def read_record(directory: Path) -> CachedModelRecord:
    path = directory / RECORD_NAME
    try:
        raw = bounded.read_bytes(path, limit=bounded.PLAN_MAX_BYTES, what="a model cache record", nofollow=True)
        return CachedModelRecord.model_validate_json(raw)
    except FileNotFoundError:
        raise CacheMismatch(f"{RECORD_NAME} is missing") from None
    except IsADirectoryError:
        raise CacheMismatch(f"{RECORD_NAME} is a directory") from None
    except bounded.InputBoundError as exc:  # a FIFO, a device, a symlink, an oversized file: never read
        raise CacheMismatch(str(exc)) from None
    except ValidationError as exc:
        raise CacheMismatch(f"{RECORD_NAME} is invalid ({exc.error_count()} errors)") from None


def verify_cached_dir(directory: Path, *, expect: dict[str, object]) -> CachedModelRecord:
    """Check ``directory`` against its record and the pins in ``expect`` (record field -> value).

    Every file must be listed and match its sha256; no unlisted file may be present.
    Raises :class:`CacheMismatch` naming the first difference.
    """
    if not directory.is_dir():
        raise CacheMismatch("directory does not exist")
    record = read_record(directory)
    for key, value in expect.items():
        if getattr(record, key) != value:
            raise CacheMismatch(f"record field {key} is {getattr(record, key)!r}, expected {value!r}")
    present = sorted(
        p.relative_to(directory).as_posix()
        for p in directory.rglob("*")
        if (p.is_file() or p.is_symlink()) and p.name != RECORD_NAME
    )
    if present != sorted(record.files):
        extra = sorted(set(present) - set(record.files))
        missing = sorted(set(record.files) - set(present))
        raise CacheMismatch(f"files differ from the record (unlisted: {extra}, missing: {missing})")
    for name in sorted(record.files):  # hashed below: a symlink to a FIFO or a device must not be opened
        try:
            bounded.check_regular(
                directory / name, limit=bounded.WEIGHTS_MAX_BYTES, what="a cached file", nofollow=True
            )
        except bounded.InputBoundError as exc:
            raise CacheMismatch(str(exc)) from None
    for name, digest in tree_digest(directory, record.files).items():
        if digest != record.files[name]:
            raise CacheMismatch(f"{name} does not match its recorded sha256")
    return record


def build_cached_dir(
    target: Path,
    write: Callable[[Path], dict[str, object]],
) -> CachedModelRecord:
    """Build ``target`` atomically.

    ``write(tmp_dir)`` fills a fresh temp directory beside ``target`` and returns the record fields
    other than ``files``; the record is completed with the sha256 of every file written, the tree is
    fsynced and renamed into place. A stale ``target`` (one that failed verification) is moved aside
    and deleted first. If another process finished the same directory first, its copy is kept.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        fields = write(tmp)
        record = CachedModelRecord.model_validate({**fields, "files": tree_digest(tmp)})
        atomic_write_json(tmp / RECORD_NAME, record.model_dump(mode="json"), pretty=True)
        _ordinary_permissions(tmp)
        fsync_tree(tmp)
        check_dir_target(target, what="model cache")
        if target.exists():
            stale = target.parent / f".{target.name}.stale-{uuid.uuid4().hex[:8]}"
            os.replace(target, stale)
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():
                raise
            # Someone else renamed a complete directory into place between our check and rename.
        return record
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)

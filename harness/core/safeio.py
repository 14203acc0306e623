"""Reading files an attacker may control: the file type is checked before anything is opened, sizes before reading.

A FIFO, a device, a directory or a symlink where a regular file is expected is refused from ``lstat`` alone, so
nothing can block on it; a file larger than its bound is refused before a byte is read.

Given the directory it was handed (``root``), a reader also refuses a symlink anywhere between that directory and
the file: each component below ``root`` is checked with ``lstat``, walking down, and the file is then opened one
component at a time without following links, so a directory swapped for a symlink in between is refused too.
``root`` itself is taken as given (the caller chose that path).
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path, PurePosixPath

from harness.core.errors import HarnessError, UsageError, VerificationError

KIB = 1 << 10
MIB = 1 << 20

# Bounds on the files the auditor reads whole (archives and distributions are streamed, never read whole).
RECORD_MAX_BYTES = 16 * MIB
MANIFEST_MAX_BYTES = 1 * MIB
SUMS_MAX_BYTES = 64 * KIB

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC
_OPENAT = os.open in os.supports_dir_fd and hasattr(os, "O_DIRECTORY")
_HASH_BLOCK = 1 << 20


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def _lstat(path: Path, what: str, check: str, error: type[HarnessError]) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise error(f"{what} does not exist", check=check) from None
    except OSError as exc:
        raise error(f"{what} cannot be examined: {exc.strerror or exc.__class__.__name__}", check=check) from None


def _parts_below(root: Path, path: Path, what: str, check: str, error: type[HarnessError]) -> tuple[str, ...]:
    """The components of ``path`` below ``root``, after ``lstat`` found each directory between them real."""
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise error(f"{what} is not inside the directory it was given in", check=check) from None
    if not parts or any(p in {"", ".", ".."} for p in parts):
        raise error(f"{what} does not name a file below the directory it was given in", check=check)
    current = root
    for depth, part in enumerate(parts[:-1], start=1):
        current = current / part
        step = "/".join(parts[:depth]) + "/"
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise error(f"{what} does not exist ({step} is missing)", check=check) from None
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise error(f"{what}: {step} cannot be examined: {reason}", check=check) from None
        if not stat.S_ISDIR(st.st_mode):
            raise error(f"{what}: {step} is {_kind(st.st_mode)}, not a directory", check=check)
    return parts


def path_below(
    root: Path, relative: str, what: str, *, check: str, error: type[HarnessError] = VerificationError
) -> Path:
    """``root``/``relative`` (POSIX, no '..'), when no component between ``root`` and it is a symlink or anything
    but a real directory; the leaf itself is left to the reader (:func:`regular_file_size`, :func:`file_digest`)."""
    rel = PurePosixPath(relative)
    if rel.is_absolute():
        raise error(f"{what} is an absolute path", check=check)
    path = root.joinpath(*rel.parts)
    _parts_below(root, path, what, check, error)
    return path


def regular_file_size(
    path: Path,
    what: str,
    *,
    check: str,
    error: type[HarnessError] = VerificationError,
    root: Path | None = None,
) -> int:
    """The size of ``path`` when it is a regular file (``lstat``: symlinks refused), and, given ``root``, no
    component between ``root`` and it is a symlink; a named error otherwise."""
    if root is not None:
        _parts_below(root, path, what, check, error)
    st = _lstat(path, what, check, error)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} is {_kind(st.st_mode)}, not a regular file", check=check)
    return st.st_size


def _open_checked(path: Path, what: str, check: str, error: type[HarnessError], root: Path | None) -> int:
    """Open the regular file ``path`` that :func:`regular_file_size` accepted, without following links or
    blocking; with ``root``, one directory at a time from ``root`` down, none of them followed either."""
    try:
        if root is None or not _OPENAT:
            fd = os.open(path, _FILE_FLAGS)
        else:
            fd = _open_from(root, path.relative_to(root).parts)
    except OSError as exc:
        raise error(f"{what} cannot be opened: {exc.strerror or exc.__class__.__name__}", check=check) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # replaced between lstat and open
        os.close(fd)
        raise error(f"{what} is not a regular file", check=check)
    return fd


def _open_from(root: Path, parts: tuple[str, ...]) -> int:
    directory = os.open(root, _DIR_FLAGS)
    try:
        for part in parts[:-1]:
            below = os.open(part, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=directory)
            os.close(directory)
            directory = below
        return os.open(parts[-1], _FILE_FLAGS, dir_fd=directory)
    finally:
        os.close(directory)


def read_regular(
    path: Path,
    what: str,
    *,
    max_bytes: int,
    check: str,
    error: type[HarnessError] = VerificationError,
    root: Path | None = None,
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; opened without following links or blocking (and,
    given ``root``, with no symlink between ``root`` and it)."""
    size = regular_file_size(path, what, check=check, error=error, root=root)
    if size > max_bytes:
        raise error(f"{what} is {size} bytes; the limit is {max_bytes}", check=check)
    with os.fdopen(_open_checked(path, what, check, error, root), "rb") as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{what} grew past the limit of {max_bytes} bytes while being read", check=check)
    return data


def file_digest(
    path: Path,
    what: str,
    *,
    check: str,
    error: type[HarnessError] = VerificationError,
    root: Path | None = None,
) -> tuple[int, str]:
    """``(bytes, sha256)`` of a regular file, both taken from one open file (no link followed, and given
    ``root``, none between ``root`` and it)."""
    regular_file_size(path, what, check=check, error=error, root=root)
    digest, size = hashlib.sha256(), 0
    with os.fdopen(_open_checked(path, what, check, error, root), "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


def require_directory(path: Path, what: str, *, check: str, error: type[HarnessError] = VerificationError) -> None:
    """``path`` is a real directory (not a symlink to one)."""
    st = _lstat(path, what, check, error)
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} is {_kind(st.st_mode)}, not a directory", check=check)


def _output_mode(path: Path, what: str, check: str) -> tuple[int | None, bool]:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, False
    except OSError as exc:
        raise UsageError(
            f"{what} {path} cannot be examined: {exc.strerror or exc.__class__.__name__}", check=check
        ) from None
    if not stat.S_ISLNK(st.st_mode):
        return st.st_mode, False
    try:
        return os.stat(path).st_mode, True
    except FileNotFoundError:
        return None, True
    except OSError as exc:
        raise UsageError(
            f"{what} {path}: a symlink that cannot be resolved ({exc.strerror}); remove it", check=check
        ) from None


def check_output_file(path: Path, what: str = "output", *, check: str = "output") -> None:
    """The one rule for every file the harness writes: ``path`` (``lstat`` first) is absent or a regular file, or
    a symlink to one (the rename replaces the link, never its target). A device, a FIFO, a socket, a directory or
    a symlink to any of them is a :class:`UsageError` (exit 2) before anything is written."""
    mode, link = _output_mode(Path(path), what, check)
    if mode is None or stat.S_ISREG(mode):
        return
    through = "a symlink to " if link else ""
    raise UsageError(
        f"{what} {path} is {through}{_kind(mode)}, not a regular file; give the path of a file to write", check=check
    )


def check_output_dir(path: Path, what: str = "output", *, check: str = "output") -> None:
    """A directory output (built beside and renamed into place): ``path`` is absent or a real directory."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(
            f"{what} {path} cannot be examined: {exc.strerror or exc.__class__.__name__}", check=check
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{what} {path} is {_kind(st.st_mode)}, not a directory; choose another path", check=check)

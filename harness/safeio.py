"""Reading files an attacker may control: the file type is checked before anything is opened, sizes before reading.

A FIFO, a device, a directory or a symlink where a regular file is expected is refused from ``lstat`` alone, so
nothing can block on it; a file larger than its bound is refused before a byte is read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from harness.errors import HarnessError, VerificationError

KIB = 1 << 10
MIB = 1 << 20

# Bounds on the files the auditor reads whole (archives and distributions are streamed, never read whole).
RECORD_MAX_BYTES = 16 * MIB
MANIFEST_MAX_BYTES = 1 * MIB
SUMS_MAX_BYTES = 64 * KIB


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


def regular_file_size(path: Path, what: str, *, check: str, error: type[HarnessError] = VerificationError) -> int:
    """The size of ``path`` when it is a regular file (``lstat``: symlinks refused); a named error otherwise."""
    st = _lstat(path, what, check, error)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{what} is {_kind(st.st_mode)}, not a regular file", check=check)
    return st.st_size


def read_regular(
    path: Path, what: str, *, max_bytes: int, check: str, error: type[HarnessError] = VerificationError
) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``; opened without following links or blocking."""
    size = regular_file_size(path, what, check=check, error=error)
    if size > max_bytes:
        raise error(f"{what} is {size} bytes; the limit is {max_bytes}", check=check)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise error(f"{what} cannot be opened: {exc.strerror or exc.__class__.__name__}", check=check) from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):  # replaced between lstat and open
            raise error(f"{what} is not a regular file", check=check)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{what} grew past the limit of {max_bytes} bytes while being read", check=check)
    return data


def require_directory(path: Path, what: str, *, check: str, error: type[HarnessError] = VerificationError) -> None:
    """``path`` is a real directory (not a symlink to one)."""
    st = _lstat(path, what, check, error)
    if not stat.S_ISDIR(st.st_mode):
        raise error(f"{what} is {_kind(st.st_mode)}, not a directory", check=check)

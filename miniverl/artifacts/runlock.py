"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock``.

The kernel drops the lock when its holder dies, so a lock is never stale and nothing guesses. While held the
file holds the holder's pid (for the refusal message); a holder that exits normally leaves it empty.
Within one process the lock is re-entrant (``run --resume`` checks for a completed run, then trains).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from miniverl.errors import UsageError

LOCK_NAME = ".lock"

#: run directory (resolved) -> [fd, depth] of the locks this process holds
_held: dict[Path, list[int]] = {}


class RunBusyError(UsageError):
    """Another process writes this run directory."""


def _holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "another process"


def acquire(run_dir: Path, *, what: str) -> bool:
    """Take the run's lock now or raise :class:`RunBusyError` naming the holder; True when newly taken.

    ``run_dir`` must exist. Never blocks.
    """
    key = run_dir.resolve()
    if key in _held:
        _held[key][1] += 1
        return False
    path = run_dir / LOCK_NAME
    if path.is_symlink():
        raise UsageError(f"{path} is a symlink; remove it")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = _holder(fd)
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunBusyError(
                f"{run_dir} is being written by {holder} (another miniverl run, export, report or eval); "
                f"wait for it to finish, then retry {what}"
            ) from None
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    _held[key] = [fd, 1]
    return True


def release(run_dir: Path) -> None:
    key = run_dir.resolve()
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    fd = entry[0]
    with contextlib.suppress(OSError):  # the directory may be gone (a failed fresh run removes its own)
        os.ftruncate(fd, 0)
    os.close(fd)  # closing the last descriptor drops the flock


@contextlib.contextmanager
def run_writer(run_dir: Path, *, what: str, optional: bool = False) -> Iterator[None]:
    """Hold ``run_dir``'s lock for the block. ``optional``: a directory we cannot create the lock file in
    (read-only) or that is not there is passed through unlocked; the command then fails or reads as before."""
    try:
        acquire(run_dir, what=what)
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        if not optional:
            raise
        yield
        return
    except OSError as exc:
        if not optional or exc.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
            raise
        yield
        return
    try:
        yield
    finally:
        release(run_dir)


def held(run_dir: Path) -> bool:
    return run_dir.resolve() in _held

"""One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock``.

The kernel drops the lock when its holder dies, so a lock is never stale and nothing guesses. The file stays
empty and is never written after its creation (a no-op ``--resume`` changes no file, not even a timestamp);
the refusal names the holder's pid as the kernel reports it (``/proc/locks``), not as a file claims it.
Within one process the lock is re-entrant (``run --resume`` checks for a completed run, then trains).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from miniverl.errors import UsageError

LOCK_NAME = ".lock"

#: run directory (resolved) -> [fd, depth] of the locks this process holds
_held: dict[Path, list[int]] = {}


class RunBusyError(UsageError):
    """Another process writes this run directory."""


def _holder(fd: int) -> str:
    """The pid holding an flock on ``fd``'s file, from the kernel's lock table (Linux); else 'another process'."""
    try:
        st = os.fstat(fd)
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read(1 << 20).splitlines()
    except OSError:
        return "another process"
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":  # "->" lines are waiters, not holders
            continue
        try:
            major, minor, inode = fields[5].split(":")
            same = (int(major, 16), int(minor, 16), int(inode)) == (
                os.major(st.st_dev),
                os.minor(st.st_dev),
                st.st_ino,
            )
        except ValueError:
            continue
        if same and fields[4].isdigit():
            return f"pid {fields[4]}"
    return "another process"


def _refuse_non_regular(path: Path, mode: int | None) -> None:
    """The lock file must be absent or a regular file (never a symlink, directory, FIFO, socket or device)."""
    if mode is None or stat.S_ISREG(mode):
        return
    from miniverl.outputs import kind_of

    raise UsageError(f"{path} is {kind_of(mode)}, not the run's lock file; remove it and retry")


def _flock_holder_pid(st: os.stat_result) -> int | None:
    """The pid holding an flock on the file ``st`` describes, from the kernel's lock table (Linux); else None."""
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as table:
            lines = table.read(1 << 20).splitlines()
    except OSError:
        return None
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in lines:
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        try:
            major, minor, inode = fields[5].split(":")
            if (int(major, 16), int(minor, 16), int(inode)) == wanted:
                return int(fields[4])
        except ValueError:
            continue
    return None


def writer_pid(run_dir: Path) -> int | None:
    """The pid of the process writing ``run_dir`` now (a running ``run``, ``export``, ...), or None.

    Read from the kernel's lock table without opening, creating or locking ``RUN_DIR/.lock``, so a reader
    (``inspect``, ``report`` of a running run) never competes with the writer for it. Linux only (elsewhere
    None: the run then reads as not running).
    """
    try:
        st = os.lstat(run_dir / LOCK_NAME)
    except OSError:
        return None
    return _flock_holder_pid(st)


def acquire(run_dir: Path, *, what: str) -> bool:
    """Take the run's lock now or raise :class:`RunBusyError` naming the holder; True when newly taken.

    ``run_dir`` must exist. Never blocks.
    """
    key = run_dir.resolve()
    if key in _held:
        _held[key][1] += 1
        return False
    path = run_dir / LOCK_NAME
    _refuse_non_regular(path, os.lstat(path).st_mode if os.path.lexists(path) else None)
    flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):  # became a symlink, directory or socket
            _refuse_non_regular(path, os.lstat(path).st_mode)
        raise
    try:
        _refuse_non_regular(path, os.fstat(fd).st_mode)
    except UsageError:
        os.close(fd)
        raise
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
    os.close(entry[0])  # closing the last descriptor drops the flock


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

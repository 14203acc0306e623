"""The one output writer: every file a ``miniverl`` command writes goes through :func:`write_file`.

Before anything is created, the target is examined with ``lstat``: it must be absent or a regular file (or a
symlink to a regular file, which the rename then replaces; its target is left untouched). A character or block
device, a FIFO, a socket, a directory where a file is expected, or a symlink to any of those is refused with an
:class:`OutputTargetError` (exit 2, one line) and nothing on disk changes. An accepted target is written to a temp
file in the same directory, fsynced and renamed into place, then the directory is fsynced: the path holds either
its old bytes or all of the new ones. The check is repeated just before the rename.

Directory outputs (an export, a bundle, a checkpoint) are built in a temp directory beside the target and moved
into place by :func:`publish_dir`, which applies the same rule with "directory" in place of "regular file".
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from miniverl.errors import UsageError

Fill = Callable[[Path], object]


class OutputTargetError(UsageError):
    """An output path that exists and is not what the command writes there (a device, a FIFO, a socket...)."""


def kind_of(mode: int) -> str:
    for test, name in (
        (stat.S_ISREG, "a regular file"),
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


def _target_mode(path: Path) -> tuple[int | None, bool]:
    """``(mode of what path names, through one symlink level resolved by stat; is it a symlink)``, or
    ``(None, False)`` when nothing is there. A dangling symlink reads as ``(None, True)``."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, False
    except NotADirectoryError:
        raise OutputTargetError(
            f"{path}: a parent of this output path is not a directory; choose another path"
        ) from None
    if not stat.S_ISLNK(st.st_mode):
        return st.st_mode, False
    try:
        return os.stat(path).st_mode, True
    except (FileNotFoundError, NotADirectoryError):
        return None, True
    except OSError as exc:  # a symlink loop
        raise OutputTargetError(f"{path}: a symlink that cannot be resolved ({exc.strerror}); remove it") from None


def check_file_target(path: str | os.PathLike[str], *, what: str = "output") -> None:
    """Refuse ``path`` unless it is absent or a regular file (or a symlink to one); nothing is written."""
    target = Path(path)
    mode, link = _target_mode(target)
    if mode is None or stat.S_ISREG(mode):
        return
    through = "a symlink to " if link else ""
    fix = "give a file name inside it" if stat.S_ISDIR(mode) else "choose a regular file path"
    raise OutputTargetError(f"{target}: the {what} path is {through}{kind_of(mode)}, not a regular file; {fix}")


def check_dir_target(path: str | os.PathLike[str], *, what: str = "output") -> None:
    """Refuse ``path`` unless it is absent or a real directory (a symlink is refused: a directory is renamed)."""
    target = Path(path)
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    except NotADirectoryError:
        raise OutputTargetError(
            f"{target}: a parent of this {what} path is not a directory; choose another path"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputTargetError(
            f"{target}: the {what} directory path is {kind_of(st.st_mode)}, not a directory; choose another path"
        )


def _ensure_parent(target: Path, what: str) -> Path:
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise OutputTargetError(
            f"{target}: a parent of this {what} path is not a directory; choose another path"
        ) from None
    if not parent.is_dir():
        raise OutputTargetError(f"{target}: {parent} is not a directory; choose another path")
    return parent


def _umask_file_mode() -> int:
    umask = os.umask(0o022)  # reading the umask means setting it: put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file(path: str | os.PathLike[str], content: bytes | Fill, *, what: str = "output") -> None:
    """Write ``content`` (bytes, or a function that fills the temp path it is given) to ``path`` atomically.

    ``path`` is checked first (:func:`check_file_target`); the temp file is created beside it, fsynced, checked to
    be still a regular file, and renamed onto ``path`` after a second check of the target.
    """
    target = Path(path)
    check_file_target(target, what=what)
    parent = _ensure_parent(target, what)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name[:80]}.", suffix=".tmp", dir=parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, _umask_file_mode())  # the user's umask, as a plain open() would
        if isinstance(content, bytes | bytearray | memoryview):
            with os.fdopen(fd, "wb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
        else:
            os.close(fd)
            content(tmp)
            if not stat.S_ISREG(os.lstat(tmp).st_mode):
                raise OutputTargetError(f"{target}: the temp file was replaced while being written; try again")
            sync = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(sync)
            finally:
                os.close(sync)
        check_file_target(target, what=what)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(parent)


def publish_dir(staging: Path, target: Path, *, what: str = "output") -> None:
    """Rename the finished ``staging`` directory onto ``target`` (absent or an empty directory), after
    :func:`check_dir_target`; the parent directory is fsynced afterwards."""
    check_dir_target(target, what=what)
    os.rename(staging, target)
    fsync_dir(target.parent)


def write_safetensors(
    path: str | os.PathLike[str], tensors: Mapping[str, Any], *, metadata: dict[str, str] | None = None
) -> None:
    """A safetensors file through :func:`write_file` (``tensors`` maps names to torch tensors)."""
    from safetensors.torch import save_file

    write_file(path, lambda tmp: save_file(dict(tensors), str(tmp), metadata=metadata), what="tensor file")


def copy_file(source: Path, path: str | os.PathLike[str], *, what: str = "output") -> None:
    """A copy of the regular file ``source`` through :func:`write_file`."""
    import shutil

    write_file(path, lambda tmp: shutil.copyfile(source, tmp), what=what)


def write_files(files: Mapping[Path, bytes | Fill], *, what: str = "output") -> None:
    """Write several files of one output: every target is checked (:func:`check_file_target`) before the first
    is written, so a refusal leaves none of them half-done; each is then written by :func:`write_file`."""
    for path in files:
        check_file_target(path, what=what)
    for path, content in files.items():
        write_file(path, content, what=what)

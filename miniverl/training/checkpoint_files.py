"""Checkpoint files without tensors: names, completeness and integrity. Never imports torch."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl import bounded
from miniverl.canonical import sha256_file
from miniverl.config.strict import loads_json
from miniverl.errors import CheckpointError, UsageError
from miniverl.records import CheckpointRecord

STUDENT_PARAMS = "student_params.safetensors"
OPTIMIZER = "optimizer.safetensors"
RNG = "rng.safetensors"
STATE = "state.json"
RECORD = "checkpoint.json"
ADAPTER_DIR = "adapter"


#: how the safetensors (Rust) writer reports an I/O error: "... I/O error: File too large (os error 27)"
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def as_os_error(exc: BaseException, path: Path | None = None) -> OSError | None:
    """The :class:`OSError` behind a safetensors write error (EFBIG, ENOSPC, EROFS, ...), naming ``path``.

    safetensors raises its own ``SafetensorError`` for a failed write; as an OSError it gets the CLI's one line
    that says what to free or fix, instead of an internal error.
    """
    if isinstance(exc, OSError):
        return None
    found = _RUST_OS_ERROR.search(str(exc))
    if found is None:
        return None
    code = int(found.group(1))
    if code not in errno.errorcode:
        return None
    if path is None:
        return OSError(code, os.strerror(code))
    return OSError(code, os.strerror(code), os.fspath(path))


def step_dir_name(step: int) -> str:
    return f"step-{step:06d}"


#: ``state.json`` carries every metrics line of the run so far, so it is bounded like ``metrics.jsonl``
STATE_MAX_BYTES = bounded.METRICS_MAX_BYTES


class CheckpointSymlinkError(UsageError):
    """``RUN/checkpoints`` or one of its step directories is a symlink: writes and prunes would leave the run."""


def _refuse_symlink(path: Path) -> None:
    if path.is_symlink():
        raise CheckpointSymlinkError(
            f"{path} is a symlink; a run's checkpoints must lie inside its run directory: "
            "replace the link with the directory it points to, then retry"
        )


def list_checkpoints(checkpoints_root: Path) -> list[Path]:
    """The ``step-*`` directories, oldest first; a symlink among them (or as the root) is refused, never
    followed: a resume would train from, and a prune delete in, a directory that is not the run's."""
    _refuse_symlink(checkpoints_root)
    if not checkpoints_root.is_dir():
        return []
    steps = sorted(p for p in checkpoints_root.iterdir() if p.name.startswith("step-"))
    for path in steps:
        _refuse_symlink(path)
    return [p for p in steps if p.is_dir()]


def read_checkpoint_json(path: Path, *, limit: int, what: str) -> object:
    """A JSON file of a checkpoint, read through :mod:`miniverl.bounded` (regular, not a symlink, size-capped).

    A FIFO, a device, a symlink, a directory or an oversized file is an :class:`~miniverl.bounded.InputBoundError`
    (exit 2); a missing one a :class:`FileNotFoundError`; text that is not JSON a :class:`ValueError`.
    """
    try:
        text = bounded.read_text(path, limit=limit, what=what, nofollow=True)
    except IsADirectoryError:
        raise bounded.InputBoundError(f"{path}: {what} must be a regular file; this is a directory") from None
    return loads_json(text)  # a UnicodeDecodeError is a ValueError too


def prune_checkpoints(checkpoints_root: Path, keep_last: int) -> list[str]:
    """Remove all but the newest ``keep_last`` checkpoints; the names removed (a kill may cut a prune short,
    so a resume prunes again)."""
    import shutil

    removed = []
    for old in list_checkpoints(checkpoints_root)[:-keep_last]:
        shutil.rmtree(old)
        removed.append(old.name)
    return removed


def verify_checkpoint(directory: Path) -> CheckpointRecord:
    """Refuse a partial or corrupt checkpoint with a message that names the problem."""
    record_path = directory / RECORD
    try:
        raw = read_checkpoint_json(record_path, limit=bounded.PLAN_MAX_BYTES, what="a checkpoint record")
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {directory.name} is partial (no {RECORD}); remove it to resume") from None
    except ValueError:
        raise CheckpointError(f"checkpoint {directory.name}: {RECORD} is corrupt") from None
    try:
        record = CheckpointRecord.model_validate(raw)
    except ValidationError:
        raise CheckpointError(f"checkpoint {directory.name}: {RECORD} is corrupt") from None
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {RECORD}
    if present != set(record.files):
        raise CheckpointError(f"checkpoint {directory.name}: files differ from {RECORD}")
    for name, expected in record.files.items():
        path = directory / name
        if path.is_symlink() or path.stat().st_size != expected.bytes or sha256_file(path) != expected.sha256:
            raise CheckpointError(f"checkpoint {directory.name} is corrupt: {name} does not match its sha256")
    _cross_check(directory, record)
    return record


def trajectory_file_name(step: int) -> str:
    """The trajectories of the update that makes ``step`` (1-based), under ``RUN_DIR/trajectories/``."""
    return f"cycle-{step:06d}.jsonl"


def _cross_check(directory: Path, record: CheckpointRecord) -> None:
    """The record's metadata agrees with itself, its directory name and its own ``state.json``.

    Each file's sha256 is already checked, so what is left is a hand-edited ``checkpoint.json`` whose
    counters no longer describe the checkpoint (e.g. a changed ``step``).
    """
    where = f"checkpoint {directory.name} is invalid:"
    if directory.name != step_dir_name(record.step):
        raise CheckpointError(f"{where} {RECORD} says step {record.step}; was it edited? remove the checkpoint")
    if record.cycle != record.step or record.policy_version != record.step or record.metrics_lines != record.step:
        raise CheckpointError(f"{where} step, cycle, policy_version and metrics_lines in {RECORD} disagree")
    if set(record.trajectories) != {trajectory_file_name(k) for k in range(1, record.step + 1)}:
        raise CheckpointError(f"{where} {RECORD} does not bind one trajectory file per update")
    try:
        state: Any = read_checkpoint_json(directory / STATE, limit=STATE_MAX_BYTES, what="a checkpoint state")
        steps = [int(line["step"]) for line in state["extra"]["metrics"]]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{where} {STATE} holds no metrics lines") from None
    if steps != list(range(1, record.step + 1)):
        raise CheckpointError(f"{where} {STATE} holds {len(steps)} metrics line(s) for step {record.step}")


def latest_checkpoint(checkpoints_root: Path) -> tuple[Path, CheckpointRecord] | None:
    candidates = list_checkpoints(checkpoints_root)
    if not candidates:
        return None
    latest = candidates[-1]
    return latest, verify_checkpoint(latest)


def checkpoint_status(checkpoints_root: Path) -> list[dict[str, Any]]:
    """Every ``step-*`` directory with its state (complete / partial / corrupt) and the reason."""
    report: list[dict[str, Any]] = []
    for directory in list_checkpoints(checkpoints_root):
        try:
            record = verify_checkpoint(directory)
        except (CheckpointError, bounded.InputBoundError) as exc:
            state = "partial" if not (directory / RECORD).is_file() else "corrupt"
            report.append({"name": directory.name, "step": None, "state": state, "reason": str(exc)})
        else:
            report.append({"name": directory.name, "step": record.step, "state": "complete", "reason": None})
    return report

"""Reading a run directory: its plan, manifest, summary, metrics and checkpoints.

Its lifecycle (a fresh run's claim, ``--resume``, ``--resume --extend N``, the settling of a completed run) is
:mod:`miniverl.artifacts.rundir.lifecycle`.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl import bounded
from miniverl.artifacts.runlock import LOCK_NAME
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError
from miniverl.outputs import OutputTargetError, check_file_target, kind_of
from miniverl.records import MetricsLine, PlanRecord, RunManifest, RunSummary

#: Longest run id: it becomes a directory name, and names past 255 bytes fail on most file systems.
MAX_RUN_ID = 128
RUN_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _read_json(path: Path) -> Any:
    try:
        return loads_json(bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="a run record"))
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; a run record must be a JSON file") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text") from None
    except StrictFormatError as exc:
        raise UsageError(f"{path} is refused: {exc}") from None


def read_jsonl_text(path: Path) -> str | None:
    """The text of a run's JSONL file (bounded, regular, UTF-8), or None when there is none yet."""
    try:
        return bounded.read_text(path, limit=bounded.METRICS_MAX_BYTES, what="a JSONL log")
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise UsageError(f"{path} is a directory; it must be a JSONL file (one JSON object per line)") from None
    except UnicodeDecodeError:
        raise UsageError(f"{path} is not UTF-8 text; it must be a JSONL file (one JSON object per line)") from None


def check_run_id(run_id: str) -> None:
    """A run id is a plain directory name: 1..128 of letters, digits, '-', '_', '.' (no leading '.')."""
    if not run_id or not set(run_id) <= RUN_ID_CHARS or run_id.startswith("."):
        raise UsageError(f"--run-id {run_id[:40]!r} may only use letters, digits, '-', '_' and '.'")
    if len(run_id) > MAX_RUN_ID:
        raise UsageError(f"--run-id is {len(run_id)} characters long; use at most {MAX_RUN_ID}")


def check_writable_dir(path: Path, *, option: str, shown: Path | None = None) -> None:
    """``path`` is, or can be created as, a directory we may write in (checked without writing).

    ``shown`` is the path named in the message (default ``path``).
    """
    probe = path
    path = shown if shown is not None else path
    while not probe.exists():
        if probe.is_symlink():
            raise UsageError(f"{option} {path}: {probe} is a dangling symlink")
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        mode = probe.stat().st_mode
        kind = "a file" if stat.S_ISREG(mode) else kind_of(mode)
        raise OutputTargetError(f"{option} {path}: {probe} is {kind}, not a directory; choose another {option}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: {probe} is not writable; choose another {option}")


def check_writable_file(path: Path, *, option: str) -> None:
    """``path`` can be written as a file: absent or a regular file (``lstat``: never a device, FIFO, socket or
    directory, nor a symlink to one), and its directory is (or can be) writable. Nothing is written."""
    check_writable_dir(path.parent, option=option, shown=path)
    check_file_target(path, what=option)


def require_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        raise UsageError(f"run directory not found: {run_dir}")
    if not (run_dir / "run.json").is_file():
        raise UsageError(f"{run_dir} is not a miniverl run directory (no run.json)")


def read_manifest(run_dir: Path) -> RunManifest:
    try:
        return RunManifest.model_validate(_read_json(run_dir / "run.json"))
    except ValidationError:
        raise UsageError(f"{run_dir / 'run.json'} does not match the run manifest schema") from None


def read_plan(run_dir: Path) -> PlanRecord:
    """The run's ``plan.json``, schema-checked and its ``plan_digest`` recomputed: an edited plan is refused."""
    from miniverl.canonical import sha256_json

    try:
        raw = _read_json(run_dir / "plan.json")
        plan = PlanRecord.model_validate(raw)
    except (ValidationError, FileNotFoundError):
        raise UsageError(f"{run_dir} has no valid plan.json") from None
    if sha256_json({k: v for k, v in raw.items() if k != "plan_digest"}) != plan.plan_digest:
        raise UsageError(
            f"{run_dir / 'plan.json'} was modified after `miniverl plan` (its plan_digest does not verify); "
            "restore it from the plan the run was started with"
        )
    return plan


def read_summary(run_dir: Path) -> RunSummary | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        return RunSummary.model_validate(_read_json(path))
    except ValidationError:
        raise UsageError(f"{path} does not match the run summary schema") from None


def finished_lines(content: str, *, live: bool) -> list[str]:
    """The lines of a JSONL text; ``live`` (a writer is appending now): an unterminated last line is one
    still being written, and is left out rather than read half-way."""
    lines = content.splitlines()
    if live and lines and not content.endswith("\n"):
        lines.pop()
    return lines


def read_metrics(run_dir: Path, *, live: bool = False) -> list[MetricsLine]:
    path = run_dir / "metrics.jsonl"
    content = read_jsonl_text(path)
    if content is None:
        return []
    lines = []
    for number, text in enumerate(finished_lines(content, live=live), start=1):
        if text.strip():
            try:
                lines.append(MetricsLine.model_validate(loads_json(text)))
            except (ValidationError, StrictFormatError):
                raise UsageError(f"{path} line {number} does not match the metrics schema") from None
    return lines


def completed_run(run_dir: Path, plan_digest: str) -> RunSummary | None:
    """The summary of ``run_dir`` when it is a completed run of this plan (so ``--resume`` has nothing to do).

    Completed means: ``summary.json`` says completed for this plan, and the last checkpoint verifies
    (every file's sha256) at the summary's final step. A corrupt checkpoint raises CheckpointError.
    """
    if not (run_dir / "run.json").is_file():
        return None
    summary = read_summary(run_dir)
    if summary is None or summary.status != "completed" or summary.plan_digest != plan_digest:
        return None
    from miniverl.training.checkpoint_files import latest_checkpoint

    found = latest_checkpoint(run_dir / "checkpoints")  # a corrupt last checkpoint is an error, not a no-op
    if found is None or found[1].step != summary.updates or found[1].plan_digest != plan_digest:
        return None
    return summary


def another_plan(what: str, run_dir: Path) -> str:
    """The refusal of ``--resume`` with a plan that is not the run's: what to type instead."""
    return (
        f"{what} belongs to another plan (the config, an override or the data changed since the run started); "
        f"continue the run with its own plan (`--plan {run_dir / 'plan.json'} --resume`, plus `--extend N` "
        "for N more cycles), or start the new plan under another --run-id"
    )


#: What a run directory holds before its first checkpoint (a run killed then may be restarted from step 0).
RUN_OUTPUTS = frozenset({"plan.json", "run.json", "metrics.jsonl", "trajectories", "checkpoints"})


def restart_unstarted_run(run_dir: Path, plan_digest: str) -> None:
    """Remove a run directory that was killed before its first checkpoint, so the run starts again at step 0.

    Only miniverl's own outputs are removed, and only for the same plan; anything else is refused.
    """
    from miniverl.errors import CheckpointError

    names = {
        p.name
        for p in run_dir.iterdir()
        if not (p.name.startswith(".") and p.name.endswith(".tmp")) and p.name != LOCK_NAME
    }
    strange = sorted(names - RUN_OUTPUTS)
    if strange:
        raise UsageError(f"{run_dir} is not a miniverl run directory ({strange[0]} is not a run output)")
    leftovers = [p.name for p in (run_dir / "checkpoints").iterdir()] if (run_dir / "checkpoints").is_dir() else []
    if any(not name.startswith(".tmp-") for name in leftovers):
        raise CheckpointError(f"{run_dir}/checkpoints holds something other than checkpoints; remove it to resume")
    for record_name in ("run.json", "plan.json"):
        if (run_dir / record_name).is_file():
            try:
                digest = _read_json(run_dir / record_name).get("plan_digest")
            except (UsageError, AttributeError):
                digest = None  # a plan.json cut short by the kill: it was being copied from this plan
            if digest is not None and digest != plan_digest:
                raise UsageError(another_plan(str(run_dir), run_dir))
    for path in run_dir.iterdir():  # every entry is what the run writes there, checked before any is removed
        if path.name != LOCK_NAME:
            _own_output(path, directory=path.name in {"trajectories", "checkpoints"})
    clear_run_outputs(run_dir)


def clear_run_outputs(run_dir: Path) -> None:
    """Remove everything in ``run_dir`` but its lock file (held by this process: the directory stays claimed)."""
    for path in sorted(run_dir.iterdir()):
        if path.name == LOCK_NAME:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _own_output(path: Path, *, directory: bool) -> bool:
    """Whether ``path`` exists as what the run itself writes there (``lstat``: a real directory or a regular file,
    never a symlink); a :class:`UsageError` naming it when it exists as anything else. Nothing is removed."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return False
    if (stat.S_ISDIR if directory else stat.S_ISREG)(mode):
        return True
    expected = "a directory" if directory else "a regular file"
    raise UsageError(
        f"{path} is {kind_of(mode)}, not {expected} this run wrote; remove it and resume (the checkpoint restores it)"
    )


def roll_back_outputs(run_dir: Path, metrics_text: str, trajectories: dict[str, str], checkpoint: str) -> None:
    """Make ``metrics.jsonl`` and ``trajectories/`` exactly what ``checkpoint`` commits (the resume point).

    Lines and files of later, uncommitted updates are dropped; a committed trajectory file that is
    missing or changed is refused, since the checkpoint can no longer vouch for it. Everything this would remove
    or replace is checked first (``lstat``: a regular file or a real directory of the expected kind, never a
    symlink, a FIFO or a device): anything else is refused before a single file is deleted.
    """
    from miniverl.canonical import atomic_write_text, sha256_file
    from miniverl.errors import CheckpointError

    folder = run_dir / "trajectories"
    extra: list[Path] = []
    if _own_output(folder, directory=True):
        for path in sorted(folder.iterdir()):
            _own_output(path, directory=False)
            if path.name not in trajectories:
                extra.append(path)
    for name, digest in sorted(trajectories.items()):
        path = folder / name
        if not path.is_file() or path.is_symlink() or sha256_file(path) != digest:
            raise CheckpointError(f"trajectories/{name} differs from what checkpoint {checkpoint} commits")
    metrics = run_dir / "metrics.jsonl"
    kept: str | None = None
    if _own_output(metrics, directory=False):
        try:
            kept = bounded.read_text(metrics, limit=bounded.METRICS_MAX_BYTES, what="a JSONL log", nofollow=True)
        except (bounded.InputBoundError, UnicodeDecodeError):
            kept = None  # not the committed text, whatever it is: replaced below
    # temp files of writes a kill cut short (atomic_write_* and write_checkpoint): never published, safe to drop
    temp_files = sorted(run_dir.glob(".*.tmp"))
    for path in temp_files:
        _own_output(path, directory=False)
    checkpoints = run_dir / "checkpoints"
    temp_dirs = sorted(checkpoints.glob(".tmp-*")) if _own_output(checkpoints, directory=True) else []
    for path in temp_dirs:
        _own_output(path, directory=True)
    for path in extra:
        path.unlink()
    if kept != metrics_text:
        atomic_write_text(metrics, metrics_text)
    for path in temp_files:
        path.unlink()
    for path in temp_dirs:
        shutil.rmtree(path)

"""Reading a run directory: its plan, manifest, summary, metrics and checkpoints."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from miniverl import bounded
from miniverl.artifacts.runlock import LOCK_NAME
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError
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
        raise UsageError(f"{option} {path}: {probe} is a file, not a directory; choose another {option}")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {path}: {probe} is not writable; choose another {option}")


def check_writable_file(path: Path, *, option: str) -> None:
    """``path`` can be written as a file: not a directory, and its directory is (or can be) writable."""
    if path.is_dir():
        raise UsageError(f"{option} {path} is a directory; give a file name")
    check_writable_dir(path.parent, option=option, shown=path)


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
    try:
        return PlanRecord.model_validate(_read_json(run_dir / "plan.json"))
    except (ValidationError, FileNotFoundError):
        raise UsageError(f"{run_dir} has no valid plan.json") from None


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


def roll_back_outputs(run_dir: Path, metrics_text: str, trajectories: dict[str, str], checkpoint: str) -> None:
    """Make ``metrics.jsonl`` and ``trajectories/`` exactly what ``checkpoint`` commits (the resume point).

    Lines and files of later, uncommitted updates are dropped; a committed trajectory file that is
    missing or changed is refused, since the checkpoint can no longer vouch for it.
    """
    from miniverl.canonical import atomic_write_text, sha256_file
    from miniverl.errors import CheckpointError

    folder = run_dir / "trajectories"
    for name, digest in sorted(trajectories.items()):
        path = folder / name
        if not path.is_file() or path.is_symlink() or sha256_file(path) != digest:
            raise CheckpointError(f"trajectories/{name} differs from what checkpoint {checkpoint} commits")
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        if path.name not in trajectories:
            path.unlink()
    metrics = run_dir / "metrics.jsonl"
    try:
        kept: str | None = bounded.read_text(
            metrics, limit=bounded.METRICS_MAX_BYTES, what="a JSONL log", nofollow=True
        )
    except IsADirectoryError:
        raise UsageError(f"{metrics} is a directory; remove it and resume (the checkpoint restores it)") from None
    except (FileNotFoundError, bounded.InputBoundError, UnicodeDecodeError):
        kept = None  # not the committed text, whatever it is: replaced below (a symlink itself, never its target)
    if kept != metrics_text:
        atomic_write_text(metrics, metrics_text)
    # temp files of writes a kill cut short (atomic_write_* and write_checkpoint): never published, safe to drop
    for path in sorted(run_dir.glob(".*.tmp")):
        path.unlink()
    for path in sorted((run_dir / "checkpoints").glob(".tmp-*")):
        shutil.rmtree(path)

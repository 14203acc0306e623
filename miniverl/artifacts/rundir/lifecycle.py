"""A run directory's lifecycle: a fresh run's claim, ``--resume``, ``--resume --extend N``, and the settling of a
completed run. Every check here is recomputed from the files (plan digests, checkpoint counters), never trusted.

One writer per run directory: a fresh run claims it by creating it (``mkdir``), then every writer holds its
``.lock`` (:mod:`miniverl.artifacts.runlock`) before it reads a checkpoint or changes any file.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miniverl import bounded
from miniverl import progress as progress_log
from miniverl.artifacts import runlock
from miniverl.artifacts.rundir import another_plan, read_manifest, read_plan, restart_unstarted_run
from miniverl.canonical import atomic_write_bytes, atomic_write_json
from miniverl.config.plan import extend_plan, load_plan, plan_ancestry
from miniverl.config.schema import MiniverlConfig
from miniverl.errors import CheckpointError, UsageError
from miniverl.records import PlanRecord

#: previous versions of an extended run's plan, one ``<plan_digest>.json`` each
PLANS_DIR = "plans"


@contextlib.contextmanager
def claimed_fresh_run(run_dir: Path) -> Iterator[None]:
    """Claim ``run_dir`` for a fresh run and hold its lock for the block; a block that fails before the run wrote
    anything leaves no directory behind (as if never run)."""
    try:
        run_dir.mkdir()  # the atomic claim: of two fresh runs exactly one creates it
    except FileExistsError:
        raise UsageError(f"run directory {run_dir} already exists; use --resume or another --run-id") from None
    locked = False
    try:
        # a --resume may lock it between our mkdir and our lock: then the directory is that writer's, and
        # this run stops here (exit 2) without touching it
        locked = runlock.acquire(run_dir, what="the run")
        yield
    except BaseException:
        if locked and not any(p.name != runlock.LOCK_NAME for p in run_dir.iterdir()):
            shutil.rmtree(run_dir, ignore_errors=True)  # ours (we created it), and empty: as if never run
        raise
    finally:
        if locked:
            runlock.release(run_dir)


def resume_point(run_dir: Path, plan: PlanRecord, config: MiniverlConfig, plan_path: Path) -> Any:
    """The checkpoint ``--resume`` continues from, verified against ``plan`` (``(path, record)``), or None when the
    run was killed before its first checkpoint (its outputs are then cleared: it starts again at step 0).
    The caller holds the run's lock."""
    from miniverl.training.checkpoint_files import latest_checkpoint

    found = latest_checkpoint(run_dir / "checkpoints")
    if found is None:  # killed before its first checkpoint: start again at step 0
        restart_unstarted_run(run_dir, plan.plan_digest)
        return None
    if found[1].plan_digest not in plan_ancestry(plan, run_dir / PLANS_DIR):
        if (run_dir / "plan.json").is_file() and read_plan(run_dir).lineage:
            raise UsageError(
                f"checkpoint {found[0].name} belongs to another plan: this run was extended; "
                f"resume with --plan {run_dir / 'plan.json'}"
            )
        raise UsageError(another_plan(f"checkpoint {found[0].name}", run_dir))
    verify_resume_point(found[0].name, found[1], plan, config)
    _verify_checkpoint_config(found[0].name, found[1], plan, run_dir)
    check_run_records(run_dir, plan, plan_path, config)
    return found


def verify_resume_point(name: str, record: Any, plan: PlanRecord, config: MiniverlConfig) -> None:
    """The checkpoint's counters are what the plan derives for its step, never taken on trust.

    ``cycle`` and ``policy_version`` equal ``step`` (each cycle is one update), and ``data_cursor`` is
    ``step x rollout.prompts_per_cycle``; a hand-edited ``checkpoint.json`` would otherwise train on
    other prompts or past the plan.
    """
    step = record.step
    where = f"checkpoint {name} does not match the plan:"
    if step > plan.updates:
        raise UsageError(f"{where} it is at step {step}, past the plan's {plan.updates} update(s)")
    if record.cycle != step or record.policy_version != step:
        raise UsageError(f"{where} cycle {record.cycle} and policy_version {record.policy_version} at step {step}")
    cursor = step * config.rollout.prompts_per_cycle
    if record.data_cursor != cursor:
        raise UsageError(
            f"{where} data_cursor is {record.data_cursor}, the plan gives {cursor} after {step} update(s); "
            "was checkpoint.json edited?"
        )


def _verify_checkpoint_config(name: str, record: Any, plan: PlanRecord, run_dir: Path) -> None:
    """The checkpoint's ``config_digest`` is the one of the plan it names (recomputed, never trusted)."""
    if record.plan_digest == plan.plan_digest:
        expected = plan.config_digest
    else:  # an ancestor of an extended plan: its file is kept and verified by plan_ancestry
        expected = load_plan(run_dir / PLANS_DIR / f"{record.plan_digest}.json", verify_data=False)[0].config_digest
    if record.config_digest != expected:
        raise UsageError(
            f"checkpoint {name} does not match the plan: its config_digest {record.config_digest[:16]} is not its "
            f"plan's {expected[:16]}; was checkpoint.json edited? Remove that checkpoint to resume from the one before"
        )


def _check_manifest_fields(manifest_path: Path, manifest: Any, root: PlanRecord, config: MiniverlConfig) -> None:
    """Every field of ``run.json`` that the plan determines is recomputed and compared (``roles`` come from the
    loaded runtime, ``miniverl_version`` from the writer)."""
    expected = {
        "plan_digest": root.plan_digest,
        "config_digest": root.config_digest,
        "data_sha256": root.data.sha256,
        "algorithm": config.algorithm.name,
        "runtime": config.models.runtime,
        "models": root.models,
    }
    for field, value in expected.items():
        if getattr(manifest, field) != value:
            raise UsageError(
                f"{manifest_path}: {field} is not what the plan gives ({str(value)[:40]!r}); it was edited: "
                "remove it and resume to have it rebuilt"
            )


def check_run_records(run_dir: Path, plan: PlanRecord, plan_path: Path, config: MiniverlConfig | None = None) -> None:
    """``plan.json`` and ``run.json`` still describe the run being resumed.

    A missing ``plan.json`` is restored from ``--plan`` (its digest is proven against the checkpoint by
    the caller); a missing ``run.json`` is rebuilt by :func:`~miniverl.training.entry.run_from_plan` once the
    runtime is loaded. Either one present but of another plan (edited, or swapped) is refused: the checkpoint
    cannot vouch for it.
    """
    current = run_dir / "plan.json"
    if current.is_symlink() or (current.exists() and not current.is_file()):
        raise UsageError(f"{current} is not a regular file; remove it and resume to have it restored")
    if current.is_file():
        try:
            kept, _ = load_plan(current, verify_data=False)
        except UsageError:
            raise UsageError(
                f"{current} was modified (its plan_digest does not verify); remove it and resume "
                f"with --plan {plan_path} to have it restored"
            ) from None
        if kept.plan_digest != plan.plan_digest:
            raise UsageError(
                f"{current} is plan {kept.plan_digest[:16]}, not the resumed plan {plan.plan_digest[:16]}; "
                f"resume with --plan {current} if it is this run's own plan"
            )
    else:
        atomic_write_bytes(current, bounded.read_bytes(plan_path, limit=bounded.PLAN_MAX_BYTES, what="a plan"))
        progress_log.phase("restore", f"{current} from --plan {plan_path} (plan {plan.plan_digest[:16]})")
    manifest_path = run_dir / "run.json"
    if manifest_path.is_symlink() or (manifest_path.exists() and not manifest_path.is_file()):
        raise UsageError(f"{manifest_path} is not a regular file; remove it and resume to have it rebuilt")
    if manifest_path.is_file():
        manifest = read_manifest(run_dir)
        if manifest.plan_digest not in plan_ancestry(plan, run_dir / PLANS_DIR) or manifest.run_id != run_dir.name:
            raise UsageError(
                f"{manifest_path} names plan {manifest.plan_digest[:16]} and run {manifest.run_id!r}, "
                f"not this run; remove it and resume to have it rebuilt"
            )
        if config is not None:
            _check_manifest_fields(manifest_path, manifest, root_plan(plan, run_dir), config)


def root_plan(plan: PlanRecord, run_dir: Path) -> PlanRecord:
    """The plan the run started with (``run.json`` describes it): the end of ``plan``'s lineage."""
    if not plan.lineage:
        return plan
    root = plan.lineage[0].previous_plan_digest
    return load_plan(run_dir / PLANS_DIR / f"{root}.json", verify_data=False)[0]


#: an extension's target, written (fsynced) before any of its work and removed when the run reaches it
EXTENSION = "extension.json"


class ExtensionTarget(BaseModel):
    """``RUN_DIR/extension.json``: the unfinished ``--extend`` (cycles before -> after, plans by digest)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["miniverl.extension"] = "miniverl.extension"
    added_cycles: int = Field(ge=1)
    from_cycles: int = Field(ge=1)
    to_cycles: int = Field(ge=2)
    from_plan_digest: str
    to_plan_digest: str


def _read_extension(run_dir: Path) -> ExtensionTarget | None:
    path = run_dir / EXTENSION
    if not path.exists() and not path.is_symlink():
        return None
    from miniverl.config.strict import loads_json

    try:
        if path.is_symlink() or not path.is_file():
            raise ValueError("not a regular file")
        text = bounded.read_text(path, limit=bounded.PLAN_MAX_BYTES, what="an extension target", nofollow=True)
        return ExtensionTarget.model_validate(loads_json(text))
    except (ValueError, ValidationError, UnicodeDecodeError):
        raise UsageError(f"{path} is unreadable; it records an unfinished --extend: restore it or remove it") from None


def extend_run(plan_path: Path, run_dir: Path, added: int) -> Path:
    """Record ``added`` more cycles in ``run_dir/plan.json``; return that path (the plan to resume with).

    ``plan_path`` must be the run's current plan. The plan it extends is kept byte for byte as
    ``run_dir/plans/<digest>.json`` (written, fsynced, before ``plan.json`` is replaced), and the
    new plan's ``lineage`` names it by digest, so :func:`~miniverl.config.plan.plan_ancestry` can
    prove the chain when the run resumes.

    Idempotent: the target (:class:`ExtensionTarget`) is written durably before anything else, so a
    retry of the same command after a kill completes that target instead of adding ``added`` again,
    and another ``--extend`` is refused until it is reached.
    """
    from miniverl.training.checkpoint_files import latest_checkpoint

    current_path = run_dir / "plan.json"
    target = _read_extension(run_dir)
    given, _ = load_plan(plan_path)
    if target is not None:
        if added != target.added_cycles:
            raise UsageError(
                f"{run_dir} has an unfinished extension from {target.from_cycles} to {target.to_cycles} cycles; "
                f"finish it with --extend {target.added_cycles} (or --resume without --extend) first"
            )
        if given.plan_digest not in (target.from_plan_digest, target.to_plan_digest):
            raise UsageError(
                f"--plan {plan_path} is neither the plan of {run_dir}'s unfinished extension nor the plan it "
                f"extends; extend with --plan {current_path}"
            )
    if not current_path.is_file():
        raise UsageError(f"nothing to extend: {run_dir} is not a run directory with a plan.json")
    current, current_config = load_plan(current_path)
    if target is not None and current.plan_digest == target.to_plan_digest:
        progress_log.phase("extend", f"completing the extension to {target.to_cycles} cycles")
        return current_path  # the retry of a killed extension: plan.json already records its target
    if given.plan_digest != current.plan_digest:
        raise UsageError(
            f"--plan {plan_path} is not the current plan of {run_dir} (plan_digest differs); "
            f"extend with --plan {current_path}"
        )
    found = latest_checkpoint(run_dir / "checkpoints")
    if found is None:
        raise UsageError(f"nothing to extend: {run_dir} has no checkpoint; run it (or --resume it) first")
    plan_ancestry(current, run_dir / PLANS_DIR)  # an earlier extension must still prove out
    verify_resume_point(found[0].name, found[1], current, current_config)  # refuse before changing anything
    extended = extend_plan(current, added)
    if target is None:
        target = ExtensionTarget(
            added_cycles=added,
            from_cycles=current.cycles,
            to_cycles=extended.cycles,
            from_plan_digest=current.plan_digest,
            to_plan_digest=extended.plan_digest,
        )
        atomic_write_json(run_dir / EXTENSION, target.model_dump(mode="json"), pretty=True)
    elif target.to_plan_digest != extended.plan_digest:
        raise UsageError(f"{run_dir / EXTENSION} does not match {current_path} extended by {added}; remove it")
    kept = run_dir / PLANS_DIR / f"{current.plan_digest}.json"
    if not kept.is_file():
        kept.parent.mkdir(exist_ok=True)
        atomic_write_bytes(kept, bounded.read_bytes(current_path, limit=bounded.PLAN_MAX_BYTES, what="a plan"))
    atomic_write_json(current_path, extended.model_dump(mode="json"), pretty=True)
    progress_log.phase("extend", f"plan {current.plan_digest[:16]} + {added} cycle(s) -> {extended.plan_digest[:16]}")
    return current_path


def finish_extension(run_dir: Path, completed_plan_digest: str) -> None:
    """The run completed ``completed_plan_digest``: an extension whose target that is, is done."""
    target = _read_extension(run_dir)
    if target is not None and target.to_plan_digest == completed_plan_digest:
        (run_dir / EXTENSION).unlink()
        fd = os.open(run_dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def settle_completed_run(run_dir: Path, plan: PlanRecord, config: MiniverlConfig, plan_path: Path) -> None:
    """``--resume`` of a completed run: verify it as a resume would, and finish what a kill cut short after
    the final checkpoint (its prune, a deleted ``plan.json``, the extension marker); otherwise change no file.
    The caller holds the run's lock."""
    from miniverl.training.checkpoint_files import latest_checkpoint, prune_checkpoints

    found = latest_checkpoint(run_dir / "checkpoints")
    if found is None:  # completed_run checked it: only a concurrent change could get here, and we hold the lock
        raise CheckpointError(f"{run_dir} lost its checkpoints")
    verify_resume_point(found[0].name, found[1], plan, config)
    _verify_checkpoint_config(found[0].name, found[1], plan, run_dir)
    check_run_records(run_dir, plan, plan_path, config)
    removed = prune_checkpoints(run_dir / "checkpoints", config.checkpoint.keep_last)
    if removed:
        progress_log.phase("prune", f"removed {', '.join(removed)} (a kill cut the final prune short)")
    finish_extension(run_dir, plan.plan_digest)

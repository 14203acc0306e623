"""``miniverl run``: verify the plan, prepare the run directory, build the runtime, train, tear down."""

from __future__ import annotations

import contextlib
import gc
import os
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from miniverl import __version__, bounded
from miniverl import progress as progress_log
from miniverl.artifacts import runlock
from miniverl.artifacts.rundir import another_plan, clear_run_outputs, read_plan
from miniverl.canonical import atomic_write_bytes, atomic_write_json
from miniverl.config.plan import load_plan
from miniverl.config.schema import MiniverlConfig
from miniverl.errors import CheckpointError, DependencyError, UsageError
from miniverl.records import CudaTeardown, MetricsLine, PlanRecord, RunManifest, RunSummary

# Teardown passes when allocated memory is back within max(2 MiB, 2 % of the baseline) of the baseline.
TEARDOWN_TOLERANCE_MIN_BYTES = 2 * 1024 * 1024
TEARDOWN_TOLERANCE_FRACTION = 0.02
#: previous versions of an extended run's plan, one ``<plan_digest>.json`` each
PLANS_DIR = "plans"
RUN_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


def _check_run_id(run_id: str) -> None:
    if not run_id or not set(run_id) <= RUN_ID_CHARS or run_id.startswith("."):
        raise UsageError(f"--run-id {run_id!r} may only use letters, digits, '-', '_' and '.'")


def run_from_plan(
    plan_path: Path,
    *,
    output: Path,
    run_id: str,
    dry_run: bool = False,
    resume: bool = False,
    extend: int = 0,
    progress: bool = False,
    on_update: Any = None,
    on_phase: Any = None,
) -> dict[str, Any]:
    """``on_update(step)`` after each update and ``on_phase(name, step)`` before each cycle phase
    (:data:`~miniverl.training.controller.PHASES`) are hooks for tests that interrupt a run.

    ``extend`` (with ``resume``) adds that many cycles: see :func:`_extend_run`.

    One writer per run directory: a fresh run claims it by creating it (``mkdir``), then every writer holds
    its ``.lock`` (:mod:`miniverl.artifacts.runlock`) before it reads a checkpoint or changes any file.
    """
    _check_run_id(run_id)
    if extend and not resume:
        raise UsageError("--extend N continues an existing run: add --resume")
    run_dir = output / run_id
    if resume:
        if not run_dir.is_dir():
            if extend:
                raise UsageError(f"nothing to extend: {run_dir} is not a run directory with a plan.json")
            raise UsageError(
                f"nothing to resume: run directory {run_dir} does not exist (start it: run without --resume)"
            )
        with runlock.run_writer(run_dir, what="the --resume"):
            return _resume(plan_path, run_dir, run_id, extend, progress, (on_update, on_phase))
    plan, config = load_plan(plan_path)
    from miniverl.data import load_prompts

    rows = load_prompts(plan.data.path, config.data.columns)
    if dry_run:
        if run_dir.exists():
            raise UsageError(f"run directory {run_dir} already exists; choose another --run-id")
        return {
            "status": "dry_run_ok",
            "run_dir": str(run_dir),
            "plan_digest": plan.plan_digest,
            "updates": plan.updates,
            "rows": len(rows),
            "message": f"dry run ok: plan {plan.plan_digest[:16]}, {len(rows)} prompts, {plan.updates} update(s)",
        }
    _require_torch()
    output.mkdir(parents=True, exist_ok=True)
    with _sigterm_as_interrupt() as stop:  # before the directory appears: a SIGTERM from then on cleans up
        try:
            run_dir.mkdir()  # the atomic claim: of two fresh runs exactly one creates it
        except FileExistsError:
            raise UsageError(f"run directory {run_dir} already exists; use --resume or another --run-id") from None
        locked = False
        try:
            # a --resume may lock it between our mkdir and our lock: then the directory is that writer's, and
            # this run stops here (exit 2) without touching it
            locked = runlock.acquire(run_dir, what="the run")
            hooks = _hooks((on_update, on_phase), stop)
            return _train(plan, config, plan_path, rows, run_dir, run_id, None, progress, hooks, stop)
        except BaseException:
            if locked and not any(p.name != runlock.LOCK_NAME for p in run_dir.iterdir()):
                shutil.rmtree(run_dir, ignore_errors=True)  # ours (we created it), and empty: as if never run
            raise
        finally:
            if locked:
                runlock.release(run_dir)


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DependencyError("training needs the [train] extra of the checkout or release wheel") from None


def _resume(
    plan_path: Path, run_dir: Path, run_id: str, extend: int, progress: bool, hooks: tuple[Any, Any]
) -> dict[str, Any]:
    """Resume (or extend) ``run_dir``; the caller holds its lock, so nothing here races another writer."""
    from miniverl.training.checkpoint_files import latest_checkpoint

    if extend:
        plan_path = _extend_run(plan_path, run_dir, extend)
    plan, config = load_plan(plan_path)
    from miniverl.data import load_prompts

    rows = load_prompts(plan.data.path, config.data.columns)
    found = latest_checkpoint(run_dir / "checkpoints")
    if found is None:  # killed before its first checkpoint: start again at step 0
        from miniverl.artifacts.rundir import restart_unstarted_run

        restart_unstarted_run(run_dir, plan.plan_digest)
    else:
        from miniverl.config.plan import plan_ancestry

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
    _require_torch()
    with _sigterm_as_interrupt() as stop:
        result = _train(plan, config, plan_path, rows, run_dir, run_id, found, progress, _hooks(hooks, stop), stop)
    finish_extension(run_dir, plan.plan_digest)
    return result


def _hooks(hooks: tuple[Any, Any], stop: _StopRequest) -> tuple[Any, Any]:
    on_update, on_phase = hooks

    def phase(name: str, step: int) -> None:
        stop.check()
        if on_phase is not None:
            on_phase(name, step)

    return on_update, phase


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
    the caller); a missing ``run.json`` is rebuilt by :func:`_train` once the runtime is loaded. Either
    one present but of another plan (edited, or swapped) is refused: the checkpoint cannot vouch for it.
    """
    from miniverl.config.plan import plan_ancestry

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
        from miniverl.artifacts.rundir import read_manifest

        manifest = read_manifest(run_dir)
        if manifest.plan_digest not in plan_ancestry(plan, run_dir / PLANS_DIR) or manifest.run_id != run_dir.name:
            raise UsageError(
                f"{manifest_path} names plan {manifest.plan_digest[:16]} and run {manifest.run_id!r}, "
                f"not this run; remove it and resume to have it rebuilt"
            )
        if config is not None:
            _check_manifest_fields(manifest_path, manifest, _root_plan(plan, run_dir), config)


def _root_plan(plan: PlanRecord, run_dir: Path) -> PlanRecord:
    """The plan the run started with (``run.json`` describes it): the end of ``plan``'s lineage."""
    if not plan.lineage:
        return plan
    root = plan.lineage[0].previous_plan_digest
    return load_plan(run_dir / PLANS_DIR / f"{root}.json", verify_data=False)[0]


class _StopRequest:
    """The signal a run received. The handler raises KeyboardInterrupt where the signal lands, but C code that
    clears errors (a dict lookup calling back into Python, say) can swallow it; ``check`` at each phase and after
    the model load raises it again, so a stop is never lost."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def check(self) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt(f"signal {self.signum}")


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[_StopRequest]:
    """SIGTERM stops a run as SIGINT does: a KeyboardInterrupt that unwinds every temp file and temp dir."""
    stop = _StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def interrupt(signum: int, frame: Any) -> None:
        stop.signum = signum
        raise KeyboardInterrupt(f"signal {signum}")

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def _extend_run(plan_path: Path, run_dir: Path, added: int) -> Path:
    """Record ``added`` more cycles in ``run_dir/plan.json``; return that path (the plan to resume with).

    ``plan_path`` must be the run's current plan. The plan it extends is kept byte for byte as
    ``run_dir/plans/<digest>.json`` (written, fsynced, before ``plan.json`` is replaced), and the
    new plan's ``lineage`` names it by digest, so :func:`~miniverl.config.plan.plan_ancestry` can
    prove the chain when the run resumes.

    Idempotent: the target (:class:`ExtensionTarget`) is written durably before anything else, so a
    retry of the same command after a kill completes that target instead of adding ``added`` again,
    and another ``--extend`` is refused until it is reached.
    """
    from miniverl.config.plan import extend_plan, plan_ancestry
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


def _train(
    plan: PlanRecord,
    config: MiniverlConfig,
    plan_path: Path,
    rows: list[Any],
    run_dir: Path,
    run_id: str,
    found: Any,
    progress: bool,
    hooks: tuple[Any, Any],
    stop: _StopRequest,
) -> dict[str, Any]:
    import torch

    from miniverl.models.loading import resolve_device
    from miniverl.runtime import build_runtime
    from miniverl.runtime.host_memory import peak_rss_bytes
    from miniverl.training.algorithms.base import resolve_adapter_precision
    from miniverl.training.controller import Controller
    from miniverl.training.memory import plan_memory

    fresh = found is None
    try:
        _seed_everything(config)
        device = resolve_device(config.models.device)
        cuda = device.type == "cuda"
        if config.memory.max_peak_reserved_gib is not None and not cuda:
            raise UsageError(
                "memory.max_peak_reserved_gib is enforced from CUDA's peak reserved memory, and this run is on "
                f"{device.type}; remove it for a {device.type} run"
            )
        if cuda:
            torch.cuda.synchronize(device)
            _release_library_caches(torch)
            baseline = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        started = time.perf_counter()
        progress_log.phase(
            "load", f"{config.models.runtime} runtime on {device.type} (threads {torch.get_num_threads()})"
        )
        runtime = build_runtime(
            config.models,
            device=device,
            placement=config.memory.placement,
            activation_checkpointing=_given_checkpointing(config.train.activation_checkpointing),
            critic_seed=config.algorithm.ppo.critic_head_seed,
        )
        memory_plan = plan_memory(config, runtime, rows, resolve_adapter_precision(config, device))
        if memory_plan is not None:
            progress_log.phase("memory plan", memory_plan.describe())
        elif not cuda:
            # On CPU the rollout copy is refolded every cycle anyway (the policy changed): holding it (and its KV
            # cache) through the update only adds its size to the update's peak RSS, so it is given back.
            runtime.apply_memory_plan(activation_checkpointing=0, max_tokens=None, release_rollout_engine=True)
        controller = None
        load_peaks = (
            (torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)) if cuda else (0, 0)
        )
        try:
            stop.check()
            if fresh:
                atomic_write_bytes(
                    run_dir / "plan.json", bounded.read_bytes(plan_path, limit=bounded.PLAN_MAX_BYTES, what="a plan")
                )
            if fresh or not (run_dir / "run.json").is_file():  # a resume rebuilds a deleted run.json
                root = _root_plan(plan, run_dir)
                manifest = RunManifest(
                    run_id=run_id,
                    miniverl_version=__version__,
                    plan_digest=root.plan_digest,
                    config_digest=root.config_digest,
                    data_sha256=root.data.sha256,
                    algorithm=config.algorithm.name,
                    runtime=config.models.runtime,
                    roles=dict(runtime.role_manifest()),
                    models=root.models,
                )
                atomic_write_json(run_dir / "run.json", manifest.model_dump(mode="json"), pretty=True)
            reporter = _progress_reporter(plan.updates) if progress else None
            controller = Controller(
                config,
                plan,
                runtime,
                rows,
                run_dir,
                on_update=hooks[0],
                progress=reporter,
                on_phase=hooks[1],
                load_metrics=memory_plan.metrics() if memory_plan is not None else None,
            )
            resumed_from = None
            if found is not None:
                controller.restore(found[0], found[1])
                resumed_from = found[1].step
            controller.run()
        finally:
            if cuda:
                # the controller resets the peak counters each cycle: take the largest of them all
                cycle_lines = controller.state.metrics if controller is not None else []
                reserved = [m.peak_reserved_bytes or 0 for m in cycle_lines]
                allocated = [m.peak_allocated_bytes or 0 for m in cycle_lines]
                peak_reserved = max([load_peaks[0], torch.cuda.max_memory_reserved(device), *reserved])
                peak_allocated = max([load_peaks[1], torch.cuda.max_memory_allocated(device), *allocated])
            if controller is not None:
                controller.release()
            runtime.close()
            del runtime
            gc.collect()
            if cuda:
                torch.cuda.synchronize(device)
                _release_library_caches(torch)
        wall = time.perf_counter() - started
        teardown = None
        if cuda:
            final = torch.cuda.memory_allocated(device)
            tolerance = max(TEARDOWN_TOLERANCE_MIN_BYTES, int(TEARDOWN_TOLERANCE_FRACTION * baseline))
            teardown = CudaTeardown(
                baseline_allocated_bytes=baseline,
                final_allocated_bytes=final,
                peak_reserved_bytes=peak_reserved,
                peak_allocated_bytes=peak_allocated,
                teardown_tolerance_bytes=tolerance,
                teardown_returned_to_baseline=final - baseline <= tolerance,
            )
        metrics = controller.state.metrics
        peak_rss = peak_rss_bytes()
        cycles_here = len(metrics) - (resumed_from or 0)
        summary = RunSummary(
            run_id=run_id,
            status="completed",
            algorithm=config.algorithm.name,
            runtime=config.models.runtime,
            device=device.type,
            dtype=config.models.dtype,
            quantization=config.models.student.quantization,
            cycles=len(metrics),
            updates=controller.state.step,
            resumed_from_step=resumed_from,
            reward_mean=_reward_mean(metrics),
            reward_std_within_group_max=max((m.reward_std_within_group_max or 0.0 for m in metrics), default=None),
            nonzero_advantages=sum(m.nonzero_advantages or 0 for m in metrics)
            if config.algorithm.name in ("grpo", "ppo")
            else None,
            adapter_changed_each_update=bool(metrics) and all(m.adapter_delta_norm > 0 for m in metrics),
            wall_seconds=wall,
            seconds_per_cycle=wall / cycles_here if cycles_here > 0 else None,
            cuda=teardown,
            torch_threads=torch.get_num_threads(),
            peak_rss_bytes=peak_rss,
            plan_digest=plan.plan_digest,
            model_identities=plan.models,
        )
        atomic_write_json(run_dir / "summary.json", summary.model_dump(mode="json"), pretty=True)
    except BaseException:
        if fresh and not any((run_dir / "checkpoints").glob("step-*")):
            clear_run_outputs(run_dir)
        raise
    payload = summary.model_dump(mode="json")
    return {
        "status": summary.status,
        "run_dir": str(run_dir),
        "updates": summary.updates,
        "cycles": summary.cycles,
        "summary": payload,
        "message": (
            f"run {run_id} completed: {summary.updates} update(s), reward mean "
            f"{summary.reward_mean if summary.reward_mean is not None else float('nan'):.3f}, "
            f"{wall:.1f}s on {device.type}, peak RSS {peak_rss / 1e9:.2f} GB; outputs in {run_dir}"
        ),
    }


def _given_checkpointing(value: int | str) -> int:
    """``train.activation_checkpointing`` at build time: ``auto`` starts off (a memory plan may turn it on)."""
    return value if isinstance(value, int) else 0


def _seed_everything(config: MiniverlConfig) -> None:
    import random

    import numpy as np
    import torch

    random.seed(config.run.seed)
    np.random.seed(config.run.seed % (2**32))
    torch.manual_seed(config.run.seed)
    if config.run.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def _progress_reporter(total: int) -> Any:
    from rich.console import Console

    console = Console(stderr=True)

    def report(step: int, _total: int, line: Any) -> None:
        console.print(
            f"[bold]update {step}/{total}[/bold] loss {line.loss:.4f} "
            f"reward {line.reward_mean if line.reward_mean is not None else float('nan'):.3f} "
            f"tokens {line.response_tokens} {line.cycle_seconds:.1f}s"
        )

    return report


def _release_library_caches(torch: Any) -> None:
    """cuBLAS workspaces live in the caching allocator: free them (and cached blocks) around a run."""
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()


def _reward_mean(metrics: list[MetricsLine]) -> float | None:
    """Mean reward over every trajectory of the run (each update's mean weighted by its trajectories)."""
    total = sum(m.trajectories for m in metrics)
    if total == 0 or all(m.reward_mean is None for m in metrics):
        return None  # nothing was scored (SFT / KD)
    return sum((m.reward_mean or 0.0) * m.trajectories for m in metrics) / total


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

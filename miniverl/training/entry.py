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
from typing import Any

from miniverl import __version__
from miniverl import progress as progress_log
from miniverl.artifacts.rundir import read_plan
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

    ``extend`` (with ``resume``) adds that many cycles: see :func:`_extend_run`."""
    _check_run_id(run_id)
    if extend:
        if not resume:
            raise UsageError("--extend N continues an existing run: add --resume")
        plan_path = _extend_run(plan_path, output / run_id, extend)
    plan, config = load_plan(plan_path)
    from miniverl.data import load_prompts

    rows = load_prompts(plan.data.path)
    run_dir = output / run_id
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
    if resume:
        from miniverl.training.checkpoint_files import latest_checkpoint

        if not run_dir.is_dir():
            raise CheckpointError(f"nothing to resume: run directory {run_dir} does not exist")
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
                raise CheckpointError(f"checkpoint {found[0].name} belongs to another plan; resume with the same plan")
    elif run_dir.exists():
        raise UsageError(f"run directory {run_dir} already exists; use --resume or another --run-id")
    else:
        found = None
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DependencyError("training needs the [train] extra of the checkout or release wheel") from None
    with _sigterm_as_interrupt() as stop:

        def phase(name: str, step: int) -> None:
            stop.check()
            if on_phase is not None:
                on_phase(name, step)

        return _train(plan, config, plan_path, rows, run_dir, run_id, found, progress, (on_update, phase), stop)


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


def _extend_run(plan_path: Path, run_dir: Path, added: int) -> Path:
    """Record ``added`` more cycles in ``run_dir/plan.json``; return that path (the plan to resume with).

    ``plan_path`` must be the run's current plan. The plan it extends is kept byte for byte as
    ``run_dir/plans/<digest>.json`` (written, fsynced, before ``plan.json`` is replaced), and the
    new plan's ``lineage`` names it by digest, so :func:`~miniverl.config.plan.plan_ancestry` can
    prove the chain when the run resumes.
    """
    from miniverl.config.plan import extend_plan, plan_ancestry
    from miniverl.training.checkpoint_files import latest_checkpoint

    current_path = run_dir / "plan.json"
    if not current_path.is_file():
        raise UsageError(f"nothing to extend: {run_dir} is not a run directory with a plan.json")
    given, _ = load_plan(plan_path)
    current, _ = load_plan(current_path)
    if given.plan_digest != current.plan_digest:
        raise UsageError(
            f"--plan {plan_path} is not the current plan of {run_dir} (plan_digest differs); "
            f"extend with --plan {current_path}"
        )
    if latest_checkpoint(run_dir / "checkpoints") is None:
        raise UsageError(f"nothing to extend: {run_dir} has no checkpoint; run it (or --resume it) first")
    plan_ancestry(current, run_dir / PLANS_DIR)  # an earlier extension must still prove out
    extended = extend_plan(current, added)
    kept = run_dir / PLANS_DIR / f"{current.plan_digest}.json"
    if not kept.is_file():
        kept.parent.mkdir(exist_ok=True)
        atomic_write_bytes(kept, current_path.read_bytes())
    atomic_write_json(current_path, extended.model_dump(mode="json"), pretty=True)
    progress_log.phase("extend", f"plan {current.plan_digest[:16]} + {added} cycle(s) -> {extended.plan_digest[:16]}")
    return current_path


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
    from miniverl.training.controller import Controller

    fresh = found is None
    if fresh:
        run_dir.mkdir(parents=True)
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
            activation_checkpointing=config.train.activation_checkpointing,
            critic_seed=config.algorithm.ppo.critic_head_seed,
        )
        controller = None
        load_peaks = (
            (torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)) if cuda else (0, 0)
        )
        try:
            stop.check()
            if fresh:
                atomic_write_bytes(run_dir / "plan.json", plan_path.read_bytes())
                manifest = RunManifest(
                    run_id=run_id,
                    miniverl_version=__version__,
                    plan_digest=plan.plan_digest,
                    config_digest=plan.config_digest,
                    data_sha256=plan.data.sha256,
                    algorithm=config.algorithm.name,
                    runtime=config.models.runtime,
                    roles=dict(runtime.role_manifest()),
                    models=plan.models,
                )
                atomic_write_json(run_dir / "run.json", manifest.model_dump(mode="json"), pretty=True)
            reporter = _progress_reporter(plan.updates) if progress else None
            controller = Controller(
                config, plan, runtime, rows, run_dir, on_update=hooks[0], progress=reporter, on_phase=hooks[1]
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
            plan_digest=plan.plan_digest,
            model_identities=plan.models,
        )
        atomic_write_json(run_dir / "summary.json", summary.model_dump(mode="json"), pretty=True)
    except BaseException:
        if fresh and not any((run_dir / "checkpoints").glob("step-*")):
            shutil.rmtree(run_dir, ignore_errors=True)
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
            f"{wall:.1f}s on {device.type}; outputs in {run_dir}"
        ),
    }


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

"""``miniverl run``: verify the plan, build the runtime, train, tear down.

The run directory's lifecycle (a fresh run's claim, resume, extend, settle) is
:mod:`miniverl.artifacts.rundir.lifecycle`; here is the training loop's setup around it.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from miniverl import __version__, bounded
from miniverl import progress as progress_log
from miniverl.artifacts import runlock
from miniverl.artifacts.rundir import check_run_id, clear_run_outputs
from miniverl.artifacts.rundir.lifecycle import (
    claimed_fresh_run,
    extend_run,
    finish_extension,
    resume_point,
    root_plan,
)
from miniverl.canonical import atomic_write_bytes, atomic_write_json
from miniverl.config.plan import load_plan
from miniverl.config.schema import MiniverlConfig
from miniverl.errors import DependencyError, UsageError
from miniverl.records import MetricsLine, PlanRecord, RunManifest, RunSummary
from miniverl.training.teardown import cuda_teardown, release_library_caches


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

    ``extend`` (with ``resume``) adds that many cycles: see :func:`~miniverl.artifacts.rundir.lifecycle.extend_run`.
    """
    check_run_id(run_id)
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
    # the SIGTERM handler goes in before the directory appears: a SIGTERM from then on cleans up
    with _sigterm_as_interrupt() as stop, claimed_fresh_run(run_dir):
        hooks = _hooks((on_update, on_phase), stop)
        return _train(plan, config, plan_path, rows, run_dir, run_id, None, progress, hooks, stop)


def _require_torch() -> None:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise DependencyError("training needs the [train] extra of the checkout or release wheel") from None


def _resume(
    plan_path: Path, run_dir: Path, run_id: str, extend: int, progress: bool, hooks: tuple[Any, Any]
) -> dict[str, Any]:
    """Resume (or extend) ``run_dir``; the caller holds its lock, so nothing here races another writer."""
    if extend:
        plan_path = extend_run(plan_path, run_dir, extend)
    plan, config = load_plan(plan_path)
    from miniverl.data import load_prompts

    rows = load_prompts(plan.data.path, config.data.columns)
    found = resume_point(run_dir, plan, config, plan_path)
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
        if config.train.fused_kernels != "none":  # before any model loads
            from miniverl.runtime.fused import check_fused_kernels

            check_fused_kernels(config.train.fused_kernels, device)
        if cuda:
            torch.cuda.synchronize(device)
            release_library_caches(torch)
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
        if config.train.fused_kernels != "none":
            fused = runtime.fuse_training_kernels(config.train.fused_kernels)
            progress_log.phase("kernels", f"{config.train.fused_kernels}: {fused['rms_norm']} RMSNorm, "
                               f"{fused['swiglu']} SwiGLU MLP")  # fmt: skip
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
                root = root_plan(plan, run_dir)
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
                release_library_caches(torch)
        wall = time.perf_counter() - started
        teardown = None
        if cuda:
            teardown = cuda_teardown(
                baseline=baseline,
                final=torch.cuda.memory_allocated(device),
                peak_reserved=peak_reserved,
                peak_allocated=peak_allocated,
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


def _reward_mean(metrics: list[MetricsLine]) -> float | None:
    """Mean reward over every trajectory of the run (each update's mean weighted by its trajectories)."""
    total = sum(m.trajectories for m in metrics)
    if total == 0 or all(m.reward_mean is None for m in metrics):
        return None  # nothing was scored (SFT / KD)
    return sum((m.reward_mean or 0.0) * m.trajectories for m in metrics) / total

"""``miniverl inspect``: what a run did, from its files alone (no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.artifacts.rundir import read_manifest, read_metrics, read_summary, require_run_dir


def _check_derived(run_dir: Path, manifest: Any) -> None:
    """``run.json``'s algorithm and runtime are what the run's own plan says (an edited one is refused)."""
    from miniverl.artifacts.rundir import read_plan
    from miniverl.errors import UsageError

    if not (run_dir / "plan.json").is_file():
        return
    config = read_plan(run_dir).config
    algorithm = (config.get("algorithm") or {}).get("name")
    runtime = ((config.get("models") or {}).get("runtime")) or manifest.runtime
    for field, value in (("algorithm", algorithm), ("runtime", runtime)):
        if value is not None and getattr(manifest, field) != value:
            raise UsageError(
                f"{run_dir / 'run.json'}: {field} {getattr(manifest, field)!r} is not the plan's {value!r}; it was "
                "edited: remove run.json and `miniverl run --resume` rebuilds it"
            )


def run_activity(run_dir: Path) -> dict[str, Any]:
    """Whether a process is training ``run_dir`` now, read without taking its lock: ``running``, the
    writer's ``writer_pid`` and the plan's ``planned_updates`` (the run's own plan.json, extensions included)."""
    from miniverl.artifacts.rundir import read_plan
    from miniverl.artifacts.runlock import writer_pid

    pid = writer_pid(run_dir)
    planned = read_plan(run_dir).updates if (run_dir / "plan.json").is_file() else None
    summary = read_summary(run_dir)
    finished = summary is not None and summary.status == "completed" and summary.updates == planned
    return {"running": pid is not None and not finished, "writer_pid": pid, "planned_updates": planned}


def inspect_run(run_dir: Path) -> dict[str, Any]:
    from miniverl.training.checkpoint_files import checkpoint_status

    require_run_dir(run_dir)
    manifest = read_manifest(run_dir)
    _check_derived(run_dir, manifest)
    activity = run_activity(run_dir)
    live = bool(activity["running"])
    summary = read_summary(run_dir)
    metrics = read_metrics(run_dir, live=live)
    checkpoints = checkpoint_status(run_dir / "checkpoints")
    complete = [c for c in checkpoints if c["state"] == "complete"]
    # Lines past the last complete checkpoint are not committed: `--resume` after a kill rolls them back. While
    # the run is alive they are its progress (fsynced, committed by its next checkpoint), so they are shown.
    committed = complete[-1]["step"] if complete else 0
    uncommitted = len(metrics) - committed
    logged = len(metrics)
    if not live:
        metrics = metrics[:committed]
    status = summary.status if summary is not None else "incomplete"
    report = {
        "run_id": manifest.run_id,
        "status": "running" if live else status,
        "algorithm": manifest.algorithm,
        "runtime": manifest.runtime,
        "plan_digest": manifest.plan_digest,
        "updates": len(metrics),
        "logged_updates": logged,
        "checkpointed_updates": committed,
        **activity,
        "uncommitted_metrics_lines": max(uncommitted, 0),
        "last_complete_step": complete[-1]["step"] if complete else None,
        "checkpoints": checkpoints,
        "metrics_last": metrics[-1].model_dump(mode="json") if metrics else None,
        "reward_mean_by_update": [m.reward_mean for m in metrics],
        "loss_by_update": [m.loss for m in metrics],
        "kl_by_update": [m.kl for m in metrics],
        "objective": _objective(manifest.algorithm, metrics),
        "summary": summary.model_dump(mode="json") if summary is not None else None,
        "roles": manifest.roles,
        "ppo": _ppo_section(metrics) if manifest.algorithm == "ppo" else None,
    }
    direct = _direct_config(run_dir)
    if direct is not None:
        report["direct_config"] = direct
    return report


def _direct_config(run_dir: Path) -> dict[str, Any] | None:
    """A direct-config run (compiler v4): its compiler, the native file's sha256 (re-checked) and bindings."""
    import hashlib

    from miniverl.artifacts.rundir import read_plan

    direct = read_plan(run_dir).direct_config
    if direct is None:
        return None
    raw = direct.native.text.encode("utf-8")
    return {
        "compiler": direct.compiler,
        "native_name": direct.native.name,
        "native_sha256": direct.native.sha256,
        "native_sha256_verified": hashlib.sha256(raw).hexdigest() == direct.native.sha256,
        "rules_digest": direct.rules_digest,
        "import_digest": direct.import_digest,
        "runtime_bindings": direct.runtime_bindings,
    }


def _ppo_section(metrics: list[Any]) -> dict[str, Any]:
    """PPO's own counts and the verl metrics of the last update, from ``metrics.jsonl``."""
    per = [m.algorithm_metrics for m in metrics]
    last = per[-1] if per else {}
    keys = ("actor/pg_clipfrac", "actor/ppo_kl", "actor/entropy", "critic/vf_loss", "critic/vf_clipfrac",
            "critic/vf_explained_var", "critic/returns/mean", "critic/advantages/mean")  # fmt: skip
    return {
        "actor_updates": int(sum(m.get("actor/updates", 0) for m in per)),
        "critic_updates": int(sum(m.get("critic/updates", 0) for m in per)),
        "critic_changed_each_update": bool(per) and all(m.get("critic/delta_norm", 0) > 0 for m in per),
        "last": {k: last[k] for k in keys if k in last},
    }


#: What each algorithm optimizes, and the metrics.jsonl key that measures it.
OBJECTIVES: dict[str, tuple[str, str, str]] = {
    "opd": ("kl", "minimized", "reverse KL(student || teacher) per response token"),
    "grpo": ("reward_mean", "maximized", "mean reward of the cycle's samples (clipped policy-gradient surrogate)"),
}


def _objective(algorithm: str, metrics: list[Any]) -> dict[str, Any] | None:
    known = OBJECTIVES.get(algorithm)
    if known is None:
        return None
    key, direction, description = known
    return {
        "metric": key,
        "direction": direction,
        "description": description,
        "by_update": [getattr(m, key, None) for m in metrics],
    }


def _fmt(value: Any) -> str:
    return "absent" if value is None else f"{value:.5f}"


def _update_lines(report: dict[str, Any]) -> list[str]:
    """One line per update; a series the run never recorded is named once, not shown as absent on every line."""
    series = [("kl", report["kl_by_update"]), ("loss", report["loss_by_update"]),
              ("reward mean", report["reward_mean_by_update"])]  # fmt: skip
    shown = [(label, values) for label, values in series if any(v is not None for v in values)]
    never = [label for label, values in series if values and all(v is None for v in values)]
    lines = [f"  not recorded: {', '.join(never)} (this run has no such metric)"] if never else []
    for index in range(len(report["loss_by_update"])):
        cells = "  ".join(f"{label} {_fmt(values[index])}" for label, values in shown)
        lines.append(f"    update {index + 1}: {cells}")
    return lines


def _updates_cell(report: dict[str, Any]) -> str:
    """The update count, and what of it a checkpoint has committed when that differs."""
    shown, committed = report["updates"], report.get("checkpointed_updates", report["updates"])
    if report.get("running"):
        if committed == shown:
            return f"{shown} logged, all checkpointed"
        return f"{shown} logged, {committed} checkpointed (the next checkpoint commits the rest)"
    pending = report.get("uncommitted_metrics_lines", 0)
    if pending:
        return f"{shown} (and {pending} logged after the last checkpoint, which `run --resume` rolls back)"
    return str(shown)


def render_inspection(report: dict[str, Any]) -> str:
    status = report["status"]
    if report.get("running"):
        done, planned = report["logged_updates"], report["planned_updates"]
        status = f"running (pid {report['writer_pid']}), update {done} of {planned}"
    lines = [
        f"run {report['run_id']}: {status} ({report['algorithm']}, {report['runtime']})",
        f"  plan      {report['plan_digest'][:16]}",
        f"  updates   {_updates_cell(report)}",
    ]
    direct = report.get("direct_config")
    if direct is not None:
        ok = "verified" if direct["native_sha256_verified"] else "MISMATCH"
        lines.append(
            f"  compiler  {direct['compiler']} (native {direct['native_name']} sha256 {direct['native_sha256']}, {ok})"
        )
    objective = report.get("objective")
    if objective is not None:
        lines.append(f"  objective {objective['metric']} ({objective['direction']}): {objective['description']}")
    lines.extend(_update_lines(report))
    for ckpt in report["checkpoints"]:
        lines.append(
            f"  checkpoint {ckpt['name']}: {ckpt['state']}" + (f" ({ckpt['reason']})" if ckpt["reason"] else "")
        )
    ppo = report.get("ppo")
    if ppo is not None:
        lines.append(f"  ppo       {ppo['actor_updates']} actor / {ppo['critic_updates']} critic updates")
        lines.extend(f"    {k}: {v:.5g}" for k, v in ppo["last"].items())
    summary = report["summary"]
    if summary is not None:
        lines.append(f"  wall      {summary['wall_seconds']:.1f}s on {summary['device']}")
        if summary.get("peak_rss_bytes"):
            peak = summary["peak_rss_bytes"] / 1e9
            lines.append(f"  memory    peak RSS {peak:.2f} GB (the run process, load included)")
        if summary["cuda"]:
            cuda = summary["cuda"]
            lines.append(
                f"  cuda      peak reserved {cuda['peak_reserved_bytes'] / 2**30:.3f} GiB, teardown "
                f"{'ok' if cuda['teardown_returned_to_baseline'] else 'NOT at baseline'}"
            )
    return "\n".join(lines)

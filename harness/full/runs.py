"""What the smollm2, pg-k1, direct-gkd and grpo-cycles workloads share: plan and run a harness YAML through the
installed CLI (``run`` side), and read and judge run summaries, metrics lines and checkpoints (``judge`` side).

The ``judge`` helpers read only evidence files through bounded strict readers and never raise on bad content.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from harness.full.base import Context, Judgement, Scale
from harness.full.reading import count, finite, read_json, transcript_steps
from harness.jsonio import canonical_bytes
from harness.proc import HARNESS_DIR
from harness.records import Profile
from harness.smoke_judge import read_metrics
from harness.transcript import CliResult

WORKLOADS = HARNESS_DIR / "workloads"
PLAN_TIMEOUT = 600
RUN_TIMEOUT = 3600
# Metrics-line fields that measure time or memory: they differ between two runs of the same plan by nature.
# Everything else in a line (losses, rewards, advantages, norms, token counts, the algorithm's metrics) must not.
VOLATILE_METRICS = frozenset(
    {
        "rollout_seconds",
        "update_seconds",
        "cycle_seconds",
        "peak_reserved_bytes",
        "peak_allocated_bytes",
        "update_start_allocated_bytes",
    }
)
# The target-length reward needs room for a response to end before the token limit (the release smoke's GRPO
# cycle uses 32 too): below that, every sample of a small CPU group is cut at the limit and scores the same.
GRPO_MIN_NEW_TOKENS = 32
# The checkpoint files whose sha256 a tensor-exact resume must reproduce: adapter, optimizer and RNG state.
STATE_FILES = ("adapter/adapter_model.safetensors", "optimizer.safetensors", "rng.safetensors")


# -- run side: drive the installed CLI --------------------------------------------------------------------


def declared_sizes(scale: Scale, *, min_new_tokens: int = 0) -> dict[str, int]:
    """The rollout sizes a workload plans at on ``scale`` (never smaller; a workload may ask for more new tokens
    than the scale, ``min_new_tokens``). The run side plans with them and the judge requires them in the plan."""
    return {
        "prompts_per_cycle": scale.prompts_per_cycle,
        "samples_per_prompt": scale.samples_per_prompt,
        "max_new_tokens": max(scale.max_new_tokens, min_new_tokens),
    }


def scale_sets(scale: Scale, *, quantize: bool = False, min_new_tokens: int = 0) -> list[str]:
    """``--set`` argv for the scale: device overrides and the declared sizes; NF4 for the student when the scale
    declares it and the workload trains quantized (``quantize``)."""
    sizes = declared_sizes(scale, min_new_tokens=min_new_tokens)
    values = [*scale.set_overrides, *(f"rollout.{key}={value}" for key, value in sizes.items())]
    if quantize and scale.quantization == "nf4":
        values.append("models.student.quantization=nf4")
    return [arg for value in values for arg in ("--set", value)]


def plan(
    ctx: Context,
    step: str,
    yaml_name: str,
    out: str,
    sets: list[str],
    *,
    quantize: bool = False,
    min_new_tokens: int = 0,
) -> tuple[CliResult, Path]:
    """Copy ``harness/workloads/YAML`` into the work dir, plan it at the scale (plus ``sets``, ``a=b`` values),
    and save the ``--json`` output (redacted) beside the plan as evidence. Returns the result and that file."""
    shutil.copyfile(WORKLOADS / yaml_name, ctx.work / yaml_name)
    extra = [arg for value in sets for arg in ("--set", value)]
    sized = scale_sets(ctx.scale, quantize=quantize, min_new_tokens=min_new_tokens)
    argv = ["plan", yaml_name, *sized, *extra, "--out", out, "--json"]
    result = ctx.cli(step, argv, timeout=PLAN_TIMEOUT)
    return result, save_output(ctx, f"{step}.json", result)


def run(ctx: Context, step: str, plan_file: str, run_id: str, *extra: str) -> tuple[CliResult, Path]:
    """``miniverl run --plan PLAN --output runs --run-id ID [extra] --json``; its ``--json`` output saved."""
    argv = ["run", "--plan", plan_file, "--output", "runs", "--run-id", run_id, *extra, "--json"]
    result = ctx.cli(step, argv, timeout=RUN_TIMEOUT)
    return result, save_output(ctx, f"{step}.json", result)


def run_dir(ctx: Context, run_id: str) -> Path:
    return ctx.work / "runs" / run_id


def checkpoint_json(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"step-{step:06d}" / "checkpoint.json"


def save_output(ctx: Context, name: str, result: CliResult) -> Path:
    """The step's ``--json`` object (redacted: no local path survives), or ``{}`` when stdout was not one."""
    return save_json(ctx, name, result.json() or {})


def save_json(ctx: Context, name: str, value: Any) -> Path:
    path = ctx.work / "outputs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(canonical_bytes(_redact(value, ctx)) + b"\n")
    return path


def _redact(value: Any, ctx: Context) -> Any:
    if isinstance(value, str):
        return ctx.cli.redact.text(value)
    if isinstance(value, dict):
        return {ctx.cli.redact.text(str(k)): _redact(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, ctx) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def existing(files: dict[str, Path]) -> dict[str, Path]:
    """The evidence files that exist (a failed step leaves some out: ``judge`` sees them missing)."""
    return {role: path for role, path in files.items() if path.is_file()}


# -- judge side: read evidence ------------------------------------------------------------------------------


class Run:
    """One run's evidence, read strictly: its summary and metrics lines (None / why when unreadable)."""

    def __init__(self, evidence: dict[str, Path], summary_role: str, metrics_role: str, algorithm: str) -> None:
        self.summary = read_json(evidence.get(summary_role))
        path = evidence.get(metrics_role)
        if path is None:
            self.lines: list[dict[str, Any]] = []
            self.why: str | None = f"{metrics_role} is missing"
        else:
            self.lines, self.why = read_metrics(path, algorithm)
        self.algorithm = algorithm

    def completed(self, cycles: int) -> tuple[bool, str]:
        """Status completed, the algorithm, ``cycles`` cycles and updates, one metrics line per update (steps
        1..n), every line's loss finite."""
        s = self.summary or {}
        updates = count(s.get("updates"))
        ok = (
            self.summary is not None
            and s.get("status") == "completed"
            and s.get("algorithm") == self.algorithm
            and count(s.get("cycles")) == cycles
            and updates == cycles
            and self.why is None
            and [line.get("step") for line in self.lines] == list(range(1, cycles + 1))
            and all(finite(line.get("loss")) is not None for line in self.lines)
        )
        return ok, (
            f"status {str(s.get('status'))[:20]!r}, algorithm {str(s.get('algorithm'))[:20]!r}, cycles "
            f"{short(s.get('cycles'))}, updates {short(updates)} (want {cycles}); "
            + (self.why or f"metrics steps {[short(line.get('step')) for line in self.lines][:8]}")
        )

    def column(self, key: str) -> list[Any]:
        return [line.get(key) for line in self.lines]


def exits(evidence: dict[str, Path]) -> dict[str, list[int]]:
    """Step -> exit codes, from the transcript ({} when it is unreadable)."""
    return transcript_steps(evidence.get("transcript")) or {}


def steps_ok(evidence: dict[str, Path], wanted: dict[str, int]) -> tuple[bool, str]:
    """Each named step ran exactly once with the wanted exit code."""
    steps = exits(evidence)
    bad = {name: steps.get(name) for name, code in wanted.items() if steps.get(name) != [code]}
    return not bad, "transcript: " + (f"unexpected exits {bad}" if bad else f"{sorted(wanted)} exited as expected")


def checkpoint_digests(path: Path | None) -> dict[str, str] | None:
    """``files`` name -> sha256 of a checkpoint.json, or None when it is not one."""
    doc = read_json(path)
    files = doc.get("files") if doc is not None else None
    if doc is None or doc.get("kind") != "miniverl.checkpoint" or not isinstance(files, dict):
        return None
    out: dict[str, str] = {}
    for name, entry in files.items():
        sha = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(sha, str) or len(sha) != 64:
            return None
        out[name] = sha
    return out


def same_state(a: Path | None, b: Path | None, step: int) -> tuple[bool, str]:
    """Both checkpoint.json files are of ``step`` and hold equal sha256 for adapter, optimizer and RNG state."""
    da, db = checkpoint_digests(a), checkpoint_digests(b)
    steps = [(read_json(p) or {}).get("step") for p in (a, b)]
    if da is None or db is None:
        return False, f"a checkpoint.json is missing or not a checkpoint (readable: {da is not None}, {db is not None})"
    missing = [n for n in STATE_FILES if n not in da or n not in db]
    differ = [n for n in STATE_FILES if n in da and n in db and da[n] != db[n]]
    others = sorted(n for n in set(da) | set(db) if n not in STATE_FILES and da.get(n) != db.get(n))
    ok = not missing and not differ and steps == [step, step]
    return ok, (
        f"checkpoint steps {[short(s) for s in steps]} (want {step}); state files missing {missing}, differing "
        f"{differ}; other files differing (informational) {others[:4]}"
    )


def stable_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in line.items() if k not in VOLATILE_METRICS} for line in lines]


def same_metrics(a: Run, b: Run) -> tuple[bool, str]:
    """Both runs' metrics lines are present and equal in every field but the time and memory figures."""
    if a.why or b.why or not a.lines:
        return False, f"metrics unreadable: {a.why or b.why or 'no lines'}"
    sa, sb = stable_lines(a.lines), stable_lines(b.lines)
    if len(sa) != len(sb):
        return False, f"{len(sa)} vs {len(sb)} metrics lines"
    bad = [i + 1 for i, (x, y) in enumerate(zip(sa, sb, strict=True)) if x != y]
    keys = sorted({k for i in bad for k in set(sa[i - 1]) | set(sb[i - 1]) if sa[i - 1].get(k) != sb[i - 1].get(k)})
    return not bad, f"{len(sa)} metrics lines; lines differing {bad} in {keys[:6]}"


def positive_each(run: Run, key: str) -> tuple[bool, list[Any]]:
    """Every metrics line holds a finite ``key`` > 0 (a count for integer fields; booleans never count)."""
    values = run.column(key)
    ok = bool(values) and run.why is None and all((finite(v) or 0.0) > 0 for v in values)
    return ok, [short(v) for v in values][:8]


def reward_varies(j: Judgement, run: Run) -> None:
    ok, values = positive_each(run, "reward_std_within_group_max")
    j.check("reward_varies_within_group", ok, f"per update, the largest within-group reward std {values}")


def nonzero_advantages(j: Judgement, run: Run, trajectories: dict[str, list[dict[str, Any]]] | None = None) -> None:
    ok, values = positive_each(run, "nonzero_advantages")
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in run.column("nonzero_advantages"))
    j.check("nonzero_advantages", ok and ints, f"per update, trajectories with a nonzero advantage {values}")


def cuda_block(summary: dict[str, Any] | None) -> dict[str, int] | None:
    cuda = summary.get("cuda") if summary is not None else None
    if not isinstance(cuda, dict):
        return None
    keys = ("baseline_allocated_bytes", "final_allocated_bytes", "peak_reserved_bytes")
    values = {k: cuda.get(k) for k in keys}
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values.values()):
        return None
    return {k: int(v) for k, v in values.items() if isinstance(v, int)}


def judge_cuda(
    j: Judgement, profile: Profile, summaries: dict[str, dict[str, Any] | None], *, teardown: bool, peak: bool
) -> None:
    """``teardown`` and ``peak_reserved`` from every named run's summary ``cuda`` block (CUDA profiles only:
    on CPU they are not required and not judged). Thresholds are the profile's (harness code)."""
    if profile.device != "cuda":
        return
    blocks = {label: cuda_block(s) for label, s in summaries.items()}
    missing = sorted(label for label, b in blocks.items() if b is None)
    t = profile.thresholds
    if teardown:
        details, ok = [], not missing and bool(blocks)
        for label, b in blocks.items():
            if b is None:
                continue
            tol = max(
                t.teardown_tolerance_bytes_min, int(t.teardown_tolerance_fraction * b["baseline_allocated_bytes"])
            )
            left = b["final_allocated_bytes"] - b["baseline_allocated_bytes"]
            ok = ok and left <= tol
            details.append(f"{label}: {left} B above baseline (tolerance {tol} B)")
        j.check("teardown", ok, "; ".join(details) + (f"; no integer cuda block in {missing}" if missing else ""))
    if peak:
        limit = t.peak_reserved_bytes_max
        peaks = {label: b["peak_reserved_bytes"] for label, b in blocks.items() if b is not None}
        ok = not missing and bool(peaks) and limit is not None and all(0 < p <= limit for p in peaks.values())
        j.check(
            "peak_reserved",
            ok,
            f"peak reserved {peaks} B (measured > 0), limit {limit} B"
            + (f"; no integer cuda block in {missing}" if missing else ""),
        )
    for label, b in blocks.items():
        if b is not None:
            j.metrics[f"{label}_cuda_peak_reserved_bytes"] = b["peak_reserved_bytes"]
            j.metrics[f"{label}_cuda_final_allocated_bytes"] = b["final_allocated_bytes"]


def planned_as_declared(plan: dict[str, Any] | None, sizes: dict[str, int], profile: Profile) -> tuple[bool, str]:
    """The plan that ran has the declared rollout sizes and the profile's device: a smaller run, or one on
    another device, never stands in for the declared one."""
    rollout = section(plan, "config", "rollout")
    device = section(plan, "config", "models").get("device")
    other = [f"{key} {short(rollout.get(key))} (declared {want})" for key, want in sizes.items()
             if count(rollout.get(key)) != want]  # fmt: skip
    ok = plan is not None and not other and device == profile.device
    return ok, (
        "no readable plan"
        if plan is None
        else f"plan sizes {'as declared' if not other else 'NOT declared: ' + ', '.join(other)}, device "
        f"{short(device)!r} (profile {profile.device!r})"
    )


def summary_metrics(j: Judgement, label: str, run: Run) -> None:
    """A few figures of a run for the record (informational, never judged)."""
    s = run.summary or {}
    for key in ("updates", "wall_seconds", "seconds_per_cycle", "reward_mean", "device", "dtype", "quantization"):
        value = s.get(key)
        if isinstance(value, bool) or value is None or isinstance(value, int | str):
            j.metrics[f"{label}_{key}"] = value if not isinstance(value, str) else value[:40]
        else:
            j.metrics[f"{label}_{key}"] = finite(value)


def section(doc: dict[str, Any] | None, *keys: str) -> dict[str, Any]:
    """``doc[k1][k2]...`` when every step is a JSON object, else ``{}``."""
    value: Any = doc
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, dict) else {}


def short(value: Any) -> Any:
    """A value small enough for a check's detail (long strings cut, containers named)."""
    if isinstance(value, str):
        return value[:80]
    if isinstance(value, bool) or value is None or isinstance(value, int | float):
        return value
    return type(value).__name__

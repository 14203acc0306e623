"""What the smollm2, pg-k1, direct-gkd and grpo-cycles workloads share: plan and run a harness YAML through the
installed CLI (``run`` side), and read and judge run summaries, metrics lines and checkpoints (``judge`` side).

The ``judge`` helpers read only evidence files through bounded strict readers and never raise on bad content.
GRPO's learning signal is judged in :mod:`harness.qualify.full.learning_signal`, CUDA memory in
:mod:`harness.qualify.full.cuda_memory`.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

from harness.core.jsonio import canonical_bytes
from harness.core.proc import HARNESS_DIR
from harness.core.records import Profile
from harness.qualify.full import statehash
from harness.qualify.full.base import Context, Judgement, Scale
from harness.qualify.full.reading import count, file_sha256, finite, read_json, read_jsonl, transcript_steps
from harness.qualify.smoke_judge import read_metrics
from harness.qualify.transcript import CliResult

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


def state_hashes(ctx: Context, checkpoints: dict[str, Path], *, tensors: bool = False) -> Path:
    """The harness's own sha256 of each labelled checkpoint's files (label = the evidence role of its kept
    checkpoint.json; ``tensors``: and each adapter tensor's), written while the work dir still holds them:
    ``outputs/state-hashes.json``."""
    return statehash.write_state_hashes(ctx.work / "outputs" / "state-hashes.json", checkpoints, tensors=tensors)


def same_state(
    evidence: dict[str, Path], a: str, b: str, step: int, names: tuple[str, ...] = STATE_FILES
) -> tuple[bool, str]:
    """Checkpoints ``a`` and ``b`` (evidence roles of kept checkpoint.json files, and their labels in
    ``state_hashes``) are of ``step`` and hold equal state files by the harness's own sha256; and each kept
    checkpoint.json states exactly the harness's digests (a product that misreports its files fails)."""
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    same, same_why = statehash.same_files(hashes, a, b, names, step=step)
    told = [statehash.product_agrees(hashes, role, evidence.get(role)) for role in (a, b)]
    steps = [(read_json(evidence.get(role)) or {}).get("step") for role in (a, b)]
    ok = same and all(agrees for agrees, _ in told) and steps == [step, step]
    return ok, (
        f"checkpoint.json steps {[short(s) for s in steps]} (want {step}); {same_why}; "
        + "; ".join(why for _, why in told)
    )


def trajectory_rows(evidence: dict[str, Path], roles: list[str]) -> dict[int, list[dict[str, Any]]] | None:
    """Update (1-based) -> the trajectories of that update, from the kept ``cycle-NNNNNN.jsonl`` files, or None."""
    out: dict[int, list[dict[str, Any]]] = {}
    for step, role in enumerate(roles, start=1):
        rows = read_jsonl(evidence.get(role))
        if not rows:
            return None
        out[step] = rows
    return out


ADAPTER = "adapter/adapter_model.safetensors"
# Both updates' checkpoints must survive the run for the harness to hash the adapter after each of them.
KEEP_BOTH_CHECKPOINTS = "checkpoint.keep_last=2"


def update_evidence(run: Path, updates: int) -> dict[str, Path]:
    """Each update's kept checkpoint.json and trajectories file (roles ``checkpoint_N``, ``trajectories_N``)."""
    files: dict[str, Path] = {}
    for step in range(1, updates + 1):
        files[f"checkpoint_{step}"] = checkpoint_json(run, step)
        files[f"trajectories_{step}"] = run / "trajectories" / f"cycle-{step:06d}.jsonl"
    return files


def cycle_evidence(ctx: Context, run: Path, updates: int) -> dict[str, Path]:
    """What a GRPO workload keeps of its run: plan, summary, metrics, each update's checkpoint.json and
    trajectories, and the harness's own hashes of those checkpoints, adapter tensors included."""
    files = {"plan": run / "plan.json", "summary": run / "summary.json", "metrics": run / "metrics.jsonl"}
    files.update(update_evidence(run, updates))
    checkpoints = {f"checkpoint_{step}": checkpoint_json(run, step).parent for step in range(1, updates + 1)}
    files["state_hashes"] = state_hashes(ctx, checkpoints, tensors=True)
    return files


def kept_trajectories(evidence: dict[str, Path], updates: int) -> tuple[dict[int, list[dict[str, Any]]] | None, str]:
    """Update -> its trajectories, from the kept files, provided the last checkpoint commits exactly those files
    (the harness's sha256 of each is the one checkpoint.json names); else None and why."""
    roles = [f"trajectories_{step}" for step in range(1, updates + 1)]
    committed, why = trajectories_committed(evidence, f"checkpoint_{updates}", roles)
    rows = trajectory_rows(evidence, roles) if committed else None
    return rows, why if committed and rows is not None else why + ("" if rows is not None else "; unreadable")


def adapter_changed_each_update(evidence: dict[str, Path], updates: int) -> tuple[bool, str]:
    """From the harness's own per-tensor digests of the adapter after each update: the first update moved a
    lora_B tensor off its all-zero init, each later one changed a tensor digest; and every kept checkpoint.json
    states exactly the harness's file digests."""
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    results = [
        statehash.adapter_moved(hashes, f"checkpoint_{step - 1}" if step > 1 else None, f"checkpoint_{step}", ADAPTER)
        for step in range(1, updates + 1)
    ]
    told = [
        statehash.product_agrees(hashes, f"checkpoint_{step}", evidence.get(f"checkpoint_{step}"))
        for step in range(1, updates + 1)
    ]
    ok = all(moved for moved, _ in results) and all(agrees for agrees, _ in told)
    return ok, "; ".join(why for _, why in results + told)


def trajectories_committed(evidence: dict[str, Path], checkpoint_role: str, roles: list[str]) -> tuple[bool, str]:
    """The kept trajectory files are the ones the checkpoint commits: the harness's sha256 of each equals the
    digest the checkpoint.json names for it (and that checkpoint.json is one the harness hashed)."""
    doc = read_json(evidence.get(checkpoint_role))
    listed = doc.get("trajectories") if doc is not None else None
    if not isinstance(listed, dict):
        return False, f"{checkpoint_role} lists no trajectories"
    wrong = [
        step
        for step, role in enumerate(roles, start=1)
        if file_sha256(evidence.get(role)) is None
        or listed.get(f"cycle-{step:06d}.jsonl") != file_sha256(evidence.get(role))
    ]
    ok = not wrong and len(listed) == len(roles)
    return ok, (
        f"{len(roles)} kept trajectory files "
        + ("are the ones the checkpoint commits" if ok else f"NOT the ones the checkpoint commits (updates {wrong})")
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


def model_sets(scale: Scale, roles: tuple[str, ...]) -> list[str]:
    """``a=b`` plan overrides that put the scale's declared hub models in ``roles`` (none where the YAML's own
    models, SmolLM2 and the tiny classifier, are what the scale declares)."""
    return [value for role in roles if (use := scale.model(role)) is not None for value in use.sets()]


def models_as_declared(j: Judgement, plan: dict[str, Any] | None, scale: Scale, roles: tuple[str, ...]) -> tuple[
    bool, str]:  # fmt: skip
    """The plan that ran used exactly the models the scale declares in ``roles``, by the identities the plan
    pinned (a hub model: its repository, its 40-hex revision in both the config and the identity, and the digest of
    its per-file sha256 pin; a builtin: its name; the tiny classifier: its source). Records per role what the seed
    asks for, what was used, and whether it stood in."""
    ok, why = plan is not None, []
    for role in roles:
        use = scale.model(role)
        identity = section(plan, "models", role)
        spec = section(plan, "config", "models", role)
        if use is None:
            ok = False
            why.append(f"{role}: the scale declares no model")
            continue
        if use.source == "hub":
            digest = identity.get("files_sha256")
            same = (
                identity.get("source") == "hub"
                and identity.get("model_id") == use.model_id
                and identity.get("revision") == use.revision
                and spec.get("revision") == use.revision
                and isinstance(digest, str)
                and len(digest) == 64
                and all(c in "0123456789abcdef" for c in digest)
            )
        elif use.source == "builtin":
            same = identity.get("source") == "builtin" and identity.get("name") == use.model_id
        else:
            same = identity.get("source") == use.source
        ok = ok and same
        found = identity.get("model_id") or identity.get("name") or identity.get("source")
        revision = identity.get("revision")
        used = f"{short(found)}@{short(revision)}" if revision is not None else str(short(found))
        why.append(
            f"{role}: the seed asks {use.requested}, the scale declares {use.used}"
            + (" (a stand-in)" if use.stands_in else "")
            + f", the plan used {used}"
            + ("" if same else " - NOT the declared model, or its files are not pinned")
        )
        j.metrics[f"model_{role}_requested"] = use.requested
        j.metrics[f"model_{role}_declared"] = use.used
        j.metrics[f"model_{role}_stands_in"] = use.stands_in
    return ok, "models: " + ("no readable plan" if plan is None else "; ".join(why))


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

"""The release smoke's judge: every check of the installed-CLI steps, decided from the evidence files alone.

The harness calls it on the files the steps produced, and the auditor calls it again on the files the
qualification binds, so a record whose checks say ``passed`` while its evidence does not support them is refused.
What the judge knows besides the evidence comes from the caller, never from the evidence: the profile (device,
thresholds, required GPU), the candidate's version and wheel sha256 (from the verified candidate manifest), and
the GPU that the captured ``nvidia-smi`` output names (``evidence/install/nvidia-smi.csv``, parsed by
:func:`harness.qualify.install_judge.captured_gpu`; None where none is bound). The install phase's checks are
:mod:`harness.qualify.install_judge`'s.
"""

from __future__ import annotations

import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import RecordError
from harness.core.jsonio import loads_strict, looks_like_local_path
from harness.core.policy import CANDIDATE_BOUND
from harness.core.records import Profile
from harness.install.origin import judge_origin
from harness.qualify.binding import transcript_bound
from harness.qualify.full.reading import file_sha256, read_json

MODEL = "smollm2-135m-instruct"
DATA_ROWS = 8
METRICS_LIMIT_BYTES = 16 << 20  # one line per update; a smoke run writes a few hundred bytes per line
EVIDENCE_LIMIT_BYTES = 256 << 20  # uploaded artifacts are bounded
# The most PEFT-reload logit difference the harness accepts, by the run's dtype, whatever tolerance the CLI reports.
RELOAD_TOLERANCE_MAX = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
# The steps whose `--json` output (redacted) the smoke keeps in cli-outputs.json, and `--version`'s text.
OUTPUT_STEPS = ("version", "model_fetch", "data_sample", "plan", "run_dry_run", "inspect", "export", "grpo_plan")


@dataclass(frozen=True)
class SmokeBasis:
    """What the judge takes from outside the evidence (see the module docstring)."""

    profile: Profile
    version: str
    wheel_sha256: str
    smi_gpu_name: str | None


@dataclass
class SmokeVerdict:
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    not_applicable: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, int | float | bool | str | None] = field(default_factory=dict)

    def check(self, name: str, passed: bool, detail: str) -> bool:
        if name in self.checks or name in self.not_applicable:
            raise ValueError(f"check {name} judged twice")
        self.checks[name] = (bool(passed), detail[:500])
        return bool(passed)


def judge_smoke(evidence: dict[str, Path], basis: SmokeBasis) -> SmokeVerdict:
    """Decide every CLI, origin and binding check of the smoke from ``evidence`` (role -> file).

    A check whose evidence is absent because an earlier step failed is left undecided (the caller records it as
    skipped, so a required one fails the level); never raises on bad content.
    """
    v = SmokeVerdict()
    profile = basis.profile
    v.check(CANDIDATE_BOUND, *transcript_bound(evidence.get("transcript"), basis.wheel_sha256))
    origin = read_json(evidence.get("origin"))
    for name, (passed, detail) in judge_origin(
        origin or {"import_error": "origin.json is missing or unreadable"}, basis.version, basis.wheel_sha256
    ).items():
        v.check(name, passed, detail)
    outputs = read_json(evidence.get("cli_outputs")) or {}
    steps = _steps(evidence.get("transcript"))

    version = outputs.get("version")
    v.check(
        "cli_version",
        _ran(steps, "version") and version == basis.version,
        f"`miniverl --version` printed {str(version)[:40]!r}, candidate {basis.version}",
    )
    _doctor(v, read_json(evidence.get("doctor")), steps, basis)
    _fetch(v, _dict(outputs.get("model_fetch")), steps)
    prompts_sha = file_sha256(evidence.get("input_prompts"))
    data = _dict(outputs.get("data_sample"))
    if "data_sample" in steps:
        v.check(
            "data_sample",
            _ran(steps, "data_sample")
            and prompts_sha is not None
            and data.get("sha256") == prompts_sha
            and data.get("rows") == DATA_ROWS,
            f"{data.get('rows')} rows (want {DATA_ROWS}), reported sha256 "
            f"{'matches' if prompts_sha and data.get('sha256') == prompts_sha else 'differs from'} the prompts file",
        )
    if _plan(v, "plan", _dict(outputs.get("plan")), read_json(evidence.get("plan")), prompts_sha, steps):
        _after_plan(v, evidence, outputs, steps, basis, prompts_sha)
    if profile.device != "cuda":
        v.not_applicable.update(
            gpu_identity="cpu profile",
            teardown="CPU run: no CUDA allocator to return to baseline",
            peak_reserved="CPU run: no CUDA memory",
        )
    return v


def _after_plan(
    v: SmokeVerdict,
    evidence: dict[str, Path],
    outputs: dict[str, Any],
    steps: dict[str, dict[str, Any]],
    basis: SmokeBasis,
    prompts_sha: str | None,
) -> None:
    """The checks of the steps that use a passing plan (a failed plan leaves them undecided: skipped)."""
    if "run_dry_run" in steps:
        dry = _dict(outputs.get("run_dry_run"))
        digest = _dict(read_json(evidence.get("plan"))).get("plan_digest")
        created = outputs.get("dry_run_dir_created")
        v.check(
            "run_dry_run",
            _ran(steps, "run_dry_run")
            and dry.get("status") == "dry_run_ok"
            and dry.get("plan_digest") == digest
            and created is False,
            f"dry run status {str(dry.get('status'))[:40]!r} (want 'dry_run_ok'), plan_digest "
            f"{'matches' if digest and dry.get('plan_digest') == digest else 'differs from'} the plan, run dir "
            f"{'not created' if created is False else 'created (or not observed)'}",
        )
    _opd(v, evidence, outputs, steps, basis)
    grpo_plan = read_json(evidence.get("grpo_plan"))
    if _plan(v, "grpo_plan", _dict(outputs.get("grpo_plan")), grpo_plan, prompts_sha, steps) and "grpo_cycle" in steps:
        _grpo(v, evidence, steps)


def evidence_checks(files: list[Path]) -> dict[str, tuple[bool, str]]:
    """``evidence_portable`` and ``evidence_bounded`` over the files a qualification binds."""
    unportable = [p.name for p in files if not portable(p)]
    total = 0
    for p in files:
        try:
            total += p.lstat().st_size
        except OSError:
            total += EVIDENCE_LIMIT_BYTES + 1
    return {
        "evidence_portable": (
            not unportable,
            "evidence JSON holds no local paths" if not unportable else f"local paths in {unportable[:5]}",
        ),
        "evidence_bounded": (total <= EVIDENCE_LIMIT_BYTES, f"{total} evidence bytes (limit {EVIDENCE_LIMIT_BYTES})"),
    }


# -- the checks ------------------------------------------------------------------------------------------------


def _doctor(
    v: SmokeVerdict, doctor: dict[str, Any] | None, steps: dict[str, dict[str, Any]], basis: SmokeBasis
) -> None:
    profile = basis.profile
    if doctor is None:
        if "doctor" in steps:
            v.check("doctor", False, "doctor.json is missing or unreadable")
        return
    verdict = _dict(doctor.get("capabilities")).get("gpu_training" if profile.device == "cuda" else "cpu_training")
    ok = isinstance(verdict, dict) and verdict.get("verdict") == "ok"
    v.check(
        "doctor",
        _ran(steps, "doctor") and ok,
        f"{profile.device} training verdict {verdict.get('verdict') if isinstance(verdict, dict) else None}",
    )
    if profile.device == "cuda":
        names = {doctor.get("gpu_name"), basis.smi_gpu_name}
        v.check(
            "gpu_identity",
            names == {profile.required_gpu_name},
            f"doctor {str(doctor.get('gpu_name'))[:60]!r}, nvidia-smi {str(basis.smi_gpu_name)[:60]!r}, "
            f"required {profile.required_gpu_name!r}",
        )


def _fetch(v: SmokeVerdict, fetched: dict[str, Any], steps: dict[str, dict[str, Any]]) -> None:
    if "model_fetch" not in steps:
        return
    identity = _dict(fetched.get("identity"))
    digests = sorted(str(k) for k, val in identity.items() if str(k).endswith("sha256") and _is_sha256(val))
    v.check(
        "model_fetch",
        _ran(steps, "model_fetch") and fetched.get("name") == MODEL and bool(digests),
        f"fetched {str(fetched.get('name'))[:60]!r} (asked {MODEL!r}), sha256 digests in its identity: {digests[:6]}",
    )


def _plan(
    v: SmokeVerdict,
    check: str,
    out: dict[str, Any],
    written: dict[str, Any] | None,
    prompts_sha: str | None,
    steps: dict[str, dict[str, Any]],
) -> bool:
    if check not in steps:
        return False
    if not _ran(steps, check):
        return v.check(check, False, _why(steps, check))
    if written is None:
        return v.check(check, False, "the plan file is missing from the evidence or unreadable")
    if written.get("plan_digest") != out.get("plan_digest"):
        return v.check(check, False, "the plan file's plan_digest is not the one `plan --json` reported")
    in_file = _dict(written.get("data")).get("sha256")
    if prompts_sha is None or in_file != prompts_sha or out.get("data_sha256") != prompts_sha:
        return v.check(
            check,
            False,
            f"the plan file binds data {str(in_file)[:16]}, `plan --json` reported {str(out.get('data_sha256'))[:16]}; "
            f"the sampled prompts hash to {str(prompts_sha)[:16]}",
        )
    return v.check(check, True, f"plan {str(out.get('plan_digest'))[:16]}... written; it binds the sampled data")


def _opd(
    v: SmokeVerdict,
    evidence: dict[str, Path],
    outputs: dict[str, Any],
    steps: dict[str, dict[str, Any]],
    basis: SmokeBasis,
) -> None:
    if "run_opd" not in steps:
        return
    summary, manifest = read_json(evidence.get("run_summary")), read_json(evidence.get("run_manifest"))
    if not _ran(steps, "run_opd") or summary is None or manifest is None:
        v.check("run_opd", False, _why(steps, "run_opd") if not _ran(steps, "run_opd") else "no summary or run.json")
        return
    v.check(
        "run_opd",
        summary.get("status") == "completed"
        and summary.get("algorithm") == "opd"
        and (_count(summary.get("cycles")) or 0) >= 1,
        f"status {str(summary.get('status'))[:20]!r}, algorithm {str(summary.get('algorithm'))[:20]!r}, "
        f"cycles {str(summary.get('cycles'))[:10]}",
    )
    lines, why = read_metrics(evidence.get("metrics"), "opd")
    _teacher_scoring(v, manifest, lines, why)
    _optimizer_update(v, summary, lines, why)
    for key in ("updates", "cycles", "wall_seconds", "seconds_per_cycle", "reward_mean", "device", "dtype"):
        value = summary.get(key)
        v.metrics[f"opd_{key}"] = value if isinstance(value, int | float | str | bool) or value is None else str(value)
    if "inspect" in steps:
        inspected = _dict(outputs.get("inspect"))
        v.check(
            "inspect",
            _ran(steps, "inspect")
            and inspected.get("status") == "completed"
            and inspected.get("updates") == summary.get("updates"),
            f"inspect: status {str(inspected.get('status'))[:20]!r}, updates {str(inspected.get('updates'))[:10]}",
        )
    if "export" in steps:
        _export(v, evidence, _dict(outputs.get("export")), steps, summary.get("dtype"))
    if basis.profile.device == "cuda":
        _cuda(v, basis.profile, summary)


def _teacher_scoring(v: SmokeVerdict, manifest: dict[str, Any], lines: list[dict[str, Any]], why: str | None) -> None:
    """Teacher log-probs were computed for the trajectories: every update has finite kl > 0 over > 0 tokens."""
    names = _dict(manifest.get("roles")).get("roles")
    role_names = sorted(str(n) for n in names) if isinstance(names, dict) else []
    has_roles = "teacher" in role_names and "student" in role_names
    scored = bool(lines) and all(
        _positive(line, "kl") and _positive(line, "response_tokens", int) and _positive(line, "trajectories", int)
        for line in lines
    )
    detail = why or (
        f"{len(lines)} metrics lines: {_per_line(lines, 'kl')}, {_per_line(lines, 'response_tokens')}, "
        f"{_per_line(lines, 'trajectories')}"
    )
    v.check("teacher_scoring", has_roles and scored and why is None, f"run.json roles {role_names[:8]}; {detail}")


def _optimizer_update(v: SmokeVerdict, summary: dict[str, Any], lines: list[dict[str, Any]], why: str | None) -> None:
    """One metrics line per update (steps 1..n, n = summary updates >= 1), each with a finite adapter delta > 0."""
    updates = summary.get("updates")
    counted = (_count(updates) or 0) >= 1 and len(lines) == updates
    steps_ok = [line.get("step") for line in lines] == list(range(1, len(lines) + 1))
    moved = bool(lines) and all(_positive(line, "adapter_delta_norm") for line in lines)
    v.check(
        "optimizer_update",
        why is None and counted and steps_ok and moved,
        why
        or f"summary updates {str(updates)[:10]}, {len(lines)} metrics lines, {_per_line(lines, 'step')}, "
        f"{_per_line(lines, 'adapter_delta_norm')}",
    )


def _export(
    v: SmokeVerdict, evidence: dict[str, Path], exported: dict[str, Any], steps: dict[str, dict[str, Any]], dtype: Any
) -> None:
    reload = _dict(exported.get("reload"))
    present = all(file_sha256(evidence.get(r)) for r in ("adapter_config", "adapter_weights", "adapter_manifest"))
    manifest_ok = present and file_sha256(evidence.get("adapter_manifest")) == exported.get("manifest_sha256")
    diff, tol = _finite(reload.get("max_abs_logit_diff")), _finite(reload.get("tolerance"))
    ceiling = RELOAD_TOLERANCE_MAX.get(dtype) if isinstance(dtype, str) else None
    within = diff is not None and tol is not None and ceiling is not None and 0 <= diff <= tol <= ceiling
    v.check(
        "export_reload",
        _ran(steps, "export") and reload.get("passed") is True and within and manifest_ok,
        f"PEFT reload max |logit diff| {diff} (tolerance {tol}, at most {ceiling} for {str(dtype)[:20]}), "
        f"files present {present}, manifest sha256 {'matches' if manifest_ok else 'differs'}",
    )
    v.metrics["export_max_abs_logit_diff"] = diff


def _cuda(v: SmokeVerdict, profile: Profile, summary: dict[str, Any]) -> None:
    """Teardown and peak reserved memory from the run's own measured bytes, against the profile's thresholds."""
    cuda = summary.get("cuda")
    keys = ("baseline_allocated_bytes", "final_allocated_bytes", "peak_reserved_bytes")
    figures = [_count(cuda.get(k)) for k in keys] if isinstance(cuda, dict) else []
    if len(figures) != 3 or any(f is None for f in figures):
        v.check("teardown", False, "summary.json has no cuda block with integer baseline/final/peak bytes")
        v.check("peak_reserved", False, "summary.json has no cuda block with integer peak_reserved_bytes")
        return
    base, final, peak = (int(f or 0) for f in figures)
    t = profile.thresholds
    tolerance = max(t.teardown_tolerance_bytes_min, int(t.teardown_tolerance_fraction * base))
    v.check(
        "teardown",
        final - base <= tolerance,
        f"allocated {final} B after teardown vs baseline {base} B (tolerance {tolerance} B)",
    )
    limit = t.peak_reserved_bytes_max
    v.check(
        "peak_reserved",
        limit is not None and 0 < peak <= limit,
        f"peak reserved {peak} B (measured > 0), limit {limit} B",
    )
    assert isinstance(cuda, dict)
    v.metrics.update(
        cuda_baseline_allocated_bytes=base,
        cuda_final_allocated_bytes=final,
        cuda_peak_reserved_bytes=peak,
        cuda_teardown_tolerance_bytes=tolerance,
        cuda_peak_allocated_bytes=_count(cuda.get("peak_allocated_bytes")),
    )


def _grpo(v: SmokeVerdict, evidence: dict[str, Path], steps: dict[str, dict[str, Any]]) -> None:
    summary = read_json(evidence.get("grpo_summary"))
    if not _ran(steps, "grpo_cycle") or summary is None:
        v.check("grpo_cycle", False, _why(steps, "grpo_cycle") if not _ran(steps, "grpo_cycle") else "no summary")
        return
    lines, why = read_metrics(evidence.get("grpo_metrics"), "grpo")
    updates = summary.get("updates")
    completed = summary.get("status") == "completed" and summary.get("algorithm") == "grpo"
    counted = (_count(updates) or 0) >= 1 and len(lines) == updates
    learned = bool(lines) and all(
        _positive(line, "reward_std_within_group_max")
        and _positive(line, "nonzero_advantages", int)
        and _positive(line, "adapter_delta_norm")
        for line in lines
    )
    v.check(
        "grpo_cycle",
        why is None and completed and counted and learned,
        f"status {str(summary.get('status'))[:20]!r}, algorithm {str(summary.get('algorithm'))[:20]!r}, "
        f"updates {str(updates)[:10]}, "
        + (
            why
            or f"{len(lines)} metrics lines: {_per_line(lines, 'reward_std_within_group_max')}, "
            f"{_per_line(lines, 'nonzero_advantages')}, {_per_line(lines, 'adapter_delta_norm')}"
        ),
    )
    reward = summary.get("reward_mean")
    v.metrics["grpo_reward_mean"] = reward if isinstance(reward, int | float) and not isinstance(reward, bool) else None


# -- readers --------------------------------------------------------------------------------------------------


def read_metrics(path: Path | None, algorithm: str) -> tuple[list[dict[str, Any]], str | None]:
    """The run's ``metrics.jsonl``, strictly: a bounded regular file, one JSON object per line.

    Returns ``(lines, None)``, or ``([], why)`` when the file is missing, oversized, holds a line that is not
    one JSON object (NaN/Infinity and duplicate keys refused) or a line of another algorithm.
    """
    if path is None:
        return [], "metrics.jsonl is missing"
    try:
        info = path.lstat()
    except OSError:
        return [], f"{path.name} is missing"
    if not stat.S_ISREG(info.st_mode):
        return [], f"{path.name} is not a regular file"
    if info.st_size > METRICS_LIMIT_BYTES:
        return [], f"{path.name} holds {info.st_size} bytes (limit {METRICS_LIMIT_BYTES})"
    data = path.read_bytes()
    if not data.endswith(b"\n"):
        return [], f"{path.name} is empty or its last line is unterminated"
    lines: list[dict[str, Any]] = []
    for number, raw in enumerate(data[:-1].split(b"\n"), start=1):
        try:
            value = loads_strict(raw, f"{path.name} line {number}")
        except RecordError as exc:
            return [], str(exc)
        except (ValueError, RecursionError) as exc:  # an integer too long to convert, nesting too deep
            return [], f"{path.name} line {number} is not plain JSON ({exc.__class__.__name__})"
        if not isinstance(value, dict):
            return [], f"{path.name} line {number} is not a JSON object"
        if value.get("algorithm") != algorithm:
            return [], f"{path.name} line {number} is algorithm {str(value.get('algorithm'))[:20]!r}, not {algorithm!r}"
        lines.append(value)
    return lines, None


def _steps(transcript: Path | None) -> dict[str, dict[str, Any]]:
    """Step name -> its (last) invocation in the transcript; empty when unreadable."""
    doc = read_json(transcript)
    rows = doc.get("invocations") if doc is not None else None
    found: dict[str, dict[str, Any]] = {}
    for inv in rows if isinstance(rows, list) else []:
        if isinstance(inv, dict) and isinstance(inv.get("step"), str):
            found[inv["step"]] = inv
    return found


def _ran(steps: dict[str, dict[str, Any]], step: str) -> bool:
    inv = steps.get(step)
    return inv is not None and inv.get("exit_code") == 0 and inv.get("timed_out") is False


def _why(steps: dict[str, dict[str, Any]], step: str) -> str:
    inv = steps.get(step)
    if inv is None:
        return f"step {step} did not run"
    if inv.get("timed_out") is not False:
        return f"`{step}` timed out"
    return f"`{step}` exited {str(inv.get('exit_code'))[:6]}: {str(inv.get('stderr_last_line') or 'no stderr')[:200]}"


def portable(path: Path) -> bool:
    """A JSON evidence file holds no local path (non-JSON files are not scanned)."""
    if path.suffix not in {".json", ".jsonl"}:
        return True
    text = path.read_text(encoding="utf-8", errors="replace")
    for line in text.splitlines():
        try:
            value = json.loads(line) if path.suffix == ".jsonl" else None
        except (ValueError, RecursionError):
            return False
        if path.suffix == ".jsonl" and _has_path(value):
            return False
    return path.suffix == ".jsonl" or not _has_path(read_json(path))


def _has_path(value: Any) -> bool:
    if isinstance(value, str):
        return looks_like_local_path(value)
    if isinstance(value, dict):
        return any(_has_path(k) or _has_path(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_path(v) for v in value)
    return False


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _is_sha256(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def _finite(value: Any) -> float | None:
    """A finite number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    """An integer count (booleans are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _positive(line: dict[str, Any], key: str, kind: type = float) -> bool:
    """``line[key]`` is a finite number > 0 (an int when ``kind`` is int; booleans never count)."""
    value = line.get(key)
    if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
        return False
    return math.isfinite(value) and value > 0


def _per_line(lines: list[dict[str, Any]], key: str) -> str:
    return f"{key} {[line.get(key) for line in lines][:8]}"

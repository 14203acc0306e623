"""Derive the two in-toto statements from a verified chain: the builder writes them, the auditor re-derives them.

Every field comes from the candidate manifest, the qualification, its workload records and the bytes of the
published files (hashed here), so the auditor can recompute each statement and compare it field by field.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Literal

from harness.build.candidate import MANIFEST
from harness.core import policy, registry
from harness.core.errors import VerificationError
from harness.core.intoto import (
    BUILD_TYPE,
    LOCAL_BUILDER,
    SLSA_PROVENANCE,
    TEST_RESULT,
    BuildDefinition,
    Builder,
    BuildMetadata,
    DigestSet,
    ExternalParameters,
    InternalParameters,
    Provenance,
    ProvenanceStatement,
    QualificationResult,
    ResourceDescriptor,
    ResultStatement,
    RunDetails,
    SourceParameters,
    Subject,
    SubjectDigest,
    WarnedTest,
    WorkflowParameters,
)
from harness.core.jsonio import sha256_bytes
from harness.core.profiles import PROFILES
from harness.core.recordio import parse_record, record_bytes
from harness.core.records import (
    Artifact,
    CandidateManifest,
    GithubActionsBinding,
    LocalBinding,
    Qualification,
    WorkloadRecord,
)
from harness.evidence.archive import ARCHIVE, ARCHIVE_MANIFEST

PROVENANCE = "build-provenance.intoto.json"
QUALIFICATION_RESULT = "qualification-result.intoto.json"
STATEMENTS = (PROVENANCE, QUALIFICATION_RESULT)
GITHUB = "https://github.com"
BUILD_JOB: Literal["build-candidate"] = "build-candidate"


def subjects(m: CandidateManifest) -> list[Subject]:
    """The wheel then the sdist, by their published names and sha256."""
    return [Subject(name=d.filename, digest=SubjectDigest(sha256=d.sha256)) for d in (m.wheel, m.sdist)]


def run_uri(binding: LocalBinding | GithubActionsBinding) -> str | None:
    """The workflow run and attempt (GitHub's URL for it); None for a local build or qualification."""
    if not isinstance(binding, GithubActionsBinding):
        return None
    return f"{GITHUB}/{binding.repository}/actions/runs/{binding.run_id}/attempts/{binding.run_attempt}"


def builder_id(m: CandidateManifest) -> str:
    """gpu.yml's hosted ``build-candidate`` job at the workflow's ref; a URN for a local ``harness build``."""
    if not isinstance(m.workflow, GithubActionsBinding):
        return LOCAL_BUILDER
    return f"{GITHUB}/{m.workflow.repository}/{m.workflow.workflow_path}@{m.workflow_ref}#{BUILD_JOB}"


def build_provenance(m: CandidateManifest) -> ProvenanceStatement:
    binding = m.workflow
    workflow = (
        WorkflowParameters(
            repository=binding.repository, path=binding.workflow_path, ref=str(m.workflow_ref), job=BUILD_JOB
        )
        if isinstance(binding, GithubActionsBinding)
        else None
    )
    source_uri = (
        f"git+{GITHUB}/{binding.repository}@{m.source_commit}" if isinstance(binding, GithubActionsBinding) else None
    )
    tools = m.build.toolchain
    dependencies = [
        ResourceDescriptor(name="source", uri=source_uri, digest=DigestSet(gitCommit=m.source_commit)),
        ResourceDescriptor(name="harness/constraints-build.txt", digest=DigestSet(sha256=tools.constraints_sha256)),
        *(
            ResourceDescriptor(name=name, uri=f"pkg:pypi/{name}@{version}")
            for name, version in (("build", tools.build), ("hatchling", tools.hatchling), ("twine", tools.twine))
        ),
    ]
    uri = run_uri(binding)
    return ProvenanceStatement(
        subject=subjects(m),
        predicateType=SLSA_PROVENANCE,
        predicate=Provenance(
            buildDefinition=BuildDefinition(
                buildType=BUILD_TYPE,
                externalParameters=ExternalParameters(
                    workflow=workflow, source=SourceParameters(commit=m.source_commit, tree=m.source_tree)
                ),
                internalParameters=InternalParameters(
                    SOURCE_DATE_EPOCH=m.source_date_epoch,
                    python=m.build.python,
                    os=m.build.os,
                    machine=m.build.machine,
                    worktree_clean=m.worktree_clean,
                ),
                resolvedDependencies=dependencies,
            ),
            runDetails=RunDetails(
                builder=Builder(id=builder_id(m)),
                metadata=BuildMetadata(invocationId=uri) if uri else None,
            ),
        ),
    )


def workload_records(
    q: Qualification, read: Callable[[Artifact], bytes], *, check: str
) -> list[tuple[str, WorkloadRecord]]:
    """Each workload record of the qualification's level, in the registry's order, read through ``read`` and
    hashed here against the artifact that binds it."""
    by_role = {a.role: a for a in q.artifacts}
    records: list[tuple[str, WorkloadRecord]] = []
    for name in policy.required_workloads(q.level):
        art = by_role.get(policy.record_artifact_role(registry.workload(name)))
        if art is None:
            raise VerificationError(f"the record of workload {name} is not bound", check=check)
        data = read(art)
        if (len(data), sha256_bytes(data)) != (art.bytes, art.sha256):
            raise VerificationError(f"{art.path} differs from the artifact that binds it", check=check)
        records.append((name, parse_record(WorkloadRecord, data, art.path, check=check)))
    return records


def _content(name: str, data: bytes) -> ResourceDescriptor:
    return ResourceDescriptor(
        name=name, digest=DigestSet(sha256=sha256_bytes(data)), content=base64.b64encode(data).decode()
    )


def _file(name: str, sha256: str) -> ResourceDescriptor:
    return ResourceDescriptor(name=name, digest=DigestSet(sha256=sha256))


def qualification_result(
    m: CandidateManifest,
    q: Qualification,
    records: list[tuple[str, WorkloadRecord]],
    *,
    digests: dict[str, str],
) -> ResultStatement:
    """The qualification as a test result. ``digests`` holds the sha256 of the published candidate manifest,
    qualification.json, evidence archive and its manifest, hashed by the caller from the files."""
    profile = PROFILES[q.profile.name]
    criteria = policy.criteria_documents(profile)
    passed: list[str] = []
    failed: list[str] = []
    warned: list[WarnedTest] = []
    for workload, record in records:
        checks = record.checks
        passed += [f"{workload}/{c.name}" for c in checks.executed if c.passed]
        failed += [f"{workload}/{c.name}" for c in checks.executed if not c.passed]
        warned += [WarnedTest(test=f"{workload}/{c.name}", outcome="skipped", reason=c.reason) for c in checks.skipped]
        warned += [
            WarnedTest(test=f"{workload}/{c.name}", outcome="not_applicable", reason=c.reason)
            for c in checks.not_applicable
        ]
    warned.sort(key=lambda w: w.test)
    return ResultStatement(
        subject=subjects(m),
        predicateType=TEST_RESULT,
        predicate=QualificationResult(
            result="PASSED" if q.status == "passed" and not failed else "FAILED",
            configuration=[
                _content(f"profile/{profile.name}.json", record_bytes(profile)),
                _file(f"known-good/{q.profile.known_good}.json", q.profile.known_good_sha256),
                _content("thresholds", criteria.thresholds),
                _content("required-checks", criteria.required_checks),
            ],
            url=run_uri(q.execution.workflow),
            passedTests=sorted(passed),
            warnedTests=[w.test for w in warned],
            failedTests=sorted(failed),
            warned_reasons=warned,
            resolved_inputs=[
                _file(name, digests[name]) for name in (MANIFEST, "qualification.json", ARCHIVE, ARCHIVE_MANIFEST)
            ],
        ),
    )

"""What the evidence archive and the auditor publish: ``evidence-manifest.json`` (the archive's members, bound to
its qualification) and ``release-verification.json`` (the auditor's checks and verdict). Pydantic v2,
``extra="forbid"``, like every record of :mod:`harness.core.records`."""

from __future__ import annotations

from typing import Literal

from pydantic import model_validator

from harness.core.records import FileDigest, GitCommit, Name, NonNegInt, Record, RelPath, Sha256


class EvidenceMember(Record):
    name: RelPath
    role: Name
    bytes: NonNegInt
    sha256: Sha256


class EvidenceManifest(Record):
    kind: Literal["miniverl.evidence-manifest"]
    schema_version: Literal[1]
    archive: FileDigest
    source_commit: GitCommit
    qualification_sha256: Sha256
    members: list[EvidenceMember]

    @model_validator(mode="after")
    def _sorted_unique(self) -> EvidenceManifest:
        names = [m.name for m in self.members]
        if names != sorted(set(names)):
            raise ValueError("members must be sorted by name and unique")
        return self


class VerificationCheck(Record):
    name: Name
    passed: bool
    detail: str


class ReleaseVerification(Record):
    kind: Literal["miniverl.release-verification"]
    schema_version: Literal[1]
    status: Literal["passed", "failed"]
    level: Literal["release_smoke", "full_qualification"]
    source_commit: GitCommit
    candidate_manifest_sha256: Sha256 | None
    qualification_sha256: Sha256 | None
    known_good_sha256: Sha256
    required_gpu_name: str | None
    checks: list[VerificationCheck]
    failed_checks: list[Name]
    release_authorized: bool
    authorization_reasons: list[str]

    @model_validator(mode="after")
    def _consistent(self) -> ReleaseVerification:
        failed = [c.name for c in self.checks if not c.passed]
        if failed != self.failed_checks:
            raise ValueError("failed_checks must list exactly the failed checks, in order")
        if (self.status == "passed") != (not failed and bool(self.checks)):
            raise ValueError("status passed iff at least one check ran and none failed")
        if self.release_authorized and (self.status != "passed" or self.authorization_reasons):
            raise ValueError("release_authorized needs status passed and no reasons against it")
        return self


AUDIT_SCHEMA_MODELS: dict[str, type[Record]] = {
    "evidence-manifest": EvidenceManifest,
    "release-verification": ReleaseVerification,
}

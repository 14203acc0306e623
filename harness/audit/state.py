"""What an audit has established so far (the candidate, the qualification, the profile, the known-good stack), each
check's outcome, and the release-verification record they make."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harness.audit.findings import require, verify_file
from harness.audit.request import AuditRequest
from harness.core import policy
from harness.core.audit_records import ReleaseVerification, VerificationCheck
from harness.core.errors import HarnessError, VerificationError
from harness.core.jsonio import sha256_bytes
from harness.core.proc import Redactor
from harness.core.recordio import load_record
from harness.core.records import (
    Artifact,
    CandidateManifest,
    KnownGoodDescriptor,
    Profile,
    Qualification,
    WorkloadRecord,
)
from harness.core.safeio import path_below

_SCRUB = Redactor({})


@dataclass
class AuditState:
    req: AuditRequest
    checks: list[VerificationCheck] = field(default_factory=list)
    manifest: CandidateManifest | None = None
    manifest_bytes: bytes | None = None
    qual: Qualification | None = None
    qual_bytes: bytes | None = None
    profile_def: Profile | None = None
    descriptor: KnownGoodDescriptor | None = None
    locate: Callable[[Artifact], Path] | None = None

    def check(self, name: str, fn: Callable[[], str]) -> bool:
        try:
            detail = fn()
        except HarnessError as exc:
            failed = exc.check if exc.check not in {"harness", "verification"} else name
            detail = _SCRUB.text(str(exc))[:500]
            self.checks.append(VerificationCheck(name=failed, passed=False, detail=detail))
            return False
        except OSError as exc:  # e.g. an unreadable directory: a failed check, never a traceback
            detail = f"{exc.__class__.__name__}: {exc.strerror or 'cannot be read'}"
            self.checks.append(VerificationCheck(name=name, passed=False, detail=detail))
            return False
        self.checks.append(VerificationCheck(name=name, passed=True, detail=detail[:500]))
        return True

    def policy_record(
        self, art: Artifact | None, role: str, filename: str, workload: str, level: str, *, check: str
    ) -> WorkloadRecord:
        """The record bound as ``role``: at ``filename``, byte-verified, named ``workload`` at ``level`` on the
        qualification's profile, bound to its candidate, and its checks meeting the policy (passed)."""
        q, profile = self.held_qualification(), self.held_profile()
        require(
            art is not None and art.path == filename, check, f"{filename} is not bound by qualification.json as {role}"
        )
        assert art is not None
        path = self.locator()(art)
        verify_file(path, art)
        record = load_record(WorkloadRecord, path, filename, check=check)
        require(
            (record.name, record.level, record.profile) == (workload, level, q.profile.name),
            check,
            f"{filename} is named {record.name!r} at level {record.level} on {record.profile}; "
            f"its role needs {workload!r} at {level} on {q.profile.name}",
        )
        require(
            record.source_commit == q.candidate.source_commit and record.wheel_sha256 == q.candidate.wheel.sha256,
            check,
            f"{filename} binds another commit or wheel",
        )
        problems = policy.check_problems(record.checks, policy.record_checks(profile, workload))
        require(
            not problems and record.status == "passed",
            check,
            f"{filename}: " + ("; ".join(problems[:3]) or f"status {record.status}"),
        )
        return record

    def held_qualification(self) -> Qualification:
        if self.qual is None:
            raise VerificationError("qualification.json could not be read", check="qualification_schema")
        return self.qual

    def held_manifest(self) -> CandidateManifest:
        if self.manifest is None:
            raise VerificationError("the candidate could not be validated", check="candidate")
        return self.manifest

    def held_profile(self) -> Profile:
        if self.profile_def is None:
            raise VerificationError("the profile could not be established", check="profile")
        return self.profile_def

    def locator(self) -> Callable[[Artifact], Path]:
        if self.locate is not None:
            return self.locate
        root = self.req.qualification.parent
        return lambda art: path_below(root, art.path, art.path, check="artifact_file_type")

    def verification(self, checks: list[VerificationCheck]) -> ReleaseVerification:
        failed = [c.name for c in checks if not c.passed]
        status: Literal["passed", "failed"] = "failed" if failed else "passed"
        q, m = self.qual, self.manifest
        if status == "passed" and q is not None and m is not None and self.profile_def is not None:
            reasons = policy.authorization_reasons(
                q.level, self.profile_def, self.descriptor, m.workflow, q.execution.worktree
            )
        else:
            reasons = ["verification failed"]
        return ReleaseVerification(
            kind="miniverl.release-verification",
            schema_version=1,
            status=status,
            level=self.req.level,  # type: ignore[arg-type]
            source_commit=self.req.commit,
            candidate_manifest_sha256=sha256_bytes(self.manifest_bytes) if self.manifest_bytes else None,
            qualification_sha256=sha256_bytes(self.qual_bytes) if self.qual_bytes else None,
            known_good_sha256=self.req.known_good_sha256,
            required_gpu_name=self.req.required_gpu_name,
            checks=checks,
            failed_checks=failed,
            release_authorized=status == "passed" and not reasons,
            authorization_reasons=reasons,
        )

"""The torch-free auditor: re-verify a candidate, a qualification and (optionally) a release-asset dir."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harness.candidate import SUMS, check_candidate, sums_text
from harness.errors import HarnessError, VerificationError
from harness.evidence import ARCHIVE, ARCHIVE_MANIFEST, ARCHIVE_MEMBERS, safe_extract
from harness.jsonio import sha256_bytes, sha256_file
from harness.proc import Redactor
from harness.profiles import PROFILES, profile_sha256
from harness.recordio import load_record
from harness.records import (
    CandidateManifest,
    EvidenceManifest,
    GithubActionsBinding,
    Qualification,
    ReleaseVerification,
    VerificationCheck,
    WorkloadRecord,
)

_SCRUB = Redactor({})
RELEASE_VERIFICATION = "release-verification.json"
QUAL_SUMS = "qualification-SHA256SUMS"
PRINCIPAL = [
    "qualification-release-smoke.json",
    "qualification-direct-gkd.json",
    "qualification-pg-k1.json",
    "qualification-smollm2.json",
]
# The nine provenance and evidence assets, in the seed's canonical order.
QUALIFICATION_ASSETS = [
    "candidate-manifest.json",
    RELEASE_VERIFICATION,
    "qualification.json",
    *PRINCIPAL,
    ARCHIVE,
    ARCHIVE_MANIFEST,
]
TOP_LEVEL = {"dist", SUMS, QUAL_SUMS, *QUALIFICATION_ASSETS}
PRINCIPAL_ROLE_PREFIX = "principal_"


@dataclass
class AuditRequest:
    candidate_dir: Path
    candidate_manifest: Path
    qualification: Path
    commit: str
    known_good_sha256: str
    required_gpu_name: str | None
    level: str = "full_qualification"
    assets_dir: Path | None = None
    profile: str | None = None
    expect_release_verification: bool = True


@dataclass
class Auditor:
    req: AuditRequest
    checks: list[VerificationCheck] = field(default_factory=list)
    manifest: CandidateManifest | None = None
    qual: Qualification | None = None

    def check(self, name: str, fn: Callable[[], str]) -> bool:
        try:
            detail = fn()
        except HarnessError as exc:
            failed = exc.check if exc.check not in {"harness", "verification"} else name
            detail = _SCRUB.text(str(exc))[:500]
            self.checks.append(VerificationCheck(name=failed, passed=False, detail=detail))
            return False
        self.checks.append(VerificationCheck(name=name, passed=True, detail=detail[:500]))
        return True

    # -- candidate and qualification ---------------------------------------------------------------
    def candidate(self) -> str:
        self.manifest = check_candidate(self.req.candidate_dir, self.req.candidate_manifest)
        return f"exact file set; {self.manifest.wheel.filename} and {self.manifest.sdist.filename} match their hashes"

    def commit(self) -> str:
        assert self.manifest is not None
        _require(
            self.manifest.source_commit == self.req.commit,
            "source_commit",
            f"candidate was built from {self.manifest.source_commit}, not {self.req.commit}",
        )
        return "candidate source commit equals --commit"

    def qualification(self) -> str:
        self.qual = load_record(Qualification, self.req.qualification, "qualification.json")
        return "qualification.json validates against its schema"

    def binding(self) -> str:
        q, m = self._q(), self._m()
        data = self.req.candidate_manifest.read_bytes()
        _require(
            q.candidate.manifest_sha256 == sha256_bytes(data),
            "candidate_binding",
            "qualification was made from a different candidate manifest",
        )
        _require(
            q.candidate.source_commit == self.req.commit,
            "source_commit",
            f"qualification binds commit {q.candidate.source_commit}, not {self.req.commit}",
        )
        _require(
            q.candidate.wheel == m.wheel and q.candidate.sdist == m.sdist and q.candidate.workflow == m.workflow,
            "candidate_binding",
            "qualification binds another wheel, sdist or build run",
        )
        return "qualification binds this candidate manifest, wheel and sdist"

    def workflow(self) -> str:
        q, m = self._q(), self._m()
        built, ran = m.workflow, q.execution.workflow
        for label, binding in (("candidate", built), ("qualification", ran)):
            if isinstance(binding, GithubActionsBinding):
                _require(
                    binding.run_attempt == 1,
                    "run_attempt",
                    f"{label} came from run attempt {binding.run_attempt}; only attempt 1 is accepted",
                )
        if isinstance(built, GithubActionsBinding) or isinstance(ran, GithubActionsBinding):
            _require(built == ran, "same_run", "candidate and qualification are not from the same workflow run")
            return f"same run {built.run_id if isinstance(built, GithubActionsBinding) else ''} attempt 1"
        return "local build and local qualification (cannot authorize a release)"

    def level(self) -> str:
        q = self._q()
        _require(
            q.level == self.req.level, "level", f"qualification level is {q.level}, the gate needs {self.req.level}"
        )
        return f"level {q.level}"

    def profile(self) -> str:
        q = self._q()
        known = PROFILES.get(q.profile.name)
        _require(
            known is not None and profile_sha256(known) == q.profile.sha256,
            "profile",
            f"profile {q.profile.name!r} is unknown or its definition differs from the harness's",
        )
        assert known is not None
        _require(
            self.req.profile in (None, q.profile.name),
            "profile",
            f"qualification used profile {q.profile.name}, expected {self.req.profile}",
        )
        _require(known.can_authorize_release == q.profile.can_authorize_release, "profile", "release authority differs")
        want = self.req.required_gpu_name
        have = q.environment.gpu.name if q.environment.gpu else None
        _require(
            known.required_gpu_name == want and have == want,
            "gpu_name",
            f"measured GPU {have!r}, profile {known.required_gpu_name!r}, required {want!r}",
        )
        return f"profile {q.profile.name}, GPU {have!r}"

    def known_good(self) -> str:
        q = self._q()
        _require(
            q.profile.known_good_sha256 == self.req.known_good_sha256 == q.environment.known_good_sha256,
            "known_good_sha256",
            "qualification's known-good sha256 differs from --known-good-sha256",
        )
        return f"known-good {q.profile.known_good} ({q.profile.known_good_status})"

    def status(self) -> str:
        q = self._q()
        _require(
            q.status == "passed",
            "qualification_status",
            f"qualification status is {q.status}: " + "; ".join(q.reasons[:3]),
        )
        return "qualification passed every required check"

    def qualification_dir(self) -> str:
        q, root = self._q(), self.req.qualification.parent
        for art in q.artifacts:
            _verify_file(root, art.path, art.bytes, art.sha256)
        self._principal(lambda name: root / name)
        return f"{len(q.artifacts)} artifacts re-verified (regular files, bytes, sha256)"

    def _principal(self, locate: Callable[[str], Path]) -> None:
        q = self._q()
        bound = {a.path: a for a in q.artifacts if a.role.startswith(PRINCIPAL_ROLE_PREFIX)}
        needed = PRINCIPAL if q.level == "full_qualification" else PRINCIPAL[:1]
        missing = [n for n in needed if n not in bound]
        _require(not missing, "principal_records", f"principal records not bound by qualification.json: {missing}")
        for name in needed:
            record = load_record(WorkloadRecord, locate(name), name)
            _require(
                record.status == "passed" or q.status == "failed", "principal_records", f"{name} is {record.status}"
            )
            _require(
                record.source_commit == q.candidate.source_commit and record.wheel_sha256 == q.candidate.wheel.sha256,
                "principal_records",
                f"{name} binds another commit or wheel",
            )

    # -- release assets ----------------------------------------------------------------------------
    def assets(self) -> str:
        root, q, m = self._assets(), self._q(), self._m()
        entries = {p.name: p for p in root.iterdir()}
        expected = (
            set(TOP_LEVEL) if self.req.expect_release_verification else TOP_LEVEL - {RELEASE_VERIFICATION, QUAL_SUMS}
        )
        _require(
            set(entries) == expected,
            "assets_layout",
            f"top level must be exactly {sorted(expected)}; "
            f"extra {sorted(set(entries) - expected)}, missing {sorted(expected - set(entries))}",
        )
        dist = root / "dist"
        _require(dist.is_dir() and not dist.is_symlink(), "assets_layout", "dist/ is not a directory")
        _require(
            sorted(p.name for p in dist.iterdir()) == sorted([m.wheel.filename, m.sdist.filename]),
            "assets_dist",
            "dist/ must hold exactly the candidate wheel and sdist",
        )
        for digest in (m.wheel, m.sdist):
            _verify_file(dist, digest.filename, digest.bytes, digest.sha256)
        _require(
            _bytes(root, SUMS) == sums_text([m.wheel, m.sdist]).encode(),
            "assets_sha256sums",
            "SHA256SUMS must list exactly the wheel then the sdist",
        )
        _require(
            _bytes(root, "candidate-manifest.json") == self.req.candidate_manifest.read_bytes(),
            "assets_candidate_manifest",
            "candidate-manifest.json differs from the candidate's",
        )
        _require(
            _bytes(root, "qualification.json") == self.req.qualification.read_bytes(),
            "assets_qualification",
            "qualification.json differs from the one given",
        )
        by_path = {a.path: a for a in q.artifacts}
        for name in PRINCIPAL:
            art = by_path.get(name)
            _require(art is not None, "principal_records", f"{name} is not bound by qualification.json")
            assert art is not None
            _verify_file(root, name, art.bytes, art.sha256)
        self._principal(lambda name: root / name)
        self._archive(root)
        if self.req.expect_release_verification:
            self._sums_and_verification(root)
        return "release assets: exact layout, every hash, byte count and file type re-verified"

    def _archive(self, root: Path) -> None:
        q = self._q()
        manifest = load_record(EvidenceManifest, root / ARCHIVE_MANIFEST, ARCHIVE_MANIFEST)
        size, digest = (root / ARCHIVE).stat().st_size, sha256_file(root / ARCHIVE)
        _require(
            manifest.archive.filename == ARCHIVE
            and manifest.archive.bytes == size
            and manifest.archive.sha256 == digest,
            "evidence_archive",
            "archive bytes differ from its manifest",
        )
        _require(
            manifest.source_commit == q.candidate.source_commit, "evidence_archive", "archive binds another commit"
        )
        _require(
            manifest.qualification_sha256 == sha256_file(self.req.qualification),
            "evidence_archive",
            "archive binds another qualification.json",
        )
        expected = {ARCHIVE_MEMBERS[a.role]: a for a in q.artifacts if not a.role.startswith(PRINCIPAL_ROLE_PREFIX)}
        with tempfile.TemporaryDirectory(prefix="miniverl-audit-") as tmp:
            files = safe_extract(root / ARCHIVE, Path(tmp))
            listed = {mem.name: mem for mem in manifest.members}
            _require(
                set(files) == set(listed) == set(expected),
                "evidence_archive",
                "archive members, manifest members and qualification artifacts differ",
            )
            for name, path in files.items():
                mem, art = listed[name], expected[name]
                actual = (path.stat().st_size, sha256_file(path))
                _require(
                    actual == (mem.bytes, mem.sha256) == (art.bytes, art.sha256) and mem.role == art.role,
                    "evidence_archive",
                    f"member {name} differs from its manifest entry or qualification artifact",
                )

    def _sums_and_verification(self, root: Path) -> None:
        want = "".join(f"{sha256_file(root / n)}  {n}\n" for n in QUALIFICATION_ASSETS).encode()
        _require(
            _bytes(root, QUAL_SUMS) == want,
            "qualification_sha256sums",
            "qualification-SHA256SUMS must cover the nine assets in canonical order with their hashes",
        )
        rv = load_record(ReleaseVerification, root / RELEASE_VERIFICATION, RELEASE_VERIFICATION)
        _require(
            rv.status == "passed"
            and rv.source_commit == self.req.commit
            and rv.candidate_manifest_sha256 == sha256_file(self.req.candidate_manifest)
            and rv.qualification_sha256 == sha256_file(self.req.qualification)
            and rv.known_good_sha256 == self.req.known_good_sha256
            and rv.level == self.req.level,
            "release_verification",
            "release-verification.json does not bind this passed chain",
        )

    # -- helpers -----------------------------------------------------------------------------------
    def _q(self) -> Qualification:
        if self.qual is None:
            raise VerificationError("qualification.json could not be read", check="record_schema")
        return self.qual

    def _m(self) -> CandidateManifest:
        if self.manifest is None:
            raise VerificationError("the candidate could not be validated", check="candidate")
        return self.manifest

    def _assets(self) -> Path:
        assert self.req.assets_dir is not None
        return self.req.assets_dir

    def authorization(self) -> list[str]:
        reasons: list[str] = []
        q, m = self.qual, self.manifest
        if q is None or m is None:
            return ["the chain could not be read"]
        if q.level != "full_qualification":
            reasons.append(f"level {q.level} is diagnostic; a release needs full_qualification")
        if not q.profile.can_authorize_release:
            reasons.append(f"profile {q.profile.name} can never authorize a release")
        if q.profile.known_good_status != "measured":
            reasons.append(f"known-good stack {q.profile.known_good} is declared, not measured")
        if not isinstance(m.workflow, GithubActionsBinding):
            reasons.append("the candidate was not built by the gpu.yml workflow (local binding)")
        elif m.workflow.workflow_path != ".github/workflows/gpu.yml":
            reasons.append(f"candidate came from {m.workflow.workflow_path}, not .github/workflows/gpu.yml")
        if q.execution.worktree.state != "clean":
            reasons.append(f"qualification ran from a {q.execution.worktree.state} checkout")
        return reasons


def audit(req: AuditRequest) -> ReleaseVerification:
    a = Auditor(req)
    if a.check("candidate", a.candidate):
        a.check("source_commit", a.commit)
    if a.check("qualification_schema", a.qualification) and a.manifest is not None:
        for name, fn in (
            ("candidate_binding", a.binding),
            ("workflow_run", a.workflow),
            ("level", a.level),
            ("profile", a.profile),
            ("known_good_sha256", a.known_good),
            ("qualification_status", a.status),
        ):
            a.check(name, fn)
        if req.assets_dir is not None:
            a.check("release_assets", a.assets)
        else:
            a.check("qualification_artifacts", a.qualification_dir)
    failed = [c.name for c in a.checks if not c.passed]
    status: Literal["passed", "failed"] = "failed" if failed else "passed"
    reasons = a.authorization() if status == "passed" else ["verification failed"]
    m, q = a.manifest, a.qual
    return ReleaseVerification(
        kind="miniverl.release-verification",
        schema_version=1,
        status=status,
        level=req.level if req.level in ("release_smoke", "full_qualification") else "full_qualification",  # type: ignore[arg-type]
        source_commit=req.commit,
        candidate_manifest_sha256=sha256_file(req.candidate_manifest) if m is not None else None,
        qualification_sha256=sha256_file(req.qualification) if q is not None else None,
        known_good_sha256=req.known_good_sha256,
        required_gpu_name=req.required_gpu_name,
        checks=a.checks,
        failed_checks=failed,
        release_authorized=status == "passed" and not reasons,
        authorization_reasons=reasons,
    )


def _require(condition: bool, check: str, message: str) -> None:
    if not condition:
        raise VerificationError(message, check=check)


def _bytes(root: Path, name: str) -> bytes:
    path = root / name
    if path.is_symlink() or not path.is_file():
        raise VerificationError(f"{name} is missing or not a regular file", check="artifact_file_type")
    return path.read_bytes()


def _verify_file(root: Path, rel: str, size: int, sha256: str) -> None:
    path = root
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            raise VerificationError(f"{rel} passes through a symlink", check="artifact_file_type")
    if not path.is_file():
        raise VerificationError(f"{rel} is missing or not a regular file", check="artifact_file_type")
    if path.stat().st_size != size:
        raise VerificationError(f"{rel}: {path.stat().st_size} bytes, record says {size}", check="artifact_bytes")
    if sha256_file(path) != sha256:
        raise VerificationError(f"{rel}: sha256 differs from the record", check="artifact_sha256")

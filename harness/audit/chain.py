"""The torch-free auditor: re-verify a candidate, a qualification and (optionally) a release-asset dir.

The policy (required checks, principal records, thresholds, release authority) comes from ``harness.core.policy``;
the records under audit only supply evidence. The published ``release-verification.json`` is the chain
verification (everything but the asset layout), so the auditor recomputes it and demands identical bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.audit.findings import every, require, verify_file, workloads_first
from harness.audit.rejudge import smoke_rejudged, workload_records
from harness.audit.request import AuditRequest, validate_request
from harness.audit.state import AuditState
from harness.build.candidate import check_candidate
from harness.build.known_good import read_known_good
from harness.core import policy
from harness.core.audit_records import ReleaseVerification, VerificationCheck
from harness.core.jsonio import loads_strict, sha256_bytes
from harness.core.profiles import PROFILES, profile_sha256
from harness.core.recordio import parse_record
from harness.core.records import Artifact, GithubActionsBinding, KnownGoodDescriptor, Qualification
from harness.core.safeio import MANIFEST_MAX_BYTES, RECORD_MAX_BYTES, read_regular
from harness.evidence.archive import ARCHIVE_MEMBERS
from harness.evidence.statements import workload_records as bound_workload_records
from harness.qualify.qualification import EVIDENCE_PATHS


@dataclass
class Auditor(AuditState):
    """The chain's checks, each a method that returns its detail or raises the named failure."""

    def candidate(self) -> str:
        self.manifest = check_candidate(self.req.candidate_dir, self.req.candidate_manifest)
        self.manifest_bytes = read_regular(
            self.req.candidate_manifest, "--candidate-manifest", max_bytes=MANIFEST_MAX_BYTES, check="candidate"
        )
        return f"exact file set; {self.manifest.wheel.filename} and {self.manifest.sdist.filename} match their hashes"

    def commit(self) -> str:
        m = self.held_manifest()
        require(
            m.source_commit == self.req.commit,
            "source_commit",
            f"candidate was built from {m.source_commit}, not {self.req.commit}",
        )
        return "candidate source commit equals --commit"

    def qualification(self) -> str:
        self.qual_bytes = read_regular(
            self.req.qualification, "qualification.json", max_bytes=RECORD_MAX_BYTES, check="qualification_schema"
        )
        self.qual = parse_record(Qualification, self.qual_bytes, "qualification.json", check="qualification_schema")
        return "qualification.json validates against its schema"

    def binding(self) -> str:
        q, m = self.held_qualification(), self.held_manifest()
        require(
            q.candidate.manifest_sha256 == sha256_bytes(self.manifest_bytes or b""),
            "candidate_binding",
            "qualification was made from a different candidate manifest",
        )
        require(
            q.candidate.source_commit == self.req.commit,
            "source_commit",
            f"qualification binds commit {q.candidate.source_commit}, not {self.req.commit}",
        )
        require(
            q.candidate.wheel == m.wheel
            and q.candidate.sdist == m.sdist
            and q.candidate.workflow == m.workflow
            and q.candidate.version == m.version,
            "candidate_binding",
            "qualification binds another wheel, sdist, version or build run",
        )
        return "qualification binds this candidate manifest, wheel and sdist"

    def workflow(self) -> str:
        q, m = self.held_qualification(), self.held_manifest()
        built, ran = m.workflow, q.execution.workflow
        for label, binding in (("candidate", built), ("qualification", ran)):
            if isinstance(binding, GithubActionsBinding):
                require(
                    binding.run_attempt == 1,
                    "run_attempt",
                    f"{label} came from run attempt {binding.run_attempt}; only attempt 1 is accepted",
                )
        if isinstance(built, GithubActionsBinding) or isinstance(ran, GithubActionsBinding):
            require(built == ran, "same_run", "candidate and qualification are not from the same workflow run")
            assert isinstance(built, GithubActionsBinding)
            return f"same run {built.run_id} attempt 1"
        return "local build and local qualification (cannot authorize a release)"

    def level(self) -> str:
        q = self.held_qualification()
        require(
            q.level == self.req.level, "level", f"qualification level is {q.level}, the gate needs {self.req.level}"
        )
        return f"level {q.level}"

    def profile(self) -> str:
        q = self.held_qualification()
        known = PROFILES.get(q.profile.name)
        require(known is not None, "profile", f"profile {q.profile.name!r} is not a harness profile")
        assert known is not None
        require(
            profile_sha256(known) == q.profile.sha256
            and known.can_authorize_release == q.profile.can_authorize_release
            and known.known_good == q.profile.known_good,
            "profile",
            f"profile {q.profile.name!r} in the record differs from the harness's definition",
        )
        want = self.req.required_gpu_name
        have = q.environment.gpu.name if q.environment.gpu else None
        require(
            known.required_gpu_name == want and have == want,
            "gpu_name",
            f"measured GPU {have!r}, profile {known.required_gpu_name!r}, required {want!r}",
        )
        require(
            self.req.profile in (None, q.profile.name),
            "profile",
            f"qualification used profile {q.profile.name}, expected {self.req.profile}",
        )
        require(known.device == q.environment.device, "profile", f"profile runs on {known.device}")
        self.profile_def = known
        return f"profile {q.profile.name}, GPU {have!r}"

    def known_good(self) -> str:
        q, m, profile = self.held_qualification(), self.held_manifest(), self.held_profile()
        data, source = read_known_good(
            self.req.known_good, self.req.candidate_dir / m.sdist.filename, m.version, profile.known_good
        )
        digest = sha256_bytes(data)
        require(
            digest == self.req.known_good_sha256,
            "known_good_sha256",
            f"known-good/{profile.known_good}.json ({source}) hashes to {digest}, not --known-good-sha256",
        )
        require(
            q.profile.known_good_sha256 == digest == q.environment.known_good_sha256,
            "known_good_sha256",
            "the qualification was made against another known-good stack",
        )
        descriptor = parse_record(
            KnownGoodDescriptor, data, f"known-good/{profile.known_good}.json", check="known_good"
        )
        require(
            descriptor.name == profile.known_good and descriptor.required_gpu_name == profile.required_gpu_name,
            "known_good",
            f"the known-good descriptor names {descriptor.name!r} for GPU {descriptor.required_gpu_name!r}",
        )
        require(
            q.profile.known_good_status == descriptor.status,
            "known_good",
            f"the record says the stack is {q.profile.known_good_status}, the descriptor says {descriptor.status}",
        )
        self.descriptor = descriptor
        return f"known-good {descriptor.name} ({descriptor.status}) from {source}"

    def status(self) -> str:
        q, profile = self.held_qualification(), self.held_profile()
        problems = policy.derived_status(q, profile)
        require(not problems, "qualification_status", every(workloads_first(problems, q)))
        require(q.status == "passed", "qualification_status", f"qualification status is {q.status}")
        return f"re-derived from the harness policy: {len(q.checks.executed)} checks executed, all required passed"

    def principal_records(self) -> str:
        q = self.held_qualification()
        wanted = policy.principals(q.level)
        bound = {a.role: a for a in q.artifacts if a.role.startswith("principal_")}
        extra = sorted(set(bound) - {p.artifact_role for p in wanted})
        require(not extra, "principal_records", f"principal roles not used by level {q.level}: {extra}")
        for role in wanted:
            self.policy_record(
                bound.get(role.artifact_role), role.artifact_role, role.filename, role.workload, role.level,
                check="principal_records",
            )  # fmt: skip
        return f"{len(wanted)} principal records: names, levels, profile, bindings and checks match the policy"

    def evidence(self) -> str:
        q, locate = self.held_qualification(), self.locator()
        subordinate = [a for a in q.artifacts if not a.role.startswith("principal_")]
        for art in subordinate:
            require(
                art.role in ARCHIVE_MEMBERS and EVIDENCE_PATHS.get(art.role) == art.path,
                "evidence_roles",
                f"artifact {art.path} has role {art.role!r}, which the harness does not map to that path",
            )
        missing = [r for r in policy.SMOKE_EVIDENCE_ROLES if r not in {a.role for a in subordinate}]
        require(not missing, "evidence_roles", f"required evidence is not bound: {missing}")
        for art in subordinate:
            verify_file(locate(art), art)
        return f"{len(subordinate)} evidence files re-verified (regular files, bytes, sha256)"

    def criteria(self) -> str:
        """The thresholds and required checks the qualification was judged by are those the candidate manifest
        fixed before any GPU work: the profile's thresholds (the record binds the profile by sha256) and the
        required list of every record the level needs, against the digests the manifest names for the profile."""
        q, m, profile, locate = self.held_qualification(), self.held_manifest(), self.held_profile(), self.locator()
        fixed = next((c for c in m.criteria if c.profile == profile.name), None)
        require(fixed is not None, "criteria_fixed", f"the candidate manifest fixes no criteria for {profile.name}")
        assert fixed is not None
        documents = policy.criteria_documents(profile)
        require(
            sha256_bytes(documents.thresholds) == fixed.thresholds_sha256,
            "criteria_fixed",
            f"the thresholds of {profile.name} differ from those the candidate manifest fixed",
        )
        require(
            sha256_bytes(documents.required_checks) == fixed.required_checks_sha256,
            "criteria_fixed",
            f"the required checks of {profile.name} differ from those the candidate manifest fixed",
        )
        fixed_lists = loads_strict(documents.required_checks, "required checks")

        def read(art: Artifact) -> bytes:
            return read_regular(locate(art), art.path, max_bytes=RECORD_MAX_BYTES, check="criteria_fixed")

        judged = [("qualification.json", q.checks.required, fixed_lists["release-smoke"])]
        judged += [
            (name, record.checks.required, fixed_lists[name])
            for name, record in bound_workload_records(q, read, check="criteria_fixed")
        ]
        differ = [name for name, listed, wanted in judged if listed != wanted]
        require(not differ, "criteria_fixed", f"required checks differ from the fixed ones in {every(differ)}")
        return f"thresholds and the required checks of {len(judged)} records equal those fixed for {profile.name}"


def chain_checks(a: Auditor) -> list[VerificationCheck]:
    if a.check("candidate", a.candidate):
        a.check("source_commit", a.commit)
    if a.check("qualification_schema", a.qualification) and a.manifest is not None:
        for name, fn in (
            ("candidate_binding", a.binding),
            ("workflow_run", a.workflow),
            ("level", a.level),
            ("profile", a.profile),
        ):
            a.check(name, fn)
        if a.profile_def is not None:
            a.check("known_good_sha256", a.known_good)
            a.check("qualification_status", a.status)
            # the evidence's layout (roles, paths, regular files, bytes) before the records that rest on it
            a.check("evidence_files", a.evidence)
            a.check("principal_records", a.principal_records)
            a.check("criteria_fixed", a.criteria)
            a.check("smoke_rejudged", lambda: smoke_rejudged(a))
            a.check("workload_records", lambda: workload_records(a))
    return list(a.checks)


def verify_chain(req: AuditRequest, locate: Callable[[Artifact], Path] | None = None) -> ReleaseVerification:
    """The chain verification: what ``release-verification.json`` publishes (no asset-layout checks)."""
    validate_request(req)
    a = Auditor(replace(req, assets_dir=None), locate=locate)
    return a.verification(chain_checks(a))

"""The torch-free auditor: re-verify a candidate, a qualification and (optionally) a release-asset dir.

The policy (required checks, principal records, thresholds, release authority) comes from ``harness.core.policy``;
the records under audit only supply evidence. The published ``release-verification.json`` is the chain
verification (everything but the asset layout), so the auditor recomputes it and demands identical bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from harness.build.candidate import check_candidate, normalize
from harness.build.known_good import read_known_good
from harness.core import policy, registry
from harness.core.errors import HarnessError, VerificationError
from harness.core.jsonio import loads_strict, sha256_bytes
from harness.core.policy import CANDIDATE_BOUND as BOUND
from harness.core.proc import Redactor
from harness.core.profiles import PROFILES, profile_sha256
from harness.core.recordio import load_record, parse_record
from harness.core.records import (
    COMMIT_HEX,
    SHA256_HEX,
    Artifact,
    CandidateManifest,
    GithubActionsBinding,
    GpuFacts,
    KnownGoodDescriptor,
    Profile,
    Qualification,
    ReleaseVerification,
    VerificationCheck,
    WorkloadRecord,
    WorkloadSpec,
)
from harness.core.safeio import (
    MANIFEST_MAX_BYTES,
    RECORD_MAX_BYTES,
    file_digest,
    path_below,
    read_regular,
    regular_file_size,
)
from harness.evidence.archive import ARCHIVE_MEMBERS
from harness.evidence.statements import workload_records
from harness.qualify.binding import transcript_bound
from harness.qualify.full.catalog import evidence_role, implemented
from harness.qualify.full.scales import SCALES
from harness.qualify.install_judge import InstallBasis, InstallFacts, captured_gpu, judge_install
from harness.qualify.qualification import EVIDENCE_PATHS, SMOKE_EVIDENCE_PATHS
from harness.qualify.smoke_judge import SmokeBasis, evidence_checks, judge_smoke

_SCRUB = Redactor({})
GPU_NAME = re.compile(r"^[A-Za-z0-9 ._()+-]{1,100}$")


@dataclass(frozen=True)
class AuditRequest:
    candidate_dir: Path
    candidate_manifest: Path
    qualification: Path
    commit: str
    known_good_sha256: str
    required_gpu_name: str | None
    level: str = "full_qualification"
    known_good: Path | None = None  # the descriptor; None reads known-good/<name>.json from the candidate's sdist
    assets_dir: Path | None = None
    profile: str | None = None
    gate_record: Path | None = None  # gate.json, compared with the statements among ``assets_dir``


def validate_request(req: AuditRequest) -> None:
    """Arguments the auditor can refuse before reading anything (exit 1, one named line)."""
    if not COMMIT_HEX.match(req.commit):
        raise VerificationError(f"--commit {req.commit[:50]!r} is not a full 40-hex lower-case sha", check="commit")
    if not SHA256_HEX.match(req.known_good_sha256):
        raise VerificationError("--known-good-sha256 is not 64 lower-case hex digits", check="known_good_sha256")
    if req.level not in policy.LEVELS:
        raise VerificationError(f"--level {req.level[:40]!r} is not one of {list(policy.LEVELS)}", check="level")
    if req.required_gpu_name is not None and not GPU_NAME.match(req.required_gpu_name):
        raise VerificationError("--required-gpu-name is not a plain GPU name", check="gpu_name")
    if req.profile is not None and req.profile not in PROFILES:
        raise VerificationError(f"--profile {req.profile[:40]!r} is not a harness profile", check="profile")


@dataclass
class Auditor:
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

    # -- the chain -------------------------------------------------------------------------------------
    def candidate(self) -> str:
        self.manifest = check_candidate(self.req.candidate_dir, self.req.candidate_manifest)
        self.manifest_bytes = read_regular(
            self.req.candidate_manifest, "--candidate-manifest", max_bytes=MANIFEST_MAX_BYTES, check="candidate"
        )
        return f"exact file set; {self.manifest.wheel.filename} and {self.manifest.sdist.filename} match their hashes"

    def commit(self) -> str:
        m = self._m()
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
        q, m = self._q(), self._m()
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
        q, m = self._q(), self._m()
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
        q = self._q()
        require(
            q.level == self.req.level, "level", f"qualification level is {q.level}, the gate needs {self.req.level}"
        )
        return f"level {q.level}"

    def profile(self) -> str:
        q = self._q()
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
        q, m, profile = self._q(), self._m(), self._profile()
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
        q, profile = self._q(), self._profile()
        problems = policy.derived_status(q, profile)
        require(not problems, "qualification_status", _every(_workloads_first(problems, q)))
        require(q.status == "passed", "qualification_status", f"qualification status is {q.status}")
        return f"re-derived from the harness policy: {len(q.checks.executed)} checks executed, all required passed"

    def principal_records(self) -> str:
        q = self._q()
        wanted = policy.principals(q.level)
        bound = {a.role: a for a in q.artifacts if a.role.startswith("principal_")}
        extra = sorted(set(bound) - {p.artifact_role for p in wanted})
        require(not extra, "principal_records", f"principal roles not used by level {q.level}: {extra}")
        for role in wanted:
            self._policy_record(
                bound.get(role.artifact_role), role.artifact_role, role.filename, role.workload, role.level,
                check="principal_records",
            )  # fmt: skip
        return f"{len(wanted)} principal records: names, levels, profile, bindings and checks match the policy"

    def _policy_record(
        self, art: Artifact | None, role: str, filename: str, workload: str, level: str, *, check: str
    ) -> WorkloadRecord:
        """The record bound as ``role``: at ``filename``, byte-verified, named ``workload`` at ``level`` on the
        qualification's profile, bound to its candidate, and its checks meeting the policy (passed)."""
        q, profile = self._q(), self._profile()
        require(
            art is not None and art.path == filename, check, f"{filename} is not bound by qualification.json as {role}"
        )
        assert art is not None
        path = self._locate()(art)
        _verify_file(path, art)
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

    def smoke_rejudged(self) -> str:
        """Every check of the release smoke re-derived from its bound evidence and compared with both records.

        The CLI, origin and binding checks come from :func:`harness.qualify.smoke_judge.judge_smoke` over the evidence
        files (the GPU name from the captured ``nvidia-smi`` output); evidence_portable/evidence_bounded are
        recomputed over those files; the install phase (clean_worktree, wheel_sha256_before_install, install,
        fresh_venv, pip_check, stack_matches_known_good, python_version) from the commands' captured output by
        :func:`harness.qualify.install_judge.judge_install`, against the candidate and the known-good descriptor.
        The record's own worktree, packages, Python, GPU and venv fields must say what that output says, and the
        CUDA byte counts the record keeps must equal those in the run's summary.
        """
        q, m, profile, locate = self._q(), self._m(), self._profile(), self._locate()
        by_role = {a.role: a for a in q.artifacts}
        evidence: dict[str, Path] = {}
        for role in SMOKE_EVIDENCE_PATHS:
            art = by_role.get(role)
            if art is not None:
                evidence[role] = locate(art)
                _verify_file(evidence[role], art)
        smi = captured_gpu(evidence)
        verdict = judge_smoke(evidence, SmokeBasis(profile, m.version, m.wheel.sha256, smi.name if smi else None))
        judged = dict(verdict.checks)
        judged.update(evidence_checks(list(evidence.values())))
        descriptor = self.descriptor
        install = judge_install(
            evidence,
            InstallBasis(
                commit=q.candidate.source_commit,
                version=m.version,
                wheel_filename=m.wheel.filename,
                wheel_sha256=m.wheel.sha256,
                extras=tuple(profile.install_extras),
                pins={normalize(k): v for k, v in descriptor.packages.items()} if descriptor else {},
                python_pin=descriptor.python if descriptor else None,
                index_urls=tuple(descriptor.extra_index_urls) if descriptor else (),
            ),
        )
        judged.update(install.checks)
        if descriptor is None:  # known_good_sha256 failed already: there are no pins to judge the stack by
            judged.pop("stack_matches_known_good")
        mismatch = _record_against_output(q, install.facts, smi)
        smoke = self._smoke_record()
        why = {n: detail for n, (_, detail) in judged.items()} | dict(verdict.not_applicable)
        failing: set[str] = set()
        for checks in (q.checks, smoke.checks):
            recorded = {c.name: c.passed for c in checks.executed}
            n_a = {c.name for c in checks.not_applicable}
            failing |= {n for n, (ok, _) in judged.items() if not ok or recorded.get(n) is not True}
            failing |= {n for n in verdict.not_applicable if n not in n_a}
        for key, value in verdict.metrics.items():
            if key.startswith("cuda_") and (q.metrics.get(key) != value or smoke.metrics.get(key) != value):
                failing.add(key)
                why[key] = f"recorded {q.metrics.get(key)!r} and {smoke.metrics.get(key)!r}, the evidence {value!r}"
        failing |= set(mismatch)
        why |= mismatch
        names = sorted(failing)
        require(
            not names,
            "smoke_rejudged",
            f"re-judged from its evidence, {names[:6]} do not hold ({'; '.join(why[n][:100] for n in names[:2])})",
        )
        return f"{len(judged)} smoke checks re-derived from the evidence; both records agree"

    def _smoke_record(self) -> WorkloadRecord:
        q = self._q()
        art = next((a for a in q.artifacts if a.role == "principal_release_smoke"), None)
        require(art is not None, "smoke_rejudged", f"{registry.SMOKE_RECORD} is not bound")
        assert art is not None
        path = self._locate()(art)
        _verify_file(path, art)
        return load_record(WorkloadRecord, path, registry.SMOKE_RECORD, check="smoke_rejudged")

    def workload_records(self) -> str:
        """Each full workload's record: bound, bound to this candidate and profile, its checks meet the policy,
        and every check its judge decides is re-derived here from the archived evidence and must agree."""
        q, profile, locate = self._q(), self._profile(), self._locate()
        if q.level != "full_qualification":
            return f"level {q.level}: no full workload records"
        by_role = {a.role: a for a in q.artifacts}
        scale = SCALES[profile.name]

        def one(spec: WorkloadSpec) -> None:
            role = policy.record_artifact_role(spec)
            record = self._policy_record(
                by_role.get(role), role, spec.principal_record, spec.name, "full_qualification",
                check="workload_records",
            )  # fmt: skip
            workload = implemented(spec.name)
            require(workload is not None, "workload_records", f"the harness has no judge for {spec.name}")
            assert workload is not None
            own = {a.role: a for a in record.artifacts}
            evidence: dict[str, Path] = {}
            for local in workload.evidence:
                bound = by_role.get(evidence_role(spec.name, local))
                if bound is None:
                    continue
                require(
                    own.get(bound.role) == bound,
                    "workload_records",
                    f"{spec.principal_record} and qualification.json bind {bound.path} differently",
                )
                evidence[local] = locate(bound)
                _verify_file(evidence[local], bound)
            judged = workload.judge(evidence, profile, scale)
            judged.checks[BOUND] = transcript_bound(evidence.get("transcript"), self._m().wheel.sha256)
            recorded = {c.name: c.passed for c in record.checks.executed}
            disagree = sorted(n for n, (ok, _) in judged.checks.items() if recorded.get(n) is not ok or not ok)
            not_applicable = {c.name for c in record.checks.not_applicable}
            disagree += sorted(n for n in judged.inapplicable if n not in not_applicable)
            why = {**{n: d for n, (_, d) in judged.checks.items()}, **judged.inapplicable}
            require(
                not disagree,
                "workload_rejudged",
                f"{spec.name}: re-judged from its evidence, {disagree[:5]} do not pass "
                f"({'; '.join(why[n][:120] for n in disagree[:2])})",
            )

        failures: list[tuple[str, HarnessError]] = []
        for spec in registry.REGISTRY.workloads[1:]:
            try:
                one(spec)
            except HarnessError as exc:  # every workload is judged, so the detail can name all that fail
                failures.append((spec.name, exc))
        if len(failures) == 1:
            raise failures[0][1]
        if failures:
            names = ", ".join(name for name, _ in failures)
            raise VerificationError(
                _every([f"{len(failures)} workloads fail: {names}", *(str(exc) for _, exc in failures)]),
                check=failures[0][1].check,
            )
        return f"{len(registry.REGISTRY.workloads) - 1} full workload records bound, within policy, and re-judged"

    def evidence(self) -> str:
        q, locate = self._q(), self._locate()
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
            _verify_file(locate(art), art)
        return f"{len(subordinate)} evidence files re-verified (regular files, bytes, sha256)"

    # -- helpers ---------------------------------------------------------------------------------------
    def criteria(self) -> str:
        """The thresholds and required checks the qualification was judged by are those the candidate manifest
        fixed before any GPU work: the profile's thresholds (the record binds the profile by sha256) and the
        required list of every record the level needs, against the digests the manifest names for the profile."""
        q, m, profile, locate = self._q(), self._m(), self._profile(), self._locate()
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
            for name, record in workload_records(q, read, check="criteria_fixed")
        ]
        differ = [name for name, listed, wanted in judged if listed != wanted]
        require(not differ, "criteria_fixed", f"required checks differ from the fixed ones in {_every(differ)}")
        return f"thresholds and the required checks of {len(judged)} records equal those fixed for {profile.name}"

    def _q(self) -> Qualification:
        if self.qual is None:
            raise VerificationError("qualification.json could not be read", check="qualification_schema")
        return self.qual

    def _m(self) -> CandidateManifest:
        if self.manifest is None:
            raise VerificationError("the candidate could not be validated", check="candidate")
        return self.manifest

    def _profile(self) -> Profile:
        if self.profile_def is None:
            raise VerificationError("the profile could not be established", check="profile")
        return self.profile_def

    def _locate(self) -> Callable[[Artifact], Path]:
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
            a.check("smoke_rejudged", a.smoke_rejudged)
            a.check("workload_records", a.workload_records)
    return list(a.checks)


def verify_chain(req: AuditRequest, locate: Callable[[Artifact], Path] | None = None) -> ReleaseVerification:
    """The chain verification: what ``release-verification.json`` publishes (no asset-layout checks)."""
    validate_request(req)
    a = Auditor(replace(req, assets_dir=None), locate=locate)
    return a.verification(chain_checks(a))


def _record_against_output(q: Qualification, seen: InstallFacts, smi: GpuFacts | None) -> dict[str, str]:
    """Each field of the record that says otherwise than the captured output -> both values."""
    tree, env = q.execution.worktree, q.environment
    pairs: dict[str, tuple[object, object]] = {
        "execution.worktree": (
            (tree.state, tree.commit, tree.changed_paths) if tree.state != "unknown" else None,
            (
                "clean" if seen.head == q.candidate.source_commit and seen.changed_paths == 0 else "dirty",
                seen.head,
                seen.changed_paths,
            )
            if seen.head is not None
            else None,
        ),
        "execution.system_site_packages": (q.execution.system_site_packages, seen.system_site_packages),
        "environment.packages": (
            {normalize(k): v for k, v in env.packages.items()},
            seen.packages,
        ),
        "environment.python": (env.python, seen.python),
        "environment.gpu": (env.gpu, smi),
    }
    return {
        name: f"the record says {str(said)[:80]}, the captured output {str(printed)[:80]}"
        for name, (said, printed) in pairs.items()
        if said != printed
    }


def require(condition: bool, check: str, message: str) -> None:
    if not condition:
        raise VerificationError(message, check=check)


def _verify_file(path: Path, art: Artifact) -> None:
    """``path`` (as located: no symlink below the root it was given in) is a regular file with the artifact's
    bytes; its size is compared before a byte is hashed, and the hash is of the file that was opened."""
    size = regular_file_size(path, art.path, check="artifact_file_type")
    if size != art.bytes:
        raise VerificationError(f"{art.path}: {size} bytes, record says {art.bytes}", check="artifact_bytes")
    hashed, digest = file_digest(path, art.path, check="artifact_file_type")
    if hashed != art.bytes:
        raise VerificationError(f"{art.path} changed while it was read", check="artifact_bytes")
    if digest != art.sha256:
        raise VerificationError(f"{art.path}: sha256 differs from the record", check="artifact_sha256")


DETAIL_CHARS = 500


def _every(items: list[str], limit: int = DETAIL_CHARS) -> str:
    """All of ``items`` joined with '; ', or as many whole ones as fit in ``limit`` characters and how many
    more there are (a check's detail is cut at ``limit``)."""
    text = "; ".join(items)
    if len(text) <= limit:
        return text
    for shown in range(len(items) - 1, 0, -1):
        text = "; ".join(items[:shown]) + f"; and {len(items) - shown} more"
        if len(text) <= limit:
            return text
    return items[0][: limit - 3] + "..."


def _workloads_first(problems: list[str], q: Qualification) -> list[str]:
    """The problems naming a workload that did not pass before the rest, so that a bounded detail names them all."""
    failed = tuple(f"workload {w.name} " for w in q.workloads if w.status != "passed")
    return sorted(problems, key=lambda p: not p.startswith(failed)) if failed else problems

"""The audit's re-judging: every check of the release smoke and of each full workload re-derived from the evidence
the qualification binds, by the same judges, and compared with what the records say."""

from __future__ import annotations

from pathlib import Path

from harness.audit.findings import every, require, verify_file
from harness.audit.state import AuditState
from harness.build.candidate import normalize
from harness.core import policy, registry
from harness.core.errors import HarnessError, VerificationError
from harness.core.policy import CANDIDATE_BOUND as BOUND
from harness.core.recordio import load_record
from harness.core.records import GpuFacts, Qualification, WorkloadRecord, WorkloadSpec
from harness.qualify.binding import transcript_bound
from harness.qualify.full.catalog import evidence_role, implemented
from harness.qualify.full.scales import SCALES
from harness.qualify.install_judge import InstallBasis, InstallFacts, captured_gpu, judge_install
from harness.qualify.qualification import SMOKE_EVIDENCE_PATHS
from harness.qualify.smoke_judge import SmokeBasis, evidence_checks, judge_smoke


def smoke_rejudged(a: AuditState) -> str:
    """Every check of the release smoke re-derived from its bound evidence and compared with both records.

    The CLI, origin and binding checks come from :func:`harness.qualify.smoke_judge.judge_smoke` over the evidence
    files (the GPU name from the captured ``nvidia-smi`` output); evidence_portable/evidence_bounded are
    recomputed over those files; the install phase (clean_worktree, wheel_sha256_before_install, install,
    fresh_venv, pip_check, stack_matches_known_good, python_version) from the commands' captured output by
    :func:`harness.qualify.install_judge.judge_install`, against the candidate and the known-good descriptor.
    The record's own worktree, packages, Python, GPU and venv fields must say what that output says, and the
    CUDA byte counts the record keeps must equal those in the run's summary.
    """
    q, m, profile, locate = a.held_qualification(), a.held_manifest(), a.held_profile(), a.locator()
    by_role = {a.role: a for a in q.artifacts}
    evidence: dict[str, Path] = {}
    for role in SMOKE_EVIDENCE_PATHS:
        art = by_role.get(role)
        if art is not None:
            evidence[role] = locate(art)
            verify_file(evidence[role], art)
    smi = captured_gpu(evidence)
    verdict = judge_smoke(evidence, SmokeBasis(profile, m.version, m.wheel.sha256, smi.name if smi else None))
    judged = dict(verdict.checks)
    judged.update(evidence_checks(list(evidence.values())))
    descriptor = a.descriptor
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
    mismatch = record_against_output(q, install.facts, smi)
    smoke = _smoke_record(a)
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


def _smoke_record(a: AuditState) -> WorkloadRecord:
    q = a.held_qualification()
    art = next((a for a in q.artifacts if a.role == "principal_release_smoke"), None)
    require(art is not None, "smoke_rejudged", f"{registry.SMOKE_RECORD} is not bound")
    assert art is not None
    path = a.locator()(art)
    verify_file(path, art)
    return load_record(WorkloadRecord, path, registry.SMOKE_RECORD, check="smoke_rejudged")


def workload_records(a: AuditState) -> str:
    """Each full workload's record: bound, bound to this candidate and profile, its checks meet the policy,
    and every check its judge decides is re-derived here from the archived evidence and must agree."""
    q, profile, locate = a.held_qualification(), a.held_profile(), a.locator()
    if q.level != "full_qualification":
        return f"level {q.level}: no full workload records"
    by_role = {a.role: a for a in q.artifacts}
    scale = SCALES[profile.name]

    def one(spec: WorkloadSpec) -> None:
        role = policy.record_artifact_role(spec)
        record = a.policy_record(
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
            verify_file(evidence[local], bound)
        judged = workload.judge(evidence, profile, scale)
        judged.checks[BOUND] = transcript_bound(evidence.get("transcript"), a.held_manifest().wheel.sha256)
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
            every([f"{len(failures)} workloads fail: {names}", *(str(exc) for _, exc in failures)]),
            check=failures[0][1].check,
        )
    return f"{len(registry.REGISTRY.workloads) - 1} full workload records bound, within policy, and re-judged"


def record_against_output(q: Qualification, seen: InstallFacts, smi: GpuFacts | None) -> dict[str, str]:
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

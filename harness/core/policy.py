"""The auditor's policy, in code: what each level, profile and workload requires, and what may authorize a release.

A record carries evidence only. Which checks are required, which principal records a level needs, which
thresholds apply and which stacks and profiles can authorize a release are decided here, from the workload
registry and the profiles of the harness at the audited commit, never from the file being audited.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from harness.core import registry
from harness.core.errors import VerificationError
from harness.core.jsonio import canonical_bytes, sha256_bytes
from harness.core.profiles import PROFILES
from harness.core.records import (
    Checks,
    CriteriaDigest,
    GithubActionsBinding,
    KnownGoodDescriptor,
    LocalBinding,
    Profile,
    Qualification,
    WorkloadSpec,
    Worktree,
)

RELEASE_WORKFLOW = ".github/workflows/gpu.yml"
# Every transcript invocation ran the candidate wheel from its proven origin (judged by harness.qualify.binding).
CANDIDATE_BOUND = "candidate_bound"
LEVELS = ("release_smoke", "full_qualification")


@dataclass(frozen=True)
class PrincipalRole:
    filename: str
    workload: str
    artifact_role: str
    level: str


PRINCIPALS = (
    PrincipalRole("qualification-release-smoke.json", "release-smoke", "principal_release_smoke", "release_smoke"),
    PrincipalRole("qualification-direct-gkd.json", "direct-gkd", "principal_direct_gkd", "full_qualification"),
    PrincipalRole("qualification-pg-k1.json", "pg-k1", "principal_pg_k1", "full_qualification"),
    PrincipalRole("qualification-smollm2.json", "smollm2", "principal_smollm2", "full_qualification"),
)
PRINCIPAL_FILES = tuple(p.filename for p in PRINCIPALS)

# Evidence every release smoke must bind (role -> why it is needed to re-check the run).
SMOKE_EVIDENCE_ROLES = (
    "transcript",
    "run_manifest",
    "run_summary",
    "metrics",
    "adapter_config",
    "adapter_weights",
    "adapter_manifest",
    "grpo_summary",
    "cli_outputs",
    "origin",
    # the install phase's raw output (harness.qualify.install_judge); nvidia-smi's only where the machine has one
    "git_head",
    "git_status",
    "wheel_sha256",
    "pip_report",
    "pyvenv_cfg",
    "venv_before_install",
    "pip_inspect",
    "pip_check",
    "python_version",
)


def record_artifact_role(spec: WorkloadSpec) -> str:
    """The role under which qualification.json binds a workload's record (principal or subordinate)."""
    for p in PRINCIPALS:
        if p.workload == spec.name:
            return p.artifact_role
    return "workload_" + spec.name.replace("-", "_")


def principals(level: str) -> tuple[PrincipalRole, ...]:
    return PRINCIPALS if level == "full_qualification" else PRINCIPALS[:1]


def required_workloads(level: str) -> list[str]:
    if level == "full_qualification":
        return [w.name for w in registry.REGISTRY.workloads]
    return ["release-smoke"]


def required_checks(profile: Profile, workload: str) -> list[str]:
    """The checks a workload must execute and pass on ``profile``: CUDA-only checks are not required on CPU, and a
    check of :data:`registry.REQUIRED_ONLY_ON` only on the profiles it names."""
    if workload == "release-smoke":
        return registry.required_smoke_checks(profile.device)
    names = registry.workload(workload).required_checks
    return [
        c
        for c in names
        if (profile.device == "cuda" or c not in registry.CUDA_ONLY)
        and profile.name in registry.REQUIRED_ONLY_ON.get((workload, c), (profile.name,))
    ]


def record_checks(profile: Profile, workload: str) -> list[str]:
    """The checks a workload's record must hold passed: what its judge decides (:func:`required_checks`) and, for a
    full workload, ``candidate_bound`` (every CLI invocation of its transcript ran the candidate), which the runner
    and the auditor decide for every workload alike."""
    checks = required_checks(profile, workload)
    return checks if workload == "release-smoke" else [*checks, CANDIDATE_BOUND]


def check_problems(checks: Checks, required: list[str]) -> list[str]:
    """Why ``checks`` does not support ``passed`` under ``required``, re-derived without trusting the record."""
    problems: list[str] = []
    if list(checks.required) != required:
        listed, wanted = Counter(checks.required), Counter(required)
        problems.append(
            f"its required list differs from the harness policy (dropped {sorted(wanted - listed)}, "
            f"added or repeated {sorted(listed - wanted)})"
        )
    passed = {c.name for c in checks.executed if c.passed}
    problems += [f"check {c.name} failed" for c in checks.executed if not c.passed]
    problems += [f"required check {name} did not pass" for name in required if name not in passed]
    return problems


def derived_status(q: Qualification, profile: Profile) -> list[str]:
    """Every reason the qualification cannot be ``passed`` under the harness policy (empty: it passed).

    The CUDA thresholds are not judged here from the record's figures: the auditor re-judges them from the run's
    own measured bytes (``smoke_rejudged``)."""
    problems = [f"qualification.json: {p}" for p in check_problems(q.checks, required_checks(profile, "release-smoke"))]
    by_name = {w.name: w for w in q.workloads}
    wanted = required_workloads(q.level)
    if [w.name for w in q.workloads] != wanted:
        problems.append(f"workloads listed {[w.name for w in q.workloads]}, the level needs {wanted}")
    problems += [
        f"workload {n} is {by_name[n].status}" for n in wanted if n in by_name and by_name[n].status != "passed"
    ]
    return problems


def profile_for_gpu(gpu_name: str | None) -> Profile:
    """The harness profile that requires ``gpu_name`` (None: the CPU profile); which stack to trust follows
    from it, never from the record under audit."""
    matches = [p for p in PROFILES.values() if p.required_gpu_name == gpu_name]
    if len(matches) != 1:
        raise VerificationError(
            f"no single harness profile requires GPU {gpu_name!r}; known: "
            f"{sorted(str(p.required_gpu_name) for p in PROFILES.values())}",
            check="profile",
        )
    return matches[0]


def authorization_reasons(
    level: str,
    profile: Profile,
    descriptor: KnownGoodDescriptor | None,
    built: LocalBinding | GithubActionsBinding,
    tree: Worktree,
) -> list[str]:
    """Why this (verified) chain cannot authorize a release; empty means it may."""
    reasons: list[str] = []
    if level != "full_qualification":
        reasons.append(f"level {level} is diagnostic; a release needs full_qualification")
    known = PROFILES.get(profile.name)
    if known is None or not known.can_authorize_release:
        reasons.append(f"profile {profile.name} can never authorize a release")
    if descriptor is None:
        reasons.append("the known-good stack could not be read")
    elif descriptor.status != "measured":
        reasons.append(f"known-good stack {descriptor.name} is {descriptor.status}, not measured")
    if not isinstance(built, GithubActionsBinding):
        reasons.append("the candidate was not built by the gpu.yml workflow (local binding)")
    elif built.workflow_path != RELEASE_WORKFLOW:
        reasons.append(f"candidate came from {built.workflow_path}, not {RELEASE_WORKFLOW}")
    if tree.state != "clean":
        reasons.append(f"qualification ran from a {tree.state} checkout")
    return reasons


@dataclass(frozen=True)
class CriteriaDocuments:
    """A profile's pass criteria as canonical JSON bytes: what the candidate manifest fixes by digest and the
    qualification-result statement carries (so a consumer re-hashes them with hashlib alone)."""

    thresholds: bytes
    required_checks: bytes

    def digest(self, profile: str) -> CriteriaDigest:
        return CriteriaDigest(
            profile=profile,
            thresholds_sha256=sha256_bytes(self.thresholds),
            required_checks_sha256=sha256_bytes(self.required_checks),
        )


def criteria_documents(profile: Profile) -> CriteriaDocuments:
    """The thresholds and, per workload of the full level (the release smoke first), the checks its record must
    hold passed on ``profile``."""
    required = {name: record_checks(profile, name) for name in required_workloads("full_qualification")}
    return CriteriaDocuments(
        thresholds=canonical_bytes(profile.thresholds.model_dump(mode="json")),
        required_checks=canonical_bytes(required),
    )


def fixed_criteria() -> list[CriteriaDigest]:
    """Every profile's criteria digests, as ``harness build`` writes them into the candidate manifest."""
    return [criteria_documents(PROFILES[name]).digest(name) for name in sorted(PROFILES)]

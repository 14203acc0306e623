"""Every record the harness reads or writes, as strict pydantic v2 models (``extra="forbid"``).

JSON Schemas for these models are generated into ``manifests/harness/`` (``python -m harness schemas``);
a test fails when the committed schemas drift from the models.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator

from harness.core.jsonio import refuse_local_paths

SCHEMA_VERSION = 1

_SHA256_PATTERN = r"^[0-9a-f]{64}$"
_COMMIT_PATTERN = r"^[0-9a-f]{40}$"
#: the same forms for plain strings the judges read from evidence
SHA256_HEX = re.compile(_SHA256_PATTERN)
COMMIT_HEX = re.compile(_COMMIT_PATTERN)
Sha256 = Annotated[str, StringConstraints(pattern=_SHA256_PATTERN)]
GitCommit = Annotated[str, StringConstraints(pattern=_COMMIT_PATTERN)]
Filename = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._+-]*$", max_length=255)]


def _no_dot_segments(value: str) -> str:
    if any(part in {".", ".."} for part in value.split("/")):
        raise ValueError("relative path may not hold '.' or '..' segments")
    return value


RelPath = Annotated[
    str,
    StringConstraints(pattern=r"^[A-Za-z0-9._+-]+(/[A-Za-z0-9._+-]+)*$", max_length=512),
    AfterValidator(_no_dot_segments),
]
Name = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]*$", max_length=100)]
Timestamp = Annotated[str, StringConstraints(pattern=r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")]
NonNegInt = Annotated[int, Field(ge=0)]
# https, or plain http only on the loopback interface (a local test index); no credentials, query or fragment.
IndexUrl = Annotated[
    str,
    StringConstraints(
        pattern=r"^(https://[A-Za-z0-9.-]+(:\d+)?|http://(127\.0\.0\.1|localhost)(:\d+)?)(/[A-Za-z0-9._~+%-]*)*/?$",
        max_length=512,
    ),
]
PositiveInt = Annotated[int, Field(ge=1)]


class Record(BaseModel):
    """Base: unknown keys refused, values immutable, NaN refused, no local paths in any string."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=False)

    @model_validator(mode="after")
    def _no_local_paths(self) -> Record:
        refuse_local_paths(self.model_dump(mode="json"))
        return self


class FileDigest(Record):
    filename: Filename
    bytes: NonNegInt
    sha256: Sha256


class LocalBinding(Record):
    kind: Literal["local"]


class GithubActionsBinding(Record):
    kind: Literal["github_actions"]
    repository: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    workflow_path: Annotated[str, StringConstraints(pattern=r"^\.github/workflows/[A-Za-z0-9_.-]+\.ya?ml$")]
    run_id: Annotated[int, Field(gt=0)]
    run_attempt: Annotated[int, Field(ge=1)]


WorkflowBinding = Annotated[LocalBinding | GithubActionsBinding, Field(discriminator="kind")]


class Toolchain(Record):
    build: str
    hatchling: str
    twine: str
    constraints_sha256: Sha256


class BuildEnvironment(Record):
    os: str
    machine: str
    python: str
    toolchain: Toolchain


class CriteriaDigest(Record):
    """One profile's pass criteria, fixed by digest when the candidate is built (before any GPU work): the sha256 of
    its thresholds' canonical JSON and of its required checks' (``harness.core.policy.criteria_documents``)."""

    profile: Name
    thresholds_sha256: Sha256
    required_checks_sha256: Sha256


class CandidateManifest(Record):
    kind: Literal["miniverl.candidate-manifest"]
    schema_version: Literal[2]
    source_commit: GitCommit
    version: Annotated[str, StringConstraints(pattern=r"^[0-9][0-9A-Za-z.+-]*$")]
    created_at: Timestamp
    source_date_epoch: NonNegInt
    source_tree: Literal["git-archive"]
    worktree_clean: bool
    workflow: WorkflowBinding
    workflow_ref: Annotated[str, StringConstraints(pattern=r"^refs/[A-Za-z0-9._/-]+$", max_length=255)] | None
    build: BuildEnvironment
    wheel: FileDigest
    sdist: FileDigest
    criteria: list[CriteriaDigest]

    @model_validator(mode="after")
    def _distribution_names(self) -> CandidateManifest:
        derived = datetime.fromtimestamp(self.source_date_epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        if self.created_at != derived:
            raise ValueError(f"created_at must be the commit time {derived} (SOURCE_DATE_EPOCH), not a wall clock")
        if not (self.wheel.filename.endswith(".whl") and f"-{self.version}-" in self.wheel.filename):
            raise ValueError("wheel.filename must be a .whl of the manifest's version")
        if self.sdist.filename != f"miniverl-{self.version}.tar.gz":
            raise ValueError("sdist.filename must be miniverl-<version>.tar.gz")
        if (self.workflow_ref is None) != isinstance(self.workflow, LocalBinding):
            raise ValueError("workflow_ref is the GitHub workflow's ref, and only a GitHub Actions build has one")
        names = [c.profile for c in self.criteria]
        if names != sorted(set(names)):
            raise ValueError("criteria must be sorted by profile and unique")
        return self


class KnownGoodDescriptor(Record):
    kind: Literal["miniverl.known-good"]
    schema_version: Literal[1]
    name: Name
    status: Literal["measured", "declared"]
    python: str
    platform: str
    required_gpu_name: str | None
    packages: dict[str, str]
    constraints_file: Filename
    constraints_sha256: Sha256
    recorded: dict[str, str | int | None] = Field(default_factory=dict)
    notes: str = ""
    # pip's --extra-index-url for the stack (e.g. the cu130 torch index serving torch==2.11.0+cu130); the constraints
    # file carries the same lines, so constraints_sha256 and this file's own sha256 both bind them.
    extra_index_urls: list[IndexUrl] = Field(default_factory=list)


class Thresholds(Record):
    peak_reserved_bytes_max: NonNegInt | None
    teardown_tolerance_bytes_min: NonNegInt
    teardown_tolerance_fraction: Annotated[float, Field(ge=0, le=1)]


class Profile(Record):
    kind: Literal["miniverl.profile"]
    schema_version: Literal[1]
    name: Name
    device: Literal["cpu", "cuda"]
    required_gpu_name: str | None
    known_good: Name
    install_extras: list[Name]
    thresholds: Thresholds
    can_authorize_release: bool
    description: str


class InstalledFrom(Record):
    """Which installed miniverl ran an invocation, as the install step proved it (``harness.install.origin``): the
    wheel's sha256 that pip recorded for the distribution, and where the package and the executable were found."""

    wheel_sha256: Sha256
    import_origin: str  # redacted, e.g. ``<venv>/lib/python3.11/site-packages/miniverl/__init__.py``
    executable: str  # ``<venv>/bin/miniverl``, or the verl interpreter that ran ``-m miniverl``


class Invocation(Record):
    step: Name
    argv: list[str]
    exit_code: int
    duration_seconds: Annotated[float, Field(ge=0)]
    timed_out: bool
    stdout_bytes: NonNegInt
    stdout_sha256: Sha256
    stderr_bytes: NonNegInt
    stderr_sha256: Sha256
    stderr_last_line: str
    installed: InstalledFrom | None  # None: the install step could not prove an origin (the binding check fails)


class Transcript(Record):
    kind: Literal["miniverl.transcript"]
    schema_version: Literal[1]
    cwd: Literal["<work>"]
    executable: Literal["<venv>/bin/miniverl"]
    invocations: list[Invocation]


class CheckResult(Record):
    name: Name
    passed: bool
    detail: str


class NotRun(Record):
    name: Name
    reason: str


class Checks(Record):
    required: list[Name]
    executed: list[CheckResult]
    skipped: list[NotRun]
    not_applicable: list[NotRun]

    @model_validator(mode="after")
    def _disjoint(self) -> Checks:
        groups = [
            [c.name for c in self.executed],
            [c.name for c in self.skipped],
            [c.name for c in self.not_applicable],
        ]
        seen: set[str] = set()
        for group in groups:
            for name in group:
                if name in seen:
                    raise ValueError(f"check {name!r} appears twice across executed/skipped/not_applicable")
                seen.add(name)
        unknown = set(self.required) - seen
        if unknown:
            raise ValueError(f"required checks with no outcome: {sorted(unknown)}")
        return self

    def failures(self) -> list[str]:
        """Why these checks do not support ``passed``: failed, skipped or not applicable required checks."""
        reasons = [f"check {c.name} failed: {c.detail}" for c in self.executed if not c.passed]
        skipped = {c.name: c.reason for c in self.skipped}
        napp = {c.name: c.reason for c in self.not_applicable}
        for name in self.required:
            if name in skipped:
                reasons.append(f"required check {name} was skipped: {skipped[name]}")
            elif name in napp:
                reasons.append(f"required check {name} is not applicable: {napp[name]}")
        return reasons


class Artifact(Record):
    path: RelPath
    role: Name
    bytes: NonNegInt
    sha256: Sha256


class CandidateRef(Record):
    manifest_sha256: Sha256
    source_commit: GitCommit
    version: str
    wheel: FileDigest
    sdist: FileDigest
    workflow: WorkflowBinding


class ProfileRef(Record):
    name: Name
    sha256: Sha256
    known_good: Name
    known_good_sha256: Sha256
    known_good_status: Literal["measured", "declared"]
    can_authorize_release: bool


class ModelRevision(Record):
    name: str
    identity: dict[str, str]


class Inputs(Record):
    workload: Name
    workload_sha256: Sha256
    config_sha256: Sha256 | None
    config_digest: str | None
    plan_sha256: Sha256 | None
    plan_digest: str | None
    data_sha256: Sha256 | None


class GpuFacts(Record):
    name: str
    count: NonNegInt
    total_memory_bytes: NonNegInt | None
    driver: str | None


class Environment(Record):
    python: str
    os: str
    machine: str
    device: Literal["cpu", "cuda"]
    gpu: GpuFacts | None
    cuda_runtime: str | None
    packages: dict[str, str]
    known_good_sha256: Sha256
    stack_mismatches: list[str]


class Worktree(Record):
    state: Literal["clean", "dirty", "unknown"]
    commit: GitCommit | None
    changed_paths: NonNegInt


class Execution(Record):
    workflow: WorkflowBinding
    started_at: Timestamp
    finished_at: Timestamp
    wall_seconds: Annotated[float, Field(ge=0)]
    worktree: Worktree
    system_site_packages: bool
    offline_wheels: bool
    install_command: list[str]
    origin: dict[str, str | int | bool | None]
    facts: dict[str, str | int | float | bool | None]


class ScientificScope(Record):
    claim: Literal["runtime_correctness_only"] = "runtime_correctness_only"
    other_hardware: Literal["unmeasured"] = "unmeasured"
    distributed_verl_execution: Literal["not_tested"] = "not_tested"


class WorkloadResult(Record):
    name: Name
    principal_record: Filename
    status: Literal["passed", "failed", "missing"]
    reasons: list[str]


class Qualification(Record):
    kind: Literal["miniverl.qualification"]
    schema_version: Literal[1]
    level: Literal["release_smoke", "full_qualification"]
    status: Literal["passed", "failed"]
    reasons: list[str]
    candidate: CandidateRef
    profile: ProfileRef
    models: list[ModelRevision]
    inputs: Inputs
    environment: Environment
    execution: Execution
    metrics: dict[str, int | float | bool | str | None]
    artifacts: list[Artifact]
    checks: Checks
    workloads: list[WorkloadResult]
    scientific_scope: ScientificScope

    @model_validator(mode="after")
    def _honest_status(self) -> Qualification:
        problems = self.checks.failures() + [
            f"workload {w.name} is {w.status}" for w in self.workloads if w.status != "passed"
        ]
        if self.status == "passed" and (problems or self.reasons):
            raise ValueError(f"status passed with unmet checks: {problems or self.reasons}")
        if self.status == "failed" and not self.reasons:
            raise ValueError("status failed needs at least one reason")
        paths = [a.path for a in self.artifacts]
        if len(paths) != len(set(paths)):
            raise ValueError("artifact paths must be unique")
        return self


class WorkloadRecord(Record):
    """A principal workload record (e.g. qualification-release-smoke.json)."""

    kind: Literal["miniverl.workload-record"]
    schema_version: Literal[1]
    name: Name
    level: Literal["release_smoke", "full_qualification"]
    status: Literal["passed", "failed"]
    reasons: list[str]
    source_commit: GitCommit
    wheel_sha256: Sha256
    profile: Name
    checks: Checks
    metrics: dict[str, int | float | bool | str | None]
    artifacts: list[Artifact]

    @model_validator(mode="after")
    def _honest_status(self) -> WorkloadRecord:
        problems = self.checks.failures()
        if self.status == "passed" and (problems or self.reasons):
            raise ValueError(f"status passed with unmet checks: {problems or self.reasons}")
        if self.status == "failed" and not self.reasons:
            raise ValueError("status failed needs at least one reason")
        return self


class WorkloadSpec(Record):
    name: Name
    description: str
    principal_record: Filename
    asset_role: Literal["principal", "subordinate"]
    required_checks: list[Name]
    provided: bool
    provided_by: str


class WorkloadRegistry(Record):
    kind: Literal["miniverl.workload-registry"]
    schema_version: Literal[1]
    workloads: list[WorkloadSpec]


# ------------------------------------------------------------------ state-hashes.json (harness.qualify.full.statehash)

KIND_STATE_HASHES: Literal["harness.state-hashes"] = "harness.state-hashes"
# Byte width of each safetensors dtype: a tensor's byte range must be exactly its shape's size.
DTYPE_BYTES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}  # fmt: skip
TensorName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$", max_length=300)]


class TensorDigest(Record):
    dtype: Literal[tuple(DTYPE_BYTES)]  # type: ignore[valid-type]
    shape: list[NonNegInt] = Field(max_length=8)
    bytes: NonNegInt
    sha256: Sha256


class FileHash(Record):
    bytes: NonNegInt
    sha256: Sha256


class StepTally(Record):
    """How many of an optimizer file's parameter slots hold ``value`` as their AdamW ``step`` counter."""

    value: float
    slots: PositiveInt


class OptimizerSteps(Record):
    """AdamW's per-parameter ``step`` counters of one optimizer safetensors file, read by the harness from the same
    bytes it hashed (``sha256``): ``slots`` parameter slots (``state.<i>.*`` tensors), tallied by step value."""

    sha256: Sha256
    slots: NonNegInt
    steps: list[StepTally] = Field(max_length=64)


class CheckpointHashes(Record):
    """One checkpoint directory as the harness hashed it: the checkpoint.json it read (its sha256 binds the copy
    kept in the evidence), every file that lists, per-tensor digests of its adapter safetensors files and, where a
    judge counts optimizer steps, the AdamW step counters of its optimizer files."""

    step: NonNegInt
    checkpoint_json_sha256: Sha256
    files: dict[RelPath, FileHash] = Field(max_length=64)
    tensors: dict[RelPath, dict[TensorName, TensorDigest]] = Field(max_length=8)
    optimizer_steps: dict[RelPath, OptimizerSteps] = Field(default_factory=dict, max_length=8)


class StateHashes(Record):
    kind: Literal["harness.state-hashes"]
    schema_version: Literal[1]
    checkpoints: dict[Name, CheckpointHashes] = Field(max_length=16)
    refused: dict[Name, str] = Field(max_length=16)  # label -> why the harness could not hash that checkpoint


SCHEMA_MODELS: dict[str, type[Record]] = {
    "candidate-manifest": CandidateManifest,
    "known-good": KnownGoodDescriptor,
    "profile": Profile,
    "transcript": Transcript,
    "qualification": Qualification,
    "workload-record": WorkloadRecord,
    "workload-registry": WorkloadRegistry,
}

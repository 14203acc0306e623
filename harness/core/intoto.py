"""The two in-toto Statement v1 documents among the release assets, as strict pydantic models (``extra="forbid"``).

Field names follow the specifications (camelCase, ``_type``): the in-toto Statement v1, the SLSA provenance v1
predicate (https://slsa.dev/spec/v1.0/provenance) and the in-toto test-result predicate v0.1. Both statements are
unsigned canonical JSON (:func:`statement_bytes`); release.yml signs them with GitHub's artifact attestations.
Our own additions to the test-result predicate are extension fields named by a URI, as the in-toto parsing rules
allow (consumers ignore fields they do not know).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field, StringConstraints, model_validator

from harness.core.jsonio import canonical_bytes
from harness.core.records import Filename, GitCommit, NonNegInt, Record, Sha256

STATEMENT_TYPE: Literal["https://in-toto.io/Statement/v1"] = "https://in-toto.io/Statement/v1"
SLSA_PROVENANCE: Literal["https://slsa.dev/provenance/v1"] = "https://slsa.dev/provenance/v1"
TEST_RESULT: Literal["https://in-toto.io/attestation/test-result/v0.1"] = (
    "https://in-toto.io/attestation/test-result/v0.1"
)
# harness/README.md ("Standard statements") documents this build type and these extension fields.
BUILD_TYPE: Literal["urn:miniverl:harness-build:v1"] = "urn:miniverl:harness-build:v1"
LOCAL_BUILDER = "urn:miniverl:builder:local-harness-build"
WARNED_REASONS = "urn:miniverl:test-result:warned-reasons"
RESOLVED_INPUTS = "urn:miniverl:test-result:resolved-inputs"

Uri = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9+.-]*:[^\s]+$", max_length=1000)]
Base64 = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9+/]*={0,2}$", max_length=1 << 20)]


class Statement(Record):
    """A part of a statement: the record rules, and keys written by their alias (``_type``, URI extension keys)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, strict=False, populate_by_name=True)


class DigestSet(Statement):
    sha256: Sha256 | None = None
    gitCommit: GitCommit | None = None

    @model_validator(mode="after")
    def _one_at_least(self) -> DigestSet:
        if self.sha256 is None and self.gitCommit is None:
            raise ValueError("a digest set needs at least one digest")
        return self


class ResourceDescriptor(Statement):
    name: str
    uri: Uri | None = None
    digest: DigestSet | None = None
    content: Base64 | None = None  # the bytes themselves (base64), so hashlib alone re-checks the digest


class SubjectDigest(Statement):
    sha256: Sha256


class Subject(Statement):
    name: Filename
    digest: SubjectDigest


def _unique_subjects(subject: list[Subject]) -> None:
    if len({s.name for s in subject}) != len(subject) or len({s.digest.sha256 for s in subject}) != len(subject):
        raise ValueError("subjects must name distinct files with distinct digests")


# -- build provenance (SLSA provenance v1) -------------------------------------------------------------------
class WorkflowParameters(Statement):
    repository: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")]
    path: Annotated[str, StringConstraints(pattern=r"^\.github/workflows/[A-Za-z0-9_.-]+\.ya?ml$")]
    ref: str
    job: Literal["build-candidate"]


class SourceParameters(Statement):
    commit: GitCommit
    tree: Literal["git-archive"]


class ExternalParameters(Statement):
    workflow: WorkflowParameters | None = None  # absent for a local build
    source: SourceParameters


class InternalParameters(Statement):
    SOURCE_DATE_EPOCH: NonNegInt
    python: str
    os: str
    machine: str
    worktree_clean: bool


class BuildDefinition(Statement):
    buildType: Literal["urn:miniverl:harness-build:v1"]
    externalParameters: ExternalParameters
    internalParameters: InternalParameters
    resolvedDependencies: list[ResourceDescriptor]


class Builder(Statement):
    id: Uri


class BuildMetadata(Statement):
    invocationId: Uri


class RunDetails(Statement):
    builder: Builder
    metadata: BuildMetadata | None = None  # absent for a local build: there is no run


class Provenance(Statement):
    buildDefinition: BuildDefinition
    runDetails: RunDetails


class ProvenanceStatement(Statement):
    type_: Literal["https://in-toto.io/Statement/v1"] = Field(default=STATEMENT_TYPE, alias="_type")
    subject: list[Subject]
    predicateType: Literal["https://slsa.dev/provenance/v1"]
    predicate: Provenance

    @model_validator(mode="after")
    def _subjects(self) -> ProvenanceStatement:
        _unique_subjects(self.subject)
        return self


# -- qualification result (in-toto test-result v0.1) ---------------------------------------------------------
class WarnedTest(Statement):
    test: str
    outcome: Literal["not_applicable", "skipped"]
    reason: str


class QualificationResult(Statement):
    result: Literal["PASSED", "FAILED"]
    configuration: list[ResourceDescriptor]
    url: Uri | None = None  # the workflow run; absent for a local qualification
    passedTests: list[str]
    warnedTests: list[str]
    failedTests: list[str]
    warned_reasons: list[WarnedTest] = Field(
        validation_alias="urn:miniverl:test-result:warned-reasons",
        serialization_alias="urn:miniverl:test-result:warned-reasons",
    )
    resolved_inputs: list[ResourceDescriptor] = Field(
        validation_alias="urn:miniverl:test-result:resolved-inputs",
        serialization_alias="urn:miniverl:test-result:resolved-inputs",
    )

    @model_validator(mode="after")
    def _reasons_for_every_warning(self) -> QualificationResult:
        if [w.test for w in self.warned_reasons] != self.warnedTests:
            raise ValueError("every warned test needs its reason, in the same order")
        return self


class ResultStatement(Statement):
    type_: Literal["https://in-toto.io/Statement/v1"] = Field(default=STATEMENT_TYPE, alias="_type")
    subject: list[Subject]
    predicateType: Literal["https://in-toto.io/attestation/test-result/v0.1"]
    predicate: QualificationResult

    @model_validator(mode="after")
    def _subjects(self) -> ResultStatement:
        _unique_subjects(self.subject)
        return self


def statement_bytes(statement: ProvenanceStatement | ResultStatement) -> bytes:
    """Canonical JSON (sorted keys, compact, UTF-8), keys by their specification names, absent fields omitted."""
    return canonical_bytes(statement.model_dump(mode="json", by_alias=True, exclude_none=True)) + b"\n"


INTOTO_SCHEMA_MODELS: dict[str, type[Record]] = {
    "build-provenance-statement": ProvenanceStatement,
    "qualification-result-statement": ResultStatement,
}

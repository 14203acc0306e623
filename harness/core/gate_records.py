"""``gate.json``: what the gate queried, every check, the chosen run and artifacts. No token, no local paths."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints, model_validator

from harness.core.records import FileDigest, GitCommit, Name, Record, Sha256, Timestamp

PositiveInt = Annotated[int, Field(gt=0)]

# GitHub's grammar: the owner is 1-39 of [A-Za-z0-9-] not starting with '-'; the name 1-100 of [A-Za-z0-9._-],
# never '.' or '..' (which would walk up the API path the repository is pasted into).
REPOSITORY = r"[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}"
# The API's path prefix under its origin (GitHub Enterprise: ``api/v3``), kept without its leading '/':
# records refuse strings that start like a local path.
API_PATH = r"([A-Za-z0-9._~-]+(/[A-Za-z0-9._~-]+)*)?"


def is_repository(text: str) -> bool:
    return re.fullmatch(REPOSITORY, text) is not None and text.split("/")[1] not in {".", ".."}


def is_api_path(text: str) -> bool:
    return re.fullmatch(API_PATH, text) is not None and not {".", ".."} & set(text.split("/"))


def _repository(value: str) -> str:
    if not is_repository(value):
        raise ValueError("not a GitHub OWNER/NAME")
    return value


def _api_path(value: str) -> str:
    if not is_api_path(value):
        raise ValueError("not an API path prefix (segments of [A-Za-z0-9._~-], no '.' or '..')")
    return value


Repository = Annotated[str, StringConstraints(pattern=f"^{REPOSITORY}$", max_length=140), AfterValidator(_repository)]


class GateQuery(Record):
    """The question asked: which commit, from which repository and workflow, at which level."""

    api_origin: Annotated[str, StringConstraints(pattern=r"^https?://[^/@\s]+$", max_length=300)]
    api_path: Annotated[str, StringConstraints(pattern=f"^{API_PATH}$", max_length=300), AfterValidator(_api_path)]
    repository: Repository
    sha: GitCommit
    workflow_path: Annotated[str, StringConstraints(pattern=r"^\.github/workflows/[A-Za-z0-9_.-]+\.ya?ml$")]
    level: Literal["full_qualification", "release_smoke"]
    candidate_artifact: Name
    qualification_artifact: Name
    required_gpu_name: str | None
    dry_run: bool


class GateCheck(Record):
    name: Name
    passed: bool
    detail: Annotated[str, StringConstraints(max_length=600)]


class ChosenRun(Record):
    id: PositiveInt
    run_attempt: Literal[1]
    event: Literal["workflow_dispatch"]
    path: str
    repository: Repository
    head_sha: GitCommit


class OtherRun(Record):
    """A run that was listed but not chosen, and the check that set it aside."""

    id: int
    check: Name
    reason: Annotated[str, StringConstraints(max_length=600)]


class ArtifactRef(Record):
    name: Name
    id: PositiveInt
    size_in_bytes: Annotated[int, Field(ge=0)]
    api_digest: str | None
    sha256: Sha256 | None
    expires_at: Timestamp
    workflow_run_id: PositiveInt


class GateRecord(Record):
    kind: Literal["miniverl.release-gate"]
    schema_version: Literal[1]
    status: Literal["passed", "failed"]
    query: GateQuery | None
    run: ChosenRun | None
    artifacts: list[ArtifactRef]
    other_runs: list[OtherRun]
    checks: list[GateCheck]
    failed_check: Name | None
    release_authorized: bool
    authorization_reasons: list[str]
    outputs: list[FileDigest]

    @model_validator(mode="after")
    def _consistent(self) -> GateRecord:
        failed = [c.name for c in self.checks if not c.passed]
        if self.status == "passed" and (failed or self.failed_check is not None or self.run is None):
            raise ValueError("a passed gate has a chosen run and no failed check")
        if self.status == "failed" and self.failed_check is None:
            raise ValueError("a failed gate names its failed check")
        if self.release_authorized and (self.status != "passed" or self.query is None or self.query.dry_run):
            raise ValueError("only a passed, non-dry-run gate can authorize a release")
        if self.release_authorized and self.query is not None and self.query.level != "full_qualification":
            raise ValueError("only full_qualification can authorize a release")
        return self


GATE_SCHEMA_MODELS: dict[str, type[Record]] = {"release-gate": GateRecord}

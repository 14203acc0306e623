"""Which run: re-check every field of every listed run and of its artifacts; take the newest that qualifies.

The API's query filters (``head_sha``, ``event``, ``status``) narrow the listing; none of them is trusted.
Inbound API objects are parsed with ``extra="ignore"`` (GitHub adds fields freely) and strict types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.core.gate_records import OtherRun
from harness.gate import GateError
from harness.gate.http import GitHubClient

ARTIFACT_MARGIN = 1 << 20
MAX_ARTIFACT_BYTES = 4 << 30
CANDIDATE_ARTIFACT = "candidate-distributions"
LEVEL_ARTIFACTS = {"full_qualification": "gpu-full-qualification", "release_smoke": "gpu-release-smoke"}


class _Api(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, frozen=True)


class ApiRepo(_Api):
    full_name: str


class ApiRun(_Api):
    id: int
    head_sha: str
    event: str
    status: str
    conclusion: str | None
    run_attempt: int
    path: str
    repository: ApiRepo
    head_repository: ApiRepo | None
    created_at: str | None = None


class ApiRunRef(_Api):
    id: int
    head_sha: str


class ApiArtifact(_Api):
    id: int
    name: str
    size_in_bytes: int
    expired: bool
    expires_at: str | None
    digest: str | None = None
    workflow_run: ApiRunRef | None


@dataclass(frozen=True)
class Target:
    api: str
    repository: str
    sha: str
    workflow: str
    level: str

    @property
    def workflow_path(self) -> str:
        return f".github/workflows/{self.workflow}"

    @property
    def artifact_names(self) -> tuple[str, str]:
        return CANDIDATE_ARTIFACT, LEVEL_ARTIFACTS[self.level]

    def runs_url(self) -> str:
        return (
            f"{self.api}/repos/{self.repository}/actions/workflows/{self.workflow}/runs"
            f"?head_sha={self.sha}&event=workflow_dispatch&status=success&per_page=100"
        )

    def artifacts_url(self, run_id: int) -> str:
        return f"{self.api}/repos/{self.repository}/actions/runs/{run_id}/artifacts?per_page=100"

    def download_url(self, artifact_id: int) -> str:
        return f"{self.api}/repos/{self.repository}/actions/artifacts/{artifact_id}/zip"


Passed = list[tuple[str, str]]  # (check, detail) of every check that passed, for gate.json


class NoRunError(GateError):
    """No listed run qualifies; carries every listed run with the check that set it aside."""

    def __init__(self, cause: GateError, others: list[OtherRun]) -> None:
        super().__init__(str(cause), check=cause.check)
        self.others = others


@dataclass
class Selection:
    run: ApiRun
    artifacts: dict[str, ApiArtifact]
    passed: Passed
    others: list[OtherRun] = field(default_factory=list)


def _parse(model: type[_Api], raw: dict[str, Any], what: str) -> Any:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"]) or "$"
        raise GateError(f"{what} has an unexpected shape at {loc}: {first['msg']}", check="api_shape") from None


def _require(ok: bool, check: str, message: str) -> None:
    if not ok:
        raise GateError(message, check=check)


def check_run(raw: dict[str, Any], t: Target) -> tuple[ApiRun, Passed]:
    """Every field that makes a run count, checked here rather than trusted from the query's filters."""
    run: ApiRun = _parse(ApiRun, raw, f"run {raw.get('id')!r}")
    head = run.head_repository.full_name if run.head_repository else None
    table = [
        ("head_sha", run.head_sha == t.sha, f"head_sha {run.head_sha[:40]!r}", f"(need {t.sha})"),
        ("event", run.event == "workflow_dispatch", f"event {run.event[:40]!r}", "(need workflow_dispatch)"),
        ("run_status", run.status == "completed", f"status {run.status[:40]!r}", "(need completed)"),
        ("conclusion", run.conclusion == "success", f"conclusion {str(run.conclusion)[:40]!r}", "(need success)"),
        (
            "run_attempt",
            run.run_attempt == 1,
            f"run_attempt {run.run_attempt}",
            "(need 1: every dispatch is single-use; start a new workflow_dispatch instead of a rerun)",
        ),
        ("workflow_path", run.path == t.workflow_path, f"path {run.path[:80]!r}", f"(need {t.workflow_path})"),
        (
            "repository",
            run.repository.full_name == t.repository and head == t.repository,
            f"repository {run.repository.full_name[:80]!r}, head_repository {str(head)[:80]!r}",
            f"(need {t.repository} for both; a fork run never counts)",
        ),
    ]
    passed: Passed = []
    for check, ok, seen, need in table:
        _require(ok, check, f"run {run.id}: {seen} {need}")
        passed.append((check, f"run {run.id}: {seen}"))
    return run, passed


def parse_time(value: str | None, what: str) -> datetime:
    try:
        when = datetime.fromisoformat(value or "")
    except ValueError:
        raise GateError(f"{what} {value!r} is not an ISO 8601 time", check="api_shape") from None
    if when.tzinfo is None:
        raise GateError(f"{what} {value!r} has no time zone", check="api_shape")
    return when.astimezone(UTC)


def check_artifacts(
    run: ApiRun, raws: list[dict[str, Any]], t: Target, now: datetime
) -> tuple[dict[str, ApiArtifact], Passed]:
    """Both named artifacts, once each, from this very run, unexpired, with a sane size and digest."""
    found: dict[str, ApiArtifact] = {}
    passed: Passed = []
    for name in t.artifact_names:
        matches = [_parse(ApiArtifact, r, f"artifact {name}") for r in raws if r.get("name") == name]
        _require(bool(matches), "artifact_missing", f"run {run.id} has no artifact {name!r}")
        _require(len(matches) == 1, "artifact_duplicate", f"run {run.id} lists {name!r} {len(matches)} times")
        art = matches[0]
        wr = art.workflow_run
        _require(
            wr is not None and wr.id == run.id and wr.head_sha == t.sha,
            "artifact_same_run",
            f"{name} (artifact {art.id}) comes from run {wr.id if wr else None}, not from run {run.id} at {t.sha}",
        )
        _require(not art.expired, "artifact_expired", f"{name} (artifact {art.id}) has expired")
        expires = parse_time(art.expires_at, f"{name}.expires_at")
        _require(expires > now, "artifact_expired", f"{name} (artifact {art.id}) expired at {art.expires_at}")
        _require(
            0 < art.size_in_bytes <= MAX_ARTIFACT_BYTES,
            "artifact_size",
            f"{name} declares {art.size_in_bytes} bytes (bound {MAX_ARTIFACT_BYTES})",
        )
        if art.digest is not None:
            algo, _, hexdigest = art.digest.partition(":")
            _require(
                algo == "sha256" and len(hexdigest) == 64 and all(c in "0123456789abcdef" for c in hexdigest),
                "artifact_digest",
                f"{name} digest {art.digest[:80]!r} is not sha256:<64 hex>",
            )
        found[name] = art
        passed.append(
            (
                f"artifact_{'candidate' if name == CANDIDATE_ARTIFACT else 'qualification'}",
                f"{name}: artifact {art.id} listed once, workflow_run {run.id} at {t.sha[:12]}, "
                f"not expired (expires_at {art.expires_at}), {art.size_in_bytes} bytes",
            )
        )
    return found, passed


def select_run(client: GitHubClient, t: Target, now: datetime) -> Selection:
    """The newest qualifying run that has both artifacts; every other listed run is kept with its reason."""
    raws = client.paginate(t.runs_url(), "workflow_runs")
    ids = [r.get("id") for r in raws]
    _require(len(ids) == len(set(map(repr, ids))), "api_response", "the API lists one run id twice")
    others: list[tuple[OtherRun, GateError]] = []
    qualifying: list[ApiRun] = []
    run_passed: dict[int, Passed] = {}
    for raw in raws:
        try:
            run, passed = check_run(raw, t)
            qualifying.append(run)
            run_passed[run.id] = passed
        except GateError as exc:
            rid = raw.get("id")
            others.append((OtherRun(id=rid if isinstance(rid, int) else 0, check=exc.check, reason=str(exc)), exc))
    chosen: Selection | None = None
    for run in sorted(qualifying, key=lambda r: r.id, reverse=True):
        if chosen is not None:
            skip = GateError(f"run {chosen.run.id} is newer and has both artifacts", check="newer_run_chosen")
            others.append((OtherRun(id=run.id, check=skip.check, reason=str(skip)), skip))
            continue
        try:
            artifacts, art_passed = check_artifacts(run, client.paginate(t.artifacts_url(run.id), "artifacts"), t, now)
        except GateError as exc:
            if exc.check in {"api_status", "api_connection", "api_response", "pagination", "redirect_limit"}:
                raise
            others.append((OtherRun(id=run.id, check=exc.check, reason=str(exc)), exc))
            continue
        chosen = Selection(run=run, artifacts=artifacts, passed=run_passed[run.id] + art_passed)
    others.sort(key=lambda pair: pair[0].id, reverse=True)
    if chosen is None:
        if not others:
            raise GateError(
                f"no {t.workflow} run is listed for {t.sha} in {t.repository}; dispatch gpu.yml for this commit",
                check="no_run",
            )
        failed = [pair for pair in others if pair[0].id in {r.id for r in qualifying}] or others
        raise NoRunError(failed[0][1], [pair[0] for pair in others])
    chosen.others = [pair[0] for pair in others]
    return chosen


def download_bound(art: ApiArtifact) -> int:
    return art.size_in_bytes + ARTIFACT_MARGIN

"""The release gate's own record (``gate.json``, published beside the release assets) against the two statements.

The gate chose one gpu.yml run through GitHub's API; the statements were derived from the candidate manifest and
``qualification.json``. Offline, with ``--gate-record``, the auditor demands that they agree: the gate passed for the
audited commit and level (``gate_record``); its run id, attempt, repository, workflow and head commit are the ones
both statements name (``gate_run``); the wheel and sdist it published are the statements' subjects (``gate_subjects``).
The statements are read as published; their own checks (``build_provenance``, ``qualification_result``) run first.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from harness.audit.findings import require
from harness.core.errors import HarnessError, VerificationError
from harness.core.gate_records import ChosenRun, GateRecord
from harness.core.intoto import ProvenanceStatement, ResultStatement
from harness.core.recordio import parse_record
from harness.core.safeio import RECORD_MAX_BYTES, read_regular
from harness.evidence.statements import GITHUB, PROVENANCE, QUALIFICATION_RESULT


def read_gate_record(path: Path) -> GateRecord:
    """``gate.json``: a regular file (``lstat``: no symlink, FIFO or directory) of bounded size, strict JSON, the
    ``GateRecord`` model. Every way it can be wrong is one ``[gate_record]`` error."""
    data = read_regular(path, f"the gate record {path.name}", max_bytes=RECORD_MAX_BYTES, check="gate_record")
    try:
        return parse_record(GateRecord, data, path.name, check="gate_record")
    except HarnessError as exc:
        raise VerificationError(f"the gate record {exc}", check="gate_record") from None


def run_uri(run: ChosenRun) -> str:
    """The run and attempt the gate chose, written as the statements write a run (``statements.run_uri``)."""
    return f"{GITHUB}/{run.repository}/actions/runs/{run.id}/attempts/{run.run_attempt}"


class GateRecordChecks:
    """The three checks over one gate record and the published statements of ``assets``."""

    def __init__(self, path: Path, assets: Path, *, commit: str, level: str) -> None:
        self.path, self.assets, self.commit, self.level = path, assets, commit, level
        self.gate: GateRecord | None = None

    def record(self) -> str:
        gate = read_gate_record(self.path)
        require(
            gate.status == "passed",
            "gate_record",
            f"the gate failed at its check {gate.failed_check}; only a passed gate's record is compared",
        )
        query, run = gate.query, gate.run
        assert query is not None and run is not None  # GateRecord: a passed gate has both
        require(
            query.sha == self.commit,
            "gate_record",
            f"the gate checked commit {query.sha}, not {self.commit}",
        )
        require(
            query.level == self.level,
            "gate_record",
            f"the gate checked level {query.level}, the audit is at {self.level}",
        )
        self.gate = gate
        return f"gate passed for {query.repository} {query.sha[:12]} at {query.level}; chose run {run.id}"

    def run(self) -> str:
        gate = self._gate("gate_run")
        query, run = gate.query, gate.run
        assert query is not None and run is not None
        require(
            (run.repository, run.path, run.head_sha) == (query.repository, query.workflow_path, query.sha),
            "gate_run",
            "the gate's chosen run is not of the repository, workflow and commit it queried",
        )
        require(
            all(a.workflow_run_id == run.id for a in gate.artifacts),
            "gate_run",
            f"the gate record lists an artifact of a run other than {run.id}",
        )
        provenance = _statement(ProvenanceStatement, self.assets, PROVENANCE, "gate_run")
        result = _statement(ResultStatement, self.assets, QUALIFICATION_RESULT, "gate_run")
        want = run_uri(run)
        # The auditor scrubs URLs from its messages (they look like paths), so a refusal names the run in words.
        chosen = f"the gate chose run {run.id} attempt {run.run_attempt} of {run.repository}"
        metadata = provenance.predicate.runDetails.metadata
        require(
            metadata is not None and metadata.invocationId == want,
            "gate_run",
            f"{PROVENANCE}'s invocationId is not the run the gate chose: {chosen}",
        )
        require(
            result.predicate.url == want,
            "gate_run",
            f"{QUALIFICATION_RESULT}'s url is not the run the gate chose: {chosen}",
        )
        external = provenance.predicate.buildDefinition.externalParameters
        workflow = external.workflow
        require(
            workflow is not None and (workflow.repository, workflow.path) == (run.repository, run.path),
            "gate_run",
            f"{PROVENANCE} names another repository or workflow than the gate's {run.repository} {run.path}",
        )
        require(
            external.source.commit == run.head_sha,
            "gate_run",
            f"{PROVENANCE} names source commit {external.source.commit}, the gate's run is of {run.head_sha}",
        )
        return (
            f"both statements name run {run.id} attempt {run.run_attempt} of {run.repository} ({run.path}) at "
            f"{run.head_sha[:12]}"
        )

    def subjects(self) -> str:
        gate = self._gate("gate_subjects")
        published = sorted((o.filename, o.sha256) for o in gate.outputs)
        subjects = {
            PROVENANCE: _statement(ProvenanceStatement, self.assets, PROVENANCE, "gate_subjects").subject,
            QUALIFICATION_RESULT: _statement(
                ResultStatement, self.assets, QUALIFICATION_RESULT, "gate_subjects"
            ).subject,
        }
        for name, subject in subjects.items():
            require(
                published == sorted((s.name, s.digest.sha256) for s in subject),
                "gate_subjects",
                f"the gate's dist/ {[n for n, _ in published]} is not {name}'s subjects (by name and sha256)",
            )
        return f"the gate's dist/ ({', '.join(n for n, _ in published)}) is both statements' subjects, by sha256"

    def _gate(self, check: str) -> GateRecord:
        if self.gate is None:
            raise VerificationError("the gate record was refused (see gate_record)", check=check)
        return self.gate


StatementT = TypeVar("StatementT", ProvenanceStatement, ResultStatement)


def _statement(model: type[StatementT], assets: Path, name: str, check: str) -> StatementT:
    """A published statement, as the model reads it (its own checks compare it with the chain)."""
    data = read_regular(assets / name, name, max_bytes=RECORD_MAX_BYTES, check=check, root=assets)
    try:
        return parse_record(model, data, name, check=check)
    except HarnessError as exc:
        raise VerificationError(f"cannot compare with the gate record: {exc}", check=check) from None

"""The auditor over the two in-toto statements: each is compared, part by part, with the statement the auditor
re-derives from the verified chain, and must then be byte-equal to it. Each part has its own check, so a refusal
names what was wrong (an edited subject digest is ``statement_subjects``, an edited run id ``provenance_run``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.audit.findings import require
from harness.core.errors import HarnessError
from harness.core.intoto import (
    RESOLVED_INPUTS,
    WARNED_REASONS,
    ProvenanceStatement,
    ResultStatement,
    statement_bytes,
)
from harness.core.jsonio import canonical_bytes, loads_strict
from harness.core.safeio import RECORD_MAX_BYTES, read_regular

Part = tuple[str, str, Callable[[Any], Any]]


def _get(*keys: str) -> Callable[[Any], Any]:
    def pick(value: Any) -> Any:
        for key in keys:
            value = value.get(key) if isinstance(value, dict) else None
        return value

    return pick


PROVENANCE_PARTS: tuple[Part, ...] = (
    ("provenance_builder", "the builder", _get("predicate", "runDetails", "builder")),
    ("provenance_builder", "the build type", _get("predicate", "buildDefinition", "buildType")),
    ("provenance_run", "the run and attempt", _get("predicate", "runDetails", "metadata")),
    ("provenance_run", "the workflow", _get("predicate", "buildDefinition", "externalParameters", "workflow")),
    ("provenance_source", "the source", _get("predicate", "buildDefinition", "externalParameters", "source")),
    ("provenance_source", "the build parameters", _get("predicate", "buildDefinition", "internalParameters")),
    ("provenance_source", "the toolchain", _get("predicate", "buildDefinition", "resolvedDependencies")),
)
RESULT_PARTS: tuple[Part, ...] = (
    ("test_result", "the result", _get("predicate", "result")),
    ("test_result_checks", "the passed checks", _get("predicate", "passedTests")),
    ("test_result_checks", "the failed checks", _get("predicate", "failedTests")),
    ("test_result_checks", "the warned checks", _get("predicate", "warnedTests")),
    ("test_result_checks", "the warned checks' reasons", _get("predicate", WARNED_REASONS)),
    ("test_result_configuration", "the configuration", _get("predicate", "configuration")),
    ("test_result_run", "the run and attempt", _get("predicate", "url")),
    ("test_result_inputs", "the resolved inputs", _get("predicate", RESOLVED_INPUTS)),
)


def verify_statement(
    path: Path, root: Path, expected: ProvenanceStatement | ResultStatement, parts: tuple[Part, ...]
) -> str:
    """``path`` against ``expected``: canonical encoding, statement and predicate type, subjects, then each part,
    then every byte. Raises ``VerificationError`` naming the first check that fails."""
    name = path.name
    data = read_regular(path, name, max_bytes=RECORD_MAX_BYTES, check="statement_canonical", root=root)
    try:
        published = loads_strict(data, name)
    except HarnessError as exc:
        require(False, "statement_canonical", f"{name} is not strict JSON: {exc}")
    require(
        data == canonical_bytes(published) + b"\n",
        "statement_canonical",
        f"{name} is not canonical JSON (sorted keys, compact separators, UTF-8, one final newline)",
    )
    want = expected.model_dump(mode="json", by_alias=True, exclude_none=True)
    require(isinstance(published, dict), "statement_type", f"{name} is not a JSON object")
    for key in ("_type", "predicateType"):
        require(published.get(key) == want[key], "statement_type", f"{name}: {key} is not {want[key]!r}")
    subject = published.get("subject")
    if isinstance(subject, list):
        names = [s.get("name") if isinstance(s, dict) else None for s in subject]
        require(len(names) == len(set(map(str, names))), "statement_subjects", f"{name} names a subject twice")
    require(
        subject == want["subject"],
        "statement_subjects",
        f"{name}: the subjects must be exactly the published wheel then sdist, by sha256",
    )
    for check, what, pick in parts:
        require(
            pick(published) == pick(want),
            check,
            f"{name}: {what} differs from the auditor's re-derivation from the chain",
        )
    require(
        data == statement_bytes(expected),
        "statement_content",
        f"{name} is not byte-equal to the statement the auditor re-derives from the chain",
    )
    return f"{name}: canonical, subjects and every predicate field equal the auditor's re-derivation"

"""Strict records: schemas in sync, NaN refused, local paths refused, honest status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from harness.core import schemas
from harness.core.errors import RecordError
from harness.core.jsonio import canonical_bytes, looks_like_local_path
from harness.core.recordio import load_record, parse_record
from harness.core.records import Artifact, CheckResult, Checks, NotRun, Qualification


def test_committed_schemas_match_the_models() -> None:
    assert schemas.drift() == [], "run `python -m harness schemas` (or `nox -s schemas`)"


def test_schema_drift_is_detected(tmp_path: Path) -> None:
    schemas.write(tmp_path)
    assert schemas.drift(tmp_path) == []
    (tmp_path / "qualification.schema.json").write_text("{}\n")
    (tmp_path / "stray.json").write_text("{}\n")
    assert len(schemas.drift(tmp_path)) == 2


def test_nan_is_refused_on_write_and_read(smoke_qual: Path) -> None:
    with pytest.raises(RecordError) as info:
        canonical_bytes({"x": float("nan")})
    assert info.value.check == "finite_numbers"
    text = (smoke_qual / "qualification.json").read_text().replace('"metrics":{', '"metrics":{"bad":NaN,', 1)
    with pytest.raises(RecordError) as info:
        parse_record(Qualification, text.encode(), "qualification.json")
    assert info.value.check == "finite_numbers"


@pytest.mark.parametrize(
    "text", ["/home/alice/run", "see /tmp/x", "~/.cache/miniverl", "~alice/x", "~", "C:\\Users\\bob", "/x"]
)
def test_local_paths_are_recognized(text: str) -> None:
    assert looks_like_local_path(text)


@pytest.mark.parametrize(
    "text", ["<venv>/bin/miniverl", "evidence/run/plan.json", "owner/repo", "sha256:ab", "~=3.9", "~= 1.2"]
)
def test_portable_strings_pass(text: str) -> None:
    assert not looks_like_local_path(text)


def test_a_local_path_in_a_record_is_refused(smoke_qual: Path) -> None:
    value = json.loads((smoke_qual / "qualification.json").read_bytes())
    value["execution"]["origin"]["import_file"] = "/home/alice/venv/lib/miniverl/__init__.py"
    with pytest.raises(RecordError) as info:
        parse_record(Qualification, canonical_bytes(value), "qualification.json")
    assert info.value.check == "no_local_paths"
    Artifact(path="evidence/x", role="x", bytes=1, sha256="0" * 64)
    with pytest.raises(RecordError):
        CheckResult(name="a", passed=True, detail="wrote /root/out")


def test_checks_are_disjoint_and_required_checks_have_outcomes() -> None:
    with pytest.raises(ValidationError):
        Checks(
            required=["a"],
            executed=[CheckResult(name="a", passed=True, detail="")],
            skipped=[NotRun(name="a", reason="x")],
            not_applicable=[],
        )
    with pytest.raises(ValidationError):
        Checks(required=["b"], executed=[], skipped=[], not_applicable=[])


def test_passed_needs_every_required_check_executed_and_passed(smoke_qual: Path) -> None:
    value = json.loads((smoke_qual / "qualification.json").read_bytes())
    assert value["status"] == "passed"
    value["checks"]["executed"][0]["passed"] = False
    with pytest.raises(RecordError):
        parse_record(Qualification, canonical_bytes(value), "qualification.json")
    value = json.loads((smoke_qual / "qualification.json").read_bytes())
    moved = value["checks"]["executed"].pop(0)
    value["checks"]["skipped"].append({"name": moved["name"], "reason": "not run"})
    with pytest.raises(RecordError):
        parse_record(Qualification, canonical_bytes(value), "qualification.json")


def test_unknown_keys_are_refused(smoke_qual: Path) -> None:
    value = json.loads((smoke_qual / "qualification.json").read_bytes())
    value["environment"]["extra"] = 1
    with pytest.raises(RecordError) as info:
        parse_record(Qualification, canonical_bytes(value), "qualification.json")
    assert info.value.check == "record_schema"


def test_qualification_record_loads(smoke_qual: Path) -> None:
    q = load_record(Qualification, smoke_qual / "qualification.json")
    assert q.scientific_scope.distributed_verl_execution == "not_tested"
    assert q.scientific_scope.other_hardware == "unmeasured"

"""Invariants of .github/workflows/release.yml, asserted from the parsed YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

RELEASE = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "release.yml"


@pytest.fixture(scope="module")
def release() -> dict[Any, Any]:
    data = yaml.safe_load(RELEASE.read_text())
    assert isinstance(data, dict)
    return data


def test_manual_dispatch_with_sha_and_dry_run(release: dict[Any, Any]) -> None:
    triggers = release[True]  # PyYAML reads `on:` as True
    assert list(triggers) == ["workflow_dispatch"]
    inputs = triggers["workflow_dispatch"]["inputs"]
    assert set(inputs) == {"sha", "dry_run"}
    assert inputs["dry_run"]["type"] == "boolean" and inputs["dry_run"]["default"] is True
    assert "pull_request" not in RELEASE.read_text()


def test_write_permission_only_on_the_publishing_job(release: dict[Any, Any]) -> None:
    assert release["permissions"] == {}
    jobs = release["jobs"]
    assert set(jobs) == {"gate", "publish"}
    assert jobs["gate"]["permissions"] == {"actions": "read", "contents": "read"}
    assert jobs["publish"]["permissions"] == {
        "contents": "write",
        "id-token": "write",
        "attestations": "write",
        "artifact-metadata": "write",
    }
    assert jobs["publish"]["needs"] == "gate" and jobs["publish"]["if"] == "${{ !inputs.dry_run }}"


def test_gate_runs_the_harness_and_publish_uploads_only_its_outputs(release: dict[Any, Any]) -> None:
    gate_runs = "\n".join(s.get("run", "") for s in release["jobs"]["gate"]["steps"])
    assert "-m harness release-gate" in gate_runs and "--level full_qualification" in gate_runs
    assert "--dry-run" in gate_runs and "GITHUB_API_URL" in gate_runs
    publish = release["jobs"]["publish"]["steps"]
    assert not any("actions/checkout" in s.get("uses", "") for s in publish)  # nothing to rebuild from
    runs = "\n".join(s.get("run", "") for s in publish)
    assert "gh release create" in runs and "files=(dist/* gate.json)" in runs and "release-assets/*" in runs
    assert "${{" not in runs  # inputs reach shell only through env


def test_publish_signs_both_statements_with_a_pinned_attest(release: dict[Any, Any]) -> None:
    steps = release["jobs"]["publish"]["steps"]
    attest = [s for s in steps if s.get("uses", "").startswith("actions/attest@")]
    assert [s["with"]["predicate-type"] for s in attest] == [
        "https://slsa.dev/provenance/v1",
        "https://in-toto.io/attestation/test-result/v0.1",
    ]
    for step in attest:
        sha = step["uses"].split("@", 1)[1]
        assert len(sha) == 40 and all(c in "0123456789abcdef" for c in sha)
        assert step["with"]["subject-path"] == "gate/dist/*"
    names = [s.get("uses", s.get("name", "")) for s in steps]
    assert names.index(attest[-1]["uses"]) < len(names) - 1  # signed before the release is created

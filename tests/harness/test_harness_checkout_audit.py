"""`make verify` (`python -m harness verify-checkout`) takes its trusted inputs from the checkout, never from out/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from harness_helpers import copy_tree

from harness.audit.auditor import audit
from harness.audit.cli import checkout_request
from harness.core import proc


@pytest.fixture
def checkout(
    fake_repo: Path,
    candidate: Path,
    smoke_qual: Path,
    known_good: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Path:
    """The stand-in repo at the candidate's commit, with out/ from a real smoke and its known-good stack."""
    repo = copy_tree(fake_repo, tmp_path / "repo")
    copy_tree(candidate, repo / "out" / "candidate")
    copy_tree(smoke_qual, repo / "out" / "qualification")
    (repo / "known-good").mkdir()
    for name in ("cpu-reference.json", "cpu-reference.txt"):
        shutil.copyfile(known_good / name, repo / "known-good" / name)
    monkeypatch.setattr(proc, "REPO_ROOT", repo)
    return repo


def test_the_checkout_audit_passes_on_an_honest_out_dir(checkout: Path) -> None:
    req = checkout_request("cpu-reference", "release_smoke", assets=False)
    assert req.commit == json.loads((checkout / "out/candidate/candidate-manifest.json").read_bytes())["source_commit"]
    assert audit(req).status == "passed"


def test_a_known_good_file_edited_after_qualification_fails_by_name(checkout: Path) -> None:
    path = checkout / "known-good" / "cpu-reference.json"
    value = json.loads(path.read_bytes())
    value["notes"] = "edited after the qualification"
    path.write_text(json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n")
    result = audit(checkout_request("cpu-reference", "release_smoke", assets=False))
    assert result.status == "failed" and result.failed_checks == ["known_good_sha256"]


def test_the_level_and_gpu_come_from_the_command_and_the_profile(checkout: Path) -> None:
    assert audit(checkout_request("cpu-reference", "full_qualification", assets=False)).failed_checks[0] == "level"
    shutil.copyfile(checkout / "known-good" / "cpu-reference.json", checkout / "known-good" / "h200-cu130.json")
    failed = audit(checkout_request("h200-cu130", "release_smoke", assets=False)).failed_checks
    assert "gpu_name" in failed or "profile" in failed


def test_without_a_path_the_descriptor_comes_from_the_candidates_sdist(
    fake_repo: Path, known_good: Path, tmp_path: Path
) -> None:
    from harness_helpers import git

    from harness.build.candidate import build_candidate
    from harness.build.known_good import read_known_good

    repo = copy_tree(fake_repo, tmp_path / "repo")
    (repo / "known-good").mkdir()
    shutil.copyfile(known_good / "cpu-reference.json", repo / "known-good" / "cpu-reference.json")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "ship the known-good stack")
    manifest = build_candidate(repo, tmp_path / "candidate", env={})
    data, source = read_known_good(
        None, tmp_path / "candidate" / manifest.sdist.filename, manifest.version, "cpu-reference"
    )
    assert data == (known_good / "cpu-reference.json").read_bytes() and source == "the candidate's sdist"


def test_make_verify_passes_a_gate_record_through_and_it_needs_the_assets(
    checkout: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main
    from harness.core.errors import UsageError

    req = checkout_request("cpu-reference", "release_smoke", assets=False, gate_record="gate.json")
    assert req.gate_record == Path("gate.json")
    with pytest.raises(UsageError, match="--gate-record needs --assets-dir"):
        audit(req)
    out = tmp_path / "rv.json"
    argv = ["verify-checkout", "--profile", "cpu-reference", "--level", "release_smoke", "--out", str(out)]
    assert main([*argv, "--gate-record", str(tmp_path / "gate.json")]) == 2
    assert "[usage] --gate-record needs --assets-dir" in capsys.readouterr().err and not out.exists()

"""The auditor on a real (stand-in) smoke: passes, and names the failed check for each tampering."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_helpers import audit, audit_args, copy_tree, rewrite_json

from harness.core.jsonio import canonical_bytes


def test_the_untampered_chain_passes(candidate: Path, smoke_qual: Path, known_good: Path) -> None:
    code, rv, err = audit(audit_args(candidate, smoke_qual, known_good))
    assert code == 0, err
    assert rv["status"] == "passed" and rv["failed_checks"] == []
    assert rv["release_authorized"] is False
    assert any("can never authorize" in r for r in rv["authorization_reasons"])
    names = [c["name"] for c in rv["checks"]]
    assert names[:2] == ["candidate", "source_commit"] and "evidence_files" in names


def _fails(args: list[str], check: str) -> dict:  # type: ignore[type-arg]
    code, rv, err = audit(args)
    assert code == 1, err
    assert check in rv["failed_checks"], rv["failed_checks"]
    assert err.startswith("validate_release_chain: error: [") and err.count("\n") == 1 and "Traceback" not in err
    return rv


@pytest.mark.parametrize(
    ("over", "check"),
    [
        ({"--commit": "f" * 40}, "source_commit"),
        ({"--required-gpu-name": "NVIDIA GeForce RTX 4080"}, "gpu_name"),
        ({"--level": "full_qualification"}, "level"),
        ({"--profile": "h200-cu130"}, "profile"),
        ({"--known-good-sha256": "0" * 64}, "known_good_sha256"),
    ],
)
def test_wrong_commit_gpu_level_profile_known_good(
    candidate: Path, smoke_qual: Path, known_good: Path, over: dict[str, str], check: str
) -> None:
    _fails(audit_args(candidate, smoke_qual, known_good, **over), check)


def test_wrong_run_attempt(candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path) -> None:
    q = copy_tree(smoke_qual, tmp_path / "q")
    binding = {
        "kind": "github_actions",
        "repository": "o/miniverl",
        "workflow_path": ".github/workflows/gpu.yml",
        "run_id": 7,
        "run_attempt": 2,
    }
    rewrite_json(q / "qualification.json", lambda v: v["execution"].update(workflow=binding))
    _fails(audit_args(candidate, q, known_good), "run_attempt")
    binding["run_attempt"] = 1
    rewrite_json(q / "qualification.json", lambda v: v["execution"].update(workflow=binding))
    _fails(audit_args(candidate, q, known_good), "same_run")


def test_a_qualification_from_a_different_candidate(
    candidate: Path, smoke_qual: Path, known_good: Path, fake_repo: Path, tmp_path: Path
) -> None:
    from harness_helpers import git

    from harness.build.candidate import build_candidate

    repo = copy_tree(fake_repo, tmp_path / "repo")
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\nchanged\n")
    git(repo, "commit", "-qam", "another commit")
    other = tmp_path / "other"
    manifest = build_candidate(repo, other, env={})
    _fails(audit_args(other, smoke_qual, known_good, **{"--commit": manifest.source_commit}), "candidate_binding")


def test_a_flipped_evidence_byte(candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path) -> None:
    q = copy_tree(smoke_qual, tmp_path / "q")
    target = q / "evidence" / "adapter" / "adapter_model.safetensors"
    data = bytearray(target.read_bytes())
    data[0] ^= 0xFF
    target.write_bytes(bytes(data))
    _fails(audit_args(candidate, q, known_good), "artifact_sha256")


def test_loose_result_files_cannot_claim_the_higher_level(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    q = copy_tree(smoke_qual, tmp_path / "q")
    for name in ("qualification-direct-gkd.json", "qualification-pg-k1.json", "qualification-smollm2.json"):
        (q / name).write_bytes((q / "qualification-release-smoke.json").read_bytes())
    _fails(audit_args(candidate, q, known_good, **{"--level": "full_qualification"}), "level")
    rewrite_json(q / "qualification.json", lambda v: v.update(level="full_qualification"))
    _fails(audit_args(candidate, q, known_good, **{"--level": "full_qualification"}), "principal_records")


def test_nan_and_local_paths_in_the_qualification(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    q = copy_tree(smoke_qual, tmp_path / "nan")
    text = (q / "qualification.json").read_text().replace('"metrics":{', '"metrics":{"x":NaN,', 1)
    (q / "qualification.json").write_text(text)
    _fails(audit_args(candidate, q, known_good), "finite_numbers")
    q = copy_tree(smoke_qual, tmp_path / "path")
    value = json.loads((q / "qualification.json").read_bytes())
    value["reasons"] = []
    value["environment"]["os"] = "Linux at /home/alice"
    (q / "qualification.json").write_bytes(canonical_bytes(value))
    _fails(audit_args(candidate, q, known_good), "no_local_paths")


def test_a_tampered_candidate_is_refused_first(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    c = copy_tree(candidate, tmp_path / "c")
    wheel = next(c.glob("*.whl"))
    data = bytearray(wheel.read_bytes())
    data[-10] ^= 1
    wheel.write_bytes(bytes(data))
    rv = _fails(audit_args(c, smoke_qual, known_good), "wheel_sha256")
    assert rv["release_authorized"] is False


def test_missing_inputs_are_one_line_errors(tmp_path: Path, known_good: Path) -> None:
    code, rv, err = audit(
        [
            "--candidate-dir",
            str(tmp_path / "none"),
            "--candidate-manifest",
            str(tmp_path / "m"),
            "--qualification",
            str(tmp_path / "q.json"),
            "--commit",
            "a" * 40,
            "--known-good-sha256",
            "b" * 64,
            "--required-gpu-name",
            "none",
        ]
    )
    assert code == 1 and rv["failed_checks"][0] == "candidate_dir"
    assert err.count("\n") == 1 and "Traceback" not in err

"""The candidate: exact file set, canonical SHA256SUMS, strict manifest, byte-identical rebuild, tampering."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from harness_helpers import rewrite_json, run_cli

from harness.build.candidate import MANIFEST, SUMS, build_candidate, check_candidate, workflow_binding
from harness.core.errors import CandidateError, UsageError
from harness.core.jsonio import sha256_file


def test_candidate_has_exactly_four_regular_files(candidate: Path) -> None:
    manifest = check_candidate(candidate)
    names = sorted(p.name for p in candidate.iterdir())
    assert names == sorted([MANIFEST, SUMS, manifest.wheel.filename, manifest.sdist.filename])
    sums = (candidate / SUMS).read_text()
    assert (
        sums
        == f"{manifest.wheel.sha256}  {manifest.wheel.filename}\n{manifest.sdist.sha256}  {manifest.sdist.filename}\n"
    )
    assert manifest.workflow.kind == "local"
    assert manifest.build.toolchain.build == "1.6.1" and manifest.build.toolchain.hatchling == "1.33.0"
    assert manifest.worktree_clean is True


def test_rebuild_of_the_same_commit_is_byte_identical(fake_repo: Path, candidate: Path, tmp_path: Path) -> None:
    build_candidate(fake_repo, tmp_path / "again", env={})
    names = sorted(p.name for p in candidate.iterdir())
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == names and len(names) == 4
    for name in names:  # the manifest too: every field derives from the commit, none from the clock
        assert (tmp_path / "again" / name).read_bytes() == (candidate / name).read_bytes(), name


def test_a_qualification_made_before_a_rebuild_still_verifies(
    fake_repo: Path, candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    from harness_helpers import audit, audit_args

    out = shutil.copytree(candidate, tmp_path / "candidate")
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    build_candidate(fake_repo, out, env={})  # same bytes: a no-op that keeps the files in place
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    code, rv, err = audit(audit_args(out, smoke_qual, known_good))
    assert code == 0 and rv["status"] == "passed", err


def test_other_bytes_in_the_output_are_never_clobbered(fake_repo: Path, candidate: Path, tmp_path: Path) -> None:
    out = shutil.copytree(candidate, tmp_path / "candidate")
    (out / SUMS).write_text("edited\n")
    with pytest.raises(CandidateError) as info:
        build_candidate(fake_repo, out, env={})
    assert info.value.check == "candidate_overwrite"
    assert (out / SUMS).read_text() == "edited\n"
    done = run_cli("-m", "harness", "build", "--repo", str(fake_repo), "--out", str(out))
    assert done.returncode == 1 and "[candidate_overwrite]" in done.stderr and done.stderr.count("\n") == 1
    build_candidate(fake_repo, out, env={}, force=True)
    assert (out / SUMS).read_bytes() == (candidate / SUMS).read_bytes()


def _copy(candidate: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "candidate"
    shutil.copytree(candidate, dest)
    return dest


def _fails(directory: Path, check: str) -> None:
    with pytest.raises(CandidateError) as info:
        check_candidate(directory)
    assert info.value.check == check, str(info.value)


def test_one_flipped_byte_in_the_wheel(candidate: Path, tmp_path: Path) -> None:
    d = _copy(candidate, tmp_path)
    wheel = next(d.glob("*.whl"))
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01
    wheel.write_bytes(bytes(data))
    _fails(d, "wheel_sha256")


def test_a_changed_manifest_field(candidate: Path, tmp_path: Path) -> None:
    d = _copy(candidate, tmp_path)
    rewrite_json(d / MANIFEST, lambda m: m["wheel"].update(sha256="0" * 64))
    _fails(d, "sha256sums")
    d2 = _copy(candidate, tmp_path / "b")
    rewrite_json(d2 / MANIFEST, lambda m: m.update(source_commit="1" * 40, unexpected=True))
    _fails(d2, "candidate_manifest")


def test_extra_missing_and_symlinked_files(candidate: Path, tmp_path: Path) -> None:
    d = _copy(candidate, tmp_path / "extra")
    (d / "notes.txt").write_text("x")
    _fails(d, "candidate_file_set")
    d = _copy(candidate, tmp_path / "missing")
    (d / SUMS).unlink()
    _fails(d, "candidate_file_set")
    d = _copy(candidate, tmp_path / "link")
    sdist = next(d.glob("*.tar.gz"))
    real = tmp_path / "elsewhere.tar.gz"
    shutil.move(sdist, real)
    os.symlink(real, sdist)
    _fails(d, "candidate_file_type")


def test_build_check_cli_reports_one_line(candidate: Path, tmp_path: Path) -> None:
    assert run_cli("-m", "harness", "build", "--check", "--out", str(candidate)).returncode == 0
    d = _copy(candidate, tmp_path)
    (d / "extra.whl").write_bytes(b"x")
    done = run_cli("-m", "harness", "build", "--check", "--out", str(d))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and "[candidate_file_set]" in done.stderr and "Traceback" not in done.stderr


def test_github_actions_binding_and_attempt_gate() -> None:
    env = {
        "GITHUB_ACTIONS": "true",
        "GITHUB_REPOSITORY": "o/miniverl",
        "GITHUB_RUN_ID": "42",
        "GITHUB_WORKFLOW_REF": "o/miniverl/.github/workflows/gpu.yml@refs/heads/main",
        "GITHUB_RUN_ATTEMPT": "1",
    }
    binding = workflow_binding(env)
    assert binding.model_dump() == {
        "kind": "github_actions",
        "repository": "o/miniverl",
        "workflow_path": ".github/workflows/gpu.yml",
        "run_id": 42,
        "run_attempt": 1,
    }
    with pytest.raises(UsageError) as info:
        workflow_binding({**env, "GITHUB_RUN_ATTEMPT": "2"})
    assert info.value.check == "run_attempt"


def test_a_failed_build_leaves_the_old_candidate(fake_repo: Path, candidate: Path, tmp_path: Path) -> None:
    d = _copy(candidate, tmp_path)
    before = {p.name: sha256_file(p) for p in d.iterdir()}
    broken = tmp_path / "broken"
    shutil.copytree(fake_repo, broken)
    (broken / "pyproject.toml").write_text("[project]\nname = 'miniverl'\nversion = \n")
    from harness_helpers import git

    git(broken, "commit", "-qam", "break")
    with pytest.raises(Exception) as info:
        build_candidate(broken, d, env={})
    assert getattr(info.value, "check", "") == "build"
    assert {p.name: sha256_file(p) for p in d.iterdir()} == before
    assert json.loads((d / MANIFEST).read_bytes())["source_commit"] != ""

"""The committed GPU full qualifications (docs/measurements/<date>-<profile>-<commit>-full/): the torch-free auditor,
run here over the committed files, re-derives every check, passes the record and never authorizes a release.

The qualification directory (12 MB, 10 MB of it the smoke's exported adapter weights) is not a tracked file: every
tracked file travels with each GPU call, and weights do not belong in the tree. It is packed as
``qualification.tar.xz`` in the commit that recorded the run and read from git's history here, by a sha256 stated in
this test, never by one read from the repository."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import NamedTuple

import pytest

from harness.core.profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = REPO / "docs" / "measurements"
ARCHIVE = "qualification.tar.xz"


class Run(NamedTuple):
    """What a committed run must be, stated here and never read from the folder being verified: its profile (hence
    the GPU and the trusted stack, the checkout's known-good/), the commit its candidate was built from, and the
    commit and sha256 of its packed qualification directory."""

    profile: str
    commit: str
    archive_commit: str
    archive_sha256: str


EXPECTED = {
    "2026-12-06-h100-cu130-0d8711e-full": Run(
        "h100-cu130",
        "0d8711ee0d1fb8e36da9971eb97d3bb4a3a32113",
        "e1d42b5b1d399be57992db7dbfe0ecefd499faab",
        "ed645e05489b479ac3d2db3394f60b802762163f46e2930076bb96f75254a635",
    ),
    "2026-12-06-h100-cu130-02b33ed-vllm-full": Run(
        "h100-cu130",
        "02b33edf2930da166eb029bfa48ca43c5f7b4f89",
        "4149486b2540955ae6216cbb6fedc33a37c539d6",
        "125efe344b6c80cecd2820603a27c883e816d481886ddcbcd20d0acff655f0b2",
    ),
}


def test_every_expected_run_is_committed_one_is_on_a_gpu_and_no_archive_is_tracked() -> None:
    for name, run in EXPECTED.items():
        assert (MEASUREMENTS / name / "commit.txt").read_text().strip() == run.commit
    assert {run.profile for run in EXPECTED.values()} & {"h100-cu130", "h200-cu130"}
    tracked = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "docs/measurements"], capture_output=True, text=True, check=False
    )
    assert tracked.returncode != 0 or not [p for p in tracked.stdout.splitlines() if p.endswith(ARCHIVE)]


def _archive(name: str, run: Run) -> bytes:
    """The packed qualification directory from the commit that recorded it (a clone without that history skips)."""
    shown = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{run.archive_commit}:docs/measurements/{name}/{ARCHIVE}"],
        capture_output=True,
        check=False,
    )
    if shown.returncode != 0:
        pytest.skip(f"not_applicable: this clone lacks commit {run.archive_commit[:12]} ({ARCHIVE} of {name})")
    assert hashlib.sha256(shown.stdout).hexdigest() == run.archive_sha256
    return shown.stdout


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_auditor_rederives_the_committed_run(name: str, tmp_path: Path) -> None:
    expected = EXPECTED[name]
    run, commit = MEASUREMENTS / name, expected.commit
    profile = PROFILES[expected.profile]
    known_good = REPO / "known-good" / f"{profile.known_good}.json"
    (tmp_path / ARCHIVE).write_bytes(_archive(name, expected))
    with tarfile.open(tmp_path / ARCHIVE) as packed:
        packed.extractall(tmp_path, filter="data")
    qualification = tmp_path / "qual" / "qualification.json"
    out = tmp_path / "release-verification.json"
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "validate_release_chain.py"),
            "--candidate-dir", str(run / "candidate"),
            "--candidate-manifest", str(run / "candidate" / "candidate-manifest.json"),
            "--qualification", str(qualification),
            "--commit", commit,
            "--known-good-sha256", hashlib.sha256(known_good.read_bytes()).hexdigest(),
            "--known-good", str(known_good),
            "--required-gpu-name", str(profile.required_gpu_name),
            "--profile", profile.name,
            "--level", "full_qualification",
            "--out", str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    verification = json.loads(out.read_text())
    assert verification["status"] == "passed", verification.get("failed_checks")
    assert verification["release_authorized"] is False
    assert json.loads(qualification.read_text())["status"] == "passed"
    assert json.loads((run / "release-verification.json").read_text())["status"] == "passed"  # as run on the GPU

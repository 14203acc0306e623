"""The committed GPU full qualifications (docs/measurements/<date>-<profile>-full/): the torch-free auditor,
run here over the committed files, re-derives every check, passes the record and never authorizes a release.

The folder under test keeps the qualification directory as ``qualification.tar.xz`` (7 MB packed: every tracked file
travels with each GPU call, so earlier runs' archives stay in git history), unpacked here by the standard library."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from harness.core.profiles import PROFILES

REPO = Path(__file__).resolve().parents[2]
MEASUREMENTS = REPO / "docs" / "measurements"
# What each committed run must be, stated here and never read from the folder being verified: its profile (hence
# the GPU and the trusted stack, the checkout's known-good/) and the commit its candidate was built from.
EXPECTED = {"2026-12-06-h100-cu130-0d8711e-full": ("h100-cu130", "0d8711ee0d1fb8e36da9971eb97d3bb4a3a32113")}
COMMITTED = sorted(p.parent.name for p in MEASUREMENTS.glob("*-full/qualification.tar.xz"))


def test_every_committed_run_is_expected_and_one_is_on_a_gpu() -> None:
    assert sorted(EXPECTED) == COMMITTED
    assert {profile for profile, _ in EXPECTED.values()} & {"h100-cu130", "h200-cu130"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_auditor_rederives_the_committed_run(name: str, tmp_path: Path) -> None:
    run = MEASUREMENTS / name
    profile_name, commit = EXPECTED[name]
    profile = PROFILES[profile_name]
    known_good = REPO / "known-good" / f"{profile.known_good}.json"
    with tarfile.open(run / "qualification.tar.xz") as packed:
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

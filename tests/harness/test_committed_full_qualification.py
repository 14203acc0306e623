"""The committed GPU full qualifications (docs/measurements/<date>-<profile>-full/): the torch-free auditor,
run here over the committed files, re-derives every check, passes the record and never authorizes a release.

Each folder keeps the qualification directory as ``qualification.tar.xz`` (12 MB of evidence, 7 MB packed: every
tracked file travels with each GPU call), unpacked here by the standard library."""

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
COMMITTED = sorted(p.parent for p in (REPO / "docs" / "measurements").glob("*-full/qualification.tar.xz"))


def test_a_gpu_full_qualification_is_committed() -> None:
    assert {(run / "profile.txt").read_text().strip() for run in COMMITTED} & {"h100-cu130", "h200-cu130"}


@pytest.mark.parametrize("run", COMMITTED, ids=[p.name for p in COMMITTED])
def test_the_auditor_rederives_the_committed_run(run: Path, tmp_path: Path) -> None:
    profile = PROFILES[(run / "profile.txt").read_text().strip()]
    known_good = run / "known-good" / f"{profile.known_good}.json"
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
            "--commit", (run / "commit.txt").read_text().strip(),
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

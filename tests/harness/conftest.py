"""Shared fixtures: a stand-in ``miniverl`` git repo, a real candidate built from it, a real smoke run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
FAKEPROJ = HERE / "fakeproj"

_missing = []
for _tool in ("build", "hatchling", "twine", "pydantic"):
    try:
        metadata.version(_tool)
    except metadata.PackageNotFoundError:
        _missing.append(_tool)
if _missing and os.environ.get("MINIVERL_HARNESS_TESTS") != "1":
    # The runtime's test session may lack the build toolchain; `nox -s harness_tests` always has it.
    collect_ignore_glob = ["test_*.py"]
elif _missing:
    raise RuntimeError(f"the harness tests need {_missing}: pip install -r harness/constraints-build.txt")

GIT_ENV = {
    "GIT_AUTHOR_NAME": "fixture",
    "GIT_AUTHOR_EMAIL": "fixture@example.invalid",
    "GIT_COMMITTER_NAME": "fixture",
    "GIT_COMMITTER_EMAIL": "fixture@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(["git", "-C", str(repo), *args], env=env, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def make_repo(dest: Path) -> Path:
    shutil.copytree(FAKEPROJ, dest, dirs_exist_ok=True)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", "fixture")
    return dest


@pytest.fixture(scope="session")
def fake_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("fakerepo"))


@pytest.fixture(scope="session")
def candidate(fake_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harness.candidate import build_candidate

    out = tmp_path_factory.mktemp("cand") / "candidate"
    build_candidate(fake_repo, out, env={})
    return out


@pytest.fixture(scope="session")
def known_good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cpu-reference stack for the stand-in (it has no dependencies, so no pins)."""
    from harness.profiles import PROFILES
    from harness.stacks import describe_existing

    directory = tmp_path_factory.mktemp("known-good")
    (directory / "cpu-reference.txt").write_text("# stand-in stack: no dependencies\n")
    describe_existing(PROFILES["cpu-reference"], directory, status="measured", python_version="3.11",
                      platform_name="linux-x86_64", notes="test")
    return directory


def run_smoke_into(out: Path, candidate: Path, repo: Path, known_good: Path, level: str = "release_smoke") -> int:
    from harness.profiles import PROFILES
    from harness.smoke import SmokeOptions, run_smoke

    opts = SmokeOptions(profile=PROFILES["cpu-reference"], out=out, level=level, candidate=candidate, repo=repo,
                        base_python=Path(sys.executable), known_good_dir=known_good)
    return run_smoke(opts)


@pytest.fixture(scope="session")
def smoke_qual(candidate: Path, fake_repo: Path, known_good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qual") / "qualification"
    run_smoke_into(out, candidate, fake_repo, known_good)
    return out


def kg_sha(known_good: Path) -> str:
    from harness.jsonio import sha256_file

    return sha256_file(known_good / "cpu-reference.json")


def audit_args(candidate: Path, qual: Path, known_good: Path, **over: str) -> list[str]:
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    args = {
        "--candidate-dir": str(candidate),
        "--candidate-manifest": str(candidate / "candidate-manifest.json"),
        "--qualification": str(qual / "qualification.json"),
        "--commit": manifest["source_commit"],
        "--known-good-sha256": kg_sha(known_good),
        "--required-gpu-name": "none",
        "--level": "release_smoke",
    }
    args.update(over)
    return [x for k, v in args.items() if v is not None for x in (k, v)]


def run_cli(*args: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False)


def rewrite_json(path: Path, edit) -> None:  # type: ignore[no-untyped-def]
    from harness.jsonio import canonical_bytes

    value = json.loads(path.read_bytes())
    edit(value)
    path.write_bytes(canonical_bytes(value) + b"\n")

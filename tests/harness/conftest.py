"""Shared fixtures: a stand-in ``miniverl`` git repo, a real candidate built from it, a real smoke run."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

import pytest
from harness_helpers import make_repo, run_smoke_into

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


@pytest.fixture(scope="session")
def fake_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("fakerepo"))


@pytest.fixture(scope="session")
def candidate(fake_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from harness.build.candidate import build_candidate

    out = tmp_path_factory.mktemp("cand") / "candidate"
    build_candidate(fake_repo, out, env={})
    return out


@pytest.fixture(scope="session")
def known_good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cpu-reference stack for the stand-in (it has no dependencies, so no pins)."""
    from harness.build.stacks import describe_existing
    from harness.core.profiles import PROFILES

    directory = tmp_path_factory.mktemp("known-good")
    (directory / "cpu-reference.txt").write_text("# stand-in stack: no dependencies\n")
    describe_existing(
        PROFILES["cpu-reference"],
        directory,
        status="measured",
        python_version="3.11",
        platform_name="linux-x86_64",
        notes="test",
    )
    return directory


@pytest.fixture(scope="session")
def smoke_qual(candidate: Path, fake_repo: Path, known_good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qual") / "qualification"
    run_smoke_into(out, candidate, fake_repo, known_good)
    return out


@pytest.fixture
def ev(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A fresh copy of the test module's ``KIT`` evidence (a ``full_evidence.EvidenceKit``), to edit."""
    return request.module.KIT.copy(tmp_path / "ev")

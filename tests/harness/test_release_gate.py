"""The release gate end to end against a real loopback GitHub (tests/harness/gate_world.py).

The artifacts are real: a candidate built by the harness inside a (simulated) GitHub Actions binding and a
qualification made by the harness's smoke on the stand-in CLI, both zipped like actions/upload-artifact.
The only thing that cannot exist here is GitHub itself; gate_world.py plays its REST API over HTTP.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gate_world import REPO, RUN_ID, WORKFLOW_PATH, Servers, World, unzip, zip_dir, zip_members
from harness_helpers import REPO_ROOT, fabricate_full, git, make_repo, run_smoke_into

TOKEN = "ghs_gateTestToken0123456789abcdefXYZ"
CANDIDATE = "candidate-distributions"
SMOKE = "gpu-release-smoke"
FULL = "gpu-full-qualification"
GH_ENV = {
    "GITHUB_ACTIONS": "true",
    "GITHUB_REPOSITORY": REPO,
    "GITHUB_WORKFLOW_REF": f"{REPO}/{WORKFLOW_PATH}@refs/heads/main",
    "GITHUB_RUN_ID": str(RUN_ID),
    "GITHUB_RUN_ATTEMPT": "1",
}


@dataclass(frozen=True)
class Chain:
    sha: str
    candidate: Path
    smoke: Path
    full: Path
    candidate_zip: bytes
    smoke_zip: bytes
    full_zip: bytes


@pytest.fixture(scope="session")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """Built once: a repo that ships its known-good stack, its candidate and its smoke, bound to run 4242."""
    from harness.candidate import build_candidate
    from harness.profiles import PROFILES
    from harness.stacks import describe_existing

    repo = make_repo(tmp_path_factory.mktemp("gate-repo"))
    kg = repo / "known-good"
    kg.mkdir()
    (kg / "cpu-reference.txt").write_text("# stand-in stack: no dependencies\n")
    describe_existing(
        PROFILES["cpu-reference"], kg, status="measured", python_version="3.11", platform_name="linux", notes="t"
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "known-good stack")
    base = tmp_path_factory.mktemp("gate-chain")
    candidate = base / "candidate"
    build_candidate(repo, candidate, env=GH_ENV)
    smoke = base / "smoke"
    with pytest.MonkeyPatch.context() as mp:
        for key, value in GH_ENV.items():
            mp.setenv(key, value)
        assert run_smoke_into(smoke, candidate, repo, kg) == 0
    full = fabricate_full(smoke, base / "full")
    return Chain(
        sha=git(repo, "rev-parse", "HEAD"),
        candidate=candidate,
        smoke=smoke,
        full=full,
        candidate_zip=zip_dir(candidate),
        smoke_zip=zip_dir(smoke),
        full_zip=zip_dir(full),
    )


@pytest.fixture
def world(chain: Chain) -> Iterator[World]:
    """The ordinary good case: run 4242 with the candidate and both qualification artifacts."""
    w = World(token=TOKEN, sha=chain.sha)
    servers = Servers(w)
    w.run()
    w.artifact(RUN_ID, CANDIDATE, chain.candidate_zip)
    w.artifact(RUN_ID, SMOKE, chain.smoke_zip)
    w.artifact(RUN_ID, FULL, chain.full_zip)
    yield w
    servers.close()


@dataclass
class Result:
    rc: int
    out: str
    err: str
    gate: dict[str, Any]
    dir: Path


def _argv(w: World, out: Path) -> list[str]:
    """The common flags; a test's own flags come after them (argparse keeps the last of a repeated flag)."""
    base = {"--api-url": w.api_url, "--repository": REPO, "--sha": w.sha, "--out": str(out)}
    base.update({"--level": "release_smoke", "--required-gpu-name": "none"})
    return [x for k, v in base.items() for x in (k, v)]


def _gate_json(out: Path) -> dict[str, Any]:
    path = out / "gate.json"
    return json.loads(path.read_bytes()) if path.is_file() else {}


def gate_inproc(
    w: World, out: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *extra: str
) -> Result:
    from harness.cli import main

    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    rc = main(["release-gate", *_argv(w, out), *extra])
    captured = capsys.readouterr()
    return Result(rc, captured.out, captured.err, _gate_json(out), out)


def gate_subprocess(w: World, out: Path, *extra: str, token: str | None = TOKEN) -> Result:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_TOKEN"}
    if token is not None:
        env["GITHUB_TOKEN"] = token
    done = subprocess.run(
        [sys.executable, "-m", "harness", "release-gate", *_argv(w, out), *extra],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return Result(done.returncode, done.stdout, done.stderr, _gate_json(out), out)


def assert_rejected(r: Result, check: str) -> None:
    lines = r.err.strip().splitlines()
    assert r.rc == 1, r.err
    assert len(lines) == 1 and f"[{check}]" in lines[0], r.err
    assert r.gate["status"] == "failed" and r.gate["failed_check"] == check
    assert not (r.dir / "dist").exists() and not (r.dir / "release-verification.json").exists()
    assert sorted(p.name for p in r.dir.iterdir()) == ["gate.json"]


def assert_no_token(r: Result) -> None:
    assert TOKEN not in r.out and TOKEN not in r.err
    for path in r.dir.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path.name


# --- end to end through `python -m harness release-gate` ---------------------------------------------------


def test_happy_path_dry_run_release_smoke(world: World, chain: Chain, tmp_path: Path) -> None:
    r = gate_subprocess(world, tmp_path / "out", "--dry-run")
    assert r.rc == 0, r.err
    assert r.err == ""
    g = r.gate
    assert g["status"] == "passed" and g["failed_check"] is None and not g["release_authorized"]
    assert g["run"]["id"] == RUN_ID and g["query"]["dry_run"] is True
    assert [a["name"] for a in g["artifacts"]] == [CANDIDATE, SMOKE]
    for art in g["artifacts"]:
        assert art["api_digest"] == f"sha256:{art['sha256']}"
    # dist/ is byte-identical to the candidate inside the downloaded artifact; nothing was rebuilt
    manifest = json.loads((chain.candidate / "candidate-manifest.json").read_bytes())
    names = sorted([manifest["wheel"]["filename"], manifest["sdist"]["filename"]])
    assert sorted(p.name for p in (r.dir / "dist").iterdir()) == names
    for name in names:
        assert (r.dir / "dist" / name).read_bytes() == (chain.candidate / name).read_bytes()
    assert sorted(o["filename"] for o in g["outputs"]) == names
    rv = json.loads((r.dir / "release-verification.json").read_bytes())
    assert rv["status"] == "passed" and rv["level"] == "release_smoke" and rv["release_authorized"] is False
    assert not (r.dir / "release-assets").exists()
    assert sorted(p.name for p in r.dir.iterdir()) == ["dist", "gate.json", "release-verification.json"]
    assert_no_token(r)
    # the artifact download crossed to the blob port without credentials or cookies, with the API headers
    blob = world.headers_at(world.blob_seen, "/blob/")
    assert len(blob) == 2
    for headers in blob:
        assert "authorization" not in headers and "proxy-authorization" not in headers and "cookie" not in headers
        assert headers["accept"] == "application/vnd.github+json" and headers["user-agent"].startswith("miniverl")
        assert headers["x-github-api-version"] == "2022-11-28"
    # the API set a cookie on every answer; no later API request sent one back
    api = world.headers_at(world.api_seen, "/repos/")
    assert len(api) >= 4 and all("cookie" not in h for h in api)
    assert all(h["authorization"] == f"Bearer {TOKEN}" for h in api)


def test_smoke_without_dry_run_cannot_authorize(world: World, tmp_path: Path) -> None:
    r = gate_subprocess(world, tmp_path / "out")
    assert_rejected(r, "release_authorized")
    assert "smoke" in r.err or "diagnostic" in r.err
    assert_no_token(r)


def test_missing_token_is_a_usage_error(world: World, tmp_path: Path) -> None:
    r = gate_subprocess(world, tmp_path / "out", "--dry-run", token=None)
    assert r.rc == 2 and "[usage]" in r.err and "GITHUB_TOKEN" in r.err
    assert r.gate["failed_check"] == "usage" and world.api_seen == []


def test_full_level_writes_canonical_release_assets(world: World, chain: Chain, tmp_path: Path) -> None:
    from harness.audit import TOP_LEVEL

    r = gate_subprocess(world, tmp_path / "out", "--level", "full_qualification", "--dry-run")
    assert r.rc == 0, r.err
    assets = r.dir / "release-assets"
    assert {p.name for p in assets.iterdir()} == TOP_LEVEL
    for p in (r.dir / "dist").iterdir():
        assert (assets / "dist" / p.name).read_bytes() == p.read_bytes()
    assert [a["name"] for a in r.gate["artifacts"]] == [CANDIDATE, FULL]
    rv = json.loads((r.dir / "release-verification.json").read_bytes())
    assert rv["level"] == "full_qualification" and rv["status"] == "passed"
    assert "cpu-reference can never authorize" in " ".join(rv["authorization_reasons"])
    assert_no_token(r)

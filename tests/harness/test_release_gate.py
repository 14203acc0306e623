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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from gate_world import REPO, RUN_ID, WORKFLOW_PATH, Servers, World, unzip, zip_dir, zip_members
from harness_helpers import (
    FULL_FIXTURES,
    REPO_ROOT,
    candidate_fixed_under_the_current_policy,
    fabricate_full,
    git,
    make_repo,
    relabel_for_profile,
    release_card_test_variant,
    run_smoke_into,
)

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
    authorizing_zip: bytes  # judged under the test-only release_card_test_variant: authorizes only under it
    release_card_zip: bytes  # the same run judged under the real policy: vllm_boundary not applicable, required
    relabelled_zip: bytes  # only the records say RTX 4080; the smoke's evidence is the CPU run's
    # the candidate as `harness build` writes it under the variant: its manifest fixes the variant's criteria (the
    # chains judged under the variant bind it; the real candidate's criteria refuse them: criteria_fixed)
    variant_candidate_zip: bytes


@pytest.fixture(scope="session")
def chain(tmp_path_factory: pytest.TempPathFactory) -> Chain:
    """Built once: a repo that ships its known-good stack, its candidate and its smoke, bound to run 4242."""
    from harness.build.candidate import build_candidate
    from harness.build.stacks import describe_existing
    from harness.core.profiles import PROFILES

    repo = make_repo(tmp_path_factory.mktemp("gate-repo"))
    kg = repo / "known-good"
    kg.mkdir()
    (kg / "cpu-reference.txt").write_text("# stand-in stack: no dependencies\n")
    for name in ("rtx4080-wsl2-cu130", "h200-cu130"):
        (kg / f"{name}.txt").write_text("# stand-in stack for the authorizing fixture: no dependencies\n")
    for name in ("cpu-reference", "rtx4080-wsl2-cu130", "h200-cu130"):
        describe_existing(
            PROFILES[name], kg, status="measured", python_version="3.11", platform_name="linux", notes="t"
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
    # Only the release card's profile may authorize; the fixture relabels the CPU run as one (no harness code does),
    # its records and (for the authorizing one) the smoke evidence the auditor re-judges. No vLLM run exists, so the
    # real policy never authorizes it (release_card); the authorizing chain is judged under the test-only
    # release_card_test_variant, and only an auditor running under that variant authorizes it.
    card = ("rtx4080-wsl2-cu130", kg / "rtx4080-wsl2-cu130.json")
    release_card = relabel_for_profile(full, base / "release-card", *card, smoke_evidence=True)
    with release_card_test_variant():
        variant = candidate_fixed_under_the_current_policy(candidate, base / "candidate-variant")
        authorizing = relabel_for_profile(full, base / "authorizing", *card, smoke_evidence=True, candidate=variant)
        relabelled = relabel_for_profile(full, base / "relabelled", *card, candidate=variant)
    return Chain(
        sha=git(repo, "rev-parse", "HEAD"),
        candidate=candidate,
        smoke=smoke,
        full=full,
        candidate_zip=zip_dir(candidate),
        smoke_zip=zip_dir(smoke),
        full_zip=zip_dir(full),
        authorizing_zip=zip_dir(authorizing),
        release_card_zip=zip_dir(release_card),
        relabelled_zip=zip_dir(relabelled),
        variant_candidate_zip=zip_dir(variant),
    )


def serve_variant(world: World, chain: Chain, full_zip: bytes) -> None:
    """Run 4242 serves a chain judged under the test-only variant, with the candidate whose manifest fixed it."""
    world.replace(RUN_ID, CANDIDATE, chain.variant_candidate_zip)
    world.replace(RUN_ID, FULL, full_zip)


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


def full_on(gpu: str) -> tuple[str, ...]:
    """The gate's arguments for a full qualification on ``gpu``."""
    return ("--level", "full_qualification", "--required-gpu-name", gpu)


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


def assert_rejected(r: Result, check: str, *named: str) -> None:
    """Refused on one line naming ``check`` (and saying each of ``named``), with gate.json alone written."""
    lines = r.err.strip().splitlines()
    assert r.rc == 1, r.err
    assert len(lines) == 1 and f"[{check}]" in lines[0], r.err
    assert r.gate["status"] == "failed" and r.gate["failed_check"] == check
    assert not (r.dir / "dist").exists() and not (r.dir / "release-verification.json").exists()
    assert sorted(p.name for p in r.dir.iterdir()) == ["gate.json"]
    assert all(text in r.err for text in named), r.err


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
    assert [c["name"] for c in g["checks"]] == [
        *("head_sha", "event", "run_status", "conclusion", "run_attempt", "workflow_path", "repository"),
        *("artifact_candidate", "artifact_qualification", "download_candidate", "download_qualification"),
        *("candidate", "source_commit", "candidate_run", "qualification_run", "known_good_sha256", "audit"),
    ]
    assert all(c["passed"] for c in g["checks"])
    assert g["query"]["api_origin"] == world.api_url and g["query"]["workflow_path"] == WORKFLOW_PATH
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


@pytest.fixture(scope="module")
def full_gate(chain: Chain, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Result]:
    """One dry-run gate at the full level (run 4242, the cpu-reference full qualification), shared read-only by the
    tests of its release assets and of the offline check of its gate.json."""
    w = World(token=TOKEN, sha=chain.sha)
    servers = Servers(w)
    w.run()
    w.artifact(RUN_ID, CANDIDATE, chain.candidate_zip)
    w.artifact(RUN_ID, FULL, chain.full_zip)
    try:
        yield gate_subprocess(
            w, tmp_path_factory.mktemp("full-gate") / "out", "--level", "full_qualification", "--dry-run"
        )
    finally:
        servers.close()


def test_full_level_writes_canonical_release_assets(full_gate: Result) -> None:
    from harness.evidence.layout import TOP_LEVEL

    r = full_gate
    assert r.rc == 0, r.err
    assets = r.dir / "release-assets"
    assert {p.name for p in assets.iterdir()} == TOP_LEVEL
    for p in (r.dir / "dist").iterdir():
        assert (assets / "dist" / p.name).read_bytes() == p.read_bytes()
    assert [a["name"] for a in r.gate["artifacts"]] == [CANDIDATE, FULL]
    rv = json.loads((r.dir / "release-verification.json").read_bytes())
    assert rv["level"] == "full_qualification" and rv["status"] == "passed"
    assert "cpu-reference can never authorize" in " ".join(rv["authorization_reasons"])
    # both statements name the run and attempt the gate chose through the API
    run = f"https://github.com/{REPO}/actions/runs/{r.gate['run']['id']}/attempts/{r.gate['run']['run_attempt']}"
    provenance = json.loads((assets / "build-provenance.intoto.json").read_bytes())["predicate"]
    assert provenance["runDetails"]["metadata"]["invocationId"] == run
    assert provenance["runDetails"]["builder"]["id"].endswith(f"{WORKFLOW_PATH}@refs/heads/main#build-candidate")
    assert json.loads((assets / "qualification-result.intoto.json").read_bytes())["predicate"]["url"] == run
    assert_no_token(r)


# --- offline: `verify --assets-dir A --gate-record gate.json` (the gate's record against both statements) ----


def _full_verify_argv(chain: Chain, gate: Result, gate_record: Path | None) -> list[str]:
    qual = json.loads((chain.full / "qualification.json").read_bytes())
    argv = [
        *("--candidate-dir", str(chain.candidate)),
        *("--candidate-manifest", str(chain.candidate / "candidate-manifest.json")),
        *("--qualification", str(chain.full / "qualification.json")),
        *("--commit", chain.sha, "--known-good-sha256", qual["environment"]["known_good_sha256"]),
        *("--required-gpu-name", "none", "--level", "full_qualification"),
        *("--assets-dir", str(gate.dir / "release-assets"), "--out", str(gate_record or gate.dir) + ".rv.json"),
    ]
    return argv + (["--gate-record", str(gate_record)] if gate_record is not None else [])


def test_verify_checks_the_gate_record_against_both_statements(
    chain: Chain, full_gate: Result, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.audit.cli import main

    record = tmp_path / "gate.json"
    record.write_bytes((full_gate.dir / "gate.json").read_bytes())
    assert main(_full_verify_argv(chain, full_gate, record)) == 0, capsys.readouterr().err
    rv = json.loads(Path(f"{record}.rv.json").read_bytes())
    checks = {c["name"]: c for c in rv["checks"]}
    assert rv["status"] == "passed"
    assert [c["name"] for c in rv["checks"][-3:]] == ["gate_record", "gate_run", "gate_subjects"]
    assert all(checks[n]["passed"] for n in ("gate_record", "gate_run", "gate_subjects"))
    assert f"run {RUN_ID} attempt 1 of {REPO}" in checks["gate_run"]["detail"]
    # without --gate-record the same audit has none of the gate's checks; the published verification is unchanged
    assert main(_full_verify_argv(chain, full_gate, None)) == 0
    without = json.loads(Path(f"{full_gate.dir}.rv.json").read_bytes())
    assert not {"gate_record", "gate_run", "gate_subjects"} & {c["name"] for c in without["checks"]}


def _gate_edit(edit: Any) -> Any:
    """Edit gate.json and write it back canonical, so that only the edited field is wrong."""

    def tamper(path: Path) -> None:
        from harness.core.jsonio import canonical_bytes

        record = json.loads(path.read_bytes())
        edit(record)
        path.write_bytes(canonical_bytes(record) + b"\n")

    return tamper


def _other_run(g: dict[str, Any]) -> None:
    g["run"]["id"] = RUN_ID + 1
    for art in g["artifacts"]:
        art["workflow_run_id"] = RUN_ID + 1


def _other_repository(g: dict[str, Any]) -> None:
    g["run"]["repository"] = g["query"]["repository"] = "mallory/miniverl"


def _other_workflow(g: dict[str, Any]) -> None:
    g["run"]["path"] = g["query"]["workflow_path"] = ".github/workflows/ci.yml"


def _other_commit(g: dict[str, Any]) -> None:
    g["run"]["head_sha"] = g["query"]["sha"] = "f" * 40


def _another_wheel(g: dict[str, Any]) -> None:
    wheel = next(o for o in g["outputs"] if o["filename"].endswith(".whl"))
    wheel.update(filename="miniverl-9.9.9-py3-none-any.whl", sha256="a" * 64)


def _failed_gate(g: dict[str, Any]) -> None:
    g.update(status="failed", failed_check="audit")
    g["checks"].append({"name": "audit", "passed": False, "detail": "refused"})


def _symlink_to_a_good_copy(path: Path) -> None:
    good = path.with_name("good-gate.json")
    path.rename(good)
    path.symlink_to(good.name)


GATE_CASES: dict[str, tuple[Any, str, str]] = {
    # case: (tamper gate.json in place, the check that refuses it, a word of its line)
    "other_run_id": (_gate_edit(_other_run), "gate_run", f"run {RUN_ID + 1} attempt 1 of {REPO}"),
    "other_attempt": (_gate_edit(lambda g: g["run"].update(run_attempt=2)), "gate_record", "run_attempt"),
    "other_repository": (_gate_edit(_other_repository), "gate_run", "mallory/miniverl"),
    "other_workflow": (_gate_edit(_other_workflow), "gate_run", "workflow"),
    "artifact_of_another_run": (
        _gate_edit(lambda g: g["artifacts"][0].update(workflow_run_id=RUN_ID + 1)),
        "gate_run",
        "artifact",
    ),
    "other_commit": (_gate_edit(_other_commit), "gate_record", "f" * 40),
    "other_level": (_gate_edit(lambda g: g["query"].update(level="release_smoke")), "gate_record", "level"),
    "another_wheel": (_gate_edit(_another_wheel), "gate_subjects", "miniverl-9.9.9"),
    "other_sdist_digest": (
        _gate_edit(
            lambda g: next(o for o in g["outputs"] if o["filename"].endswith(".tar.gz")).update(sha256="0" * 64)
        ),
        "gate_subjects",
        "sha256",
    ),
    "failed_gate": (_gate_edit(_failed_gate), "gate_record", "failed"),
    "extra_field": (_gate_edit(lambda g: g.update(note="trust me")), "gate_record", "schema"),
    "duplicate_key": (
        lambda p: p.write_bytes(p.read_bytes().replace(b'{"artifacts"', b'{"status":"passed","artifacts"', 1)),
        "gate_record",
        "duplicate key",
    ),
    "not_json": (lambda p: p.write_bytes(b"gate passed\n"), "gate_record", "JSON"),
    "missing": (lambda p: p.unlink(), "gate_record", "does not exist"),
    "directory": (lambda p: (p.unlink(), p.mkdir()), "gate_record", "directory"),
    "symlink": (_symlink_to_a_good_copy, "gate_record", "a symlink"),
    "fifo": (lambda p: (p.unlink(), os.mkfifo(p)), "gate_record", "FIFO"),
}


@pytest.mark.parametrize("case", sorted(GATE_CASES))
def test_verify_refuses_a_gate_record_that_differs_from_the_statements(
    case: str, chain: Chain, full_gate: Result, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.cli import main

    tamper, check, word = GATE_CASES[case]
    record = tmp_path / "gate.json"
    record.write_bytes((full_gate.dir / "gate.json").read_bytes())
    tamper(record)
    started = time.monotonic()
    rc = main(["verify", *_full_verify_argv(chain, full_gate, record)])
    assert time.monotonic() - started < 60, "a FIFO or a link must be refused, never waited on"
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith(f"validate_release_chain: error: [{check}]") and word in err[0], err
    rv = json.loads(Path(f"{record}.rv.json").read_bytes())
    failed = [c["name"] for c in rv["checks"] if not c["passed"]]
    assert failed == [check], failed  # the chain, the assets and the statements themselves all still pass


def test_gate_record_without_assets_is_a_usage_error(
    chain: Chain, full_gate: Result, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.audit.cli import main

    argv = _full_verify_argv(chain, full_gate, full_gate.dir / "gate.json")
    at = argv.index("--assets-dir")
    del argv[at : at + 2]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("validate_release_chain: error: [usage] --gate-record needs --assets-dir"), err
    assert err.count("\n") == 1


# --- rejections of the run itself (in-process: the same `main` the CLI calls) ------------------------------

RUN_FIELD_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "attempt_2": ({"run_attempt": 2}, "run_attempt"),
    "fork": ({"head_repository": {"id": 9, "full_name": "mallory/miniverl"}}, "repository"),
    "other_repository": ({"repository": {"id": 9, "full_name": "mallory/miniverl"}}, "repository"),
    "other_workflow_file": ({"path": ".github/workflows/ci.yml"}, "workflow_path"),
    "event_push": ({"event": "push"}, "event"),
    "conclusion_failure": ({"conclusion": "failure"}, "conclusion"),
    "still_running": ({"status": "in_progress", "conclusion": None}, "run_status"),
    "head_sha_mismatch": ({"head_sha": "f" * 40}, "head_sha"),
    "bad_shape": ({"run_attempt": "1"}, "api_shape"),
}


@pytest.mark.parametrize("case", sorted(RUN_FIELD_CASES))
def test_run_fields_are_rechecked(
    case: str, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    over, check = RUN_FIELD_CASES[case]
    world.runs[0].update(over)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, check)
    assert r.gate["other_runs"] == [{"id": RUN_ID, "check": check, "reason": r.gate["checks"][-1]["detail"]}]
    assert world.blob_seen == []  # nothing was downloaded for a run that does not count
    assert_no_token(r)


def test_no_run_listed(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.runs.clear()
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "no_run")


# --- rejections of the artifacts ----------------------------------------------------------------------------


def _art(world: World, name: str) -> dict[str, Any]:
    return next(a for a in world.artifacts[RUN_ID] if a["name"] == name)


def test_expired_artifact(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _art(world, SMOKE)["expired"] = True
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "artifact_expired")


def test_expires_at_in_the_past(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _art(world, CANDIDATE)["expires_at"] = "2026-01-02T00:00:00Z"
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "artifact_expired", "expired at 2026-01-02")


def test_artifact_missing_from_the_run(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.drop(RUN_ID, SMOKE)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "artifact_missing", SMOKE)


def test_artifacts_listed_by_the_run_but_made_by_another_run(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _art(world, SMOKE)["workflow_run"]["id"] = RUN_ID + 1
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "artifact_same_run")


def test_artifacts_whose_records_bind_another_run(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API is consistent (run 5000 lists both), but the files inside were made by run 4242."""
    world.runs.clear()
    world.artifacts.clear()
    world.run(5000)
    world.artifact(5000, CANDIDATE, chain.candidate_zip)
    world.artifact(5000, SMOKE, chain.smoke_zip)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "candidate_run")
    assert "run 4242" in r.err and "run 5000" in r.err


def test_candidate_and_qualification_from_two_runs(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 5000's qualification zip holds a qualification.json that names run 5000; its candidate names 4242."""
    from harness.core.jsonio import canonical_bytes

    members = []
    for name, data in unzip(chain.smoke_zip):
        if name == "qualification.json":
            value = json.loads(data)
            value["execution"]["workflow"]["run_id"] = 5000
            data = canonical_bytes(value) + b"\n"
        members.append((name, data))
    world.runs.clear()
    world.artifacts.clear()
    world.run(5000)
    world.artifact(5000, CANDIDATE, chain.candidate_zip)
    world.artifact(5000, SMOKE, zip_members(members))
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "candidate_run")
    # and with the candidate taken as the truth, the auditor's own same-run check refuses the pair
    from harness.audit.auditor import audit
    from harness.audit.request import AuditRequest

    qual = tmp_path / "q"
    qual.mkdir()
    for name, data in members:
        (qual / name).parent.mkdir(parents=True, exist_ok=True)
        (qual / name).write_bytes(data)
    result = audit(
        AuditRequest(
            candidate_dir=chain.candidate,
            candidate_manifest=chain.candidate / "candidate-manifest.json",
            qualification=qual / "qualification.json",
            commit=chain.sha,
            known_good_sha256=json.loads((qual / "qualification.json").read_bytes())["profile"]["known_good_sha256"],
            required_gpu_name=None,
            level="release_smoke",
        )
    )
    assert result.failed_checks == ["same_run"]


def test_wrong_digest(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _art(world, CANDIDATE)["digest"] = "sha256:" + "0" * 64
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "artifact_digest")
    assert len(world.blob_seen) == 1  # refused right after the first download
    [ref] = r.gate["artifacts"]  # the refused artifact is on record with what was measured
    assert ref["api_digest"] == "sha256:" + "0" * 64 and ref["sha256"] != "0" * 64


def test_download_larger_than_declared(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    art = _art(world, CANDIDATE)
    world.blobs[art["id"]] = world.blobs[art["id"]] + b"\0" * (2 << 20)  # past size_in_bytes + 1 MiB
    del art["digest"]
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "artifact_size")


def test_download_larger_than_declared_without_content_length(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No Content-Length to refuse up front: the bound is enforced while the body streams."""
    art = _art(world, CANDIDATE)
    world.blobs[art["id"]] = world.blobs[art["id"]] + b"\0" * (2 << 20)
    del art["digest"]
    world.blob_length = False
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "artifact_size", "passed its bound")


def test_newest_qualifying_run_with_both_artifacts_is_chosen_over_two_pages(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.runs.clear()
    world.run(9000)  # newer, qualifies, but has no artifacts
    world.run(8000, run_attempt=2)
    world.run(RUN_ID)
    world.run(4000)  # older, qualifies, has both
    world.artifact(4000, CANDIDATE, chain.candidate_zip)
    world.artifact(4000, SMOKE, chain.smoke_zip)
    world.page_size = 2
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert r.rc == 0, r.err
    assert r.gate["run"]["id"] == RUN_ID
    assert [(o["id"], o["check"]) for o in r.gate["other_runs"]] == [
        (9000, "artifact_missing"),
        (8000, "run_attempt"),
        (4000, "newer_run_chosen"),
    ]
    pages = [path for path, _ in world.api_seen if "/runs?" in path and "/workflows/" in path]
    assert len(pages) == 2 and "page=2" in pages[1]
    assert_no_token(r)


# --- redirects and headers ----------------------------------------------------------------------------------


def test_redirect_loop_is_bounded(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.redirect = "loop"
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "redirect_limit")
    assert len([p for p, _ in world.api_seen if p.endswith("/zip")]) == 4  # the first request + 3 hops


def test_same_origin_redirect_keeps_the_token(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.redirect = "same"
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert r.rc == 0, r.err
    hops = world.headers_at(world.api_seen, "/blob/")
    assert len(hops) == 2 and all(h["authorization"] == f"Bearer {TOKEN}" for h in hops)
    assert world.blob_seen == [] and all("cookie" not in h for h in hops)


def test_cross_origin_redirect_strips_credentials_even_with_ambient_ones(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Proxy and netrc settings in the environment are ignored (trust_env=False); the blob sees no secret."""
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine 127.0.0.1 login x password {TOKEN}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret@127.0.0.1:9")
    monkeypatch.setenv("NO_PROXY", "")
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert r.rc == 0, r.err
    for headers in world.headers_at(world.blob_seen, "/blob/"):
        assert not {"authorization", "proxy-authorization", "cookie"} & set(headers)
        assert headers["accept"] and headers["user-agent"]
    assert_no_token(r)


# --- the zip itself -----------------------------------------------------------------------------------------

ZIP_CASES: dict[str, tuple[list[tuple[str, bytes]], tuple[str, ...], str]] = {
    "dot_dot": ([("../evil.txt", b"x")], (), "zip_member_name"),
    "nested_dot_dot": ([("a/../../evil.txt", b"x")], (), "zip_member_name"),
    "absolute": ([("/tmp/evil.txt", b"x")], (), "zip_member_name"),
    "drive_letter": ([("C:/evil.txt", b"x")], (), "zip_member_name"),
    "backslash": ([("a\\evil.txt", b"x")], (), "zip_member_name"),
    "symlink": ([("link", b"/etc/passwd")], ("link",), "zip_symlink"),
    "duplicate": ([("candidate-manifest.json", b"{}")], (), "zip_duplicate"),
}


@pytest.mark.parametrize("case", sorted(ZIP_CASES))
def test_unsafe_zip_is_refused(
    case: str,
    world: World,
    chain: Chain,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    extra, links, check = ZIP_CASES[case]
    blob = zip_members([*unzip(chain.candidate_zip), *extra], links)
    world.replace(RUN_ID, CANDIDATE, blob)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, check)
    assert not (tmp_path / "evil.txt").exists() and not Path("/tmp/evil.txt").exists()


def test_zip_bomb_is_bounded(world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """64 MiB of zeros (about 64 KiB zipped) against a 16 MiB per-member bound."""
    from harness.core.errors import HarnessError
    from harness.gate.main import gate
    from harness.gate.safezip import ZipLimits

    bomb = zip_members([*unzip(chain.candidate_zip), ("bomb.bin", b"\0" * (64 << 20))])
    assert len(bomb) < (1 << 20)
    world.replace(RUN_ID, CANDIDATE, bomb)
    from harness.cli import parser

    out = tmp_path / "out"
    args = parser().parse_args(["release-gate", *_argv(world, out), "--dry-run"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GITHUB_TOKEN", TOKEN)
        with pytest.raises(HarnessError) as info:
            gate(args, limits=ZipLimits(max_member_bytes=16 << 20, max_total_bytes=32 << 20))
    assert info.value.check == "zip_size"
    assert _gate_json(out)["failed_check"] == "zip_size"
    assert sorted(p.name for p in out.iterdir()) == ["gate.json"]


# --- the auditor on the downloaded pair, and the API's own failures -----------------------------------------


def _replace_member(blob: bytes, name: str, edit: Any) -> bytes:
    return zip_members([(n, edit(d) if n == name else d) for n, d in unzip(blob)])


def test_tampered_wheel_fails_the_candidate_check(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    wheel = json.loads((chain.candidate / "candidate-manifest.json").read_bytes())["wheel"]["filename"]
    blob = _replace_member(chain.candidate_zip, wheel, lambda d: d[:-1] + bytes([d[-1] ^ 1]))
    world.replace(RUN_ID, CANDIDATE, blob)  # the API digest matches the tampered zip: only the manifest can tell
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "wheel_sha256")


def test_tampered_evidence_file_fails_the_auditor(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    qual = json.loads((chain.smoke / "qualification.json").read_bytes())
    evidence = next(a["path"] for a in qual["artifacts"] if not a["role"].startswith("principal_"))
    blob = _replace_member(chain.smoke_zip, evidence, lambda d: d + b" ")
    world.replace(RUN_ID, SMOKE, blob)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "artifact_bytes", evidence)


def test_wrong_token_is_refused_by_the_api(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.token = "another-token"
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "api_status", "401")
    assert_no_token(r)


def test_pagination_to_another_origin_is_refused(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.run(4100, head_sha="e" * 40)
    world.page_size = 1
    world.link_base = world.blob_url
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "pagination")
    assert world.blob_seen == []  # the token never went to the other origin


USAGE_CASES = {
    "short_sha": ["--sha", "abc123"],
    "upper_sha": ["--sha", "A" * 40],
    "repository": ["--repository", "not a repo"],
    "workflow": ["--workflow", "../gpu.yml"],
    "api_query": ["--api-url", "http://127.0.0.1:1/?x=1"],
    "api_scheme": ["--api-url", "file:///etc"],
    "api_userinfo": ["--api-url", "http://user:pw@127.0.0.1:1"],
    "api_plain_http": ["--api-url", "http://api.github.com"],
    "api_plain_http_with_path": ["--api-url", "http://ghe.example.com/api/v3"],
    "api_dot_dot_path": ["--api-url", "http://127.0.0.1:1/api/../v3"],
    "api_dot_path": ["--api-url", "http://127.0.0.1:1/api/./v3"],
    "api_empty_segment": ["--api-url", "http://127.0.0.1:1/api//v3"],
    "api_fragment": ["--api-url", "http://127.0.0.1:1/api/v3#x"],
    "api_empty_query": ["--api-url", "http://127.0.0.1:1/api/v3?"],
    "repository_dot_dot_owner": ["--repository", "../x"],
    "repository_dot_dot_name": ["--repository", "acme/.."],
    "repository_dot_name": ["--repository", "acme/."],
    "repository_owner_leading_dash": ["--repository=-acme/miniverl"],
    "repository_owner_underscore": ["--repository", "ac_me/miniverl"],
    "repository_owner_too_long": ["--repository", "a" * 40 + "/miniverl"],
    "repository_name_too_long": ["--repository", "acme/" + "n" * 101],
    "repository_three_parts": ["--repository", "acme/miniverl/x"],
    "repository_newline": ["--repository", "acme/miniverl\n"],
    "repository_encoded_slash": ["--repository", "acme/..%2fx"],
    "deadline_zero": ["--deadline-seconds", "0"],
    "deadline_negative": ["--deadline-seconds", "-5"],
    "deadline_nan": ["--deadline-seconds", "nan"],
    "deadline_word": ["--deadline-seconds", "ten"],
    "deadline_over_a_day": ["--deadline-seconds", "86401"],
    "download_zero": ["--download-seconds", "0"],
    "download_inf": ["--download-seconds", "inf"],
}


@pytest.mark.parametrize("case", sorted(USAGE_CASES))
def test_usage_errors_exit_2_and_still_write_gate_json(
    case: str, world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, *USAGE_CASES[case])
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1 and "[usage]" in r.err
    assert r.gate["status"] == "failed" and r.gate["failed_check"] == "usage" and r.gate["query"] is None
    assert world.api_seen == []
    assert "pw" not in json.dumps(r.gate)


def test_non_empty_out_is_refused_untouched(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "gate.json").write_text("previous\n")
    from harness.cli import main

    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    assert main(["release-gate", *_argv(world, out), "--dry-run"]) == 2
    assert "[usage]" in capsys.readouterr().err and (out / "gate.json").read_text() == "previous\n"


def _edit_qualification(chain: Chain, edit: Any) -> bytes:
    from harness.core.jsonio import canonical_bytes

    def rewrite(data: bytes) -> bytes:
        value = json.loads(data)
        edit(value)
        return canonical_bytes(value) + b"\n"

    return _replace_member(chain.smoke_zip, "qualification.json", rewrite)


QUAL_BINDING_CASES: dict[str, tuple[str, Any]] = {
    "run_id": ("run_id", RUN_ID + 1),
    "run_attempt": ("run_attempt", 2),
    "repository": ("repository", "mallory/miniverl"),
    "workflow_path": ("workflow_path", ".github/workflows/ci.yml"),
}


@pytest.mark.parametrize("case", sorted(QUAL_BINDING_CASES))
def test_qualification_json_must_bind_the_api_run(
    case: str,
    world: World,
    chain: Chain,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, value = QUAL_BINDING_CASES[case]
    blob = _edit_qualification(chain, lambda q: q["execution"]["workflow"].update({key: value}))
    world.replace(RUN_ID, SMOKE, blob)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "qualification_run", f"run {RUN_ID} attempt 1")


def test_qualification_against_another_known_good_stack(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stack committed at the release commit (read from the sdist) is not the one the qualification used."""

    def other_stack(q: dict[str, Any]) -> None:
        q["profile"]["known_good_sha256"] = q["environment"]["known_good_sha256"] = "1" * 64

    world.replace(RUN_ID, SMOKE, _edit_qualification(chain, other_stack))
    assert_rejected(gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run"), "known_good_sha256")


def test_sdist_without_its_known_good_stack_is_refused(
    world: World,
    chain: Chain,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A commit that does not ship known-good/<stack>.json gives the gate nothing to hold the record against."""
    from harness.build.candidate import build_candidate

    repo = make_repo(tmp_path_factory.mktemp("bare-repo"))
    candidate = tmp_path / "candidate"
    build_candidate(repo, candidate, env=GH_ENV)
    world.sha = git(repo, "rev-parse", "HEAD")
    world.runs.clear()
    world.artifacts.clear()
    world.run()
    world.artifact(RUN_ID, CANDIDATE, zip_dir(candidate))
    world.artifact(RUN_ID, SMOKE, chain.smoke_zip)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run")
    assert_rejected(r, "known_good_sha256", "known-good/cpu-reference.json")


def test_a_relabelled_stand_in_record_cannot_authorize(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The records of a CPU run relabelled as an RTX 4080 one claim every CUDA check passed; the auditor re-judges
    the smoke from its evidence (doctor names no GPU, the summary holds no CUDA bytes) and refuses it."""
    serve_variant(world, chain, chain.relabelled_zip)
    with release_card_test_variant():  # as the authorizing chain: only the smoke's evidence differs from it
        r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, *full_on("NVIDIA GeForce RTX 4080"))
    assert r.rc == 1 and "[smoke_rejudged]" in r.err, r.err
    assert r.gate["status"] == "failed" and r.gate["release_authorized"] is False
    assert not (r.dir / "dist").exists()


def test_the_release_card_authorizes_only_on_the_seeds_models(world: World, chain: Chain, tmp_path: Path) -> None:
    """The release card's policy requires vllm_boundary, which the chain meets with the real vLLM run kept from the
    H100 (never another engine's lines); what the real gate still refuses is the seed's models, which the relabelled
    CPU run never trained (Qwen3-0.6B, DistilBERT: no hub here)."""
    world.replace(RUN_ID, FULL, chain.release_card_zip)
    r = gate_subprocess(world, tmp_path / "out", *full_on("NVIDIA GeForce RTX 4080"))
    assert r.rc == 1 and "[qualification_status]" in r.err, r.err
    assert "grpo-cycles is failed" in r.err and "backend-matrix" not in r.err, r.err
    assert r.gate["status"] == "failed" and r.gate["release_authorized"] is False
    assert not (r.dir / "dist").exists()
    files = dict(unzip(chain.release_card_zip))
    backend_matrix = json.loads(files["backend-matrix.json"])
    boundary = next(c for c in backend_matrix["checks"]["executed"] if c["name"] == "vllm_boundary")
    assert boundary["passed"] and "vllm 0.26.0 sampled every trajectory of 8 cycles" in boundary["detail"]
    # what lies between this chain and an authorized release: the seed's models the release card trains
    grpo, actor, reward = json.loads(files["qualification.json"])["reasons"]
    assert grpo.startswith("check two_updates_changed failed")  # its detail names the model past the cut
    assert actor.startswith("check actor_updates failed") and "Qwen/Qwen3-0.6B" in actor
    assert reward.startswith("check reward_model failed") and "distilbert" in reward
    # the chain judged under the test-only variant (stand-in models) is refused by the real gate too: the auditor
    # re-judges its workloads under the real scale
    serve_variant(world, chain, chain.authorizing_zip)
    r = gate_subprocess(world, tmp_path / "out2", *full_on("NVIDIA GeForce RTX 4080"))
    assert r.rc == 1 and r.gate["release_authorized"] is False, r.err
    assert "grpo-cycles" in r.err, r.err


def test_without_the_vllm_run_the_release_card_backend_matrix_fails(tmp_path: Path) -> None:
    """The same CUDA-relabelled backend-matrix evidence without the H100's vLLM run: plan refused vllm (CPU), so
    vllm_boundary is not applicable, and the release card, whose policy requires it, fails the workload."""
    from harness.core.profiles import PROFILES
    from harness.qualify.full.catalog import implemented
    from harness.qualify.full.runner import judged
    from harness.qualify.full.scales import SCALES
    from harness.qualify.qualification import write_workload

    workload = implemented("backend-matrix")
    assert workload is not None
    fixtures = FULL_FIXTURES / "backend-matrix"
    evidence = {}
    for role, member in workload.evidence.items():
        source = fixtures / "h200-cu130" / member
        source = source if source.is_file() else fixtures / member
        if source.is_file():
            evidence[role] = tmp_path / member
            evidence[role].parent.mkdir(parents=True, exist_ok=True)
            evidence[role].write_bytes(source.read_bytes())
    card = PROFILES["rtx4080-wsl2-cu130"]
    outcome = judged(workload, evidence, card, SCALES[card.name], wheel_sha256="0" * 64)
    assert "vllm_boundary" in {c.name for c in outcome.book.checks().not_applicable}
    (tmp_path / "records").mkdir()
    result, _ = write_workload(
        tmp_path / "records", outcome, source_commit="0" * 40, wheel_sha256="0" * 64, profile=card.name
    )
    assert result.status == "failed", result
    assert any("vllm_boundary" in reason and "not applicable" in reason for reason in result.reasons), result


def test_an_authorizing_full_qualification_is_released_without_dry_run(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the test-only release_card_test_variant (in this process), the rest of the authorization path."""
    from harness.evidence.layout import TOP_LEVEL

    serve_variant(world, chain, chain.authorizing_zip)
    with release_card_test_variant():
        r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, *full_on("NVIDIA GeForce RTX 4080"))
    assert r.rc == 0, r.err
    assert r.gate["status"] == "passed" and r.gate["release_authorized"] is True
    assert r.gate["authorization_reasons"] == []
    rv = json.loads((r.dir / "release-verification.json").read_bytes())
    assert rv["release_authorized"] is True and rv["level"] == "full_qualification"
    assert {p.name for p in (r.dir / "release-assets").iterdir()} == TOP_LEVEL
    assert "release authorized: True" in r.out
    assert_no_token(r)


def test_an_authorizing_record_still_needs_its_gpu(
    world: World, chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    serve_variant(world, chain, chain.authorizing_zip)
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, *full_on("NVIDIA H200"))
    assert_rejected(r, "gpu_name")


def test_repository_dot_dot_is_a_usage_error_before_any_request(world: World, tmp_path: Path) -> None:
    """Pasted into ``{api}/repos/{repository}/...``, ``../x`` would walk up the API path; it never leaves here."""
    r = gate_subprocess(world, tmp_path / "out", "--repository", "../x", "--dry-run")
    assert r.rc == 2 and len(r.err.strip().splitlines()) == 1 and "[usage]" in r.err and "OWNER/NAME" in r.err
    assert "Traceback" not in r.err and r.gate["failed_check"] == "usage"
    assert world.api_seen == [] and world.blob_seen == []


def test_longest_owner_and_name_are_accepted(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """39-character owner, 100-character name with dots: the grammar lets them through to the API (404 here)."""
    repo = "a-" + "b" * 37 + "/." + "c" * 98 + "."
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--repository", repo, "--dry-run")
    assert_rejected(r, "api_status")
    assert r.gate["query"]["repository"] == repo and "404" in r.err
    assert [p for p, _ in world.api_seen] and all(p.startswith(f"/repos/{repo}/") for p, _ in world.api_seen)


# --- GitHub Enterprise: the API under a path -----------------------------------------------------------------


def test_api_under_a_path_like_github_enterprise(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--api-url http://127.0.0.1:PORT/api/v3/``: every API request, next pages included, keeps the prefix."""
    world.serve_under("/api/v3")
    world.run(4100, head_sha="e" * 40)  # a second page, reached through Link rel="next" under the prefix
    world.page_size = 1
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run", "--api-url", world.api_url + "/")
    assert r.rc == 0, r.err
    assert r.gate["status"] == "passed" and r.gate["run"]["id"] == RUN_ID
    query = r.gate["query"]
    assert query["api_path"] == "api/v3" and world.api_url == query["api_origin"] + "/api/v3"
    paths = [p for p, _ in world.api_seen]
    assert len(paths) >= 5 and all(p.startswith(f"/api/v3/repos/{REPO}/actions/") for p in paths), paths
    assert any("page=2" in p for p in paths)
    assert [(o["id"], o["check"]) for o in r.gate["other_runs"]] == [(4100, "head_sha")]
    assert len(world.blob_seen) == 2  # the artifacts came through the redirect, as on github.com
    assert_no_token(r)


def test_api_path_is_needed_when_the_server_has_one(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the test above: the same world asked at its origin answers 404."""
    world.serve_under("/api/v3")
    origin_only = world.api_url.removesuffix("/api/v3")
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run", "--api-url", origin_only)
    assert_rejected(r, "api_status")
    assert "404" in r.err and r.gate["query"]["api_path"] == ""


# --- deadlines: a server that drips one byte every 2 s --------------------------------------------------------


def test_a_dripping_download_stops_at_the_gate_deadline(world: World, tmp_path: Path) -> None:
    """Every read returns within its timeout, yet the gate (a real process) ends at its deadline with exit 1."""
    world.drip = "blob"
    start = time.monotonic()
    r = gate_subprocess(world, tmp_path / "out", "--dry-run", "--deadline-seconds", "3")
    took = time.monotonic() - start
    assert_rejected(r, "deadline")
    assert "--deadline-seconds" in r.err and "/zip" in r.err
    assert took < 30, took  # 3 s of gate plus interpreter start-up on a loaded machine; the drip alone lasts days
    assert len(world.blob_seen) == 1 and r.gate["artifacts"] == []
    assert_no_token(r)


def test_a_dripping_download_stops_at_its_own_deadline(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    world.drip = "blob"
    start = time.monotonic()
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run", "--download-seconds", "3")
    took = time.monotonic() - start
    assert_rejected(r, "download_deadline", "took longer than 3 s (--download-seconds)")
    assert 2.5 < took < 30, took  # the drip alone would last for days


def test_dripping_api_headers_stop_at_the_gate_deadline(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The status line and headers arrive a byte at a time: the watchdog covers them too, not only the body."""
    world.drip = "api"
    start = time.monotonic()
    r = gate_inproc(world, tmp_path / "out", capsys, monkeypatch, "--dry-run", "--deadline-seconds", "3")
    took = time.monotonic() - start
    assert_rejected(r, "deadline")
    assert 2.5 < took < 30, took  # the drip alone would last for days
    assert len(world.api_seen) == 1 and world.blob_seen == []


# --- `python -m harness verify --out`: a directory is one [output] line ----------------------------------------


def _verify_argv(chain: Chain, out: str) -> list[str]:
    qual = json.loads((chain.smoke / "qualification.json").read_bytes())
    return [
        *("--candidate-dir", str(chain.candidate)),
        *("--candidate-manifest", str(chain.candidate / "candidate-manifest.json")),
        *("--qualification", str(chain.smoke / "qualification.json")),
        *("--commit", chain.sha, "--known-good-sha256", qual["environment"]["known_good_sha256"]),
        *("--required-gpu-name", "none", "--level", "release_smoke", "--out", out),
    ]


@pytest.mark.parametrize("shape", ["existing_dir", "under_a_file"])
def test_verify_out_that_cannot_be_a_file_is_one_output_line(chain: Chain, tmp_path: Path, shape: str) -> None:
    existing = tmp_path / "existing"
    existing.mkdir()
    (tmp_path / "a-file").write_text("keep\n")
    out = str(existing) if shape == "existing_dir" else str(tmp_path / "a-file" / "rv.json")
    done = subprocess.run(
        [sys.executable, "-m", "harness", "verify", *_verify_argv(chain, out)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("harness: error: [output] --out"), done.stderr
    assert done.stdout == "" and list(existing.iterdir()) == [] and (tmp_path / "a-file").read_text() == "keep\n"
    # the control: the same chain and flags with a file path pass and write the record
    rv = existing / "release-verification.json"
    done = subprocess.run(
        [sys.executable, "-m", "harness", "verify", *_verify_argv(chain, str(rv))],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(rv.read_bytes())["status"] == "passed"


def test_validate_release_chain_out_directory_is_one_output_line(
    chain: Chain, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.audit.cli import main

    assert main(_verify_argv(chain, str(tmp_path))) == 2
    err = capsys.readouterr().err
    assert err.startswith("validate_release_chain: error: [output]") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []

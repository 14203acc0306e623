"""Release assets: exact layout, checksums, missing principal records, and the auditor over the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_helpers import audit, audit_args, build_assets, copy_tree, fabricate_full, run_cli

from harness.core.errors import AssetsError, UsageError
from harness.core.jsonio import sha256_file
from harness.evidence.layout import QUALIFICATION_ASSETS, TOP_LEVEL


@pytest.fixture(scope="module")
def full_qual(smoke_qual: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fabricate_full(smoke_qual, tmp_path_factory.mktemp("full") / "qualification")


@pytest.fixture(scope="module")
def assets(candidate: Path, full_qual: Path, known_good: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_assets(candidate, full_qual, tmp_path_factory.mktemp("assets") / "release", known_good)


def test_missing_principal_records_fail_the_build_by_name(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    with pytest.raises(AssetsError) as info:
        build_assets(candidate, smoke_qual, tmp_path / "out", known_good)
    assert info.value.check == "principal_records"
    for name in ("qualification-direct-gkd.json", "qualification-pg-k1.json", "qualification-smollm2.json"):
        assert name in str(info.value)
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


def test_the_layout_is_exactly_the_seeds(assets: Path, candidate: Path) -> None:
    assert {p.name for p in assets.iterdir()} == TOP_LEVEL
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    assert sorted(p.name for p in (assets / "dist").iterdir()) == sorted(
        [manifest["wheel"]["filename"], manifest["sdist"]["filename"]]
    )
    assert (assets / "SHA256SUMS").read_bytes() == (candidate / "SHA256SUMS").read_bytes()
    lines = (assets / "qualification-SHA256SUMS").read_text().splitlines()
    assert [ln.split("  ")[1] for ln in lines] == list(QUALIFICATION_ASSETS) and len(lines) == 9
    assert all(ln.split("  ")[0] == sha256_file(assets / ln.split("  ")[1]) for ln in lines)
    evidence = json.loads((assets / "qualification-evidence-manifest.json").read_bytes())
    roles = {m["role"] for m in evidence["members"]}
    assert {
        "transcript",
        "adapter_config",
        "adapter_weights",
        "adapter_manifest",
        "run_summary",
        "input_prompts",
    } <= roles
    rv = json.loads((assets / "release-verification.json").read_bytes())
    assert rv["status"] == "passed" and rv["release_authorized"] is False


def test_the_archive_is_reproducible(
    candidate: Path, full_qual: Path, assets: Path, known_good: Path, tmp_path: Path
) -> None:
    again = build_assets(candidate, full_qual, tmp_path / "again", known_good)
    for name in ("qualification-evidence.tar.gz", "qualification-evidence-manifest.json"):
        assert (again / name).read_bytes() == (assets / name).read_bytes()


def test_the_auditor_verifies_the_asset_dir(candidate: Path, full_qual: Path, assets: Path, known_good: Path) -> None:
    args = audit_args(
        candidate, full_qual, known_good, **{"--level": "full_qualification", "--assets-dir": str(assets)}
    )
    code, rv, err = audit(args)
    assert code == 0, err
    names = [c["name"] for c in rv["checks"]]
    assert {"assets_layout", "evidence_archive", "release_verification", "principal_records"} <= set(names)


@pytest.mark.parametrize(
    ("tamper", "check"),
    [
        ("extra_file", "assets_layout"),
        ("missing_archive", "assets_layout"),
        ("principal_flip", "artifact_sha256"),
        ("archive_flip", "evidence_archive"),
        ("sums_order", "qualification_sha256sums"),
        ("dist_symlink", "assets_dist"),
    ],
)
def test_tampered_assets(
    candidate: Path, full_qual: Path, assets: Path, known_good: Path, tmp_path: Path, tamper: str, check: str
) -> None:
    a = copy_tree(assets, tmp_path / "a")
    if tamper == "extra_file":
        (a / "notes.txt").write_text("x")
    elif tamper == "missing_archive":
        (a / "qualification-evidence.tar.gz").unlink()
    elif tamper == "principal_flip":
        path = a / "qualification-pg-k1.json"
        path.write_bytes(path.read_bytes().replace(b'"passed"', b'"failed"', 1))
    elif tamper == "archive_flip":
        path = a / "qualification-evidence.tar.gz"
        data = bytearray(path.read_bytes())
        data[-20] ^= 1
        path.write_bytes(bytes(data))
    elif tamper == "sums_order":
        lines = (a / "qualification-SHA256SUMS").read_text().splitlines(keepends=True)
        (a / "qualification-SHA256SUMS").write_text("".join(reversed(lines)))
    elif tamper == "dist_symlink":
        wheel = next((a / "dist").glob("*.whl"))
        wheel.unlink()
        wheel.symlink_to(next(candidate.glob("*.whl")))
    args = audit_args(candidate, full_qual, known_good, **{"--level": "full_qualification", "--assets-dir": str(a)})
    code, rv, err = audit(args)
    # the root cause first: a broken layout or archive, not the evidence missing in consequence
    assert code == 1 and rv["failed_checks"][0] == check, (rv.get("failed_checks"), err)
    assert err.startswith(f"validate_release_chain: error: [{check}] ") and "does not exist" not in err, err


def test_existing_output_is_never_lost(
    candidate: Path, full_qual: Path, assets: Path, known_good: Path, tmp_path: Path
) -> None:
    out = copy_tree(assets, tmp_path / "release")
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(UsageError):
        build_assets(candidate, full_qual, out, known_good)
    done = run_cli(
        "-m",
        "harness",
        "release-assets",
        "--profile",
        "cpu-reference",
        "--candidate",
        str(candidate),
        "--qualification-dir",
        str(tmp_path / "nowhere"),
        "--out",
        str(out),
        "--replace",
    )
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert sorted(p.name for p in out.iterdir()) == before


def test_assets_are_not_built_from_evidence_reached_through_a_symlink(
    candidate: Path, full_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    import shutil

    q = copy_tree(full_qual, tmp_path / "q")
    shutil.copytree(q / "evidence", tmp_path / "elsewhere")
    shutil.rmtree(q / "evidence")
    (q / "evidence").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(AssetsError) as info:
        build_assets(candidate, q, tmp_path / "out", known_good)
    assert info.value.check == "artifact_file_type" and "evidence/ is a symlink" in str(info.value)
    assert not (tmp_path / "out").exists()

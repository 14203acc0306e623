"""The tamper suite: the auditor as an attacker would try it.

Each case changes one thing in an honest chain (candidate dir, qualification, principal records, known-good
descriptor, evidence archive, release assets, CLI arguments) and expects exit 1, one stderr line naming the
check that refused it, no traceback, and an answer within 5 s (FIFOs and bombs included). Where a tamper
would otherwise only break a hash, the attacker re-hashes what they can (qualification.json's artifact entry,
the archive manifest, qualification-SHA256SUMS), so that the semantic check is the one that must refuse it.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import os
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import audit_args, build_assets, copy_tree, fabricate_full, kg_sha

from harness.audit.cli import main as auditor_main
from harness.core import registry
from harness.core.intoto import RESOLVED_INPUTS, WARNED_REASONS
from harness.core.jsonio import canonical_bytes, sha256_file
from harness.evidence.statements import PROVENANCE
from harness.evidence.statements import QUALIFICATION_RESULT as RESULT

SECONDS = 30.0  # a hang (a FIFO, an endless file) would last forever; a loaded 2-core CI machine takes seconds


@dataclass
class Chain:
    """A writable copy of an honest chain: candidate, qualification dir, known-good dir, optional assets."""

    candidate: Path
    qual: Path
    known_good: Path
    assets: Path | None
    over: dict[str, str | None]
    commit: str = ""

    def __post_init__(self) -> None:
        self.commit = _commit(self)

    def args(self) -> list[str]:
        extra: dict[str, str | None] = {"--commit": self.commit}
        if self.assets is not None:
            extra = {"--assets-dir": str(self.assets), "--level": "full_qualification"}
        return audit_args(self.candidate, self.qual, self.known_good, **{**extra, **self.over})  # type: ignore[arg-type]


def _edit_json(path: Path, edit: Callable[[Any], None]) -> None:
    value = json.loads(path.read_bytes())
    edit(value)
    path.write_bytes(canonical_bytes(value) + b"\n")


def _commit(c: Chain) -> str:
    return str(json.loads((c.candidate / "candidate-manifest.json").read_bytes())["source_commit"])


def _rebind(c: Chain, rel: str) -> None:
    """Re-hash one artifact entry in qualification.json after the attacker changed its file."""
    path = c.qual / rel

    def edit(q: Any) -> None:
        for art in q["artifacts"]:
            if art["path"] == rel:
                art["bytes"], art["sha256"] = path.stat().st_size, sha256_file(path)

    _edit_json(c.qual / "qualification.json", edit)


def _qual(edit: Callable[[Any], None]) -> Callable[[Chain], None]:
    return lambda c: _edit_json(c.qual / "qualification.json", edit)


def _smoke_record(edit: Callable[[Any], None]) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        _edit_json(c.qual / "qualification-release-smoke.json", edit)
        _rebind(c, "qualification-release-smoke.json")

    return tamper


def _file(c: Chain, rel: str) -> Path:
    """``rel`` in the qualification dir, or, prefixed ``cand:``, in the candidate dir."""
    return c.candidate / rel.removeprefix("cand:") if rel.startswith("cand:") else c.qual / rel


def _raw(rel: str, data: bytes) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        _file(c, rel).write_bytes(data)

    return tamper


def _fifo(rel: str) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        path = _file(c, rel)
        path.unlink()
        os.mkfifo(path)

    return tamper


def _symlink(rel: str) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        path = _file(c, rel)
        copy = path.with_name(path.name + ".real")
        path.rename(copy)
        path.symlink_to(copy.name)

    return tamper


def _directory(rel: str) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        path = _file(c, rel)
        path.unlink()
        path.mkdir()

    return tamper


def _linked_copy(root: Path, rel: str) -> None:
    """Replace the directory ``root``/``rel`` by a symlink to an identical copy of it outside ``root``."""
    import shutil

    inside = root / rel
    outside = root.parent / ("outside-" + rel.replace("/", "-"))
    shutil.copytree(inside, outside, symlinks=True)
    shutil.rmtree(inside)
    inside.symlink_to(outside, target_is_directory=True)


def _linked_dir(rel: str) -> Callable[[Chain], None]:
    return lambda c: _linked_copy(c.qual, rel)


def _dir_to_file(rel: str) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        _rmtree(c.qual / rel)
        (c.qual / rel).write_text("x")

    return tamper


def _flip(rel: str, offset: int = -10) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        path = _file(c, rel)
        data = bytearray(path.read_bytes())
        data[offset] ^= 1
        path.write_bytes(bytes(data))

    return tamper


def _arg(**over: str | None) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        c.over.update({f"--{k.replace('_', '-')}": v for k, v in over.items()})

    return tamper


def _candidate_manifest(edit: Callable[[Any], None]) -> Callable[[Chain], None]:
    return lambda c: _edit_json(c.candidate / "candidate-manifest.json", edit)


def _refixed(edit: Callable[[Any], None] | None) -> Callable[[Chain], None]:
    """Change (or, with None, drop) the criteria the candidate manifest fixed for cpu-reference, then re-bind the
    qualification to the edited manifest, so that only the criteria differ."""

    def tamper(c: Chain) -> None:
        def fix(m: Any) -> None:
            mine = next(x for x in m["criteria"] if x["profile"] == "cpu-reference")
            if edit is None:
                m["criteria"].remove(mine)
            else:
                edit(mine)

        _edit_json(c.candidate / "candidate-manifest.json", fix)
        digest = sha256_file(c.candidate / "candidate-manifest.json")
        _edit_json(c.qual / "qualification.json", lambda q: q["candidate"].update(manifest_sha256=digest))

    return tamper


def _fail_check(name: str) -> Callable[[Any], None]:
    def edit(record: Any) -> None:
        for check in record["checks"]["executed"]:
            if check["name"] == name:
                check["passed"] = False

    return edit


def _drop_required(name: str, *, also_executed: bool) -> Callable[[Any], None]:
    def edit(record: Any) -> None:
        record["checks"]["required"].remove(name)
        if also_executed:
            record["checks"]["executed"] = [c for c in record["checks"]["executed"] if c["name"] != name]

    return edit


def _skip(name: str) -> Callable[[Any], None]:
    def edit(record: Any) -> None:
        record["checks"]["executed"] = [c for c in record["checks"]["executed"] if c["name"] != name]
        record["checks"]["skipped"].append({"name": name, "reason": "attacker"})

    return edit


def _github(run_id: int, attempt: int) -> dict[str, Any]:
    return {
        "kind": "github_actions",
        "repository": "o/miniverl",
        "workflow_path": ".github/workflows/gpu.yml",
        "run_id": run_id,
        "run_attempt": attempt,
    }


def _set(path: list[str], value: Any) -> Callable[[Any], None]:
    def edit(record: Any) -> None:
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _artifact(of_role: str, **changes: Any) -> Callable[[Any], None]:
    def edit(q: Any) -> None:
        for art in q["artifacts"]:
            if art["role"] == of_role:
                art.update(changes)

    return edit


def _drop_artifact(role: str) -> Callable[[Any], None]:
    return lambda q: q.update(artifacts=[a for a in q["artifacts"] if a["role"] != role])


def _evidence(role: str) -> str:
    from harness.qualify.qualification import EVIDENCE_PATHS

    return EVIDENCE_PATHS[role]


def _known_good(edit: Callable[[Any], None], *, trust_new: bool) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        _edit_json(c.known_good / "cpu-reference.json", edit)
        if trust_new:
            c.over["--known-good-sha256"] = kg_sha(c.known_good)

    return tamper


def _mkfifo_arg(flag: str) -> Callable[[Chain], None]:
    def tamper(c: Chain) -> None:
        path = c.qual.parent / f"fifo-{flag.strip('-')}"
        os.mkfifo(path)
        c.over[flag] = str(path)

    return tamper


CHAIN_CASES: dict[str, tuple[Callable[[Chain], None], str]] = {
    # -- CLI arguments -----------------------------------------------------------------------------------
    "commit_short": (_arg(commit="abc123"), "commit"),
    "commit_upper": (
        lambda c: c.over.update({"--commit": audit_args(c.candidate, c.qual, c.known_good)[7].upper()}),
        "commit",
    ),
    "commit_39": (_arg(commit="a" * 39), "commit"),
    "commit_41": (_arg(commit="a" * 41), "commit"),
    "commit_nonhex": (_arg(commit="g" * 40), "commit"),
    "commit_empty": (_arg(commit=""), "commit"),
    "commit_other": (_arg(commit="f" * 40), "source_commit"),
    "kg_sha_short": (_arg(known_good_sha256="ab" * 10), "known_good_sha256"),
    "kg_sha_upper": (
        lambda c: c.over.update({"--known-good-sha256": kg_sha(c.known_good).upper()}),
        "known_good_sha256",
    ),
    "kg_sha_other": (_arg(known_good_sha256="0" * 64), "known_good_sha256"),
    "level_bogus": (_arg(level="release"), "level"),
    "level_full": (_arg(level="full_qualification"), "level"),
    "gpu_newline": (_arg(required_gpu_name="NVIDIA\nH200"), "gpu_name"),
    "gpu_other": (_arg(required_gpu_name="NVIDIA GeForce RTX 4080"), "gpu_name"),
    "profile_unknown": (_arg(profile="mystery"), "profile"),
    "profile_other": (_arg(profile="h200-cu130"), "profile"),
    "candidate_dir_missing": (lambda c: c.over.update({"--candidate-dir": str(c.qual / "nope")}), "candidate_dir"),
    "candidate_dir_is_file": (
        lambda c: c.over.update({"--candidate-dir": str(c.qual / "qualification.json")}),
        "candidate_dir",
    ),
    "candidate_dir_fifo": (_mkfifo_arg("--candidate-dir"), "candidate_dir"),
    "qualification_missing": (
        lambda c: c.over.update({"--qualification": str(c.qual / "nope.json")}),
        "qualification_schema",
    ),
    "qualification_is_dir": (lambda c: c.over.update({"--qualification": str(c.qual)}), "qualification_schema"),
    "qualification_fifo": (_mkfifo_arg("--qualification"), "qualification_schema"),
    "manifest_arg_fifo": (_mkfifo_arg("--candidate-manifest"), "candidate_manifest"),
    "known_good_missing": (lambda c: c.over.update({"--known-good": str(c.known_good / "nope.json")}), "known_good"),
    "known_good_fifo": (_mkfifo_arg("--known-good"), "known_good"),
    "known_good_is_dir": (lambda c: c.over.update({"--known-good": str(c.known_good)}), "known_good"),
    "known_good_from_sdist_absent": (lambda c: c.over.update({"--known-good": None}), "known_good"),
    # -- candidate directory -----------------------------------------------------------------------------
    "cand_extra_file": (_raw("cand:notes.txt", b"x"), "candidate_file_set"),
    "cand_wheel_flip": (lambda c: _flip("cand:" + next(c.candidate.glob("*.whl")).name)(c), "wheel_sha256"),
    "cand_sdist_truncated": (
        lambda c: next(c.candidate.glob("*.tar.gz")).write_bytes(next(c.candidate.glob("*.tar.gz")).read_bytes()[:-5]),
        "sdist_bytes",
    ),
    "cand_wheel_fifo": (lambda c: _fifo("cand:" + next(c.candidate.glob("*.whl")).name)(c), "candidate_file_type"),
    "cand_wheel_symlink": (
        lambda c: _symlink("cand:" + next(c.candidate.glob("*.whl")).name)(c),
        "candidate_file_type",
    ),
    "cand_sums_reordered": (
        lambda c: (c.candidate / "SHA256SUMS").write_text(
            "".join(reversed((c.candidate / "SHA256SUMS").read_text().splitlines(keepends=True)))
        ),
        "sha256sums",
    ),
    "cand_sums_extra_line": (
        lambda c: (c.candidate / "SHA256SUMS").write_text(
            (c.candidate / "SHA256SUMS").read_text() + "0" * 64 + "  x\n"
        ),
        "sha256sums",
    ),
    "cand_sums_fifo": (_fifo("cand:SHA256SUMS"), "candidate_file_type"),
    "cand_manifest_extra_key": (_candidate_manifest(lambda m: m.update(extra=1)), "candidate_manifest"),
    "cand_manifest_whitespace": (
        lambda c: (c.candidate / "candidate-manifest.json").write_bytes(
            (c.candidate / "candidate-manifest.json").read_bytes().replace(b",", b", ", 1)
        ),
        "candidate_manifest",
    ),
    "cand_manifest_dup_key": (
        lambda c: (c.candidate / "candidate-manifest.json").write_bytes(
            b'{"kind":"x",' + (c.candidate / "candidate-manifest.json").read_bytes()[1:]
        ),
        "candidate_manifest",
    ),
    "cand_manifest_huge_int": (
        lambda c: (c.candidate / "candidate-manifest.json").write_bytes(b'{"source_date_epoch":' + b"9" * 5000 + b"}"),
        "candidate_manifest",
    ),
    "cand_manifest_nan": (_raw("cand:candidate-manifest.json", b'{"source_date_epoch":NaN}'), "candidate_manifest"),
    "cand_manifest_deep": (_raw("cand:candidate-manifest.json", b"[" * 100_000 + b"]" * 100_000), "candidate_manifest"),
    "cand_manifest_huge": (_raw("cand:candidate-manifest.json", b" " * (2 << 20)), "candidate_manifest"),
    "cand_manifest_local_path": (_candidate_manifest(_set(["build", "os"], "/home/me/build")), "candidate_manifest"),
    "cand_manifest_wheel_sha": (_candidate_manifest(_set(["wheel", "sha256"], "0" * 64)), "sha256sums"),
    "cand_manifest_symlink": (_symlink("cand:candidate-manifest.json"), "candidate_file_type"),
    "cand_manifest_created_at": (
        _candidate_manifest(_set(["created_at"], "2030-01-01T00:00:00Z")),
        "candidate_manifest",
    ),
    # -- qualification.json --------------------------------------------------------------------------------
    "qual_passed_with_failed_check": (_qual(_fail_check("inspect")), "qualification_schema"),
    "qual_status_failed": (
        _qual(lambda q: q.update(status="failed", reasons=["attacker"])),
        "qualification_status",
    ),
    "cand_manifest_criteria_thresholds": (
        _refixed(lambda c: c.update(thresholds_sha256="0" * 64)),
        "criteria_fixed",
    ),
    "cand_manifest_criteria_required": (
        _refixed(lambda c: c.update(required_checks_sha256="1" * 64)),
        "criteria_fixed",
    ),
    "cand_manifest_criteria_missing": (_refixed(None), "criteria_fixed"),
    "qual_required_differs_from_fixed": (
        _smoke_record(_drop_required("grpo_cycle", also_executed=False)),
        "criteria_fixed",
    ),
    "qual_drops_required_check": (_qual(_drop_required("export_reload", also_executed=True)), "qualification_status"),
    "qual_drops_required_name_only": (
        _qual(_drop_required("teacher_scoring", also_executed=False)),
        "qualification_status",
    ),
    "qual_adds_required_check": (
        _qual(lambda q: q["checks"]["required"].append("candidate_validated") or None),
        "qualification_status",
    ),
    "qual_skips_required_check": (
        _qual(lambda q: (_skip("grpo_cycle")(q), _drop_required("grpo_cycle", also_executed=False)(q))),
        "qualification_status",
    ),
    "qual_marks_check_not_applicable": (
        _qual(
            lambda q: (
                q["checks"].update(executed=[c for c in q["checks"]["executed"] if c["name"] != "doctor"]),
                q["checks"]["not_applicable"].append({"name": "doctor", "reason": "attacker"}),
                q["checks"]["required"].remove("doctor"),
            )
        ),
        "qualification_status",
    ),
    "qual_workloads_empty": (_qual(_set(["workloads"], [])), "qualification_status"),
    "qual_workload_renamed": (_qual(lambda q: q["workloads"][0].update(name="pg-k1")), "qualification_status"),
    "qual_level_full": (_qual(_set(["level"], "full_qualification")), "level"),
    "qual_profile_renamed": (_qual(lambda q: q["profile"].update(name="rtx4080-wsl2-cu130")), "profile"),
    "qual_profile_sha": (_qual(lambda q: q["profile"].update(sha256="0" * 64)), "profile"),
    "qual_profile_authorizes": (_qual(lambda q: q["profile"].update(can_authorize_release=True)), "profile"),
    "qual_profile_known_good_name": (_qual(lambda q: q["profile"].update(known_good="h200-cu130")), "profile"),
    "qual_device_cuda": (_qual(lambda q: q["environment"].update(device="cuda")), "profile"),
    "qual_gpu_name": (
        _qual(
            _set(
                ["environment", "gpu"],
                {"name": "NVIDIA H200", "count": 1, "total_memory_bytes": 1, "driver": "1"},
            )
        ),
        "gpu_name",
    ),
    "qual_known_good_sha": (_qual(lambda q: q["profile"].update(known_good_sha256="1" * 64)), "known_good_sha256"),
    "qual_env_known_good_sha": (
        _qual(lambda q: q["environment"].update(known_good_sha256="1" * 64)),
        "known_good_sha256",
    ),
    "qual_known_good_status": (_qual(lambda q: q["profile"].update(known_good_status="declared")), "known_good"),
    "qual_wheel_sha": (_qual(lambda q: q["candidate"]["wheel"].update(sha256="0" * 64)), "candidate_binding"),
    "qual_manifest_sha": (_qual(lambda q: q["candidate"].update(manifest_sha256="0" * 64)), "candidate_binding"),
    "qual_version": (_qual(lambda q: q["candidate"].update(version="9.9.9")), "candidate_binding"),
    "qual_commit": (_qual(lambda q: q["candidate"].update(source_commit="e" * 40)), "source_commit"),
    "qual_attempt_2": (_qual(lambda q: q["execution"].update(workflow=_github(7, 2))), "run_attempt"),
    "qual_other_run": (_qual(lambda q: q["execution"].update(workflow=_github(7, 1))), "same_run"),
    "qual_dup_key": (
        lambda c: (c.qual / "qualification.json").write_bytes(
            b'{"level":"release_smoke",' + (c.qual / "qualification.json").read_bytes()[1:]
        ),
        "record_schema",
    ),
    "qual_huge_int": (
        lambda c: (c.qual / "qualification.json").write_bytes(
            (c.qual / "qualification.json")
            .read_bytes()
            .replace(b'"metrics":{', b'"metrics":{"x":' + b"9" * 5000 + b",")
        ),
        "json_limits",
    ),
    "qual_big_float": (_raw("qualification.json", b'{"a":1e999}'), "finite_numbers"),
    "qual_nan": (_raw("qualification.json", b'{"a":NaN}'), "finite_numbers"),
    "qual_infinity": (_raw("qualification.json", b'{"a":-Infinity}'), "finite_numbers"),
    "qual_deep": (_raw("qualification.json", b'{"a":' * 50_000 + b"1" + b"}" * 50_000), "json_limits"),
    "qual_huge_file": (_raw("qualification.json", b" " * (17 << 20)), "qualification_schema"),
    "qual_not_utf8": (_raw("qualification.json", b'{"a":"\xff"}'), "record_schema"),
    "qual_not_object": (_raw("qualification.json", b"[]"), "qualification_schema"),
    "qual_empty": (_raw("qualification.json", b""), "record_schema"),
    "qual_local_path": (_qual(lambda q: q["execution"]["origin"].update(where="/home/me/venv")), "no_local_paths"),
    "qual_symlink": (_symlink("qualification.json"), "qualification_schema"),
    "qual_fifo": (_fifo("qualification.json"), "qualification_schema"),
    "qual_extra_key": (_qual(lambda q: q.update(release_authorized=True)), "qualification_schema"),
    # -- evidence files -------------------------------------------------------------------------------------
    "evidence_flip": (lambda c: _flip(_evidence("run_summary"))(c), "artifact_sha256"),
    "evidence_truncated": (
        lambda c: (c.qual / _evidence("metrics")).write_bytes((c.qual / _evidence("metrics")).read_bytes()[:-1]),
        "artifact_bytes",
    ),
    "evidence_deleted": (lambda c: (c.qual / _evidence("doctor")).unlink(), "artifact_file_type"),
    "evidence_symlink": (lambda c: _symlink(_evidence("transcript"))(c), "artifact_file_type"),
    "evidence_fifo": (lambda c: _fifo(_evidence("adapter_config"))(c), "artifact_file_type"),
    "evidence_directory": (lambda c: _directory(_evidence("adapter_manifest"))(c), "artifact_file_type"),
    "evidence_dir_symlink": (_linked_dir("evidence"), "artifact_file_type"),
    "evidence_subdir_symlink": (_linked_dir("evidence/adapter"), "artifact_file_type"),
    "evidence_subdir_is_file": (_dir_to_file("evidence/run"), "artifact_file_type"),
    "evidence_role_unknown": (_qual(_artifact("doctor", role="mystery")), "evidence_roles"),
    "evidence_role_swapped": (_qual(_artifact("doctor", role="transcript")), "evidence_roles"),
    "evidence_path_moved": (_qual(_artifact("doctor", path="evidence/other.json")), "evidence_roles"),
    "evidence_required_dropped": (_qual(_drop_artifact("run_summary")), "evidence_roles"),
    "evidence_weights_dropped": (_qual(_drop_artifact("adapter_weights")), "evidence_roles"),
    "evidence_git_status_dropped": (_qual(_drop_artifact("git_status")), "evidence_roles"),
    "evidence_pip_inspect_dropped": (_qual(_drop_artifact("pip_inspect")), "evidence_roles"),
    "evidence_python_version_dropped": (_qual(_drop_artifact("python_version")), "evidence_roles"),
    # -- the principal smoke record ---------------------------------------------------------------------------
    "principal_renamed": (_smoke_record(_set(["name"], "pg-k1")), "principal_records"),
    "principal_level": (_smoke_record(_set(["level"], "full_qualification")), "principal_records"),
    "principal_profile": (_smoke_record(_set(["profile"], "h200-cu130")), "principal_records"),
    "principal_commit": (_smoke_record(_set(["source_commit"], "d" * 40)), "principal_records"),
    "principal_wheel": (_smoke_record(_set(["wheel_sha256"], "d" * 64)), "principal_records"),
    "principal_passed_with_failure": (_smoke_record(_fail_check("doctor")), "principal_records"),
    "principal_drops_required": (
        _smoke_record(_drop_required("grpo_cycle", also_executed=True)),
        "principal_records",
    ),
    "principal_skips_required": (
        _smoke_record(lambda r: (_skip("model_fetch")(r), _drop_required("model_fetch", also_executed=False)(r))),
        "principal_records",
    ),
    "principal_unbound": (_qual(_drop_artifact("principal_release_smoke")), "principal_records"),
    "principal_role_renamed": (
        _qual(_artifact("principal_release_smoke", role="principal_pg_k1")),
        "principal_records",
    ),
    "principal_path_renamed": (
        _qual(_artifact("principal_release_smoke", path="qualification-pg-k1.json")),
        "principal_records",
    ),
    "principal_flip_unbound": (_flip("qualification-release-smoke.json"), "artifact_sha256"),
    "principal_fifo": (_fifo("qualification-release-smoke.json"), "artifact_file_type"),
    # -- the known-good descriptor --------------------------------------------------------------------------
    "known_good_edited": (_known_good(lambda d: d.update(notes="edited"), trust_new=False), "known_good_sha256"),
    "known_good_edited_and_trusted": (
        _known_good(lambda d: d.update(notes="edited"), trust_new=True),
        "known_good_sha256",
    ),
    "known_good_huge": (
        lambda c: (c.known_good / "cpu-reference.json").write_bytes(b" " * (2 << 20)),
        "known_good",
    ),
}


@pytest.fixture(scope="module")
def full_chain(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("tamper-full")
    qual = fabricate_full(smoke_qual, base / "qualification")
    assets = build_assets(candidate, qual, base / "assets", known_good)
    return qual, assets


def _run(c: Chain, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, dict[str, Any], float]:
    started = time.monotonic()
    code = auditor_main(c.args())
    elapsed = time.monotonic() - started
    out, err = capsys.readouterr()
    return code, err, json.loads(out) if out.strip() else {}, elapsed


def _expect_refusal(c: Chain, check: str, capsys: pytest.CaptureFixture[str], *, first: bool = False) -> None:
    """Refused within the time bound, on one line, naming ``check``: as the first failed check (the root cause)
    when ``first``, else anywhere among the failed checks."""
    code, err, rv, elapsed = _run(c, capsys)
    assert code == 1, err
    assert elapsed < SECONDS, f"took {elapsed:.1f} s"
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("validate_release_chain: error: ["), err
    named = err.split("[", 1)[1].split("]", 1)[0]
    assert named == check or (not first and check in rv.get("failed_checks", [])), (named, rv.get("failed_checks"), err)


def _expect_passed(c: Chain, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Verified (exit 0), and the release-verification it printed passed; that record returned."""
    code, err, rv, _ = _run(c, capsys)
    assert code == 0, err
    assert rv["status"] == "passed", err
    return rv


def _writable(candidate: Path, smoke_qual: Path, known_good: Path, tmp: Path) -> Chain:
    return Chain(
        candidate=copy_tree(candidate, tmp / "candidate"),
        qual=copy_tree(smoke_qual, tmp / "qualification"),
        known_good=copy_tree(known_good, tmp / "known-good"),
        assets=None,
        over={},
    )


def test_the_honest_chain_passes(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _expect_passed(_writable(candidate, smoke_qual, known_good, tmp_path), capsys)["release_authorized"] is False


@pytest.mark.parametrize("case", sorted(CHAIN_CASES))
def test_a_tampered_chain_is_refused_by_name(
    case: str,
    candidate: Path,
    smoke_qual: Path,
    known_good: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper, check = CHAIN_CASES[case]
    c = _writable(candidate, smoke_qual, known_good, tmp_path)
    tamper(c)
    _expect_refusal(c, check, capsys)


# -- release assets and the evidence archive --------------------------------------------------------------
def _repack(assets: Path, change: Callable[[list[tarfile.TarInfo], list[bytes]], None], *, gzip_name: str = "") -> None:
    """Rewrite the evidence archive with ``change`` applied, then re-hash everything the attacker controls."""
    archive = assets / "qualification-evidence.tar.gz"
    infos: list[tarfile.TarInfo] = []
    datas: list[bytes] = []
    with tarfile.open(archive, mode="r:gz") as tar:
        for info in tar:
            handle = tar.extractfile(info)
            datas.append(handle.read() if handle else b"")
            infos.append(info)
    change(infos, datas)
    raw = io.BytesIO()
    with (
        gzip.GzipFile(filename=gzip_name, mode="wb", fileobj=raw, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for info, data in zip(infos, datas, strict=True):
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    archive.write_bytes(raw.getvalue())
    _rehash_archive(assets)


def _rehash_archive(assets: Path) -> None:
    archive = assets / "qualification-evidence.tar.gz"
    _edit_json(
        assets / "qualification-evidence-manifest.json",
        lambda m: m["archive"].update(bytes=archive.stat().st_size, sha256=sha256_file(archive)),
    )
    _rehash_sums(assets)


def _rehash_sums(assets: Path) -> None:
    from harness.evidence.layout import QUALIFICATION_ASSETS

    text = "".join(f"{sha256_file(assets / n)}  {n}\n" for n in QUALIFICATION_ASSETS)
    (assets / "qualification-SHA256SUMS").write_text(text)


def _member(index: int, **changes: Any) -> Callable[[list[tarfile.TarInfo], list[bytes]], None]:
    def change(infos: list[tarfile.TarInfo], datas: list[bytes]) -> None:
        for key, value in changes.items():
            setattr(infos[index], key, value)

    return change


def _verification(edit: Callable[[Any], None]) -> Callable[[Path], None]:
    def tamper(assets: Path) -> None:
        _edit_json(assets / "release-verification.json", edit)
        _rehash_sums(assets)

    return tamper


def _statement(name: str, edit: Callable[[Any], None]) -> Callable[[Path], None]:
    """Edit one in-toto statement and write it back as canonical JSON (so only the edited field is wrong)."""
    return lambda assets: _edit_json(assets / name, edit)


def _warned_as_passed(s: Any) -> None:
    predicate = s["predicate"]
    test = predicate["warnedTests"].pop(0)
    predicate[WARNED_REASONS].pop(0)
    predicate["passedTests"] = sorted([*predicate["passedTests"], test])


def _looser_thresholds(s: Any) -> None:
    """The thresholds descriptor re-encoded with another tolerance, its digest re-hashed to match."""
    descriptor = next(d for d in s["predicate"]["configuration"] if d["name"] == "thresholds")
    thresholds = json.loads(base64.b64decode(descriptor["content"]))
    thresholds["teardown_tolerance_fraction"] = 0.5
    data = canonical_bytes(thresholds)
    descriptor.update(content=base64.b64encode(data).decode(), digest={"sha256": hashlib.sha256(data).hexdigest()})


def _swap_first_two(infos: list[tarfile.TarInfo], datas: list[bytes]) -> None:
    infos[0], infos[1] = infos[1], infos[0]
    datas[0], datas[1] = datas[1], datas[0]


def _append_member(name: str, kind: bytes = tarfile.REGTYPE) -> Callable[[list[tarfile.TarInfo], list[bytes]], None]:
    def change(infos: list[tarfile.TarInfo], datas: list[bytes]) -> None:
        info = tarfile.TarInfo(name)
        info.mode, info.mtime, info.type = 0o644, infos[0].mtime, kind
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
        infos.append(info)
        datas.append(b"x")

    return change


def _oversize_member(infos: list[tarfile.TarInfo], datas: list[bytes]) -> None:
    datas[0] = datas[0] + b"\0" * (4 << 20)


ASSET_CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "extra_top_level": (lambda a: (a / "notes.txt").write_text("x"), "assets_layout"),
    "missing_top_level": (lambda a: (a / "qualification-SHA256SUMS").unlink(), "assets_layout"),
    "top_level_fifo": (lambda a: ((a / "SHA256SUMS").unlink(), os.mkfifo(a / "SHA256SUMS")), "assets_layout"),
    "top_level_dir": (lambda a: ((a / "SHA256SUMS").unlink(), (a / "SHA256SUMS").mkdir()), "assets_layout"),
    "dist_extra_file": (lambda a: (a / "dist" / "extra.whl").write_bytes(b"x"), "assets_dist"),
    "dist_wheel_flip": (lambda a: _flip_file(next((a / "dist").glob("*.whl"))), "assets_dist"),
    "dist_is_file": (lambda a: (_rmtree(a / "dist"), (a / "dist").write_text("x")), "assets_layout"),
    "dist_dir_symlink": (lambda a: _linked_copy(a, "dist"), "assets_layout"),
    "sums_edited": (lambda a: (a / "SHA256SUMS").write_text("0" * 64 + "  x.whl\n"), "assets_sha256sums"),
    "candidate_manifest_edited": (
        lambda a: _edit_json(a / "candidate-manifest.json", lambda m: m.update(version="9.9.9")),
        "assets_candidate",
    ),
    "qualification_edited": (
        lambda a: _edit_json(a / "qualification.json", lambda q: q.update(reasons=["x"])),
        "assets_qualification",
    ),
    "principal_flip": (lambda a: _flip_file(a / "qualification-pg-k1.json"), "artifact_sha256"),
    "principal_fifo": (
        lambda a: ((a / "qualification-smollm2.json").unlink(), os.mkfifo(a / "qualification-smollm2.json")),
        "assets_layout",
    ),
    "qual_sums_reordered": (
        lambda a: (a / "qualification-SHA256SUMS").write_text(
            "".join(reversed((a / "qualification-SHA256SUMS").read_text().splitlines(keepends=True)))
        ),
        "qualification_sha256sums",
    ),
    "verification_authorizes": (
        _verification(lambda v: v.update(release_authorized=True, authorization_reasons=[])),
        "release_verification",
    ),
    "verification_other_gpu": (
        _verification(lambda v: v.update(required_gpu_name="NVIDIA GeForce RTX 4080")),
        "release_verification",
    ),
    "verification_invented_checks": (
        _verification(lambda v: v.update(checks=[{"name": "all_good", "passed": True, "detail": "trust me"}])),
        "release_verification",
    ),
    "verification_whitespace": (
        lambda a: (
            (a / "release-verification.json").write_bytes((a / "release-verification.json").read_bytes() + b"\n"),
            _rehash_sums(a),
        ),
        "release_verification",
    ),
    "verification_deep": (
        lambda a: ((a / "release-verification.json").write_bytes(b"[" * 10_000 + b"]" * 10_000), _rehash_sums(a)),
        "release_verification",
    ),
    "provenance_subject_digest": (
        _statement(PROVENANCE, lambda s: s["subject"][0]["digest"].update(sha256="0" * 64)),
        "statement_subjects",
    ),
    "provenance_other_wheel": (
        _statement(
            PROVENANCE,
            lambda s: s["subject"][0].update(name="miniverl-9.9.9-py3-none-any.whl", digest={"sha256": "a" * 64}),
        ),
        "statement_subjects",
    ),
    "provenance_duplicate_subject": (
        _statement(PROVENANCE, lambda s: s["subject"].append(s["subject"][0])),
        "statement_subjects",
    ),
    "provenance_predicate_type": (
        _statement(PROVENANCE, lambda s: s.update(predicateType="https://slsa.dev/provenance/v0.2")),
        "statement_type",
    ),
    "provenance_statement_type": (
        _statement(PROVENANCE, lambda s: s.update(_type="https://in-toto.io/Statement/v0.1")),
        "statement_type",
    ),
    "provenance_builder": (
        _statement(
            PROVENANCE,
            lambda s: s["predicate"]["runDetails"]["builder"].update(
                id="https://github.com/o/r/.github/workflows/x.yml"
            ),
        ),
        "provenance_builder",
    ),
    "provenance_claims_a_run": (
        _statement(
            PROVENANCE,
            lambda s: s["predicate"]["runDetails"].update(
                metadata={"invocationId": "https://github.com/o/r/actions/runs/42/attempts/1"}
            ),
        ),
        "provenance_run",
    ),
    "provenance_source_date_epoch": (
        _statement(
            PROVENANCE,
            lambda s: s["predicate"]["buildDefinition"]["internalParameters"].update(SOURCE_DATE_EPOCH=0),
        ),
        "provenance_source",
    ),
    "provenance_indented": (
        lambda a: (a / PROVENANCE).write_text(json.dumps(json.loads((a / PROVENANCE).read_bytes()), indent=1)),
        "statement_canonical",
    ),
    "provenance_extra_field": (
        _statement(PROVENANCE, lambda s: s["predicate"].update(note="trust me")),
        "statement_content",
    ),
    "provenance_missing": (lambda a: (a / PROVENANCE).unlink(), "assets_layout"),
    "result_failed": (_statement(RESULT, lambda s: s["predicate"].update(result="FAILED")), "test_result"),
    "result_drops_a_passed_check": (
        _statement(RESULT, lambda s: s["predicate"]["passedTests"].pop()),
        "test_result_checks",
    ),
    "result_invents_a_failure": (
        _statement(RESULT, lambda s: s["predicate"]["failedTests"].append("pg-k1/loss_finite")),
        "test_result_checks",
    ),
    "result_warned_as_passed": (_statement(RESULT, _warned_as_passed), "test_result_checks"),
    "result_warned_reason": (
        _statement(RESULT, lambda s: s["predicate"][WARNED_REASONS][0].update(reason="measured fine")),
        "test_result_checks",
    ),
    "result_thresholds": (_statement(RESULT, _looser_thresholds), "test_result_configuration"),
    "result_known_good": (
        _statement(RESULT, lambda s: s["predicate"]["configuration"][1]["digest"].update(sha256="0" * 64)),
        "test_result_configuration",
    ),
    "result_claims_a_run": (
        _statement(RESULT, lambda s: s["predicate"].update(url="https://github.com/o/r/actions/runs/7/attempts/2")),
        "test_result_run",
    ),
    "result_other_qualification": (
        _statement(RESULT, lambda s: s["predicate"][RESOLVED_INPUTS][1]["digest"].update(sha256="0" * 64)),
        "test_result_inputs",
    ),
    "result_other_wheel": (
        _statement(RESULT, lambda s: s["subject"][0]["digest"].update(sha256="b" * 64)),
        "statement_subjects",
    ),
    "result_duplicate_subject": (
        _statement(RESULT, lambda s: s["subject"].insert(0, s["subject"][1])),
        "statement_subjects",
    ),
    "result_predicate_type": (
        _statement(RESULT, lambda s: s.update(predicateType="https://in-toto.io/attestation/test-result/v0.2")),
        "statement_type",
    ),
    "result_trailing_space": (
        lambda a: (a / RESULT).write_bytes((a / RESULT).read_bytes() + b" "),
        "statement_canonical",
    ),
    "archive_flip": (lambda a: _flip_file(a / "qualification-evidence.tar.gz"), "evidence_archive"),
    "archive_truncated": (
        lambda a: (
            (a / "qualification-evidence.tar.gz").write_bytes((a / "qualification-evidence.tar.gz").read_bytes()[:200]),
            _rehash_archive(a),
        ),
        "archive_format",
    ),
    "archive_gzip_filename": (lambda a: _repack(a, lambda i, d: None, gzip_name="evidence.tar"), "archive_metadata"),
    "member_mode_0755": (lambda a: _repack(a, _member(0, mode=0o755)), "archive_metadata"),
    "member_setuid": (lambda a: _repack(a, _member(1, mode=0o4644)), "archive_metadata"),
    "member_group_write": (lambda a: _repack(a, _member(2, mode=0o664)), "archive_metadata"),
    "member_uid": (lambda a: _repack(a, _member(0, uid=1000)), "archive_metadata"),
    "member_uname": (lambda a: _repack(a, _member(0, uname="root")), "archive_metadata"),
    "member_mtime_zero": (lambda a: _repack(a, _member(0, mtime=0)), "archive_metadata"),
    "member_order": (lambda a: _repack(a, _swap_first_two), "archive_members"),
    "member_extra": (lambda a: _repack(a, _append_member("release-smoke/extra.json")), "archive_members"),
    "member_dotdot": (lambda a: _repack(a, _member(0, name="../escape.json")), "archive_member_name"),
    "member_absolute": (lambda a: _repack(a, _member(0, name="/etc/cron.d/x")), "archive_member_name"),
    "member_symlink": (lambda a: _repack(a, _append_member("link", tarfile.SYMTYPE)), "archive_members"),
    "member_oversize": (lambda a: _repack(a, _oversize_member), "archive_size"),
    "archive_manifest_extra_member": (
        lambda a: _edit_json(
            a / "qualification-evidence-manifest.json",
            lambda m: m["members"].append({"name": "zz/x.json", "role": "doctor", "bytes": 1, "sha256": "0" * 64}),
        ),
        "evidence_archive",
    ),
    "archive_manifest_commit": (
        lambda a: _edit_json(a / "qualification-evidence-manifest.json", lambda m: m.update(source_commit="c" * 40)),
        "evidence_archive",
    ),
}


def _flip_file(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def _assets_writable(candidate: Path, known_good: Path, full_chain: tuple[Path, Path], tmp: Path) -> Chain:
    qual, assets = full_chain
    return Chain(candidate, qual, known_good, copy_tree(assets, tmp / "assets"), {})


def test_the_honest_assets_pass(
    candidate: Path, known_good: Path, full_chain: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = _assets_writable(candidate, known_good, full_chain, tmp_path)
    assert _expect_passed(c, capsys)["release_authorized"] is False


@pytest.mark.parametrize("case", sorted(ASSET_CASES))
def test_tampered_assets_are_refused_by_name(
    case: str,
    candidate: Path,
    known_good: Path,
    full_chain: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    tamper, check = ASSET_CASES[case]
    c = _assets_writable(candidate, known_good, full_chain, tmp_path)
    assert c.assets is not None
    tamper(c.assets)
    _expect_refusal(c, check, capsys, first=True)


def test_the_suite_is_large_enough() -> None:
    assert len(CHAIN_CASES) + len(ASSET_CASES) >= 100


def _chain_on(profile: str, candidate: Path, full: Path, tmp: Path, *, bind_candidate: bool = False) -> Chain:
    """``full`` relabelled as a full qualification on ``profile`` (smoke evidence included) against a stand-in
    known-good stack measured for it, with the arguments that audit it; ``bind_candidate``: the qualification
    binds ``candidate``'s manifest."""
    from harness_helpers import relabel_for_profile

    from harness.build.stacks import describe_existing
    from harness.core.profiles import PROFILES

    kg = tmp / "known-good"
    kg.mkdir()
    (kg / f"{profile}.txt").write_text("# stand-in stack\n")
    describe_existing(PROFILES[profile], kg, status="measured", python_version="3.11", platform_name="linux", notes="t")
    descriptor = kg / f"{profile}.json"
    qual = relabel_for_profile(
        full, tmp / "qualification", profile, descriptor, smoke_evidence=True,
        candidate=candidate if bind_candidate else None,
    )  # fmt: skip
    return Chain(candidate, qual, kg, None, {
        "--level": "full_qualification",
        "--known-good": str(descriptor),
        "--known-good-sha256": sha256_file(descriptor),
        "--required-gpu-name": PROFILES[profile].required_gpu_name,
    })  # fmt: skip


@pytest.mark.parametrize(
    ("profile", "reason"),
    [
        ("h200-cu130", "profile h200-cu130 can never authorize a release"),
        ("rtx4080-wsl2-cu130", "the candidate was not built by the gpu.yml workflow (local binding)"),
    ],
)
def test_authority_comes_from_the_harness_not_the_record(
    candidate: Path,
    full_chain: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    profile: str,
    reason: str,
) -> None:
    """A consistent, passed full qualification on a CUDA profile: the H200 one never authorizes (policy in
    code), and neither does the release card's one without a gpu.yml build; the record's own claim of
    authority is ignored. The release card's chain (its vLLM evidence the real H100 run's) is judged and audited
    under the test-only release_card_test_variant, the stand-in models for the seed's (the real scale refuses it:
    test_release_gate)."""
    from harness_helpers import (
        candidate_fixed_under_the_current_policy,
        use_release_card_test_variant,
    )

    if profile == "rtx4080-wsl2-cu130":
        use_release_card_test_variant(monkeypatch)  # the test-only policy variant, for this test only
        # and the candidate as `harness build` writes it under the variant (its manifest fixes the variant's criteria)
        candidate = candidate_fixed_under_the_current_policy(candidate, tmp_path / "candidate")
    c = _chain_on(profile, candidate, full_chain[0], tmp_path, bind_candidate=True)
    qual = c.qual
    _edit_json(qual / "qualification.json", lambda q: q["profile"].update(can_authorize_release=True))
    code, err, rv, _ = _run(c, capsys)
    if profile == "h200-cu130":  # the record's claim differs from the harness's definition: refused outright
        assert code == 1 and "[profile]" in err
        _edit_json(qual / "qualification.json", lambda q: q["profile"].update(can_authorize_release=False))
        code, err, rv, _ = _run(c, capsys)
    else:
        assert code == 0, err
    assert code == 0 and rv["status"] == "passed", err
    assert rv["release_authorized"] is False and reason in rv["authorization_reasons"]


_CUDA_SMOKE_EDITS: dict[str, tuple[str, Callable[[Any], None]]] = {
    "gpu_identity": ("evidence/doctor.json", lambda d: d.update(gpu_name="NVIDIA A100-SXM4-80GB")),
    "teardown": ("evidence/run/summary.json", lambda s: s["cuda"].update(final_allocated_bytes=1 << 30)),
    "peak_reserved": ("evidence/run/summary.json", lambda s: s["cuda"].update(peak_reserved_bytes=200 << 30)),
    "cuda_peak_reserved_bytes": ("qualification.json", lambda q: q["metrics"].update(cuda_peak_reserved_bytes=1)),
}


@pytest.mark.parametrize("case", sorted(_CUDA_SMOKE_EDITS))
def test_the_cuda_smoke_checks_are_rejudged_from_the_evidence(
    case: str,
    candidate: Path,
    full_chain: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """An H200 chain whose smoke evidence says CUDA passes; one edit of the doctor output, of the run's measured
    bytes, or of the record's copy of them (every hash re-bound) fails smoke_rejudged naming the check."""
    from harness_helpers import rebind_artifacts

    c = _chain_on("h200-cu130", candidate, full_chain[0], tmp_path)
    qual = c.qual
    _expect_passed(c, capsys)
    rel, edit = _CUDA_SMOKE_EDITS[case]
    _edit_json(qual / rel, edit)
    rebind_artifacts(qual)
    code, err, _, _ = _run(c, capsys)
    assert code == 1 and "[smoke_rejudged]" in err and case in err, err


def _full_writable(candidate: Path, full: Path, known_good: Path, tmp: Path) -> Chain:
    return Chain(
        candidate=copy_tree(candidate, tmp / "candidate"),
        qual=copy_tree(full, tmp / "qualification"),
        known_good=copy_tree(known_good, tmp / "known-good"),
        assets=None,
        over={"--level": "full_qualification"},
    )


def test_the_honest_full_chain_passes(
    candidate: Path, full_chain: tuple[Path, Path], known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rv = _expect_passed(_full_writable(candidate, full_chain[0], known_good, tmp_path), capsys)
    assert "workload_records" in {c["name"] for c in rv["checks"] if c["passed"]}


def _unsupport(c: Chain, workload: str) -> None:
    """Empty every evidence file of ``workload`` and re-hash it everywhere (its record, qualification.json)."""
    record_name = registry.workload(workload).principal_record
    q = json.loads((c.qual / "qualification.json").read_bytes())
    emptied = [a["path"] for a in q["artifacts"] if a["role"].startswith(f"{workload}.")]
    assert emptied
    for rel in emptied:
        (c.qual / rel).write_bytes(b"{}\n")

    def rehash(value: Any) -> None:
        for art in value["artifacts"]:
            if art["path"] in emptied:
                art["bytes"], art["sha256"] = (c.qual / art["path"]).stat().st_size, sha256_file(c.qual / art["path"])

    _edit_json(c.qual / record_name, rehash)
    _edit_json(c.qual / "qualification.json", rehash)
    _rebind(c, record_name)


@pytest.mark.parametrize("workload", [w.name for w in registry.REGISTRY.workloads[1:]])
def test_a_record_whose_evidence_no_longer_supports_it_is_refused(
    workload: str,
    candidate: Path,
    full_chain: tuple[Path, Path],
    known_good: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every evidence file of one workload emptied and re-hashed everywhere (its record, qualification.json): the
    record still says its checks passed, but the auditor re-judges the evidence and refuses the chain."""
    c = _full_writable(candidate, full_chain[0], known_good, tmp_path)
    _unsupport(c, workload)
    _expect_refusal(c, "workload_rejudged", capsys)


# -- every path component, not only the leaf --------------------------------------------------------------
@pytest.mark.parametrize("rel", ["evidence", "evidence/v011", "evidence/v011/direct-gkd/run-a"])
def test_a_symlinked_directory_anywhere_below_the_full_qualification_is_refused(
    rel: str,
    candidate: Path,
    full_chain: tuple[Path, Path],
    known_good: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The directory is replaced by a symlink to an identical copy outside the qualification dir: every byte
    still matches, and only the path's components can tell."""
    c = _full_writable(candidate, full_chain[0], known_good, tmp_path)
    _linked_copy(c.qual, rel)
    _expect_refusal(c, "artifact_file_type", capsys)
    _, err, _, _ = _run(c, capsys)
    assert f"{rel}/ is a symlink, not a directory" in err, err


def test_the_directories_given_are_taken_as_given(
    candidate: Path,
    smoke_qual: Path,
    known_good: Path,
    full_chain: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A symlink above the directories the auditor is given (here: a linked parent of all of them) is the
    caller's choice of path, not a component below a root."""
    real = tmp_path / "real"
    real.mkdir()
    _writable(candidate, smoke_qual, known_good, real)
    copy_tree(full_chain[1], real / "assets")
    copy_tree(full_chain[0], real / "full")
    via = tmp_path / "link"
    via.symlink_to(real, target_is_directory=True)
    code, err, rv, _ = _run(Chain(via / "candidate", via / "qualification", via / "known-good", None, {}), capsys)
    assert code == 0 and rv["status"] == "passed", err
    code, err, rv, _ = _run(Chain(via / "candidate", via / "full", via / "known-good", via / "assets", {}), capsys)
    assert code == 0 and rv["status"] == "passed", err


@pytest.mark.parametrize("reader", ["read_regular", "file_digest"])
def test_a_directory_swapped_for_a_symlink_after_its_check_is_refused(
    reader: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An attacker who swaps a checked directory for a symlink before the file is opened: the file is opened
    one component at a time from the root, none followed, so the swap is refused, not read through."""
    from harness.core import safeio
    from harness.core.errors import VerificationError

    root = tmp_path / "root"
    (root / "a" / "b").mkdir(parents=True)
    (root / "a" / "b" / "f.json").write_bytes(b"{}")
    checked = safeio.regular_file_size

    def then_swap(*args: Any, **kw: Any) -> int:
        size = checked(*args, **kw)
        _linked_copy(root, "a")
        return size

    monkeypatch.setattr(safeio, "regular_file_size", then_swap)
    with pytest.raises(VerificationError) as info:
        if reader == "read_regular":
            safeio.read_regular(root / "a" / "b" / "f.json", "f.json", max_bytes=10, check="probe", root=root)
        else:
            safeio.file_digest(root / "a" / "b" / "f.json", "f.json", check="probe", root=root)
    assert info.value.check == "probe" and "f.json cannot be opened" in str(info.value)


@pytest.mark.parametrize("rel", ["../x.json", "a/../../x.json", "/etc/passwd", ""])
def test_path_below_refuses_what_is_not_below_its_root(rel: str, tmp_path: Path) -> None:
    from harness.core.errors import VerificationError
    from harness.core.safeio import path_below

    (tmp_path / "a").mkdir()
    with pytest.raises(VerificationError) as info:
        path_below(tmp_path / "a", rel, "probe", check="probe")
    assert info.value.check == "probe"


def test_a_symlinked_component_is_named_and_the_root_may_be_a_symlink(tmp_path: Path) -> None:
    from harness.core.errors import VerificationError
    from harness.core.safeio import file_digest, path_below, read_regular

    real = tmp_path / "real"
    (real / "a" / "b").mkdir(parents=True)
    (real / "a" / "b" / "f.json").write_bytes(b"{}")
    root = tmp_path / "root"
    root.symlink_to(real, target_is_directory=True)
    path = path_below(root, "a/b/f.json", "f.json", check="probe")
    assert read_regular(path, "f.json", max_bytes=10, check="probe", root=root) == b"{}"
    assert file_digest(path, "f.json", check="probe", root=root)[0] == 2
    _linked_copy(real, "a/b")
    for attempt in (
        lambda: path_below(root, "a/b/f.json", "f.json", check="probe"),
        lambda: read_regular(path, "f.json", max_bytes=10, check="probe", root=root),
        lambda: file_digest(path, "f.json", check="probe", root=root),
    ):
        with pytest.raises(VerificationError, match=r"f\.json: a/b/ is a symlink, not a directory"):
            attempt()


# -- the root cause first, and every failing workload named ------------------------------------------------
def test_an_unmapped_evidence_role_is_named_before_the_judge_that_misses_it(
    candidate: Path, full_chain: tuple[Path, Path], known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pg-k1's summary bound under a role the harness does not map: the evidence layout is the cause, the
    judge that then lacks the summary is the consequence."""
    c = _full_writable(candidate, full_chain[0], known_good, tmp_path)
    _edit_json(c.qual / "qualification.json", _artifact("pg-k1.summary", role="pg-k1.mystery"))
    _expect_refusal(c, "evidence_roles", capsys, first=True)


def _detail(rv: dict[str, Any], check: str) -> str:
    return str(next(c["detail"] for c in rv["checks"] if c["name"] == check))


def test_the_status_names_every_workload_that_did_not_pass(
    candidate: Path, full_chain: tuple[Path, Path], known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every full workload failed, and so did every smoke check (listed first by the policy): the bounded detail
    still names each failed workload."""
    c = _full_writable(candidate, full_chain[0], known_good, tmp_path)
    failing = [w.name for w in registry.REGISTRY.workloads[1:]]

    def edit(q: Any) -> None:
        for w in q["workloads"]:
            if w["name"] in failing:
                w.update(status="failed", reasons=["failed on the device"])
        for check in q["checks"]["executed"]:
            check["passed"] = False
        q.update(status="failed", reasons=["every workload failed"])

    _edit_json(c.qual / "qualification.json", edit)
    _expect_refusal(c, "qualification_status", capsys, first=True)
    _, _, rv, _ = _run(c, capsys)
    detail = _detail(rv, "qualification_status")
    assert len(detail) <= 500 and "more" in detail, detail
    assert all(f"workload {name} is failed" in detail for name in failing), detail


def test_the_workload_records_check_names_every_workload_its_evidence_no_longer_supports(
    candidate: Path, full_chain: tuple[Path, Path], known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    c = _full_writable(candidate, full_chain[0], known_good, tmp_path)
    failing = [w.name for w in registry.REGISTRY.workloads[1:]]
    for workload in failing:
        _unsupport(c, workload)
    _expect_refusal(c, "workload_rejudged", capsys, first=True)
    _, _, rv, _ = _run(c, capsys)
    detail = _detail(rv, "workload_rejudged")
    assert len(detail) <= 500 and detail.startswith(f"{len(failing)} workloads fail: {', '.join(failing)}; "), detail

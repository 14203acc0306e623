"""The full-qualification framework: runner, judging into a record, the explicit evidence layout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import policy, registry
from harness.errors import HarnessError
from harness.full import catalog
from harness.full.base import Context, Judgement, Scale, Workload
from harness.full.runner import RunnerOptions, run_one
from harness.full.scales import SCALES
from harness.proc import Redactor
from harness.profiles import PROFILES
from harness.qualification import write_workload
from harness.recordio import load_record
from harness.records import Profile, WorkloadRecord

COMMIT, WHEEL = "a" * 40, "b" * 64
CPU = PROFILES["cpu-reference"]


def _toy(value: float, *, raises: bool = False, extra_role: bool = False) -> Workload:
    """A stand-in for a real workload under the pg-k1 registry entry: its evidence is one JSON file."""

    def run(ctx: Context) -> dict[str, Path]:
        path = ctx.work / "figures.json"
        path.write_text(json.dumps({"reward_std": value}))
        if raises:
            raise HarnessError("the CLI could not be started", check="workload_run")
        return {"figures": path, **({"stray": path} if extra_role else {})}

    def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
        j = Judgement()
        figures = json.loads(evidence["figures"].read_text()) if "figures" in evidence else {}
        std = figures.get("reward_std")
        j.check("run_completed", "figures" in evidence, "figures written")
        j.check("reward_varies_within_group", isinstance(std, float) and std > 0, f"std {std}")
        j.metrics["reward_std"] = std
        return j

    return Workload(
        name="pg-k1",
        evidence={"figures": "v011/pg-k1/figures.json", "transcript": "v011/pg-k1/transcript.json"},
        run=run,
        judge=judge,
    )


def _options(tmp_path: Path) -> RunnerOptions:
    data = tmp_path / "prompts.parquet"
    data.write_bytes(b"PAR1")
    return RunnerOptions(
        venv=tmp_path / "venv",
        root=tmp_path / "full",
        redact=Redactor({"work": tmp_path}),
        extra_env={},
        profile=CPU,
        scale=SCALES["cpu-reference"],
        data_source=data,
        model_wheel=None,
        verl_python=None,
        installed=None,
        wheel_sha256=WHEEL,
    )


def test_a_judged_workload_becomes_a_record_whose_status_follows_its_checks(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.5), _options(tmp_path))
    checks = outcome.book.checks()
    assert checks.required == policy.record_checks(CPU, "pg-k1")
    decided = {"run_completed", "reward_varies_within_group", "candidate_bound"}
    assert {c.name for c in checks.executed} == decided
    # The toy judge leaves two required checks undecided: they are skipped, so the record cannot pass.
    assert {c.name for c in checks.skipped} == set(checks.required) - decided
    assert set(outcome.files) == {"figures", "transcript"}
    assert outcome.metrics["scale"] == "reduced" and outcome.metrics["reward_std"] == 0.5
    staging = tmp_path / "qual"
    staging.mkdir()
    result, artifacts = write_workload(staging, outcome, source_commit=COMMIT, wheel_sha256=WHEEL, profile=CPU.name)
    record = load_record(WorkloadRecord, staging / "qualification-pg-k1.json")
    assert record.status == result.status == "failed"
    assert any("was skipped" in r for r in record.reasons)
    roles = {a.role: a.path for a in artifacts}
    assert roles == {
        "pg-k1.figures": "evidence/v011/pg-k1/figures.json",
        "pg-k1.transcript": "evidence/v011/pg-k1/transcript.json",
        "principal_pg_k1": "qualification-pg-k1.json",
    }


def test_a_bad_value_fails_the_judged_check(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.0), _options(tmp_path))
    failed = [c for c in outcome.book.checks().executed if not c.passed]
    # the toy ran no CLI: its empty transcript binds nothing to the candidate
    assert sorted(c.name for c in failed) == ["candidate_bound", "reward_varies_within_group"]


def test_a_run_that_cannot_go_on_is_a_failed_check_not_a_crash(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.5, raises=True), _options(tmp_path))
    failed = {c.name: c.detail for c in outcome.book.checks().executed if not c.passed}
    assert "workload_run" in failed and "could not be started" in failed["workload_run"]


def test_undeclared_evidence_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="does not declare"):
        run_one(_toy(0.5, extra_role=True), _options(tmp_path))


def test_every_profile_declares_its_scale() -> None:
    assert set(SCALES) == set(PROFILES)
    assert SCALES["cpu-reference"].name == "reduced" and SCALES["cpu-reference"].quantization is None
    assert all(s.quantization == "nf4" for n, s in SCALES.items() if PROFILES[n].device == "cuda")


def test_the_registry_says_provided_exactly_for_the_implemented_workloads() -> None:
    for spec in registry.REGISTRY.workloads[1:]:
        assert spec.provided == (catalog.implemented(spec.name) is not None), spec.name


def test_the_evidence_layout_is_explicit_unique_and_versioned() -> None:
    members = catalog.archive_members()
    assert len(set(members.values())) == len(members)
    for spec in registry.REGISTRY.workloads[1:]:
        if spec.asset_role == "subordinate":
            assert members[policy.record_artifact_role(spec)].startswith(catalog.SUBORDINATE_FOLDERS[spec.name] + "/")
    for workload in catalog.WORKLOADS.values():
        assert "transcript" in workload.evidence
        folder = catalog.SUBORDINATE_FOLDERS.get(workload.name, "v011")
        assert all(m.startswith(f"{folder}/") for m in workload.evidence.values()), workload.name


def test_failures_so_far_ignore_checks_not_yet_decided() -> None:
    from harness.checkbook import CheckBook

    book = CheckBook(["a", "b", "c", "later"])
    book.record("a", True, "ok")
    assert book.failures_so_far() == []
    book.record("b", False, "bad")
    book.skip("c", "an earlier step failed")
    assert book.failures_so_far() == ["check b failed: bad", "required check c was skipped: an earlier step failed"]

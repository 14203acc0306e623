"""The refresh part of backend-matrix: policy refreshes, grouped trajectory identity, the vLLM boundary.

The fixtures under ``full_fixtures/backend-matrix/`` are real evidence captured from a cpu-reference run
(``python -m harness workload backend-matrix --profile cpu-reference ...``), laid out by archive member. The judge
passes on them (vLLM is absent there, so ``vllm_boundary`` is not applicable, never passed); one bad value makes
exactly the check it belongs to fail; hostile files never make it raise.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.core import policy
from harness.core.profiles import PROFILES
from harness.qualify.full import backend_matrix, refresh
from harness.qualify.full.base import Context, Judgement, WorkloadFailure
from harness.qualify.full.runner import judged
from harness.qualify.full.scales import SCALES

FIXTURES = Path(__file__).resolve().parent / "full_fixtures" / "backend-matrix"
PROFILE = PROFILES["cpu-reference"]
SCALE = SCALES["cpu-reference"]
CHECKS = ("policy_refreshes", "grouped_trajectory_identity", "vllm_boundary")
ROOT = "v011/backend-matrix/refresh"
TRACEBACK = "vllm is not installed"


def _evidence(tmp_path: Path) -> dict[str, Path]:
    """A private copy of the captured evidence: role -> file, for every declared member present."""
    shutil.copytree(FIXTURES, tmp_path / "ev")
    found = {role: tmp_path / "ev" / member for role, member in refresh.REFRESH_EVIDENCE.items()}
    return {role: path for role, path in found.items() if path.exists()}


def _judge(evidence: dict[str, Path]) -> Judgement:
    judgement = Judgement()
    refresh.judge_refreshes(evidence, judgement, PROFILE, SCALE)
    return judgement


def _failed(judgement: Judgement) -> list[str]:
    return sorted(name for name, (ok, _) in judgement.checks.items() if not ok)


def _decided(judgement: Judgement) -> set[str]:
    return set(judgement.checks) | set(judgement.inapplicable)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))


def _edit_lines(role: str, edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        lines = _lines(ev[role])
        edit(lines)
        _write_lines(ev[role], lines)

    return apply


def _edit_json(role: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        doc = json.loads(ev[role].read_text())
        edit(doc)
        ev[role].write_text(json.dumps(doc))

    return apply


def _set(key: str, value: Any, index: int) -> Callable[[list[dict[str, Any]]], None]:
    def edit(lines: list[dict[str, Any]]) -> None:
        lines[index][key] = value

    return edit


def test_the_captured_evidence_passes() -> None:
    evidence = {role: FIXTURES / member for role, member in refresh.REFRESH_EVIDENCE.items()}
    evidence = {role: path for role, path in evidence.items() if path.exists()}
    judgement = _judge(evidence)
    assert set(judgement.checks) == {"policy_refreshes", "grouped_trajectory_identity"}
    assert _failed(judgement) == [], judgement.checks
    # vLLM is absent: the one-line refusal is kept, but nothing about its boundary was measured
    assert list(judgement.inapplicable) == ["vllm_boundary"]
    assert judgement.inapplicable["vllm_boundary"].startswith("vllm is not installed: plan refused")
    assert judgement.metrics["vllm_backend"] == "not_run"  # recorded, never "passed"
    assert "vllm is not installed" in str(judgement.metrics["vllm_backend_reason"])
    assert json.loads(evidence["refresh_vllm_plan"].read_text())["stderr_lines"] == 1
    for engine in refresh.ENGINES:
        assert len(_lines(evidence[f"refresh_{engine}_metrics"])) == SCALE.policy_refreshes == 8


def _stale_rollout(lines: list[dict[str, Any]]) -> None:
    lines[2]["policy_digest_rollout"] = lines[1]["policy_digest_before"]  # a fold that was not refreshed


def _changed_between(lines: list[dict[str, Any]]) -> None:
    lines[4]["policy_digest_before"] = lines[4]["policy_digest_rollout"] = lines[2]["policy_digest_after"]


def _unchanged(lines: list[dict[str, Any]]) -> None:
    lines[7]["policy_digest_after"] = lines[7]["policy_digest_before"]


def _dup_trajectory(lines: list[dict[str, Any]]) -> None:
    lines[1] = dict(lines[0])


def _mixed_version(lines: list[dict[str, Any]]) -> None:
    lines[0]["policy_version"] += 1


def _mixed_prompt(lines: list[dict[str, Any]]) -> None:
    other = next(line for line in lines if line["group_id"] != lines[0]["group_id"])
    lines[0]["prompt_id"] = other["prompt_id"]
    lines[0]["prompt_token_ids"] = other["prompt_token_ids"]


def _split_group(lines: list[dict[str, Any]]) -> None:
    lines[0]["group_id"] = "stray@v0"


def _reuse_group_ids(ev: dict[str, Path]) -> None:
    """Cycle 2's groups renamed to cycle 1's ids (prompts and versions left as they are)."""
    first = sorted({line["group_id"] for line in _lines(ev["refresh_hf_trajectories_1"])})
    second = _lines(ev["refresh_hf_trajectories_2"])
    names = dict(zip(sorted({line["group_id"] for line in second}), first, strict=True))
    for line in second:
        line["group_id"] = names[line["group_id"]]
    _write_lines(ev["refresh_hf_trajectories_2"], second)


def _drop(role: str) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        ev.pop(role)

    return apply


BAD: dict[str, tuple[str, Callable[[dict[str, Path]], None]]] = {
    # policy_refreshes
    "stale rollout digest": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _stale_rollout)),
    "weights changed between updates": ("policy_refreshes", _edit_lines("refresh_hf_metrics", _changed_between)),
    "an update changed nothing": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _unchanged)),
    "wrong rollout backend": (
        "policy_refreshes",
        _edit_lines("refresh_fast_metrics", _set("rollout_backend", "hf", 3)),
    ),
    "digest not hex": ("policy_refreshes", _edit_lines("refresh_hf_metrics", _set("policy_digest_after", "x" * 64, 0))),
    "a missing metrics line": ("policy_refreshes", _edit_lines("refresh_hf_metrics", lambda lines: lines.pop())),
    "a wrong step number": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _set("step", 9, 5))),
    "run failed": ("policy_refreshes", _edit_json("refresh_hf_summary", lambda d: d.update(status="failed"))),
    "fewer updates": ("policy_refreshes", _edit_json("refresh_fast_summary", lambda d: d.update(updates=7))),
    "plan on another engine": (
        "policy_refreshes",
        _edit_json("refresh_fast_plan", lambda d: d["config"]["rollout"].update(engine="auto")),
    ),
    "no summary": ("policy_refreshes", _drop("refresh_hf_summary")),
    "not the scale's quantization": (
        "policy_refreshes",
        _edit_json("refresh_fast_plan", lambda d: d["config"]["models"]["student"].update(quantization="nf4")),
    ),
    "fewer new tokens than the scale": (
        "policy_refreshes",
        _edit_json("refresh_hf_plan", lambda d: d["config"]["rollout"].update(max_new_tokens=8)),
    ),
    # grouped_trajectory_identity
    "a duplicated trajectory": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_fast_trajectories_3", _dup_trajectory),
    ),
    "a missing trajectory": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_8", lambda lines: lines.pop()),
    ),
    "a mixed policy_version": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_4", _mixed_version),
    ),
    "a group mixing prompts": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_fast_trajectories_1", _mixed_prompt),
    ),
    "a group split in two": ("grouped_trajectory_identity", _edit_lines("refresh_fast_trajectories_6", _split_group)),
    "group ids reused across cycles": ("grouped_trajectory_identity", _reuse_group_ids),
    "a missing sample index": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_2", _set("sample_index", 7, 0)),
    ),
    "a cycle's trajectories missing": ("grouped_trajectory_identity", _drop("refresh_fast_trajectories_5")),
    # vllm_boundary
    "the plan did not refuse": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(exit_code=0))),
    "refused for another reason": (
        "vllm_boundary",
        _edit_json(
            "refresh_vllm_plan",
            lambda d: d.update(stderr_last_line="miniverl: error: rollout.backend vllm: vllm is installed, but ..."),
        ),
    ),
    "a plan was written": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(plan_written=True))),
    "the plan timed out": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(timed_out=True))),
    "a traceback, not one line": (
        "vllm_boundary",
        _edit_json("refresh_vllm_plan", lambda d: d.update(stderr_last_line=f"ModuleNotFoundError: {TRACEBACK}")),
    ),
    "the right last line after a traceback": (
        "vllm_boundary",
        _edit_json("refresh_vllm_plan", lambda d: d.update(stderr_lines=12)),
    ),
    "no stderr line count": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.pop("stderr_lines"))),
    "no plan result": ("vllm_boundary", _drop("refresh_vllm_plan")),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_one_bad_value_fails_exactly_its_check(case: str, tmp_path: Path) -> None:
    check, corrupt = BAD[case]
    evidence = _evidence(tmp_path)
    corrupt(evidence)
    judgement = _judge(evidence)
    assert _failed(judgement) == [check], judgement.checks
    assert _decided(judgement) == set(CHECKS) and check not in judgement.inapplicable  # a failure: never n/a


def test_a_failure_names_the_engine_and_step(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _edit_lines("refresh_fast_metrics", _stale_rollout)(evidence)
    ok, detail = _judge(evidence).checks["policy_refreshes"]
    assert not ok and "engine fast step 3: policy_digest_rollout" in detail
    evidence = _evidence(tmp_path / "again")
    _edit_lines("refresh_hf_trajectories_4", _mixed_version)(evidence)
    ok, detail = _judge(evidence).checks["grouped_trajectory_identity"]
    assert not ok and "engine hf cycle 4" in detail and "policy_version" in detail


def _vllm_ran(evidence: dict[str, Path], recomputed: float) -> None:
    _edit_json("refresh_vllm_plan", lambda d: d.update(exit_code=0, stderr_last_line=""))(evidence)
    lines = _lines(evidence["refresh_fast_metrics"])
    for line in lines:
        line["algorithm_metrics"][refresh.OLD_LOGP_RECOMPUTED] = recomputed
    path = evidence["refresh_vllm_plan"].parent / "metrics.jsonl"
    _write_lines(path, lines)
    evidence["refresh_vllm_metrics"] = path


def test_where_vllm_ran_old_logp_must_have_been_recomputed(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _vllm_ran(evidence, 1.0)
    judgement = _judge(evidence)
    assert _failed(judgement) == [] and judgement.metrics["vllm_backend"] == "passed"
    evidence = _evidence(tmp_path / "no-recompute")
    _vllm_ran(evidence, 0.0)
    judgement = _judge(evidence)
    assert _failed(judgement) == ["vllm_boundary"] and judgement.metrics["vllm_backend"] == "failed"


def _hostile_files() -> dict[str, Callable[[Path], None]]:
    def directory(path: Path) -> None:
        path.unlink()
        path.mkdir()

    def huge(path: Path) -> None:
        with path.open("wb") as handle:
            handle.truncate(17 << 20)

    return {
        "directory": directory,
        "huge": huge,
        "garbled": lambda p: p.write_bytes(b'{"step": 1, "status": \xff\xfe'),
        "array": lambda p: p.write_text("[1, 2, 3]\n"),
        "nan": lambda p: p.write_text('{"status": NaN}\n'),
        "duplicate keys": lambda p: p.write_text('{"status": "completed", "status": "completed"}\n'),
        "deep": lambda p: p.write_text("[" * 100000 + "]" * 100000),
        "empty": lambda p: p.write_text(""),
    }


HOSTILE_TARGETS = {
    "refresh_fast_summary": "policy_refreshes",
    "refresh_hf_metrics": "policy_refreshes",
    "refresh_fast_plan": "policy_refreshes",
    "refresh_hf_trajectories_7": "grouped_trajectory_identity",
    "refresh_vllm_plan": "vllm_boundary",
}


@pytest.mark.parametrize("kind", sorted(_hostile_files()))
@pytest.mark.parametrize("role", sorted(HOSTILE_TARGETS))
def test_hostile_files_fail_without_raising(role: str, kind: str, tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _hostile_files()[kind](evidence[role])
    judgement = _judge(evidence)
    assert _decided(judgement) == set(CHECKS)
    assert HOSTILE_TARGETS[role] in _failed(judgement)  # failed, never not_applicable


def test_no_evidence_at_all_fails_every_check() -> None:
    judgement = _judge({})
    assert _failed(judgement) == sorted(CHECKS)
    assert judgement.metrics["vllm_backend"] == "failed"


def test_a_scale_beyond_the_layout_fails_closed(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    judgement = Judgement()
    refresh.judge_refreshes(evidence, judgement, PROFILE, dataclasses.replace(SCALE, policy_refreshes=9))
    assert _failed(judgement) == ["grouped_trajectory_identity", "policy_refreshes"]
    ctx = Context(
        cli=None,  # type: ignore[arg-type]  # never reached: the scale is refused first
        work=tmp_path,
        profile=PROFILE,
        scale=dataclasses.replace(SCALE, policy_refreshes=9),
        data="data/prompts.parquet",
        model_wheel=None,
        verl_python=None,
    )
    with pytest.raises(WorkloadFailure, match="9 policy refreshes"):
        refresh.run_refreshes(ctx)


def test_the_runs_use_the_declared_refresh_sizes_and_the_scales_quantization() -> None:
    for scale in SCALES.values():
        args = refresh._sizes(scale, scale.policy_refreshes)
        values = dict(v.split("=", 1) for v in args[1::2])
        assert values["train.cycles"] == str(scale.policy_refreshes) == "8"
        assert {k: values[f"rollout.{k}"] for k in refresh.REFRESH_SIZES} == {
            k: str(v) for k, v in refresh.REFRESH_SIZES.items()
        }
        assert values.get("models.student.quantization") == scale.quantization


def test_the_evidence_layout_is_explicit_and_under_the_workloads_folder() -> None:
    members = list(refresh.REFRESH_EVIDENCE.values())
    assert len(members) == len(set(members))
    assert all(m.startswith(f"{ROOT}/") for m in members)
    assert "transcript" not in refresh.REFRESH_EVIDENCE  # the workload that embeds this part declares it
    # this part's fixtures live under its own folder (the rest of backend-matrix's fixtures sit beside it)
    fixture_files = {p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / ROOT).rglob("*") if p.is_file()}
    assert fixture_files and fixture_files <= set(members)
    total = sum((FIXTURES / m).stat().st_size for m in fixture_files)
    assert total < 300_000


def test_the_policy_requires_the_vllm_boundary_only_on_the_release_card() -> None:
    """Only the release card's known-good stack is meant to include vLLM: there, a run without it (the boundary not
    applicable) fails the backend-matrix level; on the H200 and CPU profiles it does not."""
    requiring = {name for name, p in PROFILES.items() if "vllm_boundary" in policy.required_checks(p, "backend-matrix")}
    assert requiring == {"rtx4080-wsl2-cu130"}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_not_applicable_fails_the_level_exactly_where_the_policy_requires_the_check(profile: str) -> None:
    evidence = {role: FIXTURES / m for role, m in backend_matrix.EVIDENCE.items() if (FIXTURES / m).is_file()}
    outcome = judged(backend_matrix.WORKLOAD, evidence, PROFILES[profile], SCALES[profile], wheel_sha256="0" * 64)
    checks = outcome.book.checks()
    napp = {c.name: c.reason for c in checks.not_applicable}
    assert napp["vllm_boundary"].startswith("vllm is not installed")
    required_na = [f for f in checks.failures() if f.startswith("required check vllm_boundary is not applicable")]
    assert bool(required_na) == (profile == "rtx4080-wsl2-cu130"), checks.failures()


def test_the_auditor_requires_the_record_to_say_not_applicable_where_the_evidence_does(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend-matrix record that claims `vllm_boundary` executed and passed, where its evidence shows only the
    refusal of an absent vLLM, is refused by the auditor's re-judging; the honest record (not applicable) passes."""
    from harness_helpers import audit_args, fabricate_full

    from harness.audit.cli import main as auditor_main
    from harness.core.jsonio import canonical_bytes, sha256_file

    qual = fabricate_full(smoke_qual, tmp_path / "qualification")
    args = audit_args(candidate, qual, known_good, **{"--level": "full_qualification"})
    assert auditor_main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    record = qual / "backend-matrix.json"
    value = json.loads(record.read_bytes())
    (na,) = [c for c in value["checks"]["not_applicable"] if c["name"] == "vllm_boundary"]
    value["checks"]["not_applicable"].remove(na)
    value["checks"]["executed"].append({"name": "vllm_boundary", "passed": True, "detail": "vllm boundary held"})
    record.write_bytes(canonical_bytes(value) + b"\n")
    q = json.loads((qual / "qualification.json").read_bytes())
    for art in q["artifacts"]:
        if art["path"] == record.name:
            art.update(bytes=record.stat().st_size, sha256=sha256_file(record))
    (qual / "qualification.json").write_bytes(canonical_bytes(q) + b"\n")
    assert auditor_main(args) == 1
    err = capsys.readouterr().err
    assert "[workload_rejudged]" in err and "vllm_boundary" in err and "vllm is not installed" in err, err

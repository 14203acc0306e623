"""Invariants of .github/workflows/gpu.yml and ci.yml, asserted from the parsed YAML."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

WORKFLOWS = Path(__file__).resolve().parents[2] / ".github" / "workflows"


def _load(name: str) -> dict[Any, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    assert isinstance(data, dict)
    return data


@pytest.fixture(scope="module")
def gpu() -> dict[Any, Any]:
    return _load("gpu.yml")


def _steps(job: dict[str, Any]) -> list[dict[str, Any]]:
    return list(job["steps"])


def _all_uses() -> list[str]:
    uses = []
    for path in WORKFLOWS.glob("*.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            uses += [s["uses"] for s in job.get("steps", []) if "uses" in s]
    return uses


def test_gpu_runs_only_by_manual_dispatch_with_a_level(gpu: dict[Any, Any]) -> None:
    triggers = gpu[True]  # PyYAML reads the key `on:` as True
    assert list(triggers) == ["workflow_dispatch"]
    level = triggers["workflow_dispatch"]["inputs"]["level"]
    assert level["type"] == "choice" and level["options"] == ["smoke", "full"]
    text = (WORKFLOWS / "gpu.yml").read_text()
    assert "pull_request" not in text


def test_permissions_are_read_only(gpu: dict[Any, Any]) -> None:
    assert gpu["permissions"] == {"contents": "read"}
    assert _load("ci.yml")["permissions"] == {"contents": "read"}
    for job in gpu["jobs"].values():
        assert "permissions" not in job


def test_actions_are_pinned_by_commit_sha() -> None:
    uses = _all_uses()
    assert uses
    for ref in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+@[0-9a-f]{40}", ref), ref


def test_jobs_runners_and_dependency(gpu: dict[Any, Any]) -> None:
    jobs = gpu["jobs"]
    assert set(jobs) == {"build-candidate", "qualify"}
    assert jobs["build-candidate"]["runs-on"] == "ubuntu-latest"
    assert jobs["qualify"]["runs-on"] == ["self-hosted", "cuda", "rtx4080", "wsl2"]
    assert jobs["qualify"]["needs"] == "build-candidate"


def test_both_jobs_refuse_reruns_first(gpu: dict[Any, Any]) -> None:
    for job in gpu["jobs"].values():
        first = _steps(job)[0]["run"]
        assert '"${GITHUB_RUN_ATTEMPT}" != "1"' in first and "exit 1" in first


def test_build_uploads_candidate_distributions(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["build-candidate"])
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "harness/constraints-build.txt" in runs and "-m harness build" in runs and "--check" in runs
    upload = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact@")]
    assert len(upload) == 1 and upload[0]["with"]["name"] == "candidate-distributions"


def test_qualify_downloads_the_same_run_validates_then_qualifies(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["qualify"])
    names = [s.get("uses", "").split("@")[0] or s["name"] for s in steps]
    download = names.index("actions/download-artifact")
    dl = steps[download]["with"]
    assert dl["name"] == "candidate-distributions" and "run-id" not in dl  # same run only
    validate = next(i for i, s in enumerate(steps) if "build --check" in s.get("run", ""))
    qualify = next(i for i, s in enumerate(steps) if "--profile rtx4080-wsl2-cu130" in s.get("run", ""))
    assert download < validate < qualify
    runs = "\n".join(s.get("run", "") for s in steps)
    assert "python -m build" not in runs and "harness build --out" not in runs  # it never builds a distribution
    assert "pip install -e" not in runs and "--editable" not in runs
    for step in steps:
        if "run" in step and ("python" in step["run"]):
            assert "unset PYTHONPATH PYTHONHOME" in step["run"]


def test_cleanup_targets_are_checked_under_the_workspace(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["qualify"])
    cleanup = [s["run"] for s in steps if "rm -rf" in s.get("run", "")]
    assert len(cleanup) == 1
    assert 'realpath "${GITHUB_WORKSPACE}"' in cleanup[0] and '"${ws}"/?*) rm -rf -- "${path}"' in cleanup[0]
    for step in steps:
        if "rm -rf" in step.get("run", ""):
            assert step is steps[1]


def test_uploads_are_bounded(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["qualify"])
    bound = next(i for i, s in enumerate(steps) if "268435456" in s.get("run", ""))
    upload = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/upload-artifact@"))
    assert bound < upload
    assert "! -type f ! -type d" in steps[bound]["run"]
    name = steps[upload]["with"]["name"]
    assert "gpu-full-qualification" in name and "gpu-release-smoke" in name
    for step in steps:
        if "with" in step and "checkout" in step.get("uses", ""):
            assert step["with"]["persist-credentials"] is False


def test_no_expression_is_interpolated_into_a_shell_script() -> None:
    for path in WORKFLOWS.glob("*.yml"):
        for job in yaml.safe_load(path.read_text())["jobs"].values():
            for step in job.get("steps", []):
                assert "${{" not in step.get("run", ""), (path.name, step.get("name"))


def test_ci_runs_the_ci_script() -> None:
    ci = _load("ci.yml")
    assert "pull_request_target" not in ci[True]
    runs = [s.get("run") for job in ci["jobs"].values() for s in job["steps"]]
    assert "bash .ci/run" in runs

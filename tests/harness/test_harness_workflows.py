"""Invariants of .github/workflows/gpu.yml and ci.yml, asserted from the parsed YAML."""

from __future__ import annotations

import re
import shlex
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


FULL = "${{ inputs.level == 'full' }}"
VERL_VENV = "${GITHUB_WORKSPACE}/verl"
VERL_LOCK = "known-good/verl-0.9.1-cpu.txt"


def _commands(step: dict[str, Any]) -> list[list[str]]:
    """A step's script as shell words, one list per command line (backslash continuations joined)."""
    script = step.get("run", "").replace("\\\n", " ")
    return [shlex.split(line) for line in script.splitlines() if line.strip()]


def _option(words: list[str], flag: str) -> str | None:
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def _find(steps: list[dict[str, Any]], match: Any) -> list[tuple[int, list[str]]]:
    return [(i, words) for i, step in enumerate(steps) for words in _commands(step) if match(words)]


def test_the_full_level_builds_verls_venv_from_the_lock(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["qualify"])
    venv = _find(steps, lambda w: w == ["python3.12", "-m", "venv", VERL_VENV])
    assert len(venv) == 1
    at = venv[0][0]
    assert steps[at]["if"] == FULL and steps[at]["working-directory"] == "src"  # the lock is the checkout's
    pip = _find(steps, lambda w: w[:4] == [f"{VERL_VENV}/bin/python", "-m", "pip", "install"])
    assert [i for i, _ in pip] == [at, at]
    (_, torch), (_, stack) = pip
    assert _option(torch, "--index-url") == "https://download.pytorch.org/whl/cpu" and "--no-deps" in torch
    assert torch[-1] == "torch==2.13.0"
    assert _option(stack, "--constraint") == VERL_LOCK and "verl==0.9.1" in stack and "--index-url" not in stack
    assert "-e" not in stack and not any(w.startswith(".") for w in stack[4:])  # no miniverl: the harness overlays it
    check = _find(steps, lambda w: w[:2] == [f"{VERL_VENV}/bin/python", "-c"])
    assert [i for i, _ in check] == [at] and "verl.__version__ == '0.9.1'" in check[0][1][2]
    lock = (WORKFLOWS.parents[1] / VERL_LOCK).read_text().splitlines()
    assert "verl==0.9.1" in lock and "torch==2.13.0" in lock
    cleanup = _find(steps, lambda w: w[:3] == ["for", "target", "in"])
    assert len(cleanup) == 1 and "verl" in cleanup[0][1][3 : cleanup[0][1].index("do")]
    assert cleanup[0][0] < at


def test_harness_full_receives_verls_python(gpu: dict[Any, Any]) -> None:
    steps = _steps(gpu["jobs"]["qualify"])
    harness = _find(steps, lambda w: w[1:3] == ["-m", "harness"] and w[3] in ("smoke", "full"))
    by_level = {w[3]: (i, w) for i, w in harness}
    assert sorted(w[3] for _, w in harness) == ["full", "smoke"]
    at, full = by_level["full"]
    assert steps[at]["if"] == FULL
    assert _option(full, "--verl-python") == f"{VERL_VENV}/bin/python"
    assert _option(full, "--profile") == "rtx4080-wsl2-cu130"
    venv_at = _find(steps, lambda w: w == ["python3.12", "-m", "venv", VERL_VENV])[0][0]
    assert venv_at < at
    at, smoke = by_level["smoke"]
    assert steps[at]["if"] == "${{ inputs.level == 'smoke' }}" and "--verl-python" not in smoke

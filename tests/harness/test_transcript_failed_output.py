"""A failed CLI step's whole output is kept beside the work (for diagnosing a run on a lent machine); a step that
succeeds leaves nothing there."""

from __future__ import annotations

from pathlib import Path

from harness.core.proc import Redactor
from harness.qualify.transcript import FAILED_STEPS, CliDriver


def _driver(tmp_path: Path, script: str) -> CliDriver:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    exe = venv / "bin" / "miniverl"
    exe.write_text(f"#!/bin/sh\n{script}\n")
    exe.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    return CliDriver(venv=venv, work=work, redact=Redactor({"work": work}), installed=None)


def test_a_failed_step_keeps_its_output(tmp_path: Path) -> None:
    driver = _driver(
        tmp_path, 'echo "vllm said why" ; echo "miniverl: error: the reason" >&2 ; echo noise >&2 ; exit 1'
    )
    result = driver("refresh_vllm_run", ["run"])
    assert result.invocation.exit_code == 1 and result.invocation.stderr_last_line == "noise"
    kept = tmp_path / "work" / FAILED_STEPS
    assert (kept / "refresh_vllm_run.stdout").read_text() == "vllm said why\n"
    assert "miniverl: error: the reason" in (kept / "refresh_vllm_run.stderr").read_text()


def test_a_step_that_succeeds_keeps_nothing(tmp_path: Path) -> None:
    driver = _driver(tmp_path, "echo fine ; exit 0")
    assert driver("plan", ["plan"]).invocation.exit_code == 0
    assert not (tmp_path / "work" / FAILED_STEPS).exists()

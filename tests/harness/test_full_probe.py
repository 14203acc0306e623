"""``python -m harness workload``: every input is checked before anything on disk changes."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from harness.cli import main
from harness.qualify.full.probe import SCRATCH_MARK


@pytest.fixture
def inputs(tmp_path: Path) -> dict[str, Path]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    miniverl = venv / "bin" / "miniverl"
    miniverl.write_text("#!/bin/sh\nexit 1\n")
    miniverl.chmod(miniverl.stat().st_mode | stat.S_IXUSR)
    data = tmp_path / "prompts.parquet"
    data.write_bytes(b"PAR1")
    return {"venv": venv, "data": data, "work": tmp_path / "work", "out": tmp_path / "out"}


def _argv(inputs: dict[str, Path], **changes: object) -> list[str]:
    values = {**{k: str(v) for k, v in inputs.items()}, **{k: str(v) for k, v in changes.items()}}
    argv = ["workload", "pg-k1", "--profile", "cpu-reference"]
    for key in ("venv", "data", "work", "out", "verl_python"):
        if key in values:
            argv += [f"--{key.replace('_', '-')}", values[key]]
    return argv


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str], says: str) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"venv": "/nonexistent-venv"}, "no bin/miniverl"),
        ({"data": "/nonexistent.parquet"}, "--data"),
        ({"verl_python": "/nonexistent/python"}, "--verl-python"),
    ],
)
def test_a_missing_input_is_one_line_and_exit_2(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str], change: dict[str, str], says: str
) -> None:
    _refused(_argv(inputs, **change), capsys, says)
    assert not inputs["work"].exists() and not inputs["out"].exists()


def test_a_work_directory_it_did_not_make_is_never_replaced(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs["work"].mkdir()
    (inputs["work"] / "notes.txt").write_text("mine")
    _refused(_argv(inputs), capsys, "--work")
    assert (inputs["work"] / "notes.txt").read_text() == "mine"


def test_evidence_already_in_out_is_never_overwritten(
    inputs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    inputs["out"].mkdir()
    (inputs["out"] / "transcript.json").write_text("{}")
    _refused(_argv(inputs), capsys, "--out")
    assert (inputs["out"] / "transcript.json").read_text() == "{}"
    assert not inputs["work"].exists()


def test_its_own_scratch_directory_may_be_replaced(inputs: dict[str, Path]) -> None:
    """A --work it made before (marked) is replaced; the stand-in CLI fails, so the workload's checks fail."""
    inputs["work"].mkdir()
    (inputs["work"] / SCRATCH_MARK).write_text("")
    (inputs["work"] / "old-run").mkdir()
    assert main(_argv(inputs)) == 1
    assert not (inputs["work"] / "old-run").exists() and (inputs["work"] / SCRATCH_MARK).is_file()

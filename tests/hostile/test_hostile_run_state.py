"""Class: run state. Resume's rollback acts only on what the run itself wrote (a regular file or a real directory
of the expected kind, never through a symlink): anything else is one line, exit 2, and nothing is deleted first.
(Edited ``run.json``/``checkpoint.json`` fields: tests/cli/test_cli_bounded_input.py, ``*recompute*``.)"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from miniverl.artifacts.rundir import roll_back_outputs
from miniverl.errors import UsageError


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "checkpoints").mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    (run / "trajectories" / "update-000002.jsonl").write_text("uncommitted\n")
    return run


def _snapshot(root: Path) -> list[tuple[str, int]]:
    return sorted((p.relative_to(root).as_posix(), os.lstat(p).st_mode) for p in root.rglob("*"))


def _junk_dir(run: Path) -> Path:
    (run / "trajectories" / "junk").mkdir()
    return run / "trajectories" / "junk"


def _tmp_step_symlink(run: Path) -> Path:
    elsewhere = run.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep").write_text("keep")
    (run / "checkpoints" / ".tmp-step-000003").symlink_to(elsewhere)
    return run / "checkpoints" / ".tmp-step-000003"


def _tmp_step_file(run: Path) -> Path:
    (run / "checkpoints" / ".tmp-step-000003").write_text("not a directory")
    return run / "checkpoints" / ".tmp-step-000003"


def _metrics_temp_dir(run: Path) -> Path:
    (run / ".metrics.jsonl.abc.tmp").mkdir()
    return run / ".metrics.jsonl.abc.tmp"


def _trajectories_symlink(run: Path) -> Path:
    (run / "trajectories" / "update-000002.jsonl").unlink()
    (run / "trajectories").rmdir()
    elsewhere = run.parent / "other"
    elsewhere.mkdir()
    (elsewhere / "keep.jsonl").write_text("keep")
    (run / "trajectories").symlink_to(elsewhere)
    return run / "trajectories"


def _metrics_dir(run: Path) -> Path:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()
    return run / "metrics.jsonl"


@pytest.mark.parametrize(
    "make", [_junk_dir, _tmp_step_symlink, _tmp_step_file, _metrics_temp_dir, _trajectories_symlink, _metrics_dir]
)
def test_rollback_refuses_what_the_run_did_not_write_and_deletes_nothing(
    tmp_path: Path, make: Callable[[Path], Path]
) -> None:
    run = _run_dir(tmp_path)
    odd = make(run)
    before = _snapshot(tmp_path)
    with pytest.raises(UsageError, match=f"{odd.name} is a .*; remove it and resume"):
        roll_back_outputs(run, '{"step": 1}\n', {}, "step-000001")
    assert _snapshot(tmp_path) == before  # the uncommitted trajectory file too: nothing deleted before the refusal


def test_rollback_drops_uncommitted_outputs_of_the_right_kind(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    (run / ".metrics.jsonl.abc.tmp").write_text("half")
    (run / "checkpoints" / ".tmp-step-000002").mkdir()
    roll_back_outputs(run, '{"step": 1}\n', {}, "step-000001")
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == [
        "checkpoints",
        "metrics.jsonl",
        "trajectories",
    ]


def test_restart_of_an_unstarted_run_refuses_a_fifo_before_removing_anything(tmp_path: Path) -> None:
    from miniverl.artifacts.rundir import restart_unstarted_run

    run = tmp_path / "run"
    (run / "trajectories").mkdir(parents=True)
    (run / "trajectories" / "cycle-000001.jsonl").write_text("uncommitted\n")
    os.mkfifo(run / "metrics.jsonl")
    before = _snapshot(tmp_path)
    with pytest.raises(UsageError, match=r"metrics\.jsonl is a FIFO, not a regular file this run wrote"):
        restart_unstarted_run(run, "0" * 64)
    assert _snapshot(tmp_path) == before

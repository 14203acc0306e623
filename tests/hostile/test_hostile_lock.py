"""Class: the run lock. A lock path that is not a regular file (a directory, FIFO, symlink, socket) is one line and
exit 2 for every command that takes the lock, and nothing is changed."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests.cli.test_cli_errors import assert_clean_error


def _make(kind: str, path: Path, tmp_path: Path) -> None:
    if kind == "directory":
        path.mkdir()
    elif kind == "FIFO":
        os.mkfifo(path)
    else:
        (tmp_path / "target").write_text("")
        path.symlink_to(tmp_path / "target")


@pytest.mark.parametrize("kind", ["directory", "FIFO", "symlink"])
@pytest.mark.parametrize("command", ["report", "export", "resume"])
def test_a_lock_that_is_not_a_file_is_one_line(cli, workdir: Path, tmp_path: Path, kind: str, command: str) -> None:
    run_dir = workdir / "r"
    run_dir.mkdir()
    lock = run_dir / ".lock"
    _make(kind, lock, tmp_path)
    before = os.lstat(lock).st_mode
    argv = {
        "report": ["report", "r"],
        "export": ["export", "r", "--out", "e"],
        "resume": ["run", "--plan", "plan.json", "--output", ".", "--run-id", "r", "--resume"],
    }[command]
    assert_clean_error(cli(*argv), 2, f"is a {kind}, not the run's lock file; remove it and retry")
    assert stat.S_IFMT(os.lstat(lock).st_mode) == stat.S_IFMT(before)
    assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]

"""Class: output paths, harness side. The harness keeps its own writer (it never imports miniverl): every record
goes through ``harness.core.jsonio.atomic_file``, which refuses a non-regular target before writing."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from harness.audit.cli import output_file
from harness.core.errors import UsageError
from harness.core.jsonio import atomic_write_bytes, replace_dir


def test_harness_writer_refuses_fifo_directory_and_symlinks(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "link.json").symlink_to(fifo)
    for name, kind in (("fifo.json", "a FIFO"), ("dir.json", "a directory"), ("link.json", "a symlink to a FIFO")):
        with pytest.raises(UsageError, match=f"is {kind}, not a regular file") as caught:
            atomic_write_bytes(tmp_path / name, b"{}")
        assert caught.value.exit_code == 2
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and (tmp_path / "dir.json").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.json", "fifo.json", "link.json"]


def test_harness_out_refuses_dev_null_before_the_audit() -> None:
    with pytest.raises(UsageError, match="is a character device"):
        output_file("/dev/null")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_harness_directory_output_refuses_a_fifo(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    staging.mkdir()
    os.mkfifo(tmp_path / "assets")
    with pytest.raises(UsageError, match="is a FIFO, not a directory"):
        replace_dir(staging, tmp_path / "assets")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "assets").st_mode) and staging.is_dir()


@pytest.mark.parametrize("command", [["build"], ["smoke", "--profile", "cpu-reference"]])
def test_harness_directory_out_refuses_a_fifo_before_any_work(tmp_path: Path, command: list[str]) -> None:
    from harness.cli import main

    os.mkfifo(tmp_path / "out")
    assert main([*command, "--out", str(tmp_path / "out")]) == 2
    assert stat.S_ISFIFO(os.lstat(tmp_path / "out").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]

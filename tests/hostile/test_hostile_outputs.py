"""Class: output paths. Every file a command writes goes through one writer that refuses a target that is not a
regular file (device, FIFO, socket, directory, or a symlink to one) before anything is written, then writes
atomically. Nothing already on disk changes on a refusal."""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from miniverl.canonical import atomic_write_json, atomic_write_text
from miniverl.outputs import OutputTargetError, check_dir_target, publish_dir, write_file
from tests.cli.test_cli_errors import assert_clean_error


@pytest.fixture()
def unix_socket(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "sock.json"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
    except OSError:  # a path too long for AF_UNIX
        server.close()
        pytest.skip("cannot bind a unix socket here")
    yield path
    server.close()


def _targets(tmp_path: Path, unix_socket: Path) -> dict[str, tuple[Path, str]]:
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    directory = tmp_path / "dir.json"
    directory.mkdir()
    (directory / "kept").write_text("kept")
    link_fifo = tmp_path / "link-fifo.json"
    link_fifo.symlink_to(fifo)
    link_dir = tmp_path / "link-dir.json"
    link_dir.symlink_to(directory)
    return {
        "fifo": (fifo, "a FIFO"),
        "directory": (directory, "a directory"),
        "socket": (unix_socket, "a socket"),
        "symlink to a FIFO": (link_fifo, "a symlink to a FIFO"),
        "symlink to a directory": (link_dir, "a symlink to a directory"),
    }


def _snapshot(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_mode, st.st_ino


def test_writer_refuses_every_non_regular_target_and_changes_nothing(tmp_path: Path, unix_socket: Path) -> None:
    for name, (path, kind) in _targets(tmp_path, unix_socket).items():
        before = _snapshot(path)
        with pytest.raises(OutputTargetError, match=f"is {kind}, not a regular file"):
            write_file(path, b"data")
        assert _snapshot(path) == before, name
    assert (tmp_path / "dir.json" / "kept").read_text() == "kept"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]  # no temp file left behind


def test_writer_refuses_dev_null_and_leaves_it_a_character_device() -> None:
    with pytest.raises(OutputTargetError, match="is a character device, not a regular file"):
        atomic_write_json("/dev/null", {"a": 1})
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_writer_replaces_a_regular_file_atomically_and_a_symlink_not_its_target(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new"
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("untouched")
    link = tmp_path / "link.txt"
    link.symlink_to(elsewhere)
    write_file(link, b"fresh")
    assert not link.is_symlink() and link.read_bytes() == b"fresh"
    assert elsewhere.read_text() == "untouched"


def test_writer_removes_its_temp_file_when_the_fill_fails(tmp_path: Path) -> None:
    def fill(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("cut short")

    (tmp_path / "out.bin").write_bytes(b"old")
    with pytest.raises(RuntimeError):
        write_file(tmp_path / "out.bin", fill)
    assert (tmp_path / "out.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.bin"]


def test_directory_outputs_refuse_a_file_fifo_or_symlink(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "file").write_text("kept")
    (tmp_path / "link").symlink_to(tmp_path)
    staging = tmp_path / "staging"
    staging.mkdir()
    for name in ("fifo", "file", "link"):
        with pytest.raises(OutputTargetError, match="not a directory"):
            publish_dir(staging, tmp_path / name)
    assert staging.is_dir() and (tmp_path / "file").read_text() == "kept"
    check_dir_target(tmp_path / "absent")
    publish_dir(staging, tmp_path / "absent")
    assert (tmp_path / "absent").is_dir()


@pytest.mark.parametrize(("command", "out"), [("data", "x.parquet"), ("plan", "x.json")])
def test_cli_out_refuses_a_fifo_in_one_line(cli, workdir: Path, command: str, out: str) -> None:
    os.mkfifo(workdir / out)
    argv = ["data", "sample", "--task", "calculator", "--rows", "2"] if command == "data" else ["plan", "c.yaml"]
    assert_clean_error(cli(*argv, "--out", out), 2, "is a FIFO, not a regular file")
    assert stat.S_ISFIFO(os.lstat(workdir / out).st_mode)


def test_cli_out_refuses_dev_null(cli, workdir: Path) -> None:
    result = cli("data", "sample", "--task", "calculator", "--rows", "2", "--out", "/dev/null")
    assert_clean_error(result, 2, "is a character device, not a regular file")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)


def test_cli_out_refuses_a_format_mismatch(cli, workdir: Path) -> None:
    result = cli("data", "sample", "--task", "calculator", "--rows", "2", "--out", "d.jsonl")
    assert_clean_error(result, 2, "give a file name ending in .parquet")
    assert not (workdir / "d.jsonl").exists()
    assert_clean_error(cli("plan", "c.yaml", "--out", "plan.parquet"), 2, "give a file name ending in .json")


def test_run_dir_output_that_became_a_fifo_is_refused(tmp_path: Path) -> None:
    from miniverl.rollout.records import write_trajectories_jsonl

    os.mkfifo(tmp_path / "trajectories.jsonl")
    with pytest.raises(OutputTargetError, match="is a FIFO"):
        write_trajectories_jsonl(tmp_path / "trajectories.jsonl", [])
    assert stat.S_ISFIFO(os.lstat(tmp_path / "trajectories.jsonl").st_mode)


def test_init_checks_every_target_before_writing_any(cli, workdir: Path) -> None:
    target = workdir / "ex"
    target.mkdir()
    os.mkfifo(target / "config.yaml")
    assert_clean_error(cli("init", str(target), "--force"), 2, "config.yaml: the init path is a FIFO")
    assert sorted(p.name for p in target.iterdir()) == ["config.yaml"]  # no partial output


def test_write_files_checks_every_target_before_writing_any(tmp_path: Path) -> None:
    from miniverl.outputs import write_files

    os.mkfifo(tmp_path / "c.html")
    with pytest.raises(OutputTargetError, match=r"c\.html"):
        write_files({tmp_path / "a.svg": b"a", tmp_path / "b.md": b"b", tmp_path / "c.html": b"c"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.html"]


def test_bench_out_files_are_checked_before_the_bench_runs(cli, workdir: Path) -> None:
    (workdir / "b").mkdir()
    os.mkfifo(workdir / "b" / "grpo.svg")
    assert_clean_error(cli("bench", "grpo", "--out", "b"), 2, "grpo.svg: the --out path is a FIFO")

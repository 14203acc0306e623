"""The deterministic archive and its safe extraction."""

from __future__ import annotations

import gzip
import io
import tarfile
from pathlib import Path

import pytest

from harness.core.errors import ArchiveError
from harness.evidence.archive import Member, safe_extract, verify_headers, write_archive


def _members(tmp_path: Path) -> list[Member]:
    (tmp_path / "src").mkdir()
    out = []
    for name, data in (("b/summary.json", b"{}"), ("a/plan.json", b'{"x":1}'), ("c.bin", bytes(range(256)))):
        path = tmp_path / "src" / name.replace("/", "_")
        path.write_bytes(data)
        out.append(Member(name=name, role="x", source=path))
    return out


def test_building_twice_gives_the_same_bytes(tmp_path: Path) -> None:
    members = _members(tmp_path)
    write_archive(members, tmp_path / "one.tar.gz", mtime=1_700_000_000)
    write_archive(list(reversed(members)), tmp_path / "two.tar.gz", mtime=1_700_000_000)
    one = (tmp_path / "one.tar.gz").read_bytes()
    assert one == (tmp_path / "two.tar.gz").read_bytes()
    assert one[4:8] == b"\x00\x00\x00\x00", "gzip mtime must be 0"
    assert one[3] & 0x08 == 0, "gzip header must carry no filename"
    with tarfile.open(tmp_path / "one.tar.gz") as tar:
        infos = tar.getmembers()
    assert [i.name for i in infos] == ["a/plan.json", "b/summary.json", "c.bin"]
    assert all((i.mtime, i.uid, i.gid, i.uname, i.gname, i.mode) == (1_700_000_000, 0, 0, "", "", 0o644) for i in infos)
    verify_headers(tmp_path / "one.tar.gz", [(i.name, i.size) for i in infos], mtime=1_700_000_000)
    with pytest.raises(ArchiveError) as info:
        verify_headers(tmp_path / "one.tar.gz", [(i.name, i.size) for i in infos], mtime=0)
    assert info.value.check == "archive_metadata"
    extracted = safe_extract(tmp_path / "one.tar.gz", tmp_path / "out")
    assert extracted["c.bin"].read_bytes() == bytes(range(256))


def _evil(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]]) -> Path:
    path = tmp_path / "evil.tar.gz"
    with gzip.open(path, "wb") as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in entries:
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return path


def _info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize(
    ("entries", "check"),
    [
        ([(_info("../escape.json"), b"x")], "archive_member_name"),
        ([(_info("a/../../escape.json"), b"x")], "archive_member_name"),
        ([(_info("/etc/passwd"), b"x")], "archive_member_name"),
        ([(_info("link", tarfile.SYMTYPE, "/etc/passwd"), b"")], "archive_member_type"),
        ([(_info("a.json"), b"x"), (_info("hard", tarfile.LNKTYPE, "a.json"), b"")], "archive_member_type"),
        ([(_info("dev", tarfile.CHRTYPE), b"")], "archive_member_type"),
        ([(_info("fifo", tarfile.FIFOTYPE), b"")], "archive_member_type"),
        ([(_info("a.json"), b"x"), (_info("a.json"), b"y")], "archive_duplicate"),
        ([(_info("big.bin"), b"x" * 2048)], "archive_size"),
    ],
)
def test_unsafe_members_are_refused(tmp_path: Path, entries: list[tuple[tarfile.TarInfo, bytes]], check: str) -> None:
    archive = _evil(tmp_path, entries)
    with pytest.raises(ArchiveError) as info:
        safe_extract(archive, tmp_path / "out", max_member=1024)
    assert info.value.check == check
    assert not (tmp_path / "escape.json").exists()


def test_total_size_and_member_count_are_bounded(tmp_path: Path) -> None:
    archive = _evil(tmp_path, [(_info(f"m{i}"), b"x" * 600) for i in range(4)])
    with pytest.raises(ArchiveError) as info:
        safe_extract(archive, tmp_path / "a", max_total=2000)
    assert info.value.check == "archive_size"
    with pytest.raises(ArchiveError):
        safe_extract(archive, tmp_path / "b", max_members=3)


def test_a_corrupt_archive_is_refused(tmp_path: Path) -> None:
    (tmp_path / "bad.tar.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ArchiveError) as info:
        safe_extract(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert info.value.check == "archive_format"

"""Unit tests of the gate's pieces that need no server: origins, zip extraction bounds and member types."""

from __future__ import annotations

import io
import stat
import struct
import zipfile
from pathlib import Path

import pytest
from gate_world import zip_members
from harness_helpers import NO_TORCH_GUARD

from harness.core.errors import UsageError
from harness.core.gate_records import is_repository
from harness.gate import GateError
from harness.gate.http import origin
from harness.gate.main import parse_api_url, seconds
from harness.gate.safezip import ZipLimits, safe_extract


def test_origin_fills_default_ports_and_lowercases() -> None:
    assert origin("HTTPS://API.GitHub.com/x") == ("https", "api.github.com", 443)
    assert origin("http://127.0.0.1/x") == ("http", "127.0.0.1", 80)
    assert origin("http://127.0.0.1:8080") != origin("http://127.0.0.1:8081")
    assert origin("https://h:443/") == origin("https://h/")
    assert origin("http://h:443/") != origin("https://h:443/")


@pytest.mark.parametrize("url", ["ftp://h/x", "file:///etc/passwd", "http:///nohost", "https://u:p@h/", "http://h:x/"])
def test_origin_refuses(url: str) -> None:
    with pytest.raises(GateError) as info:
        origin(url)
    assert info.value.check == "url"


@pytest.mark.parametrize(
    ("url", "root", "prefix"),
    [
        ("https://api.github.com", "https://api.github.com", ""),
        ("https://api.github.com/", "https://api.github.com", ""),
        ("https://ghe.example.com/api/v3", "https://ghe.example.com/api/v3", "api/v3"),
        ("https://ghe.example.com/api/v3/", "https://ghe.example.com/api/v3", "api/v3"),
        (
            "https://ghe.example.com:8443/github~x/api.v3",
            "https://ghe.example.com:8443/github~x/api.v3",
            "github~x/api.v3",
        ),
        ("http://localhost:8080/api/v3", "http://localhost:8080/api/v3", "api/v3"),
        ("http://[::1]:8080/api", "http://[::1]:8080/api", "api"),
    ],
)
def test_api_url_keeps_its_path(url: str, root: str, prefix: str) -> None:
    assert parse_api_url(url) == (root, prefix)


@pytest.mark.parametrize(
    "url",
    [
        "http://ghe.example.com/api/v3",  # plain http off loopback: the token would travel in clear
        "https://ghe.example.com/api/../v3",
        "https://ghe.example.com/./api",
        "https://ghe.example.com//api",
        "https://ghe.example.com/api/%2e%2e",
        "https://ghe.example.com/api v3",
        "https://ghe.example.com/api/v3?per_page=1",
        "https://ghe.example.com/api/v3?",
        "https://ghe.example.com/api/v3#x",
        "https://token@ghe.example.com/api/v3",
        "ftp://ghe.example.com/api/v3",
    ],
)
def test_api_url_refused(url: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_api_url(url)
    assert info.value.check == "usage" and info.value.exit_code == 2


@pytest.mark.parametrize(
    ("repository", "ok"),
    [
        ("acme/miniverl", True),
        ("a/b", True),
        ("Acme-1/mini.verl_x-2", True),
        ("a" * 39 + "/" + "b" * 100, True),
        ("acme/.github", True),
        ("acme/..x", True),
        ("a" * 40 + "/x", False),
        ("acme/" + "b" * 101, False),
        ("../x", False),
        ("acme/..", False),
        ("acme/.", False),
        ("-acme/x", False),
        ("ac_me/x", False),
        ("ac.me/x", False),
        ("acme/x/y", False),
        ("acme/", False),
        ("/x", False),
        ("acme/x\n", False),
        ("acme/x%2f", False),
        ("ácme/x", False),
    ],
)
def test_repository_grammar(repository: str, ok: bool) -> None:
    assert is_repository(repository) is ok


def test_gate_json_holds_the_same_grammar() -> None:
    """gate.json refuses what the command refuses, and keeps the API path without a leading '/'."""
    from pydantic import ValidationError

    from harness.core.gate_records import GateQuery

    base = {
        "api_origin": "https://ghe.example.com:443",
        "api_path": "api/v3",
        "repository": "acme/miniverl",
        "sha": "a" * 40,
        "workflow_path": ".github/workflows/gpu.yml",
        "level": "full_qualification",
        "candidate_artifact": "candidate-distributions",
        "qualification_artifact": "gpu-full-qualification",
        "required_gpu_name": None,
        "dry_run": True,
    }
    assert GateQuery.model_validate(base).api_path == "api/v3"
    for key, bad in (("repository", "../x"), ("repository", "acme/.."), ("api_path", "api/../x")):
        with pytest.raises(ValidationError):
            GateQuery.model_validate({**base, key: bad})


@pytest.mark.parametrize(("text", "value"), [("600", 600.0), ("0.5", 0.5), ("86400", 86400.0)])
def test_seconds_accepted(text: str, value: float) -> None:
    assert seconds("--deadline-seconds", text) == value


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "-inf", "86401", "", "ten", "1e999"])
def test_seconds_refused(text: str) -> None:
    with pytest.raises(UsageError) as info:
        seconds("--deadline-seconds", text)
    assert "--deadline-seconds" in str(info.value) and info.value.exit_code == 2


def _extract(tmp_path: Path, blob: bytes, limits: ZipLimits | None = None) -> dict[str, Path]:
    archive = tmp_path / "a.zip"
    archive.write_bytes(blob)
    dest = tmp_path / "x"
    dest.mkdir()
    return safe_extract(archive, dest, limits or ZipLimits())


def _refused(tmp_path: Path, blob: bytes, check: str, limits: ZipLimits | None = None) -> None:
    with pytest.raises(GateError) as info:
        _extract(tmp_path, blob, limits)
    assert info.value.check == check, str(info.value)


def test_regular_files_and_directory_entries_extract(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("sub/", b"")
        zf.writestr("sub/a.txt", b"hello")
    files = _extract(tmp_path, buf.getvalue())
    assert list(files) == ["sub/a.txt"] and files["sub/a.txt"].read_bytes() == b"hello"


def test_special_file_is_refused(tmp_path: Path) -> None:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("fifo")
        info.create_system = 3
        info.external_attr = (stat.S_IFIFO | 0o644) << 16
        zf.writestr(info, b"")
    _refused(tmp_path, buf.getvalue(), "zip_member_type")


def test_encrypted_member_is_refused(tmp_path: Path) -> None:
    blob = bytearray(zip_members([("a.txt", b"x")]))
    for sig in (b"PK\x03\x04", b"PK\x01\x02"):  # set bit 0 of the general-purpose flags in both headers
        at = blob.index(sig)
        offset = at + (6 if sig == b"PK\x03\x04" else 8)
        blob[offset] |= 1
    _refused(tmp_path, bytes(blob), "zip_member_type")


def test_member_count_and_total_bounds(tmp_path: Path) -> None:
    many = zip_members([(f"f{i}", b"x") for i in range(5)])
    _refused(tmp_path, many, "zip_size", ZipLimits(max_members=4))
    two = zip_members([("a", b"\0" * 1000), ("b", b"\0" * 1000)])
    (tmp_path / "t").mkdir()
    _refused(tmp_path / "t", two, "zip_size", ZipLimits(max_member_bytes=1000, max_total_bytes=1500))


def test_a_header_that_understates_the_size_is_refused(tmp_path: Path) -> None:
    """The central directory and local header claim 10 bytes for a 100 000-byte member."""
    blob = bytearray(zip_members([("a.bin", b"\0" * 100_000)]))
    for sig, offset in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = blob.index(sig)
        struct.pack_into("<I", blob, at + offset, 10)
    tmp_path.mkdir(exist_ok=True)
    with pytest.raises(GateError) as info:
        _extract(tmp_path, bytes(blob), ZipLimits(max_member_bytes=50_000))
    assert info.value.check == "zip_format"  # zipfile stops at the stated size and the CRC then differs
    assert not (tmp_path / "x" / "a.bin").exists() or (tmp_path / "x" / "a.bin").stat().st_size <= 10


def test_not_a_zip(tmp_path: Path) -> None:
    _refused(tmp_path, b"this is not a zip", "zip_format")


def test_destination_must_be_empty(tmp_path: Path) -> None:
    archive = tmp_path / "a.zip"
    archive.write_bytes(zip_members([("a", b"x")]))
    dest = tmp_path / "x"
    dest.mkdir()
    (dest / "old").write_text("x")
    with pytest.raises(GateError) as info:
        safe_extract(archive, dest, ZipLimits())
    assert info.value.check == "zip_destination"


def test_the_gate_imports_neither_torch_nor_miniverl() -> None:
    import ast
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "harness" / "gate").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not {n.split(".")[0] for n in names} & {"torch", "miniverl", "transformers", "peft"}, path.name
    guard = NO_TORCH_GUARD + (
        "import harness.gate.main, harness.gate.verify\n"
        "from harness.cli import main\n"
        "raise SystemExit(main(['release-gate', '--help']))\n"
    )
    done = subprocess.run([sys.executable, "-c", guard], cwd=root, capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "--api-url" in done.stdout, done.stderr

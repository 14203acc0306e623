"""Bounded extraction of an artifact zip: regular files only, safe names, no duplicates, no links.

Sizes are bounded twice: by the central directory before anything is written, and again while each
member streams out (a member may not produce more than its header says, nor push the total past the bound).
CPython's zipfile already stops a member at its stated size and then fails its CRC (``zip_format``); the
streaming bound is kept so the limit holds whatever the zip reader does.
"""

from __future__ import annotations

import re
import stat
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.gate import GateError

_DRIVE = re.compile(r"^[A-Za-z]:")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CHUNK = 1 << 20


@dataclass(frozen=True)
class ZipLimits:
    max_members: int = 10_000
    max_member_bytes: int = 1 << 30
    max_total_bytes: int = 2 << 30


def check_name(name: str) -> list[str]:
    """The POSIX segments of a safe relative member name (a directory entry keeps its trailing ``/``)."""
    bare = name[:-1] if name.endswith("/") else name
    if not bare or bare.startswith("/") or _DRIVE.match(bare):
        raise GateError(f"member {name[:80]!r} has an absolute or drive-letter name", check="zip_member_name")
    if "\\" in bare or _CONTROL.search(bare):
        raise GateError(f"member {name[:80]!r} holds a backslash or a control character", check="zip_member_name")
    parts = bare.split("/")
    if any(part in {"", ".", ".."} for part in parts):
        raise GateError(f"member {name[:80]!r} holds '..', '.' or an empty segment", check="zip_member_name")
    return parts


def member_kind(info: zipfile.ZipInfo) -> str:
    """``file`` or ``dir``; links, devices, FIFOs, sockets and encrypted members are refused."""
    if info.flag_bits & 0x1:
        raise GateError(f"member {info.filename[:80]!r} is encrypted", check="zip_member_type")
    mode = info.external_attr >> 16
    if info.create_system == 3 and stat.S_IFMT(mode):  # Unix: the high 16 bits are st_mode (type 0: unstated)
        if stat.S_ISLNK(mode):
            raise GateError(f"member {info.filename[:80]!r} is a symbolic link", check="zip_symlink")
        if stat.S_ISDIR(mode):
            return _dir(info)
        if not stat.S_ISREG(mode):
            raise GateError(f"member {info.filename[:80]!r} is not a regular file", check="zip_member_type")
    if info.filename.endswith("/") or info.external_attr & 0x10:  # MS-DOS directory attribute
        return _dir(info)
    return "file"


def _dir(info: zipfile.ZipInfo) -> str:
    if info.file_size != 0 or not info.filename.endswith("/"):
        raise GateError(f"directory entry {info.filename[:80]!r} is malformed", check="zip_member_type")
    return "dir"


def safe_extract(archive: Path, dest: Path, limits: ZipLimits) -> dict[str, Path]:
    """Extract into the empty directory ``dest``; returns member name -> extracted path (files only)."""
    try:
        with zipfile.ZipFile(archive) as zf:
            plan = _plan(zf.infolist(), limits)
            return _write(zf, plan, dest, limits)
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, RuntimeError, ValueError) as exc:
        raise GateError(f"{archive.name} is not a readable zip: {exc.__class__.__name__}", check="zip_format") from None


def _plan(infos: list[zipfile.ZipInfo], limits: ZipLimits) -> list[tuple[zipfile.ZipInfo, list[str], str]]:
    if len(infos) > limits.max_members:
        raise GateError(f"{len(infos)} members; the bound is {limits.max_members}", check="zip_size")
    seen: set[str] = set()
    plan, declared = [], 0
    for info in infos:
        parts, kind = check_name(info.filename), member_kind(info)
        key = "/".join(parts)
        if key in seen:
            raise GateError(f"member {key[:80]!r} appears twice", check="zip_duplicate")
        seen.add(key)
        declared += info.file_size
        if info.file_size > limits.max_member_bytes or declared > limits.max_total_bytes:
            raise GateError(
                f"member {key[:80]!r} declares {info.file_size} bytes; the bounds are "
                f"{limits.max_member_bytes} per member and {limits.max_total_bytes} in all",
                check="zip_size",
            )
        plan.append((info, parts, kind))
    return plan


def _write(
    zf: zipfile.ZipFile, plan: list[tuple[zipfile.ZipInfo, list[str], str]], dest: Path, limits: ZipLimits
) -> dict[str, Path]:
    root = dest.resolve()
    if dest.is_symlink() or not dest.is_dir() or any(dest.iterdir()):
        raise GateError("the extraction directory must be an empty directory", check="zip_destination")
    out: dict[str, Path] = {}
    total = 0
    for info, parts, kind in plan:
        target = root.joinpath(*parts)
        try:
            if kind == "dir":
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if not target.resolve().is_relative_to(root):
                raise GateError(f"member {info.filename[:80]!r} escapes the destination", check="zip_member_name")
            with zf.open(info) as source, open(target, "xb") as handle:
                written = 0
                while block := source.read(CHUNK):
                    written += len(block)
                    total += len(block)
                    if written > min(info.file_size, limits.max_member_bytes) or total > limits.max_total_bytes:
                        raise GateError(
                            f"member {info.filename[:80]!r} expands past its bound while streaming", check="zip_size"
                        )
                    handle.write(block)
        except OSError as exc:
            raise GateError(
                f"member {info.filename[:80]!r} cannot be written: {exc.__class__.__name__}", check="zip_member_name"
            ) from None
        out["/".join(parts)] = target
    return out

"""The deterministic evidence archive (``qualification-evidence.tar.gz``) and its safe re-extraction."""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.core.audit_records import EvidenceManifest, EvidenceMember
from harness.core.errors import ArchiveError, AssetsError
from harness.core.jsonio import atomic_file, atomic_write_bytes, sha256_file
from harness.core.recordio import record_bytes
from harness.core.records import FileDigest, Qualification
from harness.core.safeio import file_digest, path_below, regular_file_size
from harness.qualify.full.catalog import archive_members

ARCHIVE = "qualification-evidence.tar.gz"
ARCHIVE_MANIFEST = "qualification-evidence-manifest.json"
MAX_MEMBER_BYTES = 512 << 20
MAX_TOTAL_BYTES = 2 << 30
MAX_MEMBERS = 10_000

# Explicit evidence-role mapping: semantic role -> archive member name. Nothing is derived from paths.
SMOKE_ARCHIVE_MEMBERS = {
    "transcript": "release-smoke/transcript.json",
    "doctor": "release-smoke/doctor.json",
    "workload_config": "release-smoke/inputs/release-smoke.yaml",
    "input_prompts": "release-smoke/inputs/prompts.parquet",
    "plan": "release-smoke/run/plan.json",
    "run_manifest": "release-smoke/run/run.json",
    "run_summary": "release-smoke/run/summary.json",
    "metrics": "release-smoke/run/metrics.jsonl",
    "adapter_config": "release-smoke/adapter/adapter_config.json",
    "adapter_weights": "release-smoke/adapter/adapter_model.safetensors",
    "adapter_manifest": "release-smoke/adapter/miniverl-manifest.json",
    "grpo_plan": "release-smoke/grpo/plan.json",
    "grpo_summary": "release-smoke/grpo/summary.json",
    "grpo_metrics": "release-smoke/grpo/metrics.jsonl",
    "cli_outputs": "release-smoke/cli-outputs.json",
    "origin": "release-smoke/install/origin.json",
    "git_head": "release-smoke/install/git-rev-parse-head.txt",
    "git_status": "release-smoke/install/git-status-porcelain.txt",
    "wheel_sha256": "release-smoke/install/wheel-sha256.txt",
    "pip_report": "release-smoke/install/pip-install-report.json",
    "pyvenv_cfg": "release-smoke/install/pyvenv.cfg",
    "venv_before_install": "release-smoke/install/pip-freeze-before-install.txt",
    "pip_inspect": "release-smoke/install/pip-inspect.json",
    "pip_check": "release-smoke/install/pip-check.txt",
    "python_version": "release-smoke/install/python-version.txt",
    "nvidia_smi": "release-smoke/install/nvidia-smi.csv",
}
# ... and each full workload's evidence and subordinate record (declared by the workloads, harness/full).
ARCHIVE_MEMBERS = {**SMOKE_ARCHIVE_MEMBERS, **archive_members()}


@dataclass(frozen=True)
class Member:
    name: str
    role: str
    source: Path


MEMBER_MODE = 0o644
GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00"  # magic, deflate, no flags (no name), mtime 0


def write_archive(members: Iterable[Member], out: Path, *, mtime: int) -> None:
    """Sorted members with the candidate's SOURCE_DATE_EPOCH as mtime, uid/gid 0, empty owner names, mode 0644.

    The gzip header carries mtime 0 and no filename.
    """
    ordered = sorted(members, key=lambda m: m.name)
    names = [m.name for m in ordered]
    if len(names) != len(set(names)):
        raise ArchiveError("two evidence files map to one archive member", check="archive_duplicate")
    # tarfile's own "w:gz" writes the filename and the current time into the gzip header.
    with (
        atomic_file(out) as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as gz,
        tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar,
    ):
        for member in ordered:
            data = member.source.read_bytes()
            info = tarfile.TarInfo(member.name)
            info.size, info.mtime, info.mode = len(data), mtime, MEMBER_MODE
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))


def _check_name(name: str) -> None:
    if not name or name.startswith("/") or "\\" in name or (len(name) > 1 and name[1] == ":"):
        raise ArchiveError(f"member {name[:80]!r} has an absolute or non-POSIX name", check="archive_member_name")
    parts = name.split("/")
    if any(p in {"", ".", ".."} for p in parts):
        raise ArchiveError(f"member {name[:80]!r} holds '..', '.' or an empty segment", check="archive_member_name")


def verify_headers(archive: Path, expected: list[tuple[str, int]], *, mtime: int) -> None:
    """Before any member's bytes are extracted: the gzip header and every tar header, in order.

    ``expected`` is the manifest's ``(name, bytes)`` list in archive order. Each header must name the next
    expected member, be a regular file of exactly that size, mode 0644 (no setuid/setgid/sticky, no group or
    world write), uid/gid 0 with empty owner names, mtime ``mtime`` (the candidate's SOURCE_DATE_EPOCH) and no
    PAX extensions. Reading stops at the first unexpected header, so a hostile size is never skipped over.
    """
    regular_file_size(archive, archive.name, check="archive_file_type", error=ArchiveError)
    with open(archive, "rb") as raw:
        if raw.read(len(GZIP_HEADER)) != GZIP_HEADER:
            raise ArchiveError(
                "gzip header is not the deterministic one (mtime 0, no filename)", check="archive_metadata"
            )
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            index = 0
            while (info := tar.next()) is not None:
                if index >= len(expected):
                    raise ArchiveError(f"member {info.name[:80]!r} is not in the manifest", check="archive_members")
                name, size = expected[index]
                _check_name(info.name)
                if info.name != name:
                    raise ArchiveError(
                        f"member {index} is {info.name[:80]!r}, the manifest lists {name!r} there",
                        check="archive_members",
                    )
                if not info.isreg():
                    raise ArchiveError(f"member {name!r} is not a regular file", check="archive_member_type")
                if info.size != size:
                    raise ArchiveError(
                        f"member {name!r} is {info.size} bytes, manifest says {size}", check="archive_size"
                    )
                facts = (info.mode, info.uid, info.gid, info.uname, info.gname, info.mtime, dict(info.pax_headers))
                want: tuple[object, ...] = (MEMBER_MODE, 0, 0, "", "", mtime, {})
                if facts != want:
                    raise ArchiveError(
                        f"member {name!r} has mode {info.mode:o}, owner {info.uid}:{info.gid} "
                        f"{info.uname!r}:{info.gname!r}, mtime {info.mtime}; the deterministic archive has "
                        f"{MEMBER_MODE:o}, 0:0 '':'', mtime {mtime} and no PAX headers",
                        check="archive_metadata",
                    )
                index += 1
            if index != len(expected):
                raise ArchiveError(
                    f"archive has {index} members, the manifest lists {len(expected)}", check="archive_members"
                )
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile, zlib.error) as exc:
        raise ArchiveError(
            f"{archive.name} is not a readable tar.gz: {exc.__class__.__name__}", check="archive_format"
        ) from None


def safe_extract(
    archive: Path,
    dest: Path,
    *,
    max_member: int = MAX_MEMBER_BYTES,
    max_total: int = MAX_TOTAL_BYTES,
    max_members: int = MAX_MEMBERS,
) -> dict[str, Path]:
    """Extract regular files only into the empty dir ``dest``; refuse links, devices, ``..``, dupes, bombs."""
    regular_file_size(archive, archive.name, check="archive_file_type", error=ArchiveError)
    out: dict[str, Path] = {}
    total = 0
    try:
        with tarfile.open(archive, mode="r:gz") as tar:
            for count, info in enumerate(tar, start=1):
                if count > max_members:
                    raise ArchiveError(f"more than {max_members} members", check="archive_size")
                _check_name(info.name)
                if info.issym() or info.islnk():
                    raise ArchiveError(f"member {info.name!r} is a link", check="archive_member_type")
                if not info.isreg():
                    raise ArchiveError(f"member {info.name!r} is not a regular file", check="archive_member_type")
                if info.name in out:
                    raise ArchiveError(f"member {info.name!r} appears twice", check="archive_duplicate")
                if info.size > max_member or total + info.size > max_total:
                    raise ArchiveError(
                        f"member {info.name!r} ({info.size} bytes) exceeds the size bound", check="archive_size"
                    )
                total += info.size
                source = tar.extractfile(info)
                if source is None:
                    raise ArchiveError(f"member {info.name!r} has no data", check="archive_member_type")
                target = dest.joinpath(*info.name.split("/"))
                target.parent.mkdir(parents=True, exist_ok=True)
                if not target.resolve().is_relative_to(dest.resolve()):
                    raise ArchiveError(f"member {info.name!r} escapes the destination", check="archive_member_name")
                with source, open(target, "xb") as handle:
                    written = 0
                    while block := source.read(1 << 20):
                        written += len(block)
                        if written > info.size:
                            raise ArchiveError(f"member {info.name!r} is longer than its header", check="archive_size")
                        handle.write(block)
                out[info.name] = target
    except (tarfile.TarError, EOFError, OSError, gzip.BadGzipFile, zlib.error) as exc:
        raise ArchiveError(
            f"{archive.name} is not a readable tar.gz: {exc.__class__.__name__}", check="archive_format"
        ) from None
    return out


def describe(path: Path) -> tuple[int, str]:
    return path.stat().st_size, sha256_file(path)


PRINCIPAL_ROLE_PREFIX = "principal_"


def pack_evidence(qual_dir: Path, qual: Qualification, out_dir: Path, *, mtime: int) -> EvidenceManifest:
    """Write the archive + its manifest into ``out_dir`` from the qualification's subordinate artifacts."""
    members: list[Member] = []
    entries: list[EvidenceMember] = []
    for art in qual.artifacts:
        if art.role.startswith(PRINCIPAL_ROLE_PREFIX):
            continue
        name = ARCHIVE_MEMBERS.get(art.role)
        if name is None:
            raise AssetsError(f"no evidence-role mapping for role {art.role!r} ({art.path})", check="evidence_roles")
        source = path_below(qual_dir, art.path, art.path, check="artifact_file_type", error=AssetsError)
        if file_digest(source, art.path, check="artifact_file_type", error=AssetsError) != (art.bytes, art.sha256):
            raise AssetsError(f"{art.path} differs from qualification.json", check="artifact_sha256")
        members.append(Member(name=name, role=art.role, source=source))
        entries.append(EvidenceMember(name=name, role=art.role, bytes=art.bytes, sha256=art.sha256))
    archive = out_dir / ARCHIVE
    write_archive(members, archive, mtime=mtime)
    manifest = EvidenceManifest(
        kind="miniverl.evidence-manifest",
        schema_version=1,
        archive=FileDigest(filename=ARCHIVE, bytes=archive.stat().st_size, sha256=sha256_file(archive)),
        source_commit=qual.candidate.source_commit,
        qualification_sha256=sha256_file(qual_dir / "qualification.json"),
        members=sorted(entries, key=lambda e: e.name),
    )
    atomic_write_bytes(out_dir / ARCHIVE_MANIFEST, record_bytes(manifest))
    return manifest

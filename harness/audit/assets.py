"""The auditor over a release-asset directory: exact layout, every byte, the archive's metadata, and a
``release-verification.json`` that must equal, byte for byte, the chain verification recomputed here."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from harness.audit.chain import Auditor, chain_checks
from harness.audit.findings import require
from harness.audit.gate_record import GateRecordChecks
from harness.audit.request import AuditRequest
from harness.audit.statements import PROVENANCE_PARTS, RESULT_PARTS, verify_statement
from harness.build.candidate import MANIFEST, SUMS, sums_text
from harness.core.audit_records import EvidenceManifest, ReleaseVerification
from harness.core.errors import VerificationError
from harness.core.jsonio import sha256_bytes
from harness.core.recordio import parse_record, record_bytes
from harness.core.records import Artifact, CandidateManifest, Qualification
from harness.core.safeio import (
    MANIFEST_MAX_BYTES,
    RECORD_MAX_BYTES,
    SUMS_MAX_BYTES,
    file_digest,
    path_below,
    read_regular,
    regular_file_size,
    require_directory,
)
from harness.evidence.archive import ARCHIVE, ARCHIVE_MANIFEST, ARCHIVE_MEMBERS, safe_extract, verify_headers
from harness.evidence.layout import QUAL_SUMS, QUALIFICATION_ASSETS, RELEASE_VERIFICATION, TOP_LEVEL
from harness.evidence.statements import (
    PROVENANCE,
    QUALIFICATION_RESULT,
    build_provenance,
    qualification_result,
    workload_records,
)


class AssetChecks:
    def __init__(self, req: AuditRequest, scratch: Path) -> None:
        assert req.assets_dir is not None
        self.req, self.root, self.scratch = req, req.assets_dir, scratch
        self.manifest: CandidateManifest | None = None
        self.qual: Qualification | None = None
        self.qual_bytes = b""
        self.extracted: dict[str, Path] = {}

    def layout(self) -> str:
        require_directory(self.root, "--assets-dir", check="assets_layout")
        entries: dict[str, Path] = {}
        for path in self.root.iterdir():
            if len(entries) > len(TOP_LEVEL):
                break
            entries[path.name] = path
        require(
            set(entries) == TOP_LEVEL,
            "assets_layout",
            f"top level must be exactly the canonical names; extra {sorted(set(entries) - TOP_LEVEL)[:5]}, "
            f"missing {sorted(TOP_LEVEL - set(entries))}",
        )
        for name in sorted(TOP_LEVEL - {"dist"}):
            regular_file_size(self.root / name, name, check="assets_layout", root=self.root)
        require_directory(self.root / "dist", "dist/", check="assets_layout")
        return "exactly the canonical top-level names, each a regular file (dist/ a directory)"

    def candidate(self) -> str:
        published = self._published_copy(
            self.req.candidate_manifest, "candidate-manifest.json", MANIFEST_MAX_BYTES, "assets_candidate"
        )
        m = self.manifest = parse_record(CandidateManifest, published, "candidate-manifest.json")
        dist = self.root / "dist"
        names = sorted(p.name for p in list(dist.iterdir())[:3])
        require(
            names == sorted([m.wheel.filename, m.sdist.filename]),
            "assets_dist",
            "dist/ must hold exactly the candidate wheel and sdist",
        )
        for digest in (m.wheel, m.sdist):
            path = dist / digest.filename
            what = f"dist/{digest.filename}"
            size = regular_file_size(path, what, check="assets_dist", root=self.root)
            require(
                size == digest.bytes
                and file_digest(path, what, check="assets_dist", root=self.root) == (digest.bytes, digest.sha256),
                "assets_dist",
                f"dist/{digest.filename} differs from the candidate manifest",
            )
        sums = read_regular(self.root / SUMS, SUMS, max_bytes=SUMS_MAX_BYTES, check="assets_sha256sums", root=self.root)
        require(
            sums == sums_text([m.wheel, m.sdist]).encode(),
            "assets_sha256sums",
            "SHA256SUMS must list exactly the wheel then the sdist",
        )
        return "dist/, SHA256SUMS and candidate-manifest.json equal the candidate"

    def qualification(self) -> str:
        published = self._published_copy(
            self.req.qualification, "qualification.json", RECORD_MAX_BYTES, "assets_qualification"
        )
        self.qual, self.qual_bytes = parse_record(Qualification, published, "qualification.json"), published
        return "qualification.json equals the one given"

    def _published_copy(self, given: Path, name: str, limit: int, check: str) -> bytes:
        """The asset ``name``, which must be byte-equal to the file the auditor was given."""
        want = read_regular(given, f"the given {name}", max_bytes=limit, check=check)
        data = read_regular(self.root / name, name, max_bytes=limit, check=check, root=self.root)
        require(data == want, check, f"{name} differs from the one given")
        return data

    def archive(self) -> str:
        q, m = self.qual, self.manifest
        require(q is not None and m is not None, "evidence_archive", "the candidate or qualification is unreadable")
        assert q is not None and m is not None
        manifest_bytes = read_regular(
            self.root / ARCHIVE_MANIFEST,
            ARCHIVE_MANIFEST,
            max_bytes=RECORD_MAX_BYTES,
            check="evidence_archive",
            root=self.root,
        )
        manifest = parse_record(EvidenceManifest, manifest_bytes, ARCHIVE_MANIFEST, check="evidence_archive")
        archive = self.root / ARCHIVE
        size = regular_file_size(archive, ARCHIVE, check="evidence_archive", root=self.root)
        require(
            manifest.archive.filename == ARCHIVE
            and manifest.archive.bytes == size
            and file_digest(archive, ARCHIVE, check="evidence_archive", root=self.root)
            == (size, manifest.archive.sha256),
            "evidence_archive",
            "archive bytes differ from its manifest",
        )
        require(manifest.source_commit == q.candidate.source_commit, "evidence_archive", "archive binds another commit")
        require(
            manifest.qualification_sha256 == sha256_bytes(self.qual_bytes),
            "evidence_archive",
            "archive binds another qualification.json",
        )
        expected = {
            ARCHIVE_MEMBERS.get(a.role, f"<unmapped role {a.role}>"): a
            for a in q.artifacts
            if not a.role.startswith("principal_")
        }
        listed = {mem.name: mem for mem in manifest.members}
        require(
            set(listed) == set(expected),
            "evidence_archive",
            "the archive manifest's members differ from the qualification's evidence",
        )
        for name, mem in listed.items():
            art = expected[name]
            require(
                (mem.bytes, mem.sha256, mem.role) == (art.bytes, art.sha256, art.role),
                "evidence_archive",
                f"member {name} differs from its qualification artifact",
            )
        order = [(mem.name, mem.bytes) for mem in manifest.members]
        verify_headers(archive, order, mtime=m.source_date_epoch)
        total = sum(b for _, b in order)
        files = safe_extract(archive, self.scratch, max_member=max((b for _, b in order), default=0), max_total=total)
        for name, path in files.items():
            require(
                file_digest(path, name, check="evidence_archive", root=self.scratch)
                == (listed[name].bytes, listed[name].sha256),
                "evidence_archive",
                f"member {name} differs from its manifest entry",
            )
        self.extracted = {listed[name].role: path for name, path in files.items()}
        return f"{len(files)} members: order, metadata (mode 0644, 0:0, mtime {m.source_date_epoch}), bytes, sha256"

    def locate(self) -> Callable[[Artifact], Path]:
        def where(art: Artifact) -> Path:
            if art.role.startswith("principal_"):
                return path_below(self.root, art.path, art.path, check="artifact_file_type")
            extracted = self.extracted.get(art.role)
            if extracted is None:  # the archive was refused (its check says why), or lacks this member
                raise VerificationError(
                    f"{art.path} is not among the verified evidence archive's members", check="evidence_archive"
                )
            return extracted

        return where

    def sums(self) -> str:
        check = "qualification_sha256sums"
        want = "".join(
            f"{file_digest(self.root / n, n, check=check, root=self.root)[1]}  {n}\n" for n in QUALIFICATION_ASSETS
        ).encode()
        got = read_regular(self.root / QUAL_SUMS, QUAL_SUMS, max_bytes=SUMS_MAX_BYTES, check=check, root=self.root)
        require(
            got == want,
            "qualification_sha256sums",
            "qualification-SHA256SUMS must cover the nine assets in canonical order with their hashes",
        )
        return "qualification-SHA256SUMS covers the nine assets in canonical order"

    def provenance(self) -> str:
        m = self.manifest
        require(m is not None, "build_provenance", "the published candidate manifest is unreadable")
        assert m is not None
        return verify_statement(self.root / PROVENANCE, self.root, build_provenance(m), PROVENANCE_PARTS)

    def result(self) -> str:
        q, m = self.qual, self.manifest
        require(q is not None and m is not None, "qualification_result", "the candidate or qualification is unreadable")
        assert q is not None and m is not None
        where = self.locate()

        def read(art: Artifact) -> bytes:
            return read_regular(where(art), art.path, max_bytes=RECORD_MAX_BYTES, check="qualification_result")

        records = workload_records(q, read, check="qualification_result")
        digests = {
            name: file_digest(self.root / name, name, check="qualification_result", root=self.root)[1]
            for name in (MANIFEST, "qualification.json", ARCHIVE, ARCHIVE_MANIFEST)
        }
        expected = qualification_result(m, q, records, digests=digests)
        return verify_statement(self.root / QUALIFICATION_RESULT, self.root, expected, RESULT_PARTS)


def audit_assets(req: AuditRequest) -> ReleaseVerification:
    with tempfile.TemporaryDirectory(prefix="miniverl-audit-") as tmp:
        checks = AssetChecks(req, Path(tmp))
        outer = Auditor(req)
        # The layout and the archive first: a file missing because the archive was refused is a consequence,
        # and the first failed check (the auditor's one-line error) must be the cause.
        if outer.check("assets_layout", checks.layout):
            outer.check("assets_candidate", checks.candidate)
            outer.check("assets_qualification", checks.qualification)
            outer.check("evidence_archive", checks.archive)
        containers = list(outer.checks)
        chain = Auditor(replace(req, assets_dir=None, gate_record=None), locate=checks.locate())
        verified = chain_checks(chain)
        published = chain.verification(verified)
        if containers[0].passed:
            outer.check("qualification_sha256sums", checks.sums)
            outer.check("release_verification", lambda: _same_verification(req, published))
            outer.check("build_provenance", checks.provenance)
            outer.check("qualification_result", checks.result)
            if req.gate_record is not None:
                gate = GateRecordChecks(req.gate_record, checks.root, commit=req.commit, level=req.level)
                if outer.check("gate_record", gate.record):  # a refused record has no run or wheel to compare
                    outer.check("gate_run", gate.run)
                    outer.check("gate_subjects", gate.subjects)
        return chain.verification(containers + verified + outer.checks[len(containers) :])


def _same_verification(req: AuditRequest, recomputed: ReleaseVerification) -> str:
    assert req.assets_dir is not None
    path = req.assets_dir / RELEASE_VERIFICATION
    data = read_regular(
        path, RELEASE_VERIFICATION, max_bytes=RECORD_MAX_BYTES, check="release_verification", root=req.assets_dir
    )
    require(
        data == record_bytes(recomputed),
        "release_verification",
        "release-verification.json is not byte-equal to the verification recomputed from the chain",
    )
    return "release-verification.json equals the recomputed chain verification, byte for byte"

"""Release assets: exactly the seed's top-level layout, built from a candidate and a qualification directory.

The builder sits above the auditor: it publishes the auditor's chain verification and re-audits the staged
directory before moving it into place, so nothing unaudited is ever written as release assets."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import replace
from pathlib import Path

from harness.audit.auditor import audit
from harness.audit.chain import verify_chain
from harness.audit.request import AuditRequest
from harness.build.candidate import MANIFEST, SUMS, check_candidate
from harness.core.errors import AssetsError, UsageError
from harness.core.intoto import statement_bytes
from harness.core.jsonio import atomic_write_bytes, publish_dir, sha256_file
from harness.core.policy import PRINCIPAL_FILES
from harness.core.recordio import load_record, record_bytes
from harness.core.records import CandidateManifest, Qualification
from harness.evidence.archive import ARCHIVE, ARCHIVE_MANIFEST, PRINCIPAL_ROLE_PREFIX, pack_evidence
from harness.evidence.layout import QUAL_SUMS, QUALIFICATION_ASSETS, RELEASE_VERIFICATION
from harness.evidence.statements import (
    PROVENANCE,
    QUALIFICATION_RESULT,
    build_provenance,
    qualification_result,
    workload_records,
)


def build_release_assets(
    candidate_dir: Path,
    qual_dir: Path,
    out: Path,
    *,
    profile: str,
    known_good_sha256: str,
    required_gpu_name: str | None,
    known_good: Path | None = None,
    replace_existing: bool = False,
) -> Path:
    """Build the asset dir (all-or-nothing) of a full qualification on ``profile`` (the caller's, not the
    record's). Fails naming any principal record that does not exist yet."""
    if out.exists() and not replace_existing:
        raise UsageError(f"{out.name} exists; pass --replace to rebuild it", check="output")
    manifest = check_candidate(candidate_dir)
    qual_path = qual_dir / "qualification.json"
    qual = load_record(Qualification, qual_path, "qualification.json")
    bound = {a.path for a in qual.artifacts if a.role.startswith(PRINCIPAL_ROLE_PREFIX)}
    missing = [name for name in PRINCIPAL_FILES if name not in bound or not (qual_dir / name).is_file()]
    if missing:
        raise AssetsError(
            f"principal workload records do not exist yet: {', '.join(missing)}", check="principal_records"
        )
    if qual.status != "passed":
        raise AssetsError(
            f"qualification status is {qual.status}: {'; '.join(qual.reasons[:2])}", check="qualification_status"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        (staging / "dist").mkdir()
        for digest in (manifest.wheel, manifest.sdist):
            _copy(candidate_dir / digest.filename, staging / "dist" / digest.filename)
        _copy(candidate_dir / SUMS, staging / SUMS)
        _copy(candidate_dir / MANIFEST, staging / "candidate-manifest.json")
        _copy(qual_path, staging / "qualification.json")
        for name in PRINCIPAL_FILES:
            _copy(qual_dir / name, staging / name)
        pack_evidence(qual_dir, qual, staging, mtime=manifest.source_date_epoch)
        chain = AuditRequest(
            candidate_dir=candidate_dir,
            candidate_manifest=candidate_dir / MANIFEST,
            qualification=qual_path,
            commit=manifest.source_commit,
            known_good_sha256=known_good_sha256,
            required_gpu_name=required_gpu_name,
            level="full_qualification",  # release assets exist only for the full level
            known_good=known_good,
            profile=profile,
        )
        verification = verify_chain(chain)
        if verification.status != "passed":
            raise AssetsError(
                f"the auditor refused the chain: {', '.join(verification.failed_checks)}",
                check=verification.failed_checks[0],
            )
        atomic_write_bytes(staging / RELEASE_VERIFICATION, record_bytes(verification))
        sums = "".join(f"{sha256_file(staging / n)}  {n}\n" for n in QUALIFICATION_ASSETS)
        atomic_write_bytes(staging / QUAL_SUMS, sums.encode())
        _write_statements(staging, manifest, qual, qual_dir)
        final = audit(replace(chain, assets_dir=staging))
        if final.status != "passed":
            raise AssetsError(
                f"the auditor refused the assets: {', '.join(final.failed_checks)}", check=final.failed_checks[0]
            )
        publish_dir(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _write_statements(staging: Path, manifest: CandidateManifest, qual: Qualification, qual_dir: Path) -> None:
    """The build provenance and the qualification result, from the staged files (the auditor re-derives both)."""
    records = workload_records(qual, lambda art: (qual_dir / art.path).read_bytes(), check="qualification_result")
    digests = {n: sha256_file(staging / n) for n in (MANIFEST, "qualification.json", ARCHIVE, ARCHIVE_MANIFEST)}
    atomic_write_bytes(staging / PROVENANCE, statement_bytes(build_provenance(manifest)))
    result = qualification_result(manifest, qual, records, digests=digests)
    atomic_write_bytes(staging / QUALIFICATION_RESULT, statement_bytes(result))


def _copy(src: Path, dst: Path) -> None:
    if src.is_symlink() or not src.is_file():
        raise AssetsError(f"{src.name} is missing or not a regular file", check="artifact_file_type")
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)

"""After the run is chosen: download, digest, safe extraction, candidate check, run bindings, the auditor.

Nothing is rebuilt: ``dist/`` is a byte copy of the wheel and sdist inside the downloaded artifact.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from harness.audit.auditor import audit
from harness.audit.release_assets import build_release_assets
from harness.audit.request import AuditRequest
from harness.build.candidate import MANIFEST, check_candidate
from harness.build.known_good import read_known_good
from harness.core.audit_records import ReleaseVerification
from harness.core.errors import HarnessError
from harness.core.gate_records import ArtifactRef
from harness.core.recordio import load_record, write_record
from harness.core.records import CandidateManifest, GithubActionsBinding, Profile, Qualification
from harness.gate import GateError
from harness.gate.http import GitHubClient
from harness.gate.runs import ApiArtifact, ApiRun, Target, download_bound, parse_time
from harness.gate.safezip import ZipLimits, safe_extract

QUALIFICATION = "qualification.json"


@dataclass
class Unpacked:
    candidate_dir: Path
    qualification_dir: Path
    manifest: CandidateManifest
    qualification: Qualification


def download(client: GitHubClient, t: Target, art: ApiArtifact, work: Path) -> tuple[ArtifactRef, Path]:
    """Download one artifact zip into ``work`` (bounded by its size) and check the API digest."""
    archive = work / f"{art.name}.zip"
    _size, sha256 = client.download(t.download_url(art.id), archive, download_bound(art))
    assert art.workflow_run is not None  # checked when the run was chosen
    ref = ArtifactRef(
        name=art.name,
        id=art.id,
        size_in_bytes=art.size_in_bytes,
        api_digest=art.digest,
        sha256=sha256,
        expires_at=parse_time(art.expires_at, "expires_at").strftime("%Y-%m-%dT%H:%M:%SZ"),
        workflow_run_id=art.workflow_run.id,
    )
    return ref, archive


def check_digest(ref: ArtifactRef) -> None:
    if ref.api_digest is not None and ref.api_digest != f"sha256:{ref.sha256}":
        raise GateError(
            f"{ref.name}: the zip's sha256 is {ref.sha256}, the API says {ref.api_digest}", check="artifact_digest"
        )


def extract(archive: Path, name: str, work: Path, limits: ZipLimits) -> Path:
    """Safe extraction into ``work/<name>``; the zip is removed afterwards."""
    dest = work / name
    dest.mkdir()
    safe_extract(archive, dest, limits)
    archive.unlink()
    return dest


def expected_binding(run: ApiRun, t: Target) -> GithubActionsBinding:
    return GithubActionsBinding(
        kind="github_actions",
        repository=t.repository,
        workflow_path=t.workflow_path,
        run_id=run.id,
        run_attempt=run.run_attempt,
    )


def unpack(candidate_dir: Path, qualification_dir: Path, run: ApiRun, t: Target) -> Unpacked:
    """``harness build --check`` on the candidate, then both records bound to the API's run and commit."""
    manifest = check_candidate(candidate_dir)
    want = expected_binding(run, t)
    if manifest.source_commit != t.sha:
        raise GateError(f"the candidate was built from {manifest.source_commit}, not {t.sha}", check="source_commit")
    if manifest.workflow != want:
        raise GateError(
            f"the candidate binds {_describe(manifest.workflow)}, the API run is {_describe(want)}",
            check="candidate_run",
        )
    qual = load_record(Qualification, qualification_dir / QUALIFICATION, QUALIFICATION)
    if qual.execution.workflow != want:
        raise GateError(
            f"qualification.json binds {_describe(qual.execution.workflow)}, the API run is {_describe(want)}",
            check="qualification_run",
        )
    return Unpacked(candidate_dir, qualification_dir, manifest, qual)


def _describe(binding: object) -> str:
    if isinstance(binding, GithubActionsBinding):
        return f"{binding.repository} {binding.workflow_path} run {binding.run_id} attempt {binding.run_attempt}"
    return "a local build (no workflow run)"


def known_good_sha256(u: Unpacked, profile: Profile) -> str:
    """sha256 of the profile's ``known-good/<stack>.json`` as committed at the release commit, read from the
    candidate's sdist. The profile comes from the required GPU (harness code), never from the record."""
    sdist = u.candidate_dir / u.manifest.sdist.filename
    try:
        data, _ = read_known_good(None, sdist, u.manifest.version, profile.known_good)
    except HarnessError as exc:
        raise GateError(str(exc), check="known_good_sha256") from None
    return hashlib.sha256(data).hexdigest()


def run_audit(u: Unpacked, t: Target, known_good: str, profile: Profile, assets: Path | None) -> ReleaseVerification:
    """The one call into the auditor (the same code as scripts/validate_release_chain.py)."""
    request = AuditRequest(
        candidate_dir=u.candidate_dir,
        candidate_manifest=u.candidate_dir / MANIFEST,
        qualification=u.qualification_dir / QUALIFICATION,
        commit=t.sha,
        known_good_sha256=known_good,
        required_gpu_name=profile.required_gpu_name,
        level=t.level,
        assets_dir=assets,
        profile=profile.name,
    )
    result = audit(request)
    if result.status != "passed":
        first = next(c for c in result.checks if not c.passed)
        raise GateError(f"the auditor refused the chain: {first.detail}", check=first.name)
    return result


def write_outputs(u: Unpacked, t: Target, known_good: str, profile: Profile, staging: Path) -> ReleaseVerification:
    """``dist/`` (byte copies), ``release-assets/`` for the full level, and ``release-verification.json``."""
    dist = staging / "dist"
    dist.mkdir()
    for digest in (u.manifest.wheel, u.manifest.sdist):  # hashes were just verified by check_candidate
        shutil.copyfile(u.candidate_dir / digest.filename, dist / digest.filename)
    verification = run_audit(u, t, known_good, profile, None)  # the chain verification that assets publish
    if t.level == "full_qualification":
        assets = build_release_assets(
            u.candidate_dir,
            u.qualification_dir,
            staging / "release-assets",
            profile=profile.name,
            known_good_sha256=known_good,
            required_gpu_name=profile.required_gpu_name,
        )
        run_audit(u, t, known_good, profile, assets)
    write_record(staging / "release-verification.json", verification)
    return verification

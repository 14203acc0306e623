"""What the auditor is asked to verify (the command line's arguments), and what it refuses before reading anything."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from harness.core import policy
from harness.core.errors import VerificationError
from harness.core.profiles import PROFILES
from harness.core.records import COMMIT_HEX, SHA256_HEX

GPU_NAME = re.compile(r"^[A-Za-z0-9 ._()+-]{1,100}$")


@dataclass(frozen=True)
class AuditRequest:
    candidate_dir: Path
    candidate_manifest: Path
    qualification: Path
    commit: str
    known_good_sha256: str
    required_gpu_name: str | None
    level: str = "full_qualification"
    known_good: Path | None = None  # the descriptor; None reads known-good/<name>.json from the candidate's sdist
    assets_dir: Path | None = None
    profile: str | None = None
    gate_record: Path | None = None  # gate.json, compared with the statements among ``assets_dir``


def validate_request(req: AuditRequest) -> None:
    """Arguments the auditor can refuse before reading anything (exit 1, one named line)."""
    if not COMMIT_HEX.match(req.commit):
        raise VerificationError(f"--commit {req.commit[:50]!r} is not a full 40-hex lower-case sha", check="commit")
    if not SHA256_HEX.match(req.known_good_sha256):
        raise VerificationError("--known-good-sha256 is not 64 lower-case hex digits", check="known_good_sha256")
    if req.level not in policy.LEVELS:
        raise VerificationError(f"--level {req.level[:40]!r} is not one of {list(policy.LEVELS)}", check="level")
    if req.required_gpu_name is not None and not GPU_NAME.match(req.required_gpu_name):
        raise VerificationError("--required-gpu-name is not a plain GPU name", check="gpu_name")
    if req.profile is not None and req.profile not in PROFILES:
        raise VerificationError(f"--profile {req.profile[:40]!r} is not a harness profile", check="profile")

"""How an audit check fails and what its detail says: one named failure, an artifact's bytes, bounded lists."""

from __future__ import annotations

from pathlib import Path

from harness.core.errors import VerificationError
from harness.core.records import Artifact, Qualification
from harness.core.safeio import file_digest, regular_file_size


def require(condition: bool, check: str, message: str) -> None:
    if not condition:
        raise VerificationError(message, check=check)


def verify_file(path: Path, art: Artifact) -> None:
    """``path`` (as located: no symlink below the root it was given in) is a regular file with the artifact's
    bytes; its size is compared before a byte is hashed, and the hash is of the file that was opened."""
    size = regular_file_size(path, art.path, check="artifact_file_type")
    if size != art.bytes:
        raise VerificationError(f"{art.path}: {size} bytes, record says {art.bytes}", check="artifact_bytes")
    hashed, digest = file_digest(path, art.path, check="artifact_file_type")
    if hashed != art.bytes:
        raise VerificationError(f"{art.path} changed while it was read", check="artifact_bytes")
    if digest != art.sha256:
        raise VerificationError(f"{art.path}: sha256 differs from the record", check="artifact_sha256")


DETAIL_CHARS = 500


def every(items: list[str], limit: int = DETAIL_CHARS) -> str:
    """All of ``items`` joined with '; ', or as many whole ones as fit in ``limit`` characters and how many
    more there are (a check's detail is cut at ``limit``)."""
    text = "; ".join(items)
    if len(text) <= limit:
        return text
    for shown in range(len(items) - 1, 0, -1):
        text = "; ".join(items[:shown]) + f"; and {len(items) - shown} more"
        if len(text) <= limit:
            return text
    return items[0][: limit - 3] + "..."


def workloads_first(problems: list[str], q: Qualification) -> list[str]:
    """The problems naming a workload that did not pass before the rest, so that a bounded detail names them all."""
    failed = tuple(f"workload {w.name} " for w in q.workloads if w.status != "passed")
    return sorted(problems, key=lambda p: not p.startswith(failed)) if failed else problems

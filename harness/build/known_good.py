"""The known-good descriptor an audit trusts: a file given by path, or the one inside the candidate's sdist."""

from __future__ import annotations

import tarfile
import zlib
from pathlib import Path

from harness.core.errors import VerificationError
from harness.core.safeio import MANIFEST_MAX_BYTES, read_regular, regular_file_size

MAX_SDIST_MEMBERS = 20_000


def read_known_good(given: Path | None, sdist: Path, version: str, name: str) -> tuple[bytes, str]:
    """``(bytes, where they came from)`` of ``known-good/<name>.json``: ``given`` if set, else from ``sdist``."""
    if given is not None:
        data = read_regular(given, f"--known-good {given.name}", max_bytes=MANIFEST_MAX_BYTES, check="known_good")
        return data, "the given file"
    return _from_sdist(sdist, f"miniverl-{version}/known-good/{name}.json"), "the candidate's sdist"


def _from_sdist(sdist: Path, member: str) -> bytes:
    regular_file_size(sdist, sdist.name, check="known_good")
    try:
        with tarfile.open(sdist, mode="r:gz") as tar:
            for count, info in enumerate(tar, start=1):
                if count > MAX_SDIST_MEMBERS:
                    break
                if info.name != member:
                    continue
                if not info.isreg() or info.size > MANIFEST_MAX_BYTES:
                    raise VerificationError(f"{member} in the sdist is not a small regular file", check="known_good")
                handle = tar.extractfile(info)
                if handle is None:
                    break
                with handle:
                    return handle.read(MANIFEST_MAX_BYTES + 1)[:MANIFEST_MAX_BYTES]
    except (tarfile.TarError, EOFError, OSError, zlib.error) as exc:
        raise VerificationError(f"{sdist.name} cannot be read: {exc.__class__.__name__}", check="known_good") from None
    raise VerificationError(
        f"{sdist.name} holds no {member}; pass --known-good known-good/<profile>.json", check="known_good"
    )

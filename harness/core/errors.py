"""One exception type per failure kind. Each carries the name of the check that failed.

The CLI prints ``harness: error: [<check>] <message>`` on one line and exits non-zero; no traceback.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base class. ``check`` names the failed check; ``exit_code`` is what the CLI returns."""

    check = "harness"
    exit_code = 1

    def __init__(self, message: str, *, check: str | None = None) -> None:
        super().__init__(message)
        if check is not None:
            self.check = check

    def line(self) -> str:
        return f"[{self.check}] {self}"


class UsageError(HarnessError):
    """Bad arguments: the caller must change what they asked for."""

    check = "usage"
    exit_code = 2


class ToolchainError(HarnessError):
    """The pinned build toolchain (build, hatchling, twine) is missing or has other versions."""

    check = "toolchain"


class SourceError(HarnessError):
    """The checkout cannot be exported: not a git repository, unknown commit, dirty when refused."""

    check = "source"


class BuildError(HarnessError):
    """``python -m build`` or ``twine check --strict`` failed."""

    check = "build"


class CandidateError(HarnessError):
    """A candidate directory is not exactly manifest + SHA256SUMS + wheel + sdist, or its bytes differ."""

    check = "candidate"


class RecordError(HarnessError):
    """A record does not validate against its schema, holds NaN, or holds a local path."""

    check = "record"


class StackError(HarnessError):
    """A known-good stack or profile is missing, inconsistent or not the one the record names."""

    check = "known_good"


class InstallError(HarnessError):
    """The fresh virtual environment could not be created or the candidate could not be installed."""

    check = "install"


class ArchiveError(HarnessError):
    """An evidence archive is unsafe (links, devices, ``..``, absolute names, duplicates, size bombs)."""

    check = "archive"


class AssetsError(HarnessError):
    """The release-asset directory cannot be built: missing principal records, wrong layout."""

    check = "release_assets"


class VerificationError(HarnessError):
    """The auditor found a failed check."""

    check = "verification"

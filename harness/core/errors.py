"""One exception type per failure kind. Each carries the name of the check that failed.

The CLI prints ``harness: error: [<check>] <message>`` on one line and exits non-zero; no traceback. A kind
names its default check (and exit code) in its class statement: ``class X(HarnessError, check="x")``.
"""

from __future__ import annotations

from typing import Any


class HarnessError(Exception):
    """Base class. ``check`` names the failed check; ``exit_code`` is what the CLI returns."""

    check = "harness"
    exit_code = 1

    def __init_subclass__(cls, *, check: str | None = None, exit_code: int | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if check is not None:
            cls.check = check
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str, *, check: str | None = None) -> None:
        super().__init__(message)
        if check is not None:
            self.check = check

    def line(self) -> str:
        return f"[{self.check}] {self}"


class UsageError(HarnessError, check="usage", exit_code=2):
    """Bad arguments: the caller must change what they asked for."""


class ToolchainError(HarnessError, check="toolchain"):
    """The pinned build toolchain (build, hatchling, twine) is missing or has other versions."""


class SourceError(HarnessError, check="source"):
    """The checkout cannot be exported: not a git repository, unknown commit, dirty when refused."""


class BuildError(HarnessError, check="build"):
    """``python -m build`` or ``twine check --strict`` failed."""


class CandidateError(HarnessError, check="candidate"):
    """A candidate directory is not exactly manifest + SHA256SUMS + wheel + sdist, or its bytes differ."""


class RecordError(HarnessError, check="record"):
    """A record does not validate against its schema, holds NaN, or holds a local path."""


class StackError(HarnessError, check="known_good"):
    """A known-good stack or profile is missing, inconsistent or not the one the record names."""


class InstallError(HarnessError, check="install"):
    """The fresh virtual environment could not be created or the candidate could not be installed."""


class ArchiveError(HarnessError, check="archive"):
    """An evidence archive is unsafe (links, devices, ``..``, absolute names, duplicates, size bombs)."""


class AssetsError(HarnessError, check="release_assets"):
    """The release-asset directory cannot be built: missing principal records, wrong layout."""


class VerificationError(HarnessError, check="verification"):
    """The auditor found a failed check."""

"""The release gate: one successful manual gpu.yml run (same run, attempt 1), verified through the GitHub API.

Stages, one module each: ``http`` (GitHub REST client, manual redirects, origin-aware headers),
``runs`` (re-check every run and artifact field, pick the run), ``safezip`` (bounded extraction),
``verify`` (candidate check, run bindings, the auditor, outputs) and ``main`` (the command).
"""

from __future__ import annotations

from harness.errors import HarnessError


class GateError(HarnessError):
    """A gate check failed; ``check`` names it (``[check] why`` on stderr, exit 1)."""

    check = "gate"

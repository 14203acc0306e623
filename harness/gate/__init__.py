"""The release gate: one successful manual gpu.yml run (same run, attempt 1), verified through the GitHub API.

Stages, one module each: ``http`` (GitHub REST client, manual redirects, origin-aware headers),
``runs`` (re-check every run and artifact field, pick the run), ``safezip`` (bounded extraction),
``verify`` (candidate check, run bindings, the auditor, outputs) and ``main`` (the command); ``gate.json``'s
records are in :mod:`harness.core.gate_records`, with every other file format.

The last stage: may import every stage below it (audit, evidence, qualify, install, build, core).
"""

from __future__ import annotations

from harness.core.errors import HarnessError


class GateError(HarnessError, check="gate"):
    """A gate check failed; ``check`` names it (``[check] why`` on stderr, exit 1)."""

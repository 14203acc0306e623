"""Evidence bound to the candidate: every CLI invocation of a transcript ran the candidate wheel, from the venv
the install step proved (or, for ``-m miniverl`` under verl's interpreter, from the candidate overlay).

The check reads only the transcript (bounded, strict) and the candidate's wheel sha256, which the judge takes from
the candidate manifest it verified, never from the evidence.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.qualify.full.reading import read_json

CLI_EXECUTABLE = "<venv>/bin/miniverl"
VENV_PREFIX = "<venv>/"
VERL_OVERLAY_PREFIX = "<verl-overlay>/"


def invocation_problem(inv: Any, wheel_sha256: str) -> str | None:
    """Why one transcript invocation is not bound to the candidate, or None."""
    if not isinstance(inv, dict):
        return "an invocation is not an object"
    step = str(inv.get("step"))[:40]
    installed = inv.get("installed")
    if not isinstance(installed, dict):
        return f"{step}: no installed-distribution binding"
    if installed.get("wheel_sha256") != wheel_sha256:
        return f"{step}: ran wheel {str(installed.get('wheel_sha256'))[:16]}..., not the candidate's"
    argv = inv.get("argv")
    program = argv[0] if isinstance(argv, list) and argv else None
    origin, exe = installed.get("import_origin"), installed.get("executable")
    if program == "miniverl":
        if exe != CLI_EXECUTABLE or not isinstance(origin, str) or not origin.startswith(VENV_PREFIX):
            return f"{step}: miniverl from {str(exe)[:60]!r}, package from {str(origin)[:80]!r} (want the venv's)"
    elif not (exe == program and isinstance(origin, str) and origin.startswith(VERL_OVERLAY_PREFIX)):
        return f"{step}: {str(program)[:60]!r} -m miniverl imported {str(origin)[:80]!r} (want the candidate overlay)"
    return None


def transcript_bound(transcript: Path | None, wheel_sha256: str) -> tuple[bool, str]:
    """(passed, detail) for ``candidate_bound`` over one transcript file."""
    doc = read_json(transcript)
    rows = doc.get("invocations") if doc is not None else None
    if not isinstance(rows, list) or not rows:
        return False, "the transcript is missing, unreadable or holds no invocation"
    problems = [p for p in (invocation_problem(inv, wheel_sha256) for inv in rows) if p is not None]
    if problems:
        return False, f"{len(problems)} of {len(rows)} invocations not bound to the candidate: " + "; ".join(
            problems[:3]
        )
    return True, f"all {len(rows)} invocations ran the candidate wheel {wheel_sha256[:16]}... from its proven origin"

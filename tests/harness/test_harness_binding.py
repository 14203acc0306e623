"""Evidence bound to the candidate: every CLI invocation of a transcript names the candidate's wheel and the origins
the install step proved; evidence spliced from another candidate's run fails ``candidate_bound``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, FIXTURES
from harness_helpers import rebind_transcript

from harness.qualify.binding import transcript_bound
from harness.qualify.full import pg_k1
from harness.qualify.full.runner import judged
from harness.qualify.full.scales import SCALES

OURS, THEIRS = "a" * 64, "b" * 64
VENV_FILE = "<venv>/lib/python3.11/site-packages/miniverl/__init__.py"


def _transcript(tmp_path: Path, *invocations: dict[str, Any]) -> Path:
    path = tmp_path / "transcript.json"
    path.write_text(json.dumps({"invocations": list(invocations)}))
    return path


def _cli(**installed: Any) -> dict[str, Any]:
    binding = {"wheel_sha256": OURS, "import_origin": VENV_FILE, "executable": "<venv>/bin/miniverl", **installed}
    return {"step": "run", "argv": ["miniverl", "run"], "exit_code": 0, "installed": binding}


def _verl(**installed: Any) -> dict[str, Any]:
    python = "<verl-venv>/bin/python"
    binding = {
        "wheel_sha256": OURS,
        "import_origin": "<verl-overlay>/miniverl/__init__.py",
        "executable": python,
        **installed,
    }
    return {"step": "diagnose", "argv": [python, "-m", "miniverl", "diagnose"], "exit_code": 0, "installed": binding}


def test_a_transcript_of_the_candidate_is_bound(tmp_path: Path) -> None:
    ok, detail = transcript_bound(_transcript(tmp_path, _cli(), _verl()), OURS)
    assert ok, detail


@pytest.mark.parametrize(
    "invocation",
    [
        _cli(wheel_sha256=THEIRS),  # another candidate's run
        _cli(import_origin="<checkout>/miniverl/__init__.py"),  # the checkout, not the venv
        _cli(executable="<path>/miniverl"),  # another miniverl on PATH
        {**_cli(), "installed": None},  # an origin the install step could not prove
        {k: v for k, v in _cli().items() if k != "installed"},  # a transcript written before the binding existed
        _verl(import_origin=VENV_FILE),  # verl's interpreter imported something other than the overlay
        _verl(executable="<venv>/bin/python"),  # the binding names another interpreter than the one that ran
        _verl(wheel_sha256=THEIRS),
        "not an object",
    ],
)
def test_an_invocation_of_anything_else_is_not(tmp_path: Path, invocation: Any) -> None:
    ok, detail = transcript_bound(_transcript(tmp_path, _cli(), invocation), OURS)
    assert not ok and "1 of 2 invocations" in detail


def test_an_empty_missing_or_garbled_transcript_is_not(tmp_path: Path) -> None:
    assert not transcript_bound(_transcript(tmp_path), OURS)[0]
    assert not transcript_bound(tmp_path / "absent.json", OURS)[0]
    (tmp_path / "garbled.json").write_text("{")
    assert not transcript_bound(tmp_path / "garbled.json", OURS)[0]


def test_evidence_spliced_from_another_candidates_run_fails_its_workload(tmp_path: Path) -> None:
    """Real pg-k1 evidence (captured from another candidate's run) fails candidate_bound as it is, and when it is
    re-bound to a third wheel; only a transcript that names this candidate's wheel passes (every other check of
    the workload is unchanged)."""
    workload = pg_k1.WORKLOAD
    root = FIXTURES / workload.name
    evidence = {role: root / member for role, member in workload.evidence.items() if (root / member).is_file()}

    def bound(wheel_in_transcript: str | None) -> dict[str, bool]:
        ev = dict(evidence)
        if wheel_in_transcript is not None:
            ev["transcript"] = tmp_path / f"transcript-{wheel_in_transcript[:4]}.json"
            ev["transcript"].write_bytes(rebind_transcript(evidence["transcript"].read_bytes(), wheel_in_transcript))
        outcome = judged(workload, ev, CPU, SCALES[CPU.name], wheel_sha256=OURS)
        return {c.name: c.passed for c in outcome.book.checks().executed}

    as_captured, spliced, ours = bound(None), bound(THEIRS), bound(OURS)
    assert as_captured["candidate_bound"] is False and spliced["candidate_bound"] is False
    assert ours["candidate_bound"] is True
    others = {k: v for k, v in ours.items() if k != "candidate_bound"}
    assert others == {k: v for k, v in spliced.items() if k != "candidate_bound"} and all(others.values())

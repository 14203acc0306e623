"""The vLLM refresh run kept as a fixture (tests/harness/full_fixtures/backend-matrix/h100-cu130-vllm/) is the H100
qualification's own: every file is byte-equal to the member of that run's archive, read from git history by the
sha256 stated in test_committed_full_qualification.py (a clone without that history skips), and the judge passes
the boundary on it."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from harness_helpers import FULL_FIXTURES, VLLM_RUN_ON_THE_H100
from test_committed_full_qualification import EXPECTED, _archive

RUN = "2026-12-06-h100-cu130-02b33ed-vllm-full"
FIXTURE = FULL_FIXTURES / "backend-matrix" / VLLM_RUN_ON_THE_H100


def _fixture_files() -> dict[str, bytes]:
    return {p.relative_to(FIXTURE).as_posix(): p.read_bytes() for p in FIXTURE.rglob("*") if p.is_file()}


def test_the_fixture_is_the_h100_runs_own_bytes() -> None:
    shown = _archive(RUN, EXPECTED[RUN])  # by the sha256 the committed-run test states (skips without the history)
    with tarfile.open(fileobj=io.BytesIO(shown)) as packed:
        members = {
            m.name.removeprefix("qual/evidence/"): packed.extractfile(m).read()  # type: ignore[union-attr]
            for m in packed.getmembers()
            if m.isfile() and m.name.startswith("qual/evidence/v011/backend-matrix/refresh/vllm/")
        }
    kept = {name: data for name, data in _fixture_files().items() if name != "README.md"}
    assert len(kept) == 22 and kept == members  # plan-result, engine, plan, summary, metrics, hashes, 8 + 8


def test_the_boundary_passes_on_the_real_vllm_run(tmp_path: Path) -> None:
    from harness.core.profiles import PROFILES
    from harness.qualify.full import refresh
    from harness.qualify.full.base import Judgement
    from harness.qualify.full.scales import SCALES

    evidence: dict[str, Path] = {}
    for role, member in refresh.REFRESH_EVIDENCE.items():
        if (FIXTURE / member).is_file():
            evidence[role] = FIXTURE / member
    judgement = Judgement()
    profile = PROFILES["h100-cu130"]
    refresh._vllm(evidence, judgement, SCALES[profile.name].policy_refreshes)
    assert judgement.checks["vllm_boundary"][0], judgement.checks
    assert judgement.metrics["vllm_version"] == "0.26.0"

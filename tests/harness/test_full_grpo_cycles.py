"""The grpo-cycles workload: its judge on real captured evidence, one bad value per check, hostile evidence."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit

from harness import policy
from harness.full import grpo_cycles
from harness.full.scales import SCALES

W = grpo_cycles.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
_evidence, _judge, _failed, _path = KIT.evidence, KIT.judge, KIT.failed, KIT.path
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set


@pytest.fixture
def ev(tmp_path: Path) -> Path:
    return KIT.copy(tmp_path / "ev")


def _on_cuda(root: Path, peak: int = 2 << 30) -> None:
    """The evidence as an NF4 CUDA run would have it (quantization nf4, a cuda block)."""
    KIT.cuda("summary", peak=peak)(root)
    _edit_json(root, "summary", lambda d: d.update(quantization="nf4"))
    _edit_json(root, "plan", lambda d: d["config"]["models"]["student"].update(quantization="nf4"))


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(checks) == set(policy.required_checks(CPU, "grpo-cycles"))
    assert all(checks.values()), checks


def test_the_evidence_members_are_declared_and_small() -> None:
    members = sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob("*") if p.is_file())
    assert members == sorted(W.evidence.values())
    assert sum((FIXTURE / m).stat().st_size for m in members) < 300_000
    assert all(m.startswith("v012/grpo-cycles/") for m in members)


BAD: dict[str, list[Callable[[Path], None]]] = {
    "reward_varies_within_group": [
        lambda root: _edit_line(root, "metrics", 0, "reward_std_within_group_max", 0.0),
        lambda root: _edit_line(root, "metrics", 1, "reward_std_within_group_max", -1.0),
    ],
    "nonzero_advantages": [
        lambda root: _edit_line(root, "metrics", 1, "nonzero_advantages", 0),
        lambda root: _edit_line(root, "metrics", 0, "nonzero_advantages", True),
    ],
    "two_updates_changed": [
        lambda root: _edit_line(root, "metrics", 1, "adapter_delta_norm", 0.0),
        lambda root: _edit_line(root, "metrics", 0, "adapter_delta_norm", None),
        _set("summary", "updates", 1),
        _set("summary", "quantization", "nf4"),  # a CPU scale declares no quantization
        _exit("run", 1),
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["rollout"].update(samples_per_prompt=3)),
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["models"].update(device="auto")),
    ],
    "verl_plan_compiled": [
        _set("handoff_output", "compiler", "verl-rl-v0.8-multi-gpu"),
        _exit("handoff", 1),
    ],
}


@pytest.mark.parametrize(
    ("check", "index"), [(check, i) for check, changes in BAD.items() for i in range(len(changes))]
)
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_on_a_cuda_nf4_profile_quantization_and_peak_memory_are_judged(ev: Path) -> None:
    assert _failed(ev, CUDA) == {"two_updates_changed", "peak_reserved"}  # unquantized on the CPU, no cuda block
    KIT.plans_on(ev, CUDA)
    _on_cuda(ev)
    assert _failed(ev, CUDA) == set() and "peak_reserved" in _judge(ev, CUDA)
    _on_cuda(ev, peak=int(14.6 * (1 << 30)))
    assert _failed(ev, CUDA) == {"peak_reserved"}


def test_handoff_digests_are_recorded_when_present(ev: Path) -> None:
    j = W.judge(_evidence(ev), CPU, SCALES[CPU.name])
    assert j.metrics["handoff_ir_digest"] == json.loads(_path(ev, "handoff_output").read_text()).get("ir_digest")
    _set("handoff_output", "ir_digest", "not a digest")(ev)
    j = W.judge(_evidence(ev), CPU, SCALES[CPU.name])
    assert j.metrics["handoff_ir_digest"] is None and all(ok for ok, _ in j.checks.values())


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert _failed(ev)

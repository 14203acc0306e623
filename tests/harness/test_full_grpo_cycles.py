"""The grpo-cycles workload: its judge on real captured evidence, one bad value per check, hostile evidence."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit, bad_value_cases, one_advantage_zero, same_rewards

from harness.core import policy
from harness.qualify.full import grpo_cycles
from harness.qualify.full.scales import SCALES

W = grpo_cycles.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
_evidence, _judge, _failed, _path = KIT.evidence, KIT.judge, KIT.failed, KIT.path
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set


def _on_cuda(root: Path, peak: int = 2 << 30) -> None:
    """The evidence as an NF4 CUDA run would have it (quantization nf4, a cuda block)."""
    KIT.cuda("summary", peak=peak)(root)
    _edit_json(root, "summary", lambda d: d.update(quantization="nf4"))
    _edit_json(root, "plan", lambda d: d["config"]["models"]["student"].update(quantization="nf4"))
    _set("handoff_output", "quantization", grpo_cycles.handed_off("nf4"))(root)


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(checks) == set(policy.required_checks(CPU, "grpo-cycles"))
    assert all(checks.values()), checks


def test_the_evidence_members_are_declared_and_small() -> None:
    members = KIT.members()
    assert members == sorted(W.evidence.values())
    assert KIT.fixture_bytes() < 300_000
    assert all(m.startswith("v012/grpo-cycles/") for m in members)


BAD: dict[str, list[Callable[[Path], None]]] = {
    "reward_varies_within_group": [
        lambda root: _edit_line(root, "metrics", 0, "reward_std_within_group_max", 0.0),
        lambda root: _edit_line(root, "metrics", 1, "reward_std_within_group_max", -1.0),
        KIT.forge_trajectories(1, same_rewards),  # the trajectories' rewards do not vary as the metrics say
    ],
    "nonzero_advantages": [
        lambda root: _edit_line(root, "metrics", 1, "nonzero_advantages", 0),
        lambda root: _edit_line(root, "metrics", 0, "nonzero_advantages", True),
        KIT.forge_trajectories(1, one_advantage_zero),  # counted from the trajectories: one fewer than said
    ],
    "two_updates_changed": [
        KIT.tensors_as("checkpoint_2", "checkpoint_1"),  # the second update left every adapter tensor as it was
        KIT.zero_lora_b("checkpoint_1"),  # the first update left the initial LoRA (lora_B all zero)
        KIT.refused("checkpoint_2"),
        _digest("checkpoint_1", "adapter/adapter_model.safetensors"),  # the product misstates its adapter file
        KIT.harness_hash("checkpoint_2", "optimizer.safetensors"),  # ... or the harness found other bytes
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
        _set("handoff_output", "quantization", None),  # no word on what verl receives
        _set("handoff_output", "quantization", {"trained": "none", "handed_off": "none", "carried_over": False}),
        _set("handoff_output", "quantization", grpo_cycles.handed_off("nf4")),  # not what this run trained
    ],
}


@pytest.mark.parametrize(("check", "index"), bad_value_cases(BAD))
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_on_a_cuda_nf4_profile_quantization_and_peak_memory_are_judged(ev: Path) -> None:
    # unquantized on the CPU (its run and its handoff), no cuda block
    assert _failed(ev, CUDA) == {"two_updates_changed", "verl_plan_compiled", "peak_reserved"}
    KIT.plans_on(ev, CUDA)
    _on_cuda(ev)
    assert _failed(ev, CUDA) == set() and "peak_reserved" in _judge(ev, CUDA)
    _on_cuda(ev, peak=int(14.6 * (1 << 30)))
    assert _failed(ev, CUDA) == {"peak_reserved"}


def test_an_nf4_run_must_say_its_quantization_is_not_carried_over(ev: Path) -> None:
    KIT.plans_on(ev, CUDA)
    _on_cuda(ev)
    assert _failed(ev, CUDA) == set()
    assert W.judge(_evidence(ev), CUDA, SCALES[CUDA.name]).metrics["handoff_quantization_carried_over"] is False
    for claimed in (
        {"trained": "nf4", "handed_off": "nf4", "carried_over": True},  # verl 0.9 has no NF4 base
        {"trained": "nf4", "handed_off": "none", "carried_over": True},
        grpo_cycles.handed_off("none"),  # the handoff of an unquantized run
    ):
        _set("handoff_output", "quantization", claimed)(ev)
        assert _failed(ev, CUDA) == {"verl_plan_compiled"}, claimed


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

"""The direct-gkd workload: its judge on real captured evidence, one bad value per check, hostile evidence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit, bad_value_cases

from harness.core import policy
from harness.qualify.full import direct_gkd

W = direct_gkd.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
_evidence, _judge, _failed, _path = KIT.evidence, KIT.judge, KIT.failed, KIT.path
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set


def _cuda(peak: int) -> Callable[[Path], None]:
    return KIT.cuda("a_summary", "b_summary", peak=peak)


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(checks) == set(policy.required_checks(CPU, "direct-gkd"))
    assert all(checks.values()), checks


def test_the_evidence_members_are_declared_and_small() -> None:
    members = KIT.members()
    assert members == sorted(W.evidence.values())
    assert KIT.fixture_bytes() < 300_000


def _distill(key: str, value: Any) -> Callable[[Path], None]:
    return lambda root: _edit_json(root, "a_plan", lambda d: d["config"]["algorithm"]["distill"].update({key: value}))


def _reload(key: str, value: Any) -> Callable[[Path], None]:
    return lambda root: _edit_json(root, "export_output", lambda d: d["reload"].update({key: value}))


BAD: dict[str, list[Callable[[Path], None]]] = {
    "run_completed": [
        _exit("run_a", 1),
        _exit("run_b_extend", 1),
        _exit("export", 1),
        _set("a_summary", "status", "failed"),
        _distill("objective", "exact"),
        _distill("divergence", "reverse_kl"),
        lambda root: _edit_json(
            root, "a_plan", lambda d: d["config"]["models"]["teacher"].update(privileged_context=None)
        ),
        lambda root: _edit_json(root, "a_plan", lambda d: d["config"]["rollout"].update(prompts_per_cycle=1)),
        lambda root: _edit_json(root, "a_plan", lambda d: d["config"]["models"].update(device="auto")),
    ],
    "resume_tensor_exact": [
        KIT.forged("b_checkpoint", "adapter/adapter_model.safetensors"),  # run B really holds other bytes
        KIT.forged("a_checkpoint", "rng.safetensors"),
        KIT.forged("a_checkpoint", "optimizer.safetensors", product=False),  # the product misstates its file
        KIT.refused("b_checkpoint"),
        _digest("b_checkpoint", "adapter/adapter_model.safetensors"),
        _digest("a_checkpoint", "optimizer.safetensors"),
        _digest("b_checkpoint", "rng.safetensors"),
        lambda root: _edit_line(root, "b_metrics", 1, "kl", 0.5),
        _set("b_summary", "resumed_from_step", None),
        lambda root: _edit_json(root, "b_first_output", lambda d: d["summary"].update(updates=2)),
    ],
    "export_reload": [
        _reload("passed", False),
        _reload("max_abs_logit_diff", 1.0),
        _reload("tolerance", 1.0),
        lambda root: _path(root, "export_manifest").write_bytes(b"{}"),
        _set("b_summary", "dtype", "float64"),
    ],
}


@pytest.mark.parametrize(("check", "index"), bad_value_cases(BAD))
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_peak_reserved_is_judged_on_a_cuda_profile(ev: Path) -> None:
    assert _failed(ev, CUDA) == {"run_completed", "peak_reserved"}  # planned on the CPU at reduced size; no cuda block
    KIT.plans_on(ev, CUDA)
    assert _failed(ev, CUDA) == {"peak_reserved"}
    _cuda(2 << 30)(ev)
    assert _failed(ev, CUDA) == set() and "peak_reserved" in _judge(ev, CUDA)
    _cuda(15 << 30)(ev)
    assert _failed(ev, CUDA) == {"peak_reserved"}
    _cuda(0)(ev)
    assert _failed(ev, CUDA) == {"peak_reserved"}


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert _failed(ev)

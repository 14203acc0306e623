"""The pg-k1 workload: its judge on real captured evidence, one bad value per check, hostile evidence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit, bad_value_cases, one_advantage_zero, same_rewards

from harness.core import policy
from harness.qualify.full import pg_k1

W = pg_k1.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
_evidence, _judge, _failed, _path = KIT.evidence, KIT.judge, KIT.failed, KIT.path
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(checks) == set(policy.required_checks(CPU, "pg-k1")) == set(policy.required_checks(CUDA, "pg-k1"))
    assert all(checks.values()), checks


def test_the_evidence_members_are_declared_and_small() -> None:
    members = KIT.members()
    assert members == sorted(W.evidence.values())
    assert KIT.fixture_bytes() < 300_000


def _plan_grpo(key: str, value: Any) -> Callable[[Path], None]:
    return lambda root: _edit_json(root, "plan", lambda d: d["config"]["algorithm"]["grpo"].update({key: value}))


BAD: dict[str, list[Callable[[Path], None]]] = {
    "run_completed": [
        _exit("run", 1),
        _exit("plan", 2),
        _set("summary", "status", "failed"),
        _set("summary", "updates", 1),
        _plan_grpo("kl_estimator", "k3"),
        _plan_grpo("kl_coef", 0.0),
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["models"].update(reference=None)),
        lambda root: _edit_json(
            root, "plan", lambda d: d["config"]["rollout"].update(samples_per_prompt=2)
        ),  # a smaller run than declared
        lambda root: _edit_json(
            root, "plan", lambda d: d["config"]["rollout"].update(max_new_tokens=16)
        ),  # below the GRPO floor of 32
        lambda root: _edit_json(
            root, "plan", lambda d: d["config"]["models"].update(device="auto")
        ),  # another device than the profile's
    ],
    "reward_varies_within_group": [
        lambda root: _edit_line(root, "metrics", 0, "reward_std_within_group_max", 0.0),
        lambda root: _edit_line(root, "metrics", 1, "reward_std_within_group_max", None),
        KIT.forge_trajectories(1, same_rewards),  # the trajectories' rewards do not vary as the metrics say
        KIT.forge_trajectories(2, same_rewards),
    ],
    "nonzero_advantages": [
        lambda root: _edit_line(root, "metrics", 1, "nonzero_advantages", 0),
        lambda root: _edit_line(root, "metrics", 0, "nonzero_advantages", 2.5),
        KIT.forge_trajectories(2, one_advantage_zero),  # counted from the trajectories: one fewer than said
    ],
    "adapter_changed": [
        KIT.tensors_as("checkpoint_2", "checkpoint_1"),  # the second update left every adapter tensor as it was
        KIT.zero_lora_b("checkpoint_1"),  # the first update left the initial LoRA (lora_B all zero)
        KIT.refused("checkpoint_1"),
        _digest("checkpoint_2", "adapter/adapter_model.safetensors"),  # the product misstates its adapter file
        _digest("checkpoint_1", "optimizer.safetensors"),
        lambda root: _edit_line(root, "metrics", 1, "adapter_delta_norm", 0.0),
        _set("summary", "adapter_changed_each_update", False),
    ],
    "kl_measured": [
        lambda root: _edit_line(root, "metrics", 1, "kl", 0.0),
        lambda root: _edit_line(root, "metrics", 0, "kl", None),
        lambda root: _edit_line(root, "metrics", 1, "kl", "0.1"),
    ],
}


@pytest.mark.parametrize(("check", "index"), bad_value_cases(BAD))
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_trajectories_that_are_not_the_committed_ones_fail_both_checks_that_read_them(ev: Path) -> None:
    path = _path(ev, "trajectories_1")
    path.write_text(path.read_text().replace('"advantage":', '"advantage": ', 1))  # other bytes, same rows
    assert _failed(ev) == {"reward_varies_within_group", "nonzero_advantages"}


def test_a_nan_in_the_metrics_fails_without_raising(ev: Path) -> None:
    path = _path(ev, "metrics")
    path.write_text(path.read_text().replace('"kl":', '"kl":NaN,"was_kl":', 1))
    assert {"kl_measured", "run_completed", "adapter_changed"} <= _failed(ev)


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert _failed(ev)

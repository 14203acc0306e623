"""The v0.15 direct-config workload: its judge on real evidence captured from a cpu-reference run
(tests/harness/full_fixtures/direct-config/, laid out by archive member), one bad value per check, hostile
evidence; and its harness inputs (the native GRPO YAML is the example's exact bytes)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit

from harness import policy, registry
from harness.full import direct_config
from harness.full.base import WorkloadFailure
from harness.full.catalog import SUBORDINATE_FOLDERS, archive_members, implemented
from harness.full.scales import SCALES
from harness.proc import HARNESS_DIR

W = direct_config.WORKLOAD
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
CHECKS = policy.required_checks(CPU, W.name)
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set
Edit = Callable[[Path], None]


@pytest.fixture
def ev(tmp_path: Path) -> Path:
    return KIT.copy(tmp_path / "ev")


@pytest.mark.parametrize("profile", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_real_evidence_passes_every_required_check(profile: Any, tmp_path: Path) -> None:
    root = FIXTURE if profile is CPU else KIT.as_cuda(FIXTURE, tmp_path / "cuda")
    checks = KIT.judge(root, profile)
    assert set(checks) == set(policy.required_checks(profile, W.name)) == set(CHECKS)
    assert all(checks.values()), checks


def test_cpu_evidence_does_not_pass_for_a_cuda_profile() -> None:
    assert KIT.failed(FIXTURE, CUDA) == {"run_completed"}  # the plan ran on the CPU


def test_the_evidence_members_are_declared_small_and_portable() -> None:
    members = sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob("*") if p.is_file())
    assert members == sorted(W.evidence.values())
    assert sum((FIXTURE / m).stat().st_size for m in members) < 300_000
    for member in members:
        text = (FIXTURE / member).read_text()
        assert "/tmp/" not in text and "/work/" not in text and "/root" not in text, member


def test_it_is_registered_as_the_v015_subordinate_record() -> None:
    spec = registry.workload(W.name)
    assert spec.provided and spec.provided_by == "harness/full/direct_config.py" and implemented(W.name) is W
    assert spec.asset_role == "subordinate" and SUBORDINATE_FOLDERS[W.name] == "v015"
    assert archive_members()[policy.record_artifact_role(spec)] == "v015/direct-config.json"
    assert all(member.startswith("v015/direct-config/") for member in W.evidence.values())


def test_the_native_input_is_the_examples_exact_bytes() -> None:
    example = HARNESS_DIR.parent / "examples" / "verl-native-grpo.yaml"
    assert (HARNESS_DIR / "workloads" / direct_config.NATIVE).read_bytes() == example.read_bytes()


def test_the_native_ppo_input_is_the_grpo_file_with_a_realistic_critic_and_gae() -> None:
    grpo = (HARNESS_DIR / "workloads" / direct_config.NATIVE).read_text().splitlines()
    ppo = (HARNESS_DIR / "workloads" / direct_config.NATIVE_PPO).read_text().splitlines()
    body = [line for line in ppo if not line.startswith("#")]
    assert "critic:" in body and "  enable: true" in body and "  adv_estimator: gae" in body
    critic = body[body.index("critic:") + 1 : body.index("reward_model: {enable: false}")]
    assert {"  model:", "  optim: {lr: 1.0e-5, clip_grad: 1.0}"} <= set(critic)  # a realistic critic section
    actor = [line for line in grpo if not line.startswith("#")]
    assert body[: body.index("critic:")] == actor[: actor.index("critic: {enable: false}")]


@pytest.mark.parametrize("variant", [direct_config.REPLAY, direct_config.PPO_EPOCHS_2, direct_config.MINI_BATCHES_2])
def test_each_variant_changes_exactly_one_line_of_the_native_file(tmp_path: Path, variant: Any) -> None:
    native = (HARNESS_DIR / "workloads" / direct_config.NATIVE).read_bytes()
    variant.write(native, tmp_path / variant.file)
    old, new = native.decode().splitlines(), (tmp_path / variant.file).read_text().splitlines()
    assert [(a, b) for a, b in zip(old, new, strict=True) if a != b] == [(variant.line[:-1], variant.replacement[:-1])]
    with pytest.raises(WorkloadFailure):
        variant.write(native.replace(variant.line.encode(), b""), tmp_path / "none.yaml")


def _nested(role: str, keys: list[str], value: Any) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return lambda root: _edit_json(root, role, change)


def _diff_entry(key: str, **values: Any) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        for entry in doc["entries"]:
            if entry["key"] == key:
                entry.update(values)

    return lambda root: _edit_json(root, "native_diff", change)


def _invocation(step: str, **values: Any) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        for inv in doc["invocations"]:
            if inv["step"] == step:
                inv.update(values)

    return lambda root: _edit_json(root, "transcript", change)


def _append(role: str, data: bytes) -> Edit:
    return lambda root: KIT.path(root, role).write_bytes(KIT.path(root, role).read_bytes() + data)


def _plan_text(root: Path) -> None:
    def change(doc: dict[str, Any]) -> None:
        native = doc["direct_config"]["native"]
        native["text"] += " "

    _edit_json(root, "plan", change)


BAD: dict[str, list[Edit]] = {
    "run_completed": [
        _exit("run", 1),
        _exit("inspect_3", 1),
        _exit("resume_extend", 124),
        _set("summary", "updates", 2),
        lambda root: _edit_json(
            root, "plan", lambda d: d["config"]["rollout"].update(samples_per_prompt=8)
        ),  # not the native file's rollout.n
        lambda root: _edit_json(root, "plan", lambda d: d["config"]["models"].update(device="auto")),
        _set("summary", "status", "failed"),
        _nested("resume_output", ["summary", "resumed_from_step"], None),
        _nested("run_output", ["summary", "updates"], 1),
        _set("inspect_3", "last_complete_step", 2),
        _nested("plan", ["config", "algorithm", "name"], "ppo"),
        lambda root: _edit_line(root, "metrics", 2, "loss", None),
    ],
    "native_bytes_unchanged": [
        _set("native_sha256", "sha256_after", "0" * 64),
        _set("plan_output", "native_sha256", "1" * 64),
        _plan_text,
        _nested("inspect_2", ["direct_config", "native_sha256_verified"], False),
        _nested("inspect_3", ["direct_config", "native_sha256"], "2" * 64),
        _nested("handoff", ["direct_config", "native_sha256"], "3" * 64),
        _set("native_diff", "native_sha256", "4" * 64),
        _append("bundle_native", b"\n"),
    ],
    "actor_passes": [
        _diff_entry("actor_rollout_ref.actor.ppo_epochs", native=2),
        _diff_entry("actor_rollout_ref.actor.ppo_mini_batch_size", native=1),
        _diff_entry("data.train_batch_size", status="changed"),
        _set("plan", "updates", 4),
        lambda root: _edit_line(root, "metrics", 2, "algorithm_metrics", {"actor/updates": 2.0}),
        lambda root: _edit_line(root, "metrics", 2, "algorithm_metrics", {}),
        lambda root: _edit_line(root, "metrics", 2, "grad_norm", 0.0),
        lambda root: _edit_line(root, "metrics", 2, "adapter_delta_norm", None),
        _set("summary", "adapter_changed_each_update", False),
        _exit("plan_ppo_epochs_2", 0),
        _invocation("plan_mini_batches_2", stderr_last_line="miniverl: error: handoff refused (unknown_native_key): x"),
    ],
    "resume_tensor_exact": [
        KIT.forged("replay_checkpoint_2", "optimizer.safetensors"),  # the replay really holds other bytes
        KIT.forged("checkpoint_2", "adapter/adapter_model.safetensors"),
        KIT.forged("checkpoint_2", "rng.safetensors", product=False),  # the product misstates what it wrote
        KIT.refused("replay_checkpoint_2"),
        _digest("replay_checkpoint_2", "optimizer.safetensors"),
        _digest("replay_checkpoint_2", "rng.safetensors"),
        _digest("checkpoint_2", "adapter/adapter_model.safetensors"),
        _set("replay_summary", "resumed_from_step", None),
        lambda root: _edit_line(root, "replay_metrics", 1, "reward_mean", 0.5),
        _exit("resume_replay", 1),
        _nested("replay_first_output", ["summary", "updates"], 2),
    ],
    "handoff_digests": [
        _set("handoff", "ir_digest", "0" * 64),
        _set("diagnose", "rules_digest", "1" * 64),
        _nested("plan_output", ["handoff", "compiler"], "verl-rl-v0.9-single-gpu-v2"),
        _nested("plan_output", ["handoff", "status"], "refused"),
        _nested("native_diff", ["counts", "changed"], 1),
        _set("native_diff", "semantically_equal", False),
        _nested("bundle_manifest", ["direct_config", "rules_digest"], "5" * 64),
        _exit("handoff", 1),
    ],
    "launch_status": [
        _set("diagnose", "launch_status", "compose_failed"),
        _set("diagnose", "blockers", ["ray_missing"]),
        _set("diagnose", "verl_version", "0.8.0"),
        _exit("diagnose", 1),
    ],
    "native_ppo_refused": [
        _exit("plan_native_ppo", 0),
        _exit("plan_native_ppo", 1),
        _invocation("plan_native_ppo", stderr_last_line="miniverl: error: handoff refused (unknown_native_key): x"),
        _invocation("plan_native_ppo", argv=["plan", "--verl-config", "verl-native-grpo.yaml"]),
    ],
}


def test_every_check_is_seen_failing() -> None:
    assert set(BAD) == set(CHECKS)


@pytest.mark.parametrize(("check", "index"), [(c, i) for c, edits in BAD.items() for i in range(len(edits))])
def test_one_bad_value_fails_exactly_its_check(ev: Path, tmp_path: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert KIT.failed(ev) == {check}
    assert KIT.failed(KIT.as_cuda(ev, tmp_path / "cuda"), CUDA) == {check}


def test_without_verl_the_launch_is_not_diagnosed_and_fails(ev: Path) -> None:
    _edit_json(ev, "diagnose_environment", lambda d: d.update(verl_python=None, reason="no verl 0.9.1 given"))
    KIT.path(ev, "diagnose").unlink()
    judged = W.judge(KIT.evidence(ev), CPU, SCALES["cpu-reference"])
    failed = {name for name, (ok, _) in judged.checks.items() if not ok}
    assert failed == {"launch_status", "handoff_digests"}
    assert "not diagnosed: no verl 0.9.1 given" in judged.checks["launch_status"][1]


def test_a_nan_in_the_metrics_fails_without_raising(ev: Path) -> None:
    path = KIT.path(ev, "metrics")
    path.write_text(path.read_text().replace('"grad_norm":', '"grad_norm":NaN,"was":', 1))
    assert {"run_completed", "actor_passes", "resume_tensor_exact"} <= KIT.failed(ev)


def test_a_replay_line_that_is_not_json_fails_without_raising(ev: Path) -> None:
    _append("replay_metrics", b"{not json}\n")(ev)
    assert KIT.failed(ev) == {"resume_tensor_exact"}


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert KIT.failed(ev)


def test_no_evidence_at_all_fails_every_check() -> None:
    judged = W.judge({}, CPU, SCALES["cpu-reference"])
    assert {name for name, (ok, _) in judged.checks.items() if not ok} == set(CHECKS)


def test_the_details_say_the_optimizer_steps_the_runtime_recorded() -> None:
    judged = W.judge(KIT.evidence(FIXTURE), CPU, SCALES["cpu-reference"])
    assert "optimizer steps per update recorded [1.0, 1.0, 1.0] (want 1 each" in judged.checks["actor_passes"][1]
    assert json.loads(KIT.path(FIXTURE, "native_sha256").read_text())["file"] == direct_config.NATIVE


def test_a_lone_surrogate_in_the_plans_native_text_fails_without_raising(ev: Path) -> None:
    path = KIT.path(ev, "plan")
    path.write_text(path.read_text().replace('"text": "', '"text": "\\ud800', 1))
    assert KIT.failed(ev) == {"native_bytes_unchanged"}

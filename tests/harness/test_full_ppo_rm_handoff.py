"""The v0.13 PPO/RM/handoff judge on real evidence captured from a cpu-reference run
(tests/harness/full_fixtures/ppo-rm-handoff/, laid out by archive member): it passes there, one bad value makes
exactly its check fail, and hostile files fail checks without raising."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CUDA, HOSTILE, EvidenceKit, forge_checkpoint

from harness.core import policy
from harness.core.profiles import PROFILES
from harness.qualify.full import ppo_rm_handoff
from harness.qualify.full.ppo_rm_handoff import WORKLOAD
from harness.qualify.full.scales import SCALES

KIT = EvidenceKit(WORKLOAD)
FIXTURES = KIT.fixture
CPU = PROFILES["cpu-reference"]
SCALE = SCALES["cpu-reference"]
CHECKS = policy.required_checks(CPU, "ppo-rm-handoff")


def _copy(tmp_path: Path) -> dict[str, Path]:
    return KIT.evidence(KIT.copy(tmp_path / "evidence"))


def _failed(evidence: dict[str, Path]) -> set[str]:
    judged = WORKLOAD.judge(evidence, CPU, SCALE)
    assert set(judged.checks) == set(CHECKS)
    return {name for name, (ok, _) in judged.checks.items() if not ok}


def _edit_json(path: Path, edit: Callable[[Any], None]) -> None:
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


def _edit_lines(path: Path, index: int, edit: Callable[[dict[str, Any]], None]) -> None:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines[index])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def _invocation(step: str, **values: Any) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for inv in doc["invocations"]:
            if inv["step"] == step:
                inv.update(values)

    return edit


def _line(role: str, index: int, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: _edit_lines(ev[role], index, lambda line: line.update(values))


def _top(role: str, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: _edit_json(ev[role], lambda doc: doc.update(values))


def _step(step: str, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: _edit_json(ev["transcript"], _invocation(step, **values))


def _same_as_step2(name: str) -> Callable[[dict[str, Path]], None]:
    """The harness found checkpoint 2's bytes of ``name`` in checkpoint 1 too (and the product says so): that
    update changed nothing."""

    def mutate(ev: dict[str, Path]) -> None:
        after = json.loads(ev["state_hashes"].read_text())["checkpoints"]["checkpoint_2"]["files"][name]["sha256"]
        forge_checkpoint(
            ev["state_hashes"], ev["checkpoint_1"], "checkpoint_1", name, after, product=True, harness=True
        )

    return mutate


def _forged(label: str, name: str, *, product: bool = True, harness: bool = True) -> Callable[[dict[str, Path]], None]:
    return lambda ev: forge_checkpoint(ev["state_hashes"], ev[label], label, name, "f" * 64, product=product,
                                       harness=harness)  # fmt: skip


def _algo(key: str, value: Any, index: int = 1, role: str = "metrics") -> Callable[[dict[str, Path]], None]:
    return lambda ev: _edit_lines(ev[role], index, lambda line: line["algorithm_metrics"].update({key: value}))


def _rm_score(ev: dict[str, Path]) -> None:
    lines = [json.loads(x) for x in ev["resumed_trajectories_2"].read_text().splitlines()]
    lines[0]["reward_components"]["reward_model"] += 0.5
    ev["resumed_trajectories_2"].write_text("".join(json.dumps(x) + "\n" for x in lines))


def _flat_advantages(ev: dict[str, Path]) -> None:
    def edit(line: dict[str, Any]) -> None:
        extra = line["algorithm_metrics"]
        extra["critic/advantages/min"] = extra["critic/advantages/max"]

    _edit_lines(ev["metrics"], 1, edit)


def _manifest_digest(ev: dict[str, Path]) -> None:
    _edit_json(ev["bundle_manifest"], lambda d: d.update(ir_digest="0" * 64))


MUTATIONS: list[tuple[str, str, Callable[[dict[str, Path]], None]]] = [
    ("actor_delta_zero", "actor_updates", _line("metrics", 1, adapter_delta_norm=0.0)),
    ("actor_adapter_unchanged", "actor_updates", _same_as_step2("adapter/adapter_model.safetensors")),
    ("actor_no_optimizer_step", "actor_updates", _algo("actor/updates", 0.0, 0)),
    ("critic_delta_zero", "critic_updates", _algo("critic/delta_norm", 0.0, 0)),
    ("critic_params_unchanged", "critic_updates", _same_as_step2("critic_params.safetensors")),
    ("advantages_all_equal", "gae_nontrivial", _flat_advantages),
    ("returns_zero", "gae_nontrivial", _algo("critic/returns/mean", 0.0, 0)),
    ("no_nonzero_advantages", "gae_nontrivial", _line("metrics", 0, nonzero_advantages=0)),
    ("resumed_critic_optimizer_differs", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "critic_optimizer.safetensors")),
    ("resumed_adapter_differs", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "adapter/adapter_model.safetensors")),
    ("harness_found_other_resumed_rng", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "rng.safetensors")),
    ("resume_exit_1", "resume_tensor_exact", _step("resume_extend", exit_code=1)),
    ("rm_score_not_deterministic", "reward_model", _rm_score),
    ("rm_constant", "reward_model", _algo("reward_model/std", 0.0, 0, "resumed_metrics")),
    ("launch_blocked", "handoff", _top("diagnose", launch_status="compose_failed")),
    ("compiler_v1", "handoff", _top("handoff", compiler="verl-rl-v0.9-single-gpu-v1")),
    ("manifest_digest_differs", "handoff", _manifest_digest),
    ("other_verl", "handoff", _top("diagnose", verl_version="0.8.0")),
    ("diagnose_exit_1", "handoff", _step("diagnose", exit_code=1)),
    ("no_verl", "handoff", _top("diagnose_environment", verl_python=None)),
]  # fmt: skip


def test_the_judge_passes_on_real_cpu_reference_evidence(tmp_path: Path) -> None:
    evidence = _copy(tmp_path)
    assert set(evidence) == set(WORKLOAD.evidence)
    judged = WORKLOAD.judge(evidence, CPU, SCALE)
    assert {n: ok for n, (ok, _) in judged.checks.items()} == dict.fromkeys(CHECKS, True), judged.checks
    assert judged.metrics["reward_source"] == "tiny" and judged.metrics["updates"] == 2


def test_the_fixtures_are_small_and_portable() -> None:
    total = sum(p.stat().st_size for p in FIXTURES.rglob("*") if p.is_file())
    assert total < 300_000
    for path in FIXTURES.rglob("*.json"):
        assert "/tmp/" not in path.read_text() and "/work/" not in path.read_text(), path


@pytest.mark.parametrize(("label", "check", "mutate"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_one_bad_value_fails_exactly_its_check(
    tmp_path: Path, label: str, check: str, mutate: Callable[[dict[str, Path]], None]
) -> None:
    evidence = _copy(tmp_path)
    mutate(evidence)
    assert _failed(evidence) == {check}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda ev: _edit_json(ev["plan"], lambda d: d["config"]["rollout"].update(samples_per_prompt=2)),
        lambda ev: _edit_json(ev["plan"], lambda d: d["config"]["models"].update(device="auto")),
    ],
    ids=["smaller_than_declared", "other_device"],
)
def test_a_plan_not_at_the_declared_scale_fails_every_check_of_that_run(
    tmp_path: Path, mutate: Callable[[dict[str, Path]], None]
) -> None:
    evidence = _copy(tmp_path)
    mutate(evidence)
    assert _failed(evidence) == {"actor_updates", "critic_updates", "gae_nontrivial", "reward_model"}


@pytest.mark.parametrize(
    "mutate",
    [
        _forged("checkpoint_2", "critic_params.safetensors", harness=False),  # the product misstates a file
        _forged("checkpoint_2", "state.json", product=False),  # ... or the harness found other bytes
        lambda ev: ev["state_hashes"].unlink(),
    ],
    ids=["product_misstates", "harness_found_other_bytes", "no_harness_hashes"],
)
def test_a_checkpoint_the_harness_cannot_vouch_for_fails_every_check_that_reads_it(
    tmp_path: Path, mutate: Callable[[dict[str, Path]], None]
) -> None:
    evidence = _copy(tmp_path)
    mutate(evidence)
    assert _failed(evidence) == {"actor_updates", "critic_updates", "resume_tensor_exact", "reward_model"}


def test_on_cpu_the_reward_model_offload_measured_nothing_and_is_not_applicable(tmp_path: Path) -> None:
    judged = WORKLOAD.judge(_copy(tmp_path), CPU, SCALE)
    assert "reward_model_offloaded" not in judged.checks and "reward_model_offloaded" not in CHECKS
    assert judged.inapplicable == {"reward_model_offloaded": ppo_rm_handoff.OFFLOAD_NOT_MEASURED}
    assert "reward_model_offloaded" in policy.required_checks(CUDA, "ppo-rm-handoff")


def test_on_cuda_the_reward_model_offload_is_judged_from_both_runs(tmp_path: Path) -> None:
    root = KIT.as_cuda(FIXTURES, tmp_path / "cuda")
    judged = WORKLOAD.judge(KIT.evidence(root), CUDA, SCALES[CUDA.name])
    assert judged.checks["reward_model_offloaded"][0] and not judged.inapplicable
    for index, role in ((1, "metrics"), (0, "resumed_metrics")):
        _algo("reward_model/offloaded_after_phase", 0.0, index, role)(KIT.evidence(root))
        judged = WORKLOAD.judge(KIT.evidence(root), CUDA, SCALES[CUDA.name])
        assert {n for n, (ok, _) in judged.checks.items() if not ok} == {"reward_model_offloaded"}
        _algo("reward_model/offloaded_after_phase", 1.0, index, role)(KIT.evidence(root))


def test_every_check_is_seen_failing() -> None:
    assert {m[1] for m in MUTATIONS} == set(CHECKS)


@pytest.mark.parametrize("role", sorted(WORKLOAD.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(tmp_path: Path, role: str, kind: str) -> None:
    root = KIT.copy(tmp_path / "evidence")
    KIT.spoil(root, role, kind)
    assert _failed(KIT.evidence(root)), f"{kind} {role} passed every check"


def test_no_evidence_at_all_fails_every_check() -> None:
    assert _failed({}) == set(CHECKS)

"""The v0.14 product-walkthrough judge on real evidence captured from a cpu-reference run
(tests/harness/full_fixtures/product-workflows/, laid out by archive member): it passes there, one bad value makes
exactly its check fail, and hostile files fail checks without raising."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, HOSTILE, EvidenceKit, edit_json_file, forge_checkpoint

from harness.core import policy, registry
from harness.core.profiles import PROFILES
from harness.qualify.full.product_workflows import WORKLOAD
from harness.qualify.full.product_workflows_judge import VRAM_NOT_MEASURED
from harness.qualify.full.product_workflows_layout import CASE_STEPS, PRODUCT_WORKFLOW_INVOCATIONS, Walkthrough
from harness.qualify.full.scales import SCALES

KIT = EvidenceKit(WORKLOAD)
CHECKS = policy.required_checks(CPU, "product-workflows")
CUDA_PEAKS = {"peak_reserved_bytes": 1 << 30, "peak_allocated_bytes": 1 << 29}


def _fetch(**values: Any) -> Callable[[dict[str, Path]], None]:
    def edit(doc: Any) -> None:
        doc["invocations"][0].update(values)

    return lambda ev: edit_json_file(ev["transcript"], edit)


def _drop_fetch(ev: dict[str, Path]) -> None:
    edit_json_file(ev["transcript"], lambda doc: doc["invocations"].pop(0))


def _digest(role: str, name: str) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev[role], lambda doc: doc["files"][name].update(sha256="0" * 64))


def _forged(label: str, name: str, *, product: bool = True) -> Callable[[dict[str, Path]], None]:
    return lambda ev: forge_checkpoint(ev["state_hashes"], ev[label], label, name, "f" * 64, product=product,
                                       harness=True)  # fmt: skip


def _duplicate_line(ev: dict[str, Path]) -> None:
    path = ev["grpo_replay_metrics"]
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "".join(lines))


def _duplicate_checkpoint(ev: dict[str, Path]) -> None:
    edit_json_file(ev["ppo_inspect"], lambda doc: doc["checkpoints"].append(doc["checkpoints"][-1]))


def _cuda_on_cpu(ev: dict[str, Path]) -> None:
    edit_json_file(ev["ppo_replay_summary"], lambda doc: doc.update(cuda=dict(CUDA_PEAKS)))


def _on_device(role: str, device: str) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev[role], lambda doc: doc.update(device=device))


def _not_a_compiler(doc: Any) -> None:
    doc["compiler"] = "not-a-verl-compiler"


def _everywhere_not_a_compiler(ev: dict[str, Path]) -> None:
    """The three files agree with each other, on a compiler that is not verl's."""
    for case in ("ppo", "grpo"):
        edit_json_file(ev[f"{case}_handoff"], _not_a_compiler)
        edit_json_file(ev[f"{case}_diagnose"], _not_a_compiler)
    edit_json_file(ev["walkthrough"], lambda d: [_not_a_compiler(c) for c in d["cases"]])


def _plan_handoff(case: str, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev[f"{case}_plan"], lambda doc: doc["handoff"].update(values))


def _everywhere_plan_too_not_a_compiler(ev: dict[str, Path]) -> None:
    """The plans, handoffs, diagnoses and walkthrough all agree, on a compiler that is not verl's."""
    _everywhere_not_a_compiler(ev)
    for case in ("ppo", "grpo"):
        _plan_handoff(case, compiler="not-a-verl-compiler")(ev)


def _compilers_swapped(ev: dict[str, Path]) -> None:
    """Each case names the other case's (real) compiler, in all three files."""
    swap = {
        "verl-rl-v0.9-single-gpu-v1": "verl-rl-v0.9-single-gpu-v2",
        "verl-rl-v0.9-single-gpu-v2": "verl-rl-v0.9-single-gpu-v1",
    }

    def edit(doc: Any) -> None:
        doc["compiler"] = swap[doc["compiler"]]

    for case in ("ppo", "grpo"):
        edit_json_file(ev[f"{case}_handoff"], edit)
        edit_json_file(ev[f"{case}_diagnose"], edit)
    edit_json_file(ev["walkthrough"], lambda d: [edit(c) for c in d["cases"]])


def _walk(edit: Callable[[Any], None]) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev["walkthrough"], edit)


MUTATIONS: list[tuple[str, str, Callable[[dict[str, Path]], None]]] = [
    ("fetch_exit_1", "cli_invocations", _fetch(exit_code=1)),
    ("fetch_timed_out", "cli_invocations", _fetch(timed_out=True)),
    ("fetch_renamed", "cli_invocations", _fetch(step="doctor")),
    ("fetch_unhashed", "cli_invocations", _fetch(stdout_sha256="not-a-digest")),
    ("fetch_missing", "cli_invocations", _drop_fetch),
    ("ppo_critic_replay_differs", "tensor_replay", _forged("ppo_replay_checkpoint", "critic_params.safetensors")),
    ("grpo_optimizer_replay_differs", "tensor_replay", _forged("grpo_replay_checkpoint", "optimizer.safetensors")),
    ("ppo_product_misstates", "tensor_replay", _digest("ppo_checkpoint", "critic_params.safetensors")),
    ("grpo_harness_other_bytes", "tensor_replay", _forged("grpo_checkpoint", "rng.safetensors", product=False)),
    ("no_harness_hashes", "tensor_replay", lambda ev: ev["state_hashes"].unlink()),
    ("metrics_line_duplicated", "records_unduplicated", _duplicate_line),
    ("checkpoint_listed_twice", "records_unduplicated", _duplicate_checkpoint),
    ("cuda_block_on_cpu", "walkthrough_record", _cuda_on_cpu),
    ("device_misreported", "walkthrough_record", _on_device("grpo_summary", "cuda")),
    ("reward_misreported", "walkthrough_record", _walk(lambda d: d["cases"][0]["rewards"].__setitem__(0, 9.0))),
    ("exit_misreported", "walkthrough_record", _walk(lambda d: d["cases"][1]["invocations"][0].update(exit_code=1))),
    ("models_misreported", "walkthrough_record", _walk(lambda d: d["cases"][0].update(models={}))),
    ("extra_field", "walkthrough_record", _walk(lambda d: d.update(note="x"))),
    ("compiler_in_handoff", "walkthrough_record", lambda ev: edit_json_file(ev["ppo_handoff"], _not_a_compiler)),
    ("compiler_in_diagnose", "walkthrough_record", lambda ev: edit_json_file(ev["grpo_diagnose"], _not_a_compiler)),
    ("compiler_in_walkthrough", "walkthrough_record", _walk(lambda d: _not_a_compiler(d["cases"][0]))),
    ("compiler_in_ppo_handoff", "walkthrough_record", lambda ev: edit_json_file(ev["ppo_handoff"], _not_a_compiler)),
    ("compiler_in_grpo_handoff", "walkthrough_record", lambda ev: edit_json_file(ev["grpo_handoff"], _not_a_compiler)),
    ("compiler_in_ppo_diagnose", "walkthrough_record", lambda ev: edit_json_file(ev["ppo_diagnose"], _not_a_compiler)),
    ("compiler_in_grpo_walkthrough", "walkthrough_record", _walk(lambda d: _not_a_compiler(d["cases"][1]))),
    ("compiler_everywhere", "walkthrough_record", _everywhere_not_a_compiler),
    ("compiler_everywhere_plan_too", "walkthrough_record", _everywhere_plan_too_not_a_compiler),
    ("compiler_in_plan", "walkthrough_record", _plan_handoff("grpo", compiler="not-a-verl-compiler")),
    ("plan_handoff_refused", "walkthrough_record", _plan_handoff("ppo", status="refused")),
    ("plan_rules_differ", "walkthrough_record", _plan_handoff("ppo", rules_digest="0" * 64)),
    (
        "diagnose_rules_differ",
        "walkthrough_record",
        lambda ev: edit_json_file(ev["grpo_diagnose"], lambda d: d.update(rules_digest="1" * 64)),
    ),
    (
        "diagnose_ir_differs",
        "walkthrough_record",
        lambda ev: edit_json_file(ev["ppo_diagnose"], lambda d: d.update(ir_digest="2" * 64)),
    ),
    ("compilers_swapped", "walkthrough_record", _compilers_swapped),
    (
        "ppo_smaller_than_declared",
        "walkthrough_record",
        lambda ev: edit_json_file(ev["ppo_plan"], lambda d: d["config"]["rollout"].update(samples_per_prompt=2)),
    ),
    (
        "grpo_other_device",
        "walkthrough_record",
        lambda ev: edit_json_file(ev["grpo_plan"], lambda d: d["config"]["models"].update(device="auto")),
    ),
    (
        "grpo_plan_not_the_run_plan",
        "walkthrough_record",
        lambda ev: edit_json_file(ev["grpo_plan"], lambda d: d.update(plan_digest="0" * 64)),
    ),
]


def test_the_declared_invocations_are_25_distinct_steps() -> None:
    assert len(PRODUCT_WORKFLOW_INVOCATIONS) == 25 == 1 + 2 * len(CASE_STEPS)
    assert len(set(PRODUCT_WORKFLOW_INVOCATIONS)) == 25
    assert registry.workload("product-workflows").provided


def test_the_judge_passes_on_real_cpu_reference_evidence(tmp_path: Path) -> None:
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    assert set(evidence) == set(WORKLOAD.evidence)
    checks = KIT.judged(evidence)
    assert {n: ok for n, (ok, _) in checks.items()} == dict.fromkeys(CHECKS, True), checks
    walk = Walkthrough.model_validate_json(evidence["walkthrough"].read_bytes())
    assert [c.case for c in walk.cases] == ["ppo", "grpo"]
    assert all(len(c.rewards) == 2 and len(c.losses) == 2 and c.models for c in walk.cases)
    steps = [inv["step"] for inv in json.loads(evidence["transcript"].read_text())["invocations"]]
    assert steps == list(PRODUCT_WORKFLOW_INVOCATIONS)


def test_the_fixtures_are_small_and_portable() -> None:
    KIT.assert_small_and_portable()


@pytest.mark.parametrize(("label", "check", "mutate"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_one_bad_value_fails_exactly_its_check(
    tmp_path: Path, label: str, check: str, mutate: Callable[[dict[str, Path]], None]
) -> None:
    assert KIT.failed_after(tmp_path, mutate) == {check}


def test_on_cpu_vram_measured_nothing_and_is_not_applicable(tmp_path: Path) -> None:
    judged = WORKLOAD.judge(KIT.evidence_copy(tmp_path / "evidence"), CPU, SCALES[CPU.name])
    assert judged.inapplicable == {"vram_measured": VRAM_NOT_MEASURED}
    assert "vram_measured" not in CHECKS and "vram_measured" in policy.required_checks(
        PROFILES["h200-cu130"], "product-workflows"
    )


def test_every_check_is_seen_failing() -> None:
    assert {m[1] for m in MUTATIONS} == set(CHECKS)


def test_vram_on_a_cuda_profile_needs_measured_peaks(tmp_path: Path) -> None:
    """The CPU evidence has no CUDA peaks, so a CUDA profile fails vram_measured; with peaks in every summary
    (what a CUDA run records) it passes."""
    cuda = PROFILES["h200-cu130"]
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    assert "vram_measured" in KIT.failed_checks(evidence, cuda)
    for role in [r for r in evidence if r.endswith("summary")]:
        edit_json_file(evidence[role], lambda doc: doc.update(cuda=dict(CUDA_PEAKS)))
    assert "vram_measured" not in KIT.failed_checks(evidence, cuda)
    edit_json_file(evidence["grpo_summary"], lambda doc: doc["cuda"].update(peak_reserved_bytes=0))
    assert "vram_measured" in KIT.failed_checks(evidence, cuda)


@pytest.mark.parametrize("role", sorted(WORKLOAD.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(tmp_path: Path, role: str, kind: str) -> None:
    assert KIT.failed_when_spoiled(tmp_path, role, kind), f"{kind} {role} passed every check"


def test_no_evidence_at_all_fails_every_check() -> None:
    assert KIT.failed_checks({}) == set(CHECKS)

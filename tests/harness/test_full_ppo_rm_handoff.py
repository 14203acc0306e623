"""The v0.13 PPO/RM/handoff judge on real evidence captured from a cpu-reference run
(tests/harness/full_fixtures/ppo-rm-handoff/, laid out by archive member): it passes there, one bad value makes
exactly its check fail, and hostile files fail checks without raising."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit, edit_json_file, edit_jsonl_line, forge_checkpoint

from harness.core import policy
from harness.qualify.full import gae, ppo_rm_handoff
from harness.qualify.full.ppo_rm_handoff import WORKLOAD
from harness.qualify.full.scales import SCALES

KIT = EvidenceKit(WORKLOAD)
FIXTURES = KIT.fixture
SCALE = SCALES[CPU.name]
CHECKS = policy.required_checks(CPU, "ppo-rm-handoff")


def _invocation(step: str, **values: Any) -> Callable[[Any], None]:
    def edit(doc: Any) -> None:
        for inv in doc["invocations"]:
            if inv["step"] == step:
                inv.update(values)

    return edit


def _line(role: str, index: int, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_jsonl_line(ev[role], index, lambda line: line.update(values))


def _top(role: str, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev[role], lambda doc: doc.update(values))


def _step(step: str, **values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev["transcript"], _invocation(step, **values))


def _same_as_step2(name: str) -> Callable[[dict[str, Path]], None]:
    """The harness found checkpoint 2's bytes of ``name`` in checkpoint 1 too (and the product says so): that
    update changed nothing."""

    def mutate(ev: dict[str, Path]) -> None:
        after = json.loads(ev["state_hashes"].read_text())["checkpoints"]["checkpoint_2"]["files"][name]["sha256"]
        for label in ("checkpoint_1", "interrupted_checkpoint_1"):  # the same bytes: the stop left step 1 as it was
            forge_checkpoint(ev["state_hashes"], ev[label], label, name, after, product=True, harness=True)

    return mutate


def _forged(label: str, name: str, *, product: bool = True, harness: bool = True) -> Callable[[dict[str, Path]], None]:
    return lambda ev: forge_checkpoint(ev["state_hashes"], ev[label], label, name, "f" * 64, product=product,
                                       harness=harness)  # fmt: skip


def _algo(key: str, value: Any, index: int = 1, role: str = "metrics") -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_jsonl_line(ev[role], index, lambda line: line["algorithm_metrics"].update({key: value}))


def _rm_score(ev: dict[str, Path]) -> None:
    lines = [json.loads(x) for x in ev["resumed_trajectories_2"].read_text().splitlines()]
    lines[0]["reward_components"]["reward_model"] += 0.5
    ev["resumed_trajectories_2"].write_text("".join(json.dumps(x) + "\n" for x in lines))


def _rebind_trajectories(ev: dict[str, Path], step: int) -> None:
    """Checkpoint 2's listing names the edited trajectories file's sha256, and the harness's record of that listing
    follows: only the GAE numbers inside differ from what the run wrote."""
    name = f"cycle-{step:06d}.jsonl"
    listing = json.loads(ev["checkpoint_2"].read_text())
    listing["trajectories"][name] = hashlib.sha256(ev[f"trajectories_{step}"].read_bytes()).hexdigest()
    ev["checkpoint_2"].write_text(json.dumps(listing))
    record = json.loads(ev["state_hashes"].read_text())
    record["checkpoints"]["checkpoint_2"]["checkpoint_json_sha256"] = hashlib.sha256(
        ev["checkpoint_2"].read_bytes()
    ).hexdigest()
    ev["state_hashes"].write_text(json.dumps(record))


def _gae_edit(step: int, edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[dict[str, Path]], None]:
    def mutate(ev: dict[str, Path]) -> None:
        lines = [json.loads(x) for x in ev[f"trajectories_{step}"].read_text().splitlines()]
        edit(lines)
        ev[f"trajectories_{step}"].write_text("".join(json.dumps(x) + "\n" for x in lines))
        _rebind_trajectories(ev, step)

    return mutate


def _bump(key: str, index: int, by: float) -> Callable[[list[dict[str, Any]]], None]:
    def edit(lines: list[dict[str, Any]]) -> None:
        lines[0]["gae"][key][index] += by

    return edit


def _reward_edited(lines: list[dict[str, Any]]) -> None:
    """The record's score and its last token's reward both moved (consistently): the product's GAE is not theirs."""
    n = len(lines[0]["response_token_ids"])
    lines[0]["reward"] += 0.25
    lines[0]["gae"]["rewards"][n - 1] += 0.25


def _no_gae(lines: list[dict[str, Any]]) -> None:
    del lines[0]["gae"]


def _other_updates_gae(ev: dict[str, Path]) -> None:
    """Update 1's records carry update 2's GAE rows (each record's own row of the other update)."""
    other = [json.loads(x)["gae"] for x in ev["trajectories_2"].read_text().splitlines()]

    def edit(lines: list[dict[str, Any]]) -> None:
        for line, row in zip(lines, other, strict=True):
            line["gae"] = row

    _gae_edit(1, edit)(ev)


def _consistent(lines: list[dict[str, Any]], values: Callable[[int, list[float]], list[float]]) -> None:
    """New critic values (and, when they make everything zero, zero scores), with the advantages, returns and
    whitened advantages recomputed by the judge's own GAE: a product that claims exactly what it computed."""
    rows = gae.GaeRows([x["gae"]["mask"] for x in lines], [x["gae"]["rewards"] for x in lines], [])
    rows.values = [values(i, x["gae"]["values"]) for i, x in enumerate(lines)]
    adv, ret = gae.gae(rows, 1.0, 0.95)
    white = gae.whiten(adv, rows.mask)
    for i, line in enumerate(lines):
        n = sum(rows.mask[i])
        line["gae"].update(values=rows.values[i], advantages=adv[i], returns=ret[i], whitened_advantages=white[i])
        line["advantage"] = sum(white[i][:n]) / n


def _constant_values(lines: list[dict[str, Any]]) -> None:
    _consistent(lines, lambda i, row: [0.5 if m else 0.0 for m in lines[i]["gae"]["mask"]])


def _all_zero(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        line["reward"] = 0.0
        line["gae"]["rewards"] = [0.0] * len(line["gae"]["rewards"])
    _consistent(lines, lambda i, row: [0.0] * len(row))


def _plan_ppo(**values: Any) -> Callable[[dict[str, Path]], None]:
    return lambda ev: edit_json_file(ev["plan"], lambda d: d["config"]["algorithm"]["ppo"].update(values))


def _stderr(edit: Callable[[list[str]], list[str]], *, rebind: bool = True) -> Callable[[dict[str, Path]], None]:
    """The interrupted run's kept stderr, edited line by line; with ``rebind`` the transcript's sha256 of that
    invocation's stderr follows (a forger who fixed the transcript too)."""

    def mutate(ev: dict[str, Path]) -> None:
        path = ev["interrupted_stderr"]
        path.write_text("".join(line + "\n" for line in edit(path.read_text().splitlines())))
        if rebind:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            edit_json_file(ev["transcript"], _invocation(ppo_rm_handoff.INTERRUPTED_STEP, stderr_sha256=digest))

    return mutate


def _went_on(lines: list[str]) -> list[str]:
    """The run printed its critic pass after the actor pass: the stop landed outside the actor pass."""
    at = next(i for i, line in enumerate(lines) if "cycle 2/2 actor_pass" in line)
    return [*lines[: at + 1], lines[at].replace("actor_pass", "critic_pass"), *lines[at + 1 :]]


def _never_interrupted(lines: list[str]) -> list[str]:
    return [line for line in lines if "interrupted" not in line]


def _first_update_event(ev: dict[str, Path]) -> None:
    """The recorded event is cycle 1's progress line: the signal went out in another update."""
    first = next(line for line in ev["interrupted_stderr"].read_text().splitlines() if "cycle 1/2 update" in line)
    edit_json_file(ev["interrupt"], lambda d: d.update(event=first))


def _manifest_digest(ev: dict[str, Path]) -> None:
    edit_json_file(ev["bundle_manifest"], lambda d: d.update(ir_digest="0" * 64))


MUTATIONS: list[tuple[str, str, Callable[[dict[str, Path]], None]]] = [
    ("actor_delta_zero", "actor_updates", _line("metrics", 1, adapter_delta_norm=0.0)),
    ("actor_adapter_unchanged", "actor_updates", _same_as_step2("adapter/adapter_model.safetensors")),
    ("actor_no_optimizer_step", "actor_updates", _algo("actor/updates", 0.0, 0)),
    ("critic_delta_zero", "critic_updates", _algo("critic/delta_norm", 0.0, 0)),
    ("critic_params_unchanged", "critic_updates", _same_as_step2("critic_params.safetensors")),
    ("gae_row_missing", "gae_nontrivial", _gae_edit(2, _no_gae)),
    ("gae_rows_of_the_other_update", "gae_nontrivial", _other_updates_gae),
    ("gae_reward_edited", "gae_nontrivial", _gae_edit(1, _reward_edited)),
    ("gae_value_edited", "gae_nontrivial", _gae_edit(2, _bump("values", 0, 0.01))),
    ("gae_advantage_edited", "gae_nontrivial", _gae_edit(1, _bump("advantages", 0, 1e-5))),
    ("gae_return_edited", "gae_nontrivial", _gae_edit(2, _bump("returns", 1, 1e-5))),
    ("gae_whitened_edited", "gae_nontrivial", _gae_edit(1, _bump("whitened_advantages", 0, 1e-5))),
    ("gae_gamma_not_the_plans", "gae_nontrivial", _plan_ppo(gamma=0.9)),
    ("gae_lambda_not_the_plans", "gae_nontrivial", _plan_ppo(lam=1.0)),
    ("gae_values_constant", "gae_nontrivial", _gae_edit(1, _constant_values)),
    ("gae_all_zero", "gae_nontrivial", _gae_edit(2, _all_zero)),
    ("resumed_critic_optimizer_differs", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "critic_optimizer.safetensors")),
    ("resumed_adapter_differs", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "adapter/adapter_model.safetensors")),
    ("harness_found_other_resumed_rng", "resume_tensor_exact",
     _forged("resumed_checkpoint_2", "rng.safetensors")),
    ("resume_exit_1", "resume_tensor_exact", _step("resume", exit_code=1)),
    ("no_interrupt_record", "resume_tensor_exact", lambda ev: ev["interrupt"].unlink()),
    ("no_interrupted_stderr", "resume_tensor_exact", lambda ev: ev["interrupted_stderr"].unlink()),
    ("stderr_not_the_transcripts", "resume_tensor_exact", _stderr(lambda ls: [*ls, "x"], rebind=False)),
    ("went_on_after_the_actor_pass", "resume_tensor_exact", _stderr(_went_on)),
    ("never_interrupted", "resume_tensor_exact", _stderr(_never_interrupted)),
    ("event_in_the_first_update", "resume_tensor_exact", _first_update_event),
    ("never_signalled", "resume_tensor_exact", _top("interrupt", signalled=False)),
    ("sigkill_not_sigterm", "resume_tensor_exact", _top("interrupt", signal="SIGKILL")),
    ("interrupted_exit_0", "resume_tensor_exact", _step(ppo_rm_handoff.INTERRUPTED_STEP, exit_code=0)),
    ("half_written_checkpoint_left", "resume_tensor_exact",
     _top("interrupt", temp_entries_after=["checkpoints/.tmp-step-000002"])),
    ("second_checkpoint_left", "resume_tensor_exact",
     _top("interrupt", checkpoints_after=["step-000001", "step-000002"])),
    ("left_checkpoint_is_another", "resume_tensor_exact",
     _forged("interrupted_checkpoint_1", "critic_optimizer.safetensors")),
    ("left_checkpoint_swapped_for_step_2", "resume_tensor_exact",
     lambda ev: ev["interrupted_checkpoint_1"].write_bytes(ev["checkpoint_2"].read_bytes())),
    ("not_resumed_from_step_1", "resume_tensor_exact", _top("resumed_summary", resumed_from_step=None)),
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
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    assert set(evidence) == set(WORKLOAD.evidence)
    judged = WORKLOAD.judge(evidence, CPU, SCALE)
    assert {n: ok for n, (ok, _) in judged.checks.items()} == dict.fromkeys(CHECKS, True), judged.checks
    assert judged.metrics["reward_source"] == "tiny" and judged.metrics["updates"] == 2


def test_the_fixtures_are_small_and_portable() -> None:
    KIT.assert_small_and_portable()


@pytest.mark.parametrize(("label", "check", "mutate"), MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_one_bad_value_fails_exactly_its_check(
    tmp_path: Path, label: str, check: str, mutate: Callable[[dict[str, Path]], None]
) -> None:
    assert KIT.failed_after(tmp_path, mutate) == {check}


@pytest.mark.parametrize(
    "mutate",
    [
        lambda ev: edit_json_file(ev["plan"], lambda d: d["config"]["rollout"].update(samples_per_prompt=2)),
        lambda ev: edit_json_file(ev["plan"], lambda d: d["config"]["models"].update(device="auto")),
    ],
    ids=["smaller_than_declared", "other_device"],
)
def test_a_plan_not_at_the_declared_scale_fails_every_check_of_that_run(
    tmp_path: Path, mutate: Callable[[dict[str, Path]], None]
) -> None:
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    mutate(evidence)
    assert KIT.failed_checks(evidence) == {"actor_updates", "critic_updates", "gae_nontrivial", "reward_model"}


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
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    mutate(evidence)
    assert KIT.failed_checks(evidence) == {
        "actor_updates", "critic_updates", "gae_nontrivial", "resume_tensor_exact", "reward_model"
    }  # fmt: skip


def test_a_trajectories_file_from_another_run_fails_the_checks_that_read_it(tmp_path: Path) -> None:
    """Update 2's records replaced by update 1's file (swapped, not re-bound): the checkpoint does not commit it."""
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    evidence["trajectories_2"].write_bytes(evidence["trajectories_1"].read_bytes())
    assert {"gae_nontrivial", "reward_model"} <= KIT.failed_checks(evidence)


def test_the_interruption_evidence_of_another_role_fails_the_resume(tmp_path: Path) -> None:
    evidence = KIT.evidence_copy(tmp_path / "evidence")
    evidence["interrupted_stderr"].write_bytes(evidence["interrupt"].read_bytes())
    assert KIT.failed_checks(evidence) == {"resume_tensor_exact"}


def test_the_judges_gae_matches_the_products_formulas_on_a_hand_worked_row() -> None:
    """gamma 1, lambda 0.5; rewards (0, 1) on a 2-token response and one pad; values (0.5, 0.25, pad 9):
    delta_1 = 1 - 0.25 = 0.75 -> A_1 = 0.75; delta_0 = 0 + 0.25 - 0.5 = -0.25 -> A_0 = -0.25 + 0.5 * 0.75."""
    rows = gae.GaeRows([[1, 1, 0]], [[0.0, 1.0, 0.0]], [[0.5, 0.25, 9.0]])
    adv, ret = gae.gae(rows, 1.0, 0.5)
    assert adv == [[0.125, 0.75, 0.0]] and ret == [[0.625, 1.0, 0.0]]
    white = gae.whiten(adv, rows.mask)
    assert abs(white[0][0] + white[0][1]) < 1e-12 and white[0][2] == 0.0


def test_on_cpu_the_reward_model_offload_measured_nothing_and_is_not_applicable(tmp_path: Path) -> None:
    judged = WORKLOAD.judge(KIT.evidence_copy(tmp_path / "evidence"), CPU, SCALE)
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
    assert KIT.failed_when_spoiled(tmp_path, role, kind), f"{kind} {role} passed every check"


def test_no_evidence_at_all_fails_every_check() -> None:
    assert KIT.failed_checks({}) == set(CHECKS)

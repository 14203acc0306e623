"""The refresh part of backend-matrix: policy refreshes, grouped trajectory identity, the vLLM boundary.

The fixtures under ``full_fixtures/backend-matrix/`` are real evidence captured from a cpu-reference run
(``python -m harness workload backend-matrix --profile cpu-reference ...``), laid out by archive member. The judge
passes on them (vLLM is absent there, so ``vllm_boundary`` is not applicable, never passed); one bad value makes
exactly the check it belongs to fail; hostile files never make it raise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.core import policy
from harness.core.jsonio import sha256_file
from harness.core.profiles import PROFILES
from harness.qualify.full import backend_matrix, refresh
from harness.qualify.full.base import Context, Judgement, WorkloadFailure
from harness.qualify.full.runner import judged
from harness.qualify.full.scales import SCALES

FIXTURES = Path(__file__).resolve().parent / "full_fixtures" / "backend-matrix"
PROFILE = PROFILES["cpu-reference"]
SCALE = SCALES["cpu-reference"]
CHECKS = ("policy_refreshes", "grouped_trajectory_identity", "vllm_boundary")
ROOT = "v011/backend-matrix/refresh"
TRACEBACK = "vllm is not installed"


def _evidence(tmp_path: Path) -> dict[str, Path]:
    """A private copy of the captured evidence: role -> file, for every declared member present."""
    shutil.copytree(FIXTURES, tmp_path / "ev")
    found = {role: tmp_path / "ev" / member for role, member in refresh.REFRESH_EVIDENCE.items()}
    return {role: path for role, path in found.items() if path.exists()}


def _judge(evidence: dict[str, Path]) -> Judgement:
    judgement = Judgement()
    refresh.judge_refreshes(evidence, judgement, PROFILE, SCALE)
    return judgement


def _failed(judgement: Judgement) -> list[str]:
    return sorted(name for name, (ok, _) in judgement.checks.items() if not ok)


def _decided(judgement: Judgement) -> set[str]:
    return set(judgement.checks) | set(judgement.inapplicable)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _write_lines(path: Path, lines: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(line, sort_keys=True) + "\n" for line in lines))


def _edit_lines(role: str, edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        lines = _lines(ev[role])
        edit(lines)
        _write_lines(ev[role], lines)

    return apply


def _edit_json(role: str, edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        doc = json.loads(ev[role].read_text())
        edit(doc)
        ev[role].write_text(json.dumps(doc))

    return apply


def _set(key: str, value: Any, index: int) -> Callable[[list[dict[str, Any]]], None]:
    def edit(lines: list[dict[str, Any]]) -> None:
        lines[index][key] = value

    return edit


def test_the_captured_evidence_passes() -> None:
    evidence = {role: FIXTURES / member for role, member in refresh.REFRESH_EVIDENCE.items()}
    evidence = {role: path for role, path in evidence.items() if path.exists()}
    judgement = _judge(evidence)
    assert set(judgement.checks) == {"policy_refreshes", "grouped_trajectory_identity"}
    assert _failed(judgement) == [], judgement.checks
    # vLLM is absent: the one-line refusal is kept, but nothing about its boundary was measured
    assert list(judgement.inapplicable) == ["vllm_boundary"]
    assert judgement.inapplicable["vllm_boundary"].startswith("vllm is not installed: plan refused")
    assert judgement.metrics["vllm_backend"] == "not_run"  # recorded, never "passed"
    assert "vllm is not installed" in str(judgement.metrics["vllm_backend_reason"])
    assert json.loads(evidence["refresh_vllm_plan"].read_text())["stderr_lines"] == 1
    for engine in refresh.ENGINES:
        assert len(_lines(evidence[f"refresh_{engine}_metrics"])) == SCALE.policy_refreshes == 8


def _stale_rollout(lines: list[dict[str, Any]]) -> None:
    lines[2]["policy_digest_rollout"] = lines[1]["policy_digest_before"]  # a fold that was not refreshed


def _changed_between(lines: list[dict[str, Any]]) -> None:
    lines[4]["policy_digest_before"] = lines[4]["policy_digest_rollout"] = lines[2]["policy_digest_after"]


def _unchanged(lines: list[dict[str, Any]]) -> None:
    lines[7]["policy_digest_after"] = lines[7]["policy_digest_before"]


def _dup_trajectory(lines: list[dict[str, Any]]) -> None:
    lines[1] = dict(lines[0])


def _mixed_version(lines: list[dict[str, Any]]) -> None:
    lines[0]["policy_version"] += 1


def _mixed_prompt(lines: list[dict[str, Any]]) -> None:
    other = next(line for line in lines if line["group_id"] != lines[0]["group_id"])
    lines[0]["prompt_id"] = other["prompt_id"]
    lines[0]["prompt_token_ids"] = other["prompt_token_ids"]


def _split_group(lines: list[dict[str, Any]]) -> None:
    lines[0]["group_id"] = "stray@v0"


def _reuse_group_ids(ev: dict[str, Path]) -> None:
    """Cycle 2's groups renamed to cycle 1's ids (prompts and versions left as they are)."""
    first = sorted({line["group_id"] for line in _lines(ev["refresh_hf_trajectories_1"])})
    second = _lines(ev["refresh_hf_trajectories_2"])
    names = dict(zip(sorted({line["group_id"] for line in second}), first, strict=True))
    for line in second:
        line["group_id"] = names[line["group_id"]]
    _write_lines(ev["refresh_hf_trajectories_2"], second)


def _drop(role: str) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        ev.pop(role)

    return apply


BAD: dict[str, tuple[str, Callable[[dict[str, Path]], None]]] = {
    # policy_refreshes
    "stale rollout digest": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _stale_rollout)),
    "weights changed between updates": ("policy_refreshes", _edit_lines("refresh_hf_metrics", _changed_between)),
    "an update changed nothing": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _unchanged)),
    "wrong rollout backend": (
        "policy_refreshes",
        _edit_lines("refresh_fast_metrics", _set("rollout_backend", "hf", 3)),
    ),
    "digest not hex": ("policy_refreshes", _edit_lines("refresh_hf_metrics", _set("policy_digest_after", "x" * 64, 0))),
    "a missing metrics line": ("policy_refreshes", _edit_lines("refresh_hf_metrics", lambda lines: lines.pop())),
    "a wrong step number": ("policy_refreshes", _edit_lines("refresh_fast_metrics", _set("step", 9, 5))),
    "run failed": ("policy_refreshes", _edit_json("refresh_hf_summary", lambda d: d.update(status="failed"))),
    "fewer updates": ("policy_refreshes", _edit_json("refresh_fast_summary", lambda d: d.update(updates=7))),
    "plan on another engine": (
        "policy_refreshes",
        _edit_json("refresh_fast_plan", lambda d: d["config"]["rollout"].update(engine="auto")),
    ),
    "no summary": ("policy_refreshes", _drop("refresh_hf_summary")),
    "not the scale's quantization": (
        "policy_refreshes",
        _edit_json("refresh_fast_plan", lambda d: d["config"]["models"]["student"].update(quantization="nf4")),
    ),
    "fewer new tokens than the scale": (
        "policy_refreshes",
        _edit_json("refresh_hf_plan", lambda d: d["config"]["rollout"].update(max_new_tokens=8)),
    ),
    # grouped_trajectory_identity
    "a duplicated trajectory": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_fast_trajectories_3", _dup_trajectory),
    ),
    "a missing trajectory": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_8", lambda lines: lines.pop()),
    ),
    "a mixed policy_version": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_4", _mixed_version),
    ),
    "a group mixing prompts": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_fast_trajectories_1", _mixed_prompt),
    ),
    "a group split in two": ("grouped_trajectory_identity", _edit_lines("refresh_fast_trajectories_6", _split_group)),
    "group ids reused across cycles": ("grouped_trajectory_identity", _reuse_group_ids),
    "a missing sample index": (
        "grouped_trajectory_identity",
        _edit_lines("refresh_hf_trajectories_2", _set("sample_index", 7, 0)),
    ),
    "a cycle's trajectories missing": ("grouped_trajectory_identity", _drop("refresh_fast_trajectories_5")),
    # vllm_boundary
    "the plan did not refuse": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(exit_code=0))),
    "refused for another reason": (
        "vllm_boundary",
        _edit_json(
            "refresh_vllm_plan",
            lambda d: d.update(stderr_last_line="miniverl: error: rollout.backend vllm: vllm is installed, but ..."),
        ),
    ),
    "a plan was written": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(plan_written=True))),
    "the plan timed out": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.update(timed_out=True))),
    "a traceback, not one line": (
        "vllm_boundary",
        _edit_json("refresh_vllm_plan", lambda d: d.update(stderr_last_line=f"ModuleNotFoundError: {TRACEBACK}")),
    ),
    "the right last line after a traceback": (
        "vllm_boundary",
        _edit_json("refresh_vllm_plan", lambda d: d.update(stderr_lines=12)),
    ),
    "no stderr line count": ("vllm_boundary", _edit_json("refresh_vllm_plan", lambda d: d.pop("stderr_lines"))),
    "no plan result": ("vllm_boundary", _drop("refresh_vllm_plan")),
}


# An edited or missing trajectory file is also no longer what the kept checkpoints commit (policy_refreshes).
TRAJECTORY_EDITS = {
    "a duplicated trajectory",
    "a missing trajectory",
    "a mixed policy_version",
    "a group mixing prompts",
    "a group split in two",
    "group ids reused across cycles",
    "a missing sample index",
    "a cycle's trajectories missing",
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_one_bad_value_fails_exactly_its_check(case: str, tmp_path: Path) -> None:
    check, corrupt = BAD[case]
    evidence = _evidence(tmp_path)
    corrupt(evidence)
    judgement = _judge(evidence)
    expected = sorted({check, "policy_refreshes"} if case in TRAJECTORY_EDITS else {check})
    if case == "the plan did not refuse":  # accepted: the refresh chains must then hold vllm's run too
        expected = sorted(CHECKS)
    assert _failed(judgement) == expected, judgement.checks
    assert _decided(judgement) == set(CHECKS) and check not in judgement.inapplicable  # a failure: never n/a


def test_a_failure_names_the_engine_and_step(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _edit_lines("refresh_fast_metrics", _stale_rollout)(evidence)
    ok, detail = _judge(evidence).checks["policy_refreshes"]
    assert not ok and "engine fast step 3: policy_digest_rollout" in detail
    evidence = _evidence(tmp_path / "again")
    _edit_lines("refresh_hf_trajectories_4", _mixed_version)(evidence)
    ok, detail = _judge(evidence).checks["grouped_trajectory_identity"]
    assert not ok and "engine hf cycle 4" in detail and "policy_version" in detail


# -- policy_refreshes from the harness's own hashes of every update's checkpoint ----------------------------------
ADAPTER = refresh.ADAPTER


def _hashes(ev: dict[str, Path], engine: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(ev[f"refresh_{engine}_state_hashes"].read_text())
    return doc


def _write_hashes(ev: dict[str, Path], engine: str, doc: dict[str, Any]) -> None:
    ev[f"refresh_{engine}_state_hashes"].write_text(json.dumps(doc))


def _swap_hash_labels(ev: dict[str, Path]) -> None:
    """Updates 3 and 4 hashed under each other's label (a swapped cycle)."""
    doc = _hashes(ev, "fast")
    cps = doc["checkpoints"]
    a, b = "refresh_fast_checkpoint_3", "refresh_fast_checkpoint_4"
    cps[a], cps[b] = cps[b], cps[a]
    _write_hashes(ev, "fast", doc)


def _swap_kept_checkpoints(ev: dict[str, Path]) -> None:
    a, b = ev["refresh_hf_checkpoint_6"], ev["refresh_hf_checkpoint_7"]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _edit_adapter_hash(ev: dict[str, Path]) -> None:
    doc = _hashes(ev, "hf")
    doc["checkpoints"]["refresh_hf_checkpoint_5"]["files"][ADAPTER]["sha256"] = "ab" * 32
    _write_hashes(ev, "hf", doc)


def _unchanged_update_everywhere(ev: dict[str, Path]) -> None:
    """Update 5's adapter stated, in the harness's hashes and in the kept checkpoint.json (whose sha256 the hashes
    re-bind), as update 4's: everything agrees, but by the harness's own hashes the update changed nothing."""
    doc = _hashes(ev, "fast")
    cps = doc["checkpoints"]
    same = cps["refresh_fast_checkpoint_4"]["files"][ADAPTER]
    cps["refresh_fast_checkpoint_5"]["files"][ADAPTER] = dict(same)
    listing = json.loads(ev["refresh_fast_checkpoint_5"].read_text())
    listing["files"][ADAPTER] = dict(same)
    ev["refresh_fast_checkpoint_5"].write_text(json.dumps(listing))
    cps["refresh_fast_checkpoint_5"]["checkpoint_json_sha256"] = sha256_file(ev["refresh_fast_checkpoint_5"])
    _write_hashes(ev, "fast", doc)


def _lora_b_still_zero(ev: dict[str, Path]) -> None:
    doc = _hashes(ev, "hf")
    table = doc["checkpoints"]["refresh_hf_checkpoint_1"]["tensors"][ADAPTER]
    for digest in table.values():
        digest["sha256"] = hashlib.sha256(bytes(digest["bytes"])).hexdigest()
    _write_hashes(ev, "hf", doc)


def _another_runs_hashes(ev: dict[str, Path]) -> None:
    """The hf run's hashes and checkpoints (relabelled) passed off as the fast run's."""
    doc = _hashes(ev, "hf")
    doc["checkpoints"] = {k.replace("_hf_", "_fast_"): v for k, v in doc["checkpoints"].items()}
    _write_hashes(ev, "fast", doc)
    for cycle in range(1, 9):
        ev[f"refresh_fast_checkpoint_{cycle}"].write_bytes(ev[f"refresh_hf_checkpoint_{cycle}"].read_bytes())


def _another_runs_hashes_only(ev: dict[str, Path]) -> None:
    doc = _hashes(ev, "hf")
    doc["checkpoints"] = {k.replace("_hf_", "_fast_"): v for k, v in doc["checkpoints"].items()}
    _write_hashes(ev, "fast", doc)


def _refused(ev: dict[str, Path]) -> None:
    doc = _hashes(ev, "hf")
    doc["checkpoints"].pop("refresh_hf_checkpoint_2")
    doc["refused"]["refresh_hf_checkpoint_2"] = "adapter/adapter_model.safetensors is a symlink"
    _write_hashes(ev, "hf", doc)


def _digests_name_other_states(lines: list[dict[str, Any]]) -> None:
    """The product says update 5 left the weights update 3 left (its chain still links), the harness's hashes
    say otherwise."""
    again = lines[2]["policy_digest_after"]
    lines[4]["policy_digest_after"] = again
    lines[5]["policy_digest_before"] = lines[5]["policy_digest_rollout"] = again


# case -> (edit, what the failure must name)
HASH_BAD: dict[str, tuple[Callable[[dict[str, Path]], None], str]] = {
    "no state hashes": (_drop("refresh_fast_state_hashes"), "engine fast: state-hashes.json missing"),
    "a kept checkpoint.json missing": (
        _drop("refresh_hf_checkpoint_4"),
        "engine hf update 4: the harness hashed step 4",
    ),
    "a checkpoint the harness could not hash": (_refused, "engine hf update 2: the harness could not hash"),
    "a swapped cycle in the hashes": (_swap_hash_labels, "engine fast update 3: the harness hashed step 4"),
    "swapped kept checkpoints": (_swap_kept_checkpoints, "engine hf update 6: the harness hashed step 6"),
    "an edited adapter hash": (_edit_adapter_hash, "engine hf update 5: checkpoint refresh_hf_checkpoint_5: the kept"),
    "an unchanged update, consistently stated": (_unchanged_update_everywhere, "update 5: the harness's sha256 of"),
    "update 1 left lora_B at its zero init": (_lora_b_still_zero, "engine hf update 1: checkpoint refresh_hf_"),
    "another run's hashes and checkpoints": (_another_runs_hashes, "NOT the ones the checkpoint commits"),
    "another run's hashes": (_another_runs_hashes_only, "is NOT the one the harness hashed"),
    "product digests naming other states": (
        _edit_lines("refresh_fast_metrics", _digests_name_other_states),
        "engine fast steps 3 and 5: the product's policy digests and the harness's adapter sha256",
    ),
    "hashes not a harness record": (
        _edit_json("refresh_hf_state_hashes", lambda d: d.update(kind="miniverl.x")),
        "engine hf: state-hashes.json missing or not a harness state-hashes record",
    ),
}


@pytest.mark.parametrize("case", sorted(HASH_BAD))
def test_the_refresh_chain_is_judged_from_the_harness_hashes(case: str, tmp_path: Path) -> None:
    corrupt, named = HASH_BAD[case]
    evidence = _evidence(tmp_path)
    corrupt(evidence)
    judgement = _judge(evidence)
    assert _failed(judgement) == ["policy_refreshes"], judgement.checks
    assert named in judgement.checks["policy_refreshes"][1], judgement.checks["policy_refreshes"][1]


def test_the_kept_hashes_are_the_harness_s_own_of_every_update() -> None:
    """Each engine's state-hashes.json holds one checkpoint per update, of that step, whose kept checkpoint.json is
    the one hashed; update 1 with its adapter's lora_B digests (only those: all the judge reads)."""
    for engine in refresh.ENGINES:
        doc = json.loads((FIXTURES / refresh.REFRESH_EVIDENCE[f"refresh_{engine}_state_hashes"]).read_text())
        assert doc["refused"] == {}
        cps = doc["checkpoints"]
        assert sorted(cps) == sorted(f"refresh_{engine}_checkpoint_{k}" for k in range(1, 9))
        for k in range(1, 9):
            kept = FIXTURES / refresh.REFRESH_EVIDENCE[f"refresh_{engine}_checkpoint_{k}"]
            assert cps[f"refresh_{engine}_checkpoint_{k}"]["step"] == k
            assert cps[f"refresh_{engine}_checkpoint_{k}"]["checkpoint_json_sha256"] == sha256_file(kept)
        names = list(cps[f"refresh_{engine}_checkpoint_1"]["tensors"][ADAPTER])
        assert names and all("lora_B" in n for n in names)
        assert all(not cps[f"refresh_{engine}_checkpoint_{k}"]["tensors"] for k in range(2, 9))


# -- vllm_boundary: judged only on evidence of a real vLLM run ----------------------------------------------------
def _accepted(ev: dict[str, Path]) -> None:
    """The plan probe as `miniverl plan` would leave it where vllm is installed: exit 0, one plan written."""
    _edit_json(
        "refresh_vllm_plan", lambda d: d.update(exit_code=0, stderr_last_line="", stderr_lines=0, plan_written=True)
    )(ev)


def _vllm_contract_run(ev: dict[str, Path], version: str = "0.11.0") -> None:
    """A vLLM refresh run in the shape of the evidence contract (:data:`refresh.VLLM_TRAJECTORY_FIELDS`), built here
    from the fast engine's 8 cycles: its trajectories given vLLM's fields (each then committed by rewritten
    checkpoint.json files, re-hashed under vllm's labels as the harness would), its metrics lines saying vllm. No
    CPU run can produce a real one (vLLM runs only on the GPU machine). It shows the judge accepts the contract and
    the refresh chain on a third engine and lets each test below break one part of it. It never reaches a chain
    that authorizes (harness_helpers builds none from it)."""
    _accepted(ev)
    folder = ev["refresh_vllm_plan"].parent
    (folder / "trajectories").mkdir(exist_ok=True)
    (folder / "checkpoints").mkdir(exist_ok=True)
    plan = json.loads(ev["refresh_fast_plan"].read_text())
    plan["config"]["rollout"].update(backend="vllm", engine="auto")
    summary = json.loads(ev["refresh_fast_summary"].read_text())
    lines = _lines(ev["refresh_fast_metrics"])
    committed: dict[str, str] = {}
    for cycle, line in enumerate(lines, start=1):
        records = _lines(ev[f"refresh_fast_trajectories_{cycle}"])
        largest = 0.0
        for number, record in enumerate(records):
            record.update(rollout_backend="vllm", rollout_backend_version=version)
            record["old_logprobs"] = list(record["sampled_logprobs"])
            # a foreign sampler's log-prob of one token differs from the trainer's recomputed one
            record["sampled_logprobs"][number % len(record["sampled_logprobs"])] += 0.01 * (number + cycle)
            pairs = zip(record["sampled_logprobs"], record["old_logprobs"], strict=True)
            largest = max(largest, *(abs(a - b) for a, b in pairs))
        line["rollout_backend"] = "vllm"
        line["algorithm_metrics"][refresh.OLD_LOGP_MAX_ABS_DIFF] = largest
        name = f"cycle-{cycle:06d}.jsonl"
        _write_lines(folder / "trajectories" / name, records)
        ev[f"refresh_vllm_trajectories_{cycle}"] = folder / "trajectories" / name
        committed[name] = sha256_file(folder / "trajectories" / name)
    hashes = _hashes(ev, "fast")
    relabelled: dict[str, Any] = {}
    for k in range(1, len(lines) + 1):
        listing = json.loads(ev[f"refresh_fast_checkpoint_{k}"].read_text())
        listing["trajectories"] = {n: d for n, d in committed.items() if int(n[6:12]) <= k}
        path = folder / "checkpoints" / f"checkpoint-{k}.json"
        path.write_text(json.dumps(listing))
        ev[f"refresh_vllm_checkpoint_{k}"] = path
        entry = hashes["checkpoints"][f"refresh_fast_checkpoint_{k}"]
        relabelled[f"refresh_vllm_checkpoint_{k}"] = {**entry, "checkpoint_json_sha256": sha256_file(path)}
    hashes["checkpoints"] = relabelled
    files = {
        "refresh_vllm_run_plan": (folder / "plan.json", [plan]),
        "refresh_vllm_summary": (folder / "summary.json", [summary]),
        "refresh_vllm_metrics": (folder / "metrics.jsonl", lines),
        "refresh_vllm_state_hashes": (folder / "state-hashes.json", [hashes]),
        # as the harness reads it from the run's interpreter (importlib.metadata): the version the run installed
        "refresh_vllm_engine": (
            folder / "engine.json",
            [{"vllm_version": version, "vllm_importable": True, "exit_code": 0, "stderr_last_line": ""}],
        ),
    }
    for role, (path, docs) in files.items():
        _write_lines(path, docs)
        ev[role] = path


def test_a_run_meeting_the_vllm_contract_passes_the_boundary(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _vllm_contract_run(evidence)
    judgement = _judge(evidence)
    assert _failed(judgement) == [] and "vllm_boundary" in judgement.checks, judgement.checks
    assert judgement.metrics["vllm_backend"] == "passed" and judgement.metrics["vllm_version"] == "0.11.0"
    assert judgement.metrics["refresh_vllm_chain_ok"] is True
    for check in ("policy_refreshes", "grouped_trajectory_identity"):
        assert "engine vllm: 8" in judgement.checks[check][1], judgement.checks[check]
    for cycle in range(1, 9):
        assert set(refresh.VLLM_TRAJECTORY_FIELDS) <= set(_lines(evidence[f"refresh_vllm_trajectories_{cycle}"])[0])


def test_a_refused_vllm_leaves_the_chains_to_the_in_process_engines(tmp_path: Path) -> None:
    """Where vllm was refused, its run's files (had any been kept) are not judged: the chains are fast's and hf's and
    vllm_boundary is not applicable, as on the captured CPU evidence."""
    evidence = _evidence(tmp_path)
    _vllm_contract_run(evidence)
    refusal = json.loads((FIXTURES / refresh.REFRESH_EVIDENCE["refresh_vllm_plan"]).read_text())
    evidence["refresh_vllm_plan"].write_text(json.dumps(refusal))
    judgement = _judge(evidence)
    assert _failed(judgement) == [] and list(judgement.inapplicable) == ["vllm_boundary"]
    assert "engine vllm" not in judgement.checks["policy_refreshes"][1]


def _vllm_hashes(edit: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Path]], None]:
    return _edit_json("refresh_vllm_state_hashes", edit)


def _fast_files_as_vllm(*kinds: str) -> Callable[[dict[str, Path]], None]:
    """The fast run's own files of ``kinds`` (checkpoints, trajectories, state hashes) passed off as vllm's."""

    def apply(ev: dict[str, Path]) -> None:
        for k in range(1, 9):
            for kind in kinds:
                if kind in ("checkpoint", "trajectories"):
                    ev[f"refresh_vllm_{kind}_{k}"].write_bytes(ev[f"refresh_fast_{kind}_{k}"].read_bytes())
        if "state_hashes" in kinds:
            doc = _hashes(ev, "fast")
            doc["checkpoints"] = {k.replace("_fast_", "_vllm_"): v for k, v in doc["checkpoints"].items()}
            _write_hashes(ev, "vllm", doc)

    return apply


def _swap_vllm_checkpoints(ev: dict[str, Path]) -> None:
    a, b = ev["refresh_vllm_checkpoint_2"], ev["refresh_vllm_checkpoint_3"]
    data = a.read_bytes()
    a.write_bytes(b.read_bytes())
    b.write_bytes(data)


def _hf_plan_as_vllm(ev: dict[str, Path]) -> None:
    ev["refresh_vllm_run_plan"].write_bytes(ev["refresh_hf_plan"].read_bytes())


# case -> (edit, the checks it must fail, what the policy_refreshes failure must name (None: that check passes))
VLLM_CHAIN_BAD: dict[str, tuple[Callable[[dict[str, Path]], None], set[str], str | None]] = {
    "no state hashes": (_drop("refresh_vllm_state_hashes"), {"policy_refreshes"}, "engine vllm: state-hashes.json"),
    "a kept checkpoint missing": (_drop("refresh_vllm_checkpoint_5"), {"policy_refreshes"}, "engine vllm update 5"),
    "swapped kept checkpoints": (_swap_vllm_checkpoints, {"policy_refreshes"}, "engine vllm update 2"),
    "an edited adapter hash": (
        _vllm_hashes(
            lambda d: d["checkpoints"]["refresh_vllm_checkpoint_4"]["files"][ADAPTER].update(sha256="ab" * 32)
        ),
        {"policy_refreshes"},
        "engine vllm update 4",
    ),
    "the fast run's checkpoints and hashes": (
        _fast_files_as_vllm("checkpoint", "state_hashes"),
        {"policy_refreshes"},
        "NOT the ones the checkpoint commits",
    ),
    "the fast run's hashes only": (
        _fast_files_as_vllm("state_hashes"),
        {"policy_refreshes"},
        "is NOT the one the harness hashed",
    ),
    "the fast run's whole chain relabelled": (
        _fast_files_as_vllm("checkpoint", "trajectories", "state_hashes"),
        {"vllm_boundary"},
        None,
    ),
    "a stale rollout digest": (
        _edit_lines("refresh_vllm_metrics", _stale_rollout),
        {"policy_refreshes"},
        "engine vllm step",
    ),
    "seven of eight updates": (
        _edit_json("refresh_vllm_summary", lambda d: d.update(updates=7)),
        {"policy_refreshes", "vllm_boundary"},
        "engine vllm: 7 updates",
    ),
    "the hf plan as vllm's": (_hf_plan_as_vllm, {"policy_refreshes", "vllm_boundary"}, "rollout.backend vllm"),
    "a cycle's trajectories missing": (
        _drop("refresh_vllm_trajectories_6"),
        {"policy_refreshes", "grouped_trajectory_identity", "vllm_boundary"},
        "engine vllm update 6",
    ),
    "a mixed policy_version": (
        _edit_lines("refresh_vllm_trajectories_4", _mixed_version),
        {"policy_refreshes", "grouped_trajectory_identity"},
        "engine vllm update 4",
    ),
    "a later cycle from another backend": (
        _edit_lines("refresh_vllm_trajectories_8", _set("rollout_backend", "hf", 2)),
        {"policy_refreshes", "vllm_boundary"},
        "engine vllm update 8",
    ),
    "a later cycle's stated difference wrong": (
        _edit_lines(
            "refresh_vllm_metrics",
            lambda lines: lines[6]["algorithm_metrics"].update({refresh.OLD_LOGP_MAX_ABS_DIFF: 0.5}),
        ),
        {"vllm_boundary"},
        None,
    ),
}


@pytest.mark.parametrize("case", sorted(VLLM_CHAIN_BAD))
def test_the_vllm_refresh_chain_is_judged_like_the_engines(case: str, tmp_path: Path) -> None:
    corrupt, checks, named = VLLM_CHAIN_BAD[case]
    evidence = _evidence(tmp_path)
    _vllm_contract_run(evidence)
    corrupt(evidence)
    judgement = _judge(evidence)
    assert _failed(judgement) == sorted(checks), judgement.checks
    if named is not None:
        assert named in judgement.checks["policy_refreshes"][1], judgement.checks["policy_refreshes"][1]


def test_old_logp_recomputed_alone_never_passes_the_vllm_boundary(tmp_path: Path) -> None:
    """The fast engine's real metrics (every line says actor/old_logp_recomputed 1.0, as every in-process GRPO line
    does) passed off as the vLLM run's, behind an accepted plan: refused, not passed."""
    evidence = _evidence(tmp_path)
    fast = _lines(evidence["refresh_fast_metrics"])
    assert all(m["algorithm_metrics"][refresh.OLD_LOGP_RECOMPUTED] == 1.0 for m in fast)
    _accepted(evidence)
    folder = evidence["refresh_vllm_plan"].parent
    for role, source, name in (
        ("refresh_vllm_metrics", "refresh_fast_metrics", "metrics.jsonl"),
        ("refresh_vllm_run_plan", "refresh_fast_plan", "plan.json"),
        ("refresh_vllm_summary", "refresh_fast_summary", "summary.json"),
    ):
        (folder / name).write_bytes(evidence[source].read_bytes())
        evidence[role] = folder / name
    judgement = _judge(evidence)
    # (no vllm trajectories or harness hashes were kept either, so its refresh chain fails with it)
    assert _failed(judgement) == sorted(CHECKS) and judgement.metrics["vllm_backend"] == "failed"


def _vllm_records(edit: Callable[[list[dict[str, Any]]], None]) -> Callable[[dict[str, Path]], None]:
    return _edit_lines("refresh_vllm_trajectories_1", edit)


def _each(key: str, value: Any) -> Callable[[list[dict[str, Any]]], None]:
    def edit(lines: list[dict[str, Any]]) -> None:
        for line in lines:
            line[key] = value

    return edit


def _trainer_logprobs(lines: list[dict[str, Any]]) -> None:
    for line in lines:
        line["sampled_logprobs"] = list(line["old_logprobs"])


def _drop_key(key: str) -> Callable[[list[dict[str, Any]]], None]:
    def edit(lines: list[dict[str, Any]]) -> None:
        lines[3].pop(key)

    return edit


def _another_engines_metrics(ev: dict[str, Path]) -> None:
    ev["refresh_vllm_metrics"].write_text(ev["refresh_fast_metrics"].read_text().splitlines()[0] + "\n")


def _metrics_set(key: str, value: Any) -> Callable[[dict[str, Path]], None]:
    def apply(ev: dict[str, Path]) -> None:
        lines = _lines(ev["refresh_vllm_metrics"])
        lines[0]["algorithm_metrics"][key] = value
        _write_lines(ev["refresh_vllm_metrics"], lines)

    return apply


VLLM_BAD: dict[str, Callable[[dict[str, Path]], None]] = {
    "no engine record": _drop("refresh_vllm_engine"),
    "another vllm installed than the trajectories name": _edit_json(
        "refresh_vllm_engine", lambda d: d.update(vllm_version="0.26.0")
    ),
    "vllm not importable by the run's interpreter": _edit_json(
        "refresh_vllm_engine", lambda d: d.update(vllm_importable=False)
    ),
    "the engine record could not read a version": _edit_json(
        "refresh_vllm_engine", lambda d: d.update(vllm_version=None, exit_code=1)
    ),
    "trajectories of another vllm than installed": _vllm_records(_each("rollout_backend_version", "0.10.2")),
    "missing trajectories": _drop("refresh_vllm_trajectories_1"),
    "empty trajectories": lambda ev: ev["refresh_vllm_trajectories_1"].write_text(""),
    "backend field fast": _vllm_records(_each("rollout_backend", "fast")),
    "backend field hf": _vllm_records(_each("rollout_backend", "hf")),
    "one trajectory from another backend": _vllm_records(_set("rollout_backend", "hf", 5)),
    "version missing": _vllm_records(_drop_key("rollout_backend_version")),
    "version not a version": _vllm_records(_each("rollout_backend_version", "unknown")),
    "two vllm versions": _vllm_records(_set("rollout_backend_version", "0.10.2", 2)),
    "log-probs equal to the trainer's": _vllm_records(_trainer_logprobs),
    "no trainer log-probs": _vllm_records(_drop_key("old_logprobs")),
    "a token's log-prob missing": _vllm_records(lambda lines: lines[1]["sampled_logprobs"].pop()),
    "metrics from another engine's run": _another_engines_metrics,
    "old_logp not recomputed": _metrics_set(refresh.OLD_LOGP_RECOMPUTED, 0.0),
    "a stated difference the trajectories do not show": _metrics_set(refresh.OLD_LOGP_MAX_ABS_DIFF, 0.5),
    "no stated difference": _metrics_set(refresh.OLD_LOGP_MAX_ABS_DIFF, None),
    "metrics counting other trajectories": _edit_lines("refresh_vllm_metrics", _set("trajectories", 16, 0)),
    "no metrics": _drop("refresh_vllm_metrics"),
    "the run failed": _edit_json("refresh_vllm_summary", lambda d: d.update(status="failed")),
    "no summary": _drop("refresh_vllm_summary"),
    "the kept plan names backend hf": _edit_json(
        "refresh_vllm_run_plan", lambda d: d["config"]["rollout"].update(backend="hf")
    ),
    "no kept plan": _drop("refresh_vllm_run_plan"),
    "a plan accepted but not written": _edit_json("refresh_vllm_plan", lambda d: d.update(plan_written=False)),
    "the accepted plan timed out": _edit_json("refresh_vllm_plan", lambda d: d.update(timed_out=True)),
}


@pytest.mark.parametrize("case", sorted(VLLM_BAD))
def test_each_way_the_vllm_evidence_can_be_wrong_fails_the_boundary(case: str, tmp_path: Path) -> None:
    """(An edited trajectory file is also no longer what vllm's checkpoints commit, so policy_refreshes fails
    with it; see VLLM_CHAIN_BAD for the chain's own cases.)"""
    evidence = _evidence(tmp_path)
    _vllm_contract_run(evidence)
    VLLM_BAD[case](evidence)
    judgement = _judge(evidence)
    assert "vllm_boundary" in _failed(judgement), judgement.checks
    assert "vllm_boundary" not in judgement.inapplicable and judgement.metrics["vllm_backend"] == "failed"


def test_a_plan_accepted_without_a_run_fails_the_boundary(tmp_path: Path) -> None:
    """exit 0 and a plan written, but nothing of a run kept (it crashed before writing, or never ran): the boundary
    fails, and so do the refresh chains, which the accepted vllm must have run too."""
    evidence = _evidence(tmp_path)
    _accepted(evidence)
    judgement = _judge(evidence)
    assert _failed(judgement) == sorted(CHECKS) and "vllm_boundary" not in judgement.inapplicable
    assert "engine vllm: no readable summary.json" in judgement.checks["policy_refreshes"][1]


def _hostile_files() -> dict[str, Callable[[Path], None]]:
    def directory(path: Path) -> None:
        path.unlink()
        path.mkdir()

    def huge(path: Path) -> None:
        with path.open("wb") as handle:
            handle.truncate(17 << 20)

    return {
        "directory": directory,
        "huge": huge,
        "garbled": lambda p: p.write_bytes(b'{"step": 1, "status": \xff\xfe'),
        "array": lambda p: p.write_text("[1, 2, 3]\n"),
        "nan": lambda p: p.write_text('{"status": NaN}\n'),
        "duplicate keys": lambda p: p.write_text('{"status": "completed", "status": "completed"}\n'),
        "deep": lambda p: p.write_text("[" * 100000 + "]" * 100000),
        "empty": lambda p: p.write_text(""),
    }


HOSTILE_TARGETS = {
    "refresh_fast_summary": "policy_refreshes",
    "refresh_fast_state_hashes": "policy_refreshes",
    "refresh_hf_checkpoint_3": "policy_refreshes",
    "refresh_hf_metrics": "policy_refreshes",
    "refresh_fast_plan": "policy_refreshes",
    "refresh_hf_trajectories_7": "grouped_trajectory_identity",
    "refresh_vllm_plan": "vllm_boundary",
}


@pytest.mark.parametrize("kind", sorted(_hostile_files()))
@pytest.mark.parametrize("role", sorted(HOSTILE_TARGETS))
def test_hostile_files_fail_without_raising(role: str, kind: str, tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    _hostile_files()[kind](evidence[role])
    judgement = _judge(evidence)
    assert _decided(judgement) == set(CHECKS)
    assert HOSTILE_TARGETS[role] in _failed(judgement)  # failed, never not_applicable


def test_no_evidence_at_all_fails_every_check() -> None:
    judgement = _judge({})
    assert _failed(judgement) == sorted(CHECKS)
    assert judgement.metrics["vllm_backend"] == "failed"


def test_a_scale_beyond_the_layout_fails_closed(tmp_path: Path) -> None:
    evidence = _evidence(tmp_path)
    judgement = Judgement()
    refresh.judge_refreshes(evidence, judgement, PROFILE, dataclasses.replace(SCALE, policy_refreshes=9))
    assert _failed(judgement) == ["grouped_trajectory_identity", "policy_refreshes"]
    ctx = Context(
        cli=None,  # type: ignore[arg-type]  # never reached: the scale is refused first
        work=tmp_path,
        profile=PROFILE,
        scale=dataclasses.replace(SCALE, policy_refreshes=9),
        data="data/prompts.parquet",
        model_wheel=None,
        verl_python=None,
    )
    with pytest.raises(WorkloadFailure, match="9 policy refreshes"):
        refresh.run_refreshes(ctx)


def test_the_runs_use_the_declared_refresh_sizes_and_the_scales_quantization() -> None:
    for scale in SCALES.values():
        args = refresh._sizes(scale, scale.policy_refreshes)
        values = dict(v.split("=", 1) for v in args[1::2])
        assert values["train.cycles"] == str(scale.policy_refreshes) == "8"
        assert {k: values[f"rollout.{k}"] for k in refresh.REFRESH_SIZES} == {
            k: str(v) for k, v in refresh.REFRESH_SIZES.items()
        }
        assert values.get("models.student.quantization") == scale.quantization


def test_the_evidence_layout_is_explicit_and_under_the_workloads_folder() -> None:
    members = list(refresh.REFRESH_EVIDENCE.values())
    assert len(members) == len(set(members))
    assert all(m.startswith(f"{ROOT}/") for m in members)
    assert "transcript" not in refresh.REFRESH_EVIDENCE  # the workload that embeds this part declares it
    # this part's fixtures live under its own folder (the rest of backend-matrix's fixtures sit beside it)
    fixture_files = {p.relative_to(FIXTURES).as_posix() for p in (FIXTURES / ROOT).rglob("*") if p.is_file()}
    assert fixture_files and fixture_files <= set(members)
    total = sum((FIXTURES / m).stat().st_size for m in fixture_files)
    assert total < 360_000  # 8 updates x 2 engines of trajectories, checkpoint.json files and harness hashes


def test_the_policy_requires_the_vllm_boundary_only_on_the_release_card() -> None:
    """Only the release card's known-good stack is meant to include vLLM: there, a run without it (the boundary not
    applicable) fails the backend-matrix level; on the H200 and CPU profiles it does not."""
    requiring = {name for name, p in PROFILES.items() if "vllm_boundary" in policy.required_checks(p, "backend-matrix")}
    assert requiring == {"rtx4080-wsl2-cu130"}


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_not_applicable_fails_the_level_exactly_where_the_policy_requires_the_check(profile: str) -> None:
    evidence = {role: FIXTURES / m for role, m in backend_matrix.EVIDENCE.items() if (FIXTURES / m).is_file()}
    outcome = judged(backend_matrix.WORKLOAD, evidence, PROFILES[profile], SCALES[profile], wheel_sha256="0" * 64)
    checks = outcome.book.checks()
    napp = {c.name: c.reason for c in checks.not_applicable}
    assert napp["vllm_boundary"].startswith("vllm is not installed")
    required_na = [f for f in checks.failures() if f.startswith("required check vllm_boundary is not applicable")]
    assert bool(required_na) == (profile == "rtx4080-wsl2-cu130"), checks.failures()


def test_the_auditor_requires_the_record_to_say_not_applicable_where_the_evidence_does(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A backend-matrix record that claims `vllm_boundary` executed and passed, where its evidence shows only the
    refusal of an absent vLLM, is refused by the auditor's re-judging; the honest record (not applicable) passes."""
    from harness_helpers import audit_args, fabricate_full

    from harness.audit.cli import main as auditor_main
    from harness.core.jsonio import canonical_bytes, sha256_file

    qual = fabricate_full(smoke_qual, tmp_path / "qualification")
    args = audit_args(candidate, qual, known_good, **{"--level": "full_qualification"})
    assert auditor_main(args) == 0, capsys.readouterr().err
    capsys.readouterr()
    record = qual / "backend-matrix.json"
    value = json.loads(record.read_bytes())
    (na,) = [c for c in value["checks"]["not_applicable"] if c["name"] == "vllm_boundary"]
    value["checks"]["not_applicable"].remove(na)
    value["checks"]["executed"].append({"name": "vllm_boundary", "passed": True, "detail": "vllm boundary held"})
    record.write_bytes(canonical_bytes(value) + b"\n")
    q = json.loads((qual / "qualification.json").read_bytes())
    for art in q["artifacts"]:
        if art["path"] == record.name:
            art.update(bytes=record.stat().st_size, sha256=sha256_file(record))
    (qual / "qualification.json").write_bytes(canonical_bytes(q) + b"\n")
    assert auditor_main(args) == 1
    err = capsys.readouterr().err
    assert "[workload_rejudged]" in err and "vllm_boundary" in err and "vllm is not installed" in err, err


def test_the_engine_record_is_what_the_runs_interpreter_has_installed(tmp_path: Path) -> None:
    """``_installed_vllm`` asks the venv's interpreter, in the CLI's environment, which vllm it would import: a
    named fake distribution here (vllm cannot be installed on CPU), seen through a site on PYTHONPATH as the
    qualification's --vllm-site is; without it the record says vllm is not importable."""
    import sys
    from types import SimpleNamespace

    from harness.core.proc import Redactor

    site = tmp_path / "vllm-site"
    (site / "vllm").mkdir(parents=True)
    (site / "vllm" / "__init__.py").write_text("raise RuntimeError('the harness never imports vllm')\n")
    (site / "vllm-9.9.9.dist-info").mkdir()
    (site / "vllm-9.9.9.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 9.9.9\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    work = tmp_path / "work"
    work.mkdir()

    def record(extra_env: dict[str, str]) -> dict[str, Any]:
        cli = SimpleNamespace(venv=venv, extra_env=extra_env, redact=Redactor({"work": work}))
        return json.loads(refresh._installed_vllm(SimpleNamespace(cli=cli, work=work)).read_text())

    seen = record({"PYTHONPATH": str(site)})
    assert (seen["vllm_version"], seen["vllm_importable"], seen["exit_code"]) == ("9.9.9", True, 0)
    absent = record({})
    assert "vllm_version" not in absent and absent["exit_code"] != 0
    assert "PackageNotFoundError" in absent["stderr_last_line"]
    (venv / "bin" / "python").unlink()  # no interpreter at all: recorded, never a traceback
    missing = record({"PYTHONPATH": str(site)})
    assert missing["exit_code"] == 127 and "vllm_version" not in missing

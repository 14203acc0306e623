"""The full-qualification framework: runner, judging into a record, the explicit evidence layout."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import pytest
from full_evidence import runner_options

from harness.core import policy, registry
from harness.core.errors import HarnessError
from harness.core.profiles import PROFILES
from harness.core.recordio import load_record
from harness.core.records import Profile, WorkloadRecord
from harness.qualify.full import catalog, statehash
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.runner import RunnerOptions, judged, run_one
from harness.qualify.full.scales import SCALES
from harness.qualify.qualification import write_workload

COMMIT, WHEEL = "a" * 40, "b" * 64
CPU = PROFILES["cpu-reference"]


def _toy(value: float, *, raises: bool = False, extra_role: bool = False) -> Workload:
    """A stand-in for a real workload under the pg-k1 registry entry: its evidence is one JSON file."""

    def run(ctx: Context) -> dict[str, Path]:
        path = ctx.work / "figures.json"
        path.write_text(json.dumps({"reward_std": value}))
        if raises:
            raise HarnessError("the CLI could not be started", check="workload_run")
        return {"figures": path, **({"stray": path} if extra_role else {})}

    def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
        j = Judgement()
        figures = json.loads(evidence["figures"].read_text()) if "figures" in evidence else {}
        std = figures.get("reward_std")
        j.check("run_completed", "figures" in evidence, "figures written")
        j.check("reward_varies_within_group", isinstance(std, float) and std > 0, f"std {std}")
        j.metrics["reward_std"] = std
        return j

    return Workload(
        name="pg-k1",
        evidence={"figures": "v011/pg-k1/figures.json", "transcript": "v011/pg-k1/transcript.json"},
        run=run,
        judge=judge,
    )


def _options(tmp_path: Path) -> RunnerOptions:
    return runner_options(tmp_path, tmp_path / "venv", {"work": tmp_path}, WHEEL)


def test_a_judged_workload_becomes_a_record_whose_status_follows_its_checks(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.5), _options(tmp_path))
    checks = outcome.book.checks()
    assert checks.required == policy.record_checks(CPU, "pg-k1")
    decided = {"run_completed", "reward_varies_within_group", "candidate_bound"}
    assert {c.name for c in checks.executed} == decided
    # The toy judge leaves two required checks undecided: they are skipped, so the record cannot pass.
    assert {c.name for c in checks.skipped} == set(checks.required) - decided
    assert set(outcome.files) == {"figures", "transcript"}
    assert outcome.metrics["scale"] == "reduced" and outcome.metrics["reward_std"] == 0.5
    staging = tmp_path / "qual"
    staging.mkdir()
    result, artifacts = write_workload(staging, outcome, source_commit=COMMIT, wheel_sha256=WHEEL, profile=CPU.name)
    record = load_record(WorkloadRecord, staging / "qualification-pg-k1.json")
    assert record.status == result.status == "failed"
    assert any("was skipped" in r for r in record.reasons)
    roles = {a.role: a.path for a in artifacts}
    assert roles == {
        "pg-k1.figures": "evidence/v011/pg-k1/figures.json",
        "pg-k1.transcript": "evidence/v011/pg-k1/transcript.json",
        "principal_pg_k1": "qualification-pg-k1.json",
    }


def test_a_bad_value_fails_the_judged_check(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.0), _options(tmp_path))
    failed = [c for c in outcome.book.checks().executed if not c.passed]
    # the toy ran no CLI: its empty transcript binds nothing to the candidate
    assert sorted(c.name for c in failed) == ["candidate_bound", "reward_varies_within_group"]


def test_a_run_that_cannot_go_on_is_a_failed_check_not_a_crash(tmp_path: Path) -> None:
    outcome = run_one(_toy(0.5, raises=True), _options(tmp_path))
    failed = {c.name: c.detail for c in outcome.book.checks().executed if not c.passed}
    assert "workload_run" in failed and "could not be started" in failed["workload_run"]


def _judged_not_applicable(name: str) -> Workload:
    """A judge that decides every required check but finds ``name`` measured nothing here."""

    def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
        j = Judgement()
        for check in registry.workload("pg-k1").required_checks:
            if check != name:
                j.check(check, True, "measured")
        j.not_applicable(name, "nothing to measure on this device")
        return j

    return Workload(name="pg-k1", evidence={"transcript": "v011/pg-k1/transcript.json"}, run=lambda c: {}, judge=judge)


def test_a_not_applicable_check_is_recorded_with_its_reason_and_a_required_one_fails_the_level() -> None:
    workload = _judged_not_applicable("kl_measured")
    outcome = judged(workload, {}, CPU, SCALES["cpu-reference"], wheel_sha256=WHEEL)
    checks = outcome.book.checks()
    assert {c.name: c.reason for c in checks.not_applicable} == {"kl_measured": "nothing to measure on this device"}
    assert "kl_measured" not in {c.name for c in checks.executed}
    failures = [f for f in checks.failures() if "candidate_bound" not in f]  # the toy has no transcript
    assert failures == ["required check kl_measured is not applicable: nothing to measure on this device"]


def test_a_check_is_judged_once_whether_measured_or_not() -> None:
    j = Judgement()
    j.not_applicable("teardown", "cpu")
    with pytest.raises(ValueError, match="judged twice"):
        j.check("teardown", True, "x")
    with pytest.raises(ValueError, match="judged twice"):
        j.not_applicable("teardown", "cpu")


def test_undeclared_evidence_is_refused(tmp_path: Path) -> None:
    with pytest.raises(HarnessError, match="does not declare"):
        run_one(_toy(0.5, extra_role=True), _options(tmp_path))


def test_every_profile_declares_its_scale() -> None:
    assert set(SCALES) == set(PROFILES)
    assert SCALES["cpu-reference"].name == "reduced" and SCALES["cpu-reference"].quantization is None
    assert all(s.quantization == "nf4" for n, s in SCALES.items() if PROFILES[n].device == "cuda")


def test_the_registry_says_provided_exactly_for_the_implemented_workloads() -> None:
    for spec in registry.REGISTRY.workloads[1:]:
        assert spec.provided == (catalog.implemented(spec.name) is not None), spec.name


def test_the_evidence_layout_is_explicit_unique_and_versioned() -> None:
    members = catalog.archive_members()
    assert len(set(members.values())) == len(members)
    for spec in registry.REGISTRY.workloads[1:]:
        if spec.asset_role == "subordinate":
            assert members[policy.record_artifact_role(spec)].startswith(catalog.SUBORDINATE_FOLDERS[spec.name] + "/")
    for workload in catalog.WORKLOADS.values():
        assert "transcript" in workload.evidence
        folder = catalog.SUBORDINATE_FOLDERS.get(workload.name, "v011")
        assert all(m.startswith(f"{folder}/") for m in workload.evidence.values()), workload.name


def test_failures_so_far_ignore_checks_not_yet_decided() -> None:
    from harness.qualify.checkbook import CheckBook

    book = CheckBook(["a", "b", "c", "later"])
    book.record("a", True, "ok")
    assert book.failures_so_far() == []
    book.record("b", False, "bad")
    book.skip("c", "an earlier step failed")
    assert book.failures_so_far() == ["check b failed: bad", "required check c was skipped: an earlier step failed"]


# -- statehash: the harness's own hashes of checkpoint files ---------------------------------------------------


def _safetensors(tensors: dict[str, tuple[str, list[int], bytes]], *, header: bytes | None = None) -> bytes:
    """A safetensors file written by hand (no torch): 8-byte little-endian header length, JSON header, data."""
    entries, data = {}, b""
    for name, (dtype, shape, raw) in tensors.items():
        entries[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    head = header if header is not None else json.dumps(entries).encode()
    return struct.pack("<Q", len(head)) + head + data


def _checkpoint(root: Path, lora_b: bytes, *, step: int = 1) -> Path:
    (root / "adapter").mkdir(parents=True)
    adapter = _safetensors(
        {"m.lora_A.weight": ("F32", [2, 2], bytes(range(16))), "m.lora_B.weight": ("F32", [2, 2], lora_b)}
    )
    (root / "adapter" / "adapter_model.safetensors").write_bytes(adapter)
    (root / "rng.safetensors").write_bytes(_safetensors({}))
    files = {
        name: {"bytes": (root / name).stat().st_size, "sha256": hashlib.sha256((root / name).read_bytes()).hexdigest()}
        for name in ("adapter/adapter_model.safetensors", "rng.safetensors")
    }
    (root / "checkpoint.json").write_text(json.dumps({"kind": "miniverl.checkpoint", "step": step, "files": files}))
    return root


def test_state_hashes_hash_each_listed_file_and_each_adapter_tensor(tmp_path: Path) -> None:
    init = _checkpoint(tmp_path / "init", bytes(16))
    moved = _checkpoint(tmp_path / "moved", b"\x01" + bytes(15), step=2)
    labelled = {"init": init, "moved": moved, "gone": tmp_path / "x"}
    out = statehash.write_state_hashes(tmp_path / "sh.json", labelled, tensors=True)
    hashes = statehash.read_state_hashes(out)
    assert hashes is not None and set(hashes.checkpoints) == {"init", "moved"} and not hashes.refused
    table = hashes.checkpoints["moved"].tensors["adapter/adapter_model.safetensors"]
    assert table["m.lora_B.weight"].sha256 == hashlib.sha256(b"\x01" + bytes(15)).hexdigest()
    assert table["m.lora_A.weight"].shape == [2, 2] and table["m.lora_A.weight"].bytes == 16
    name = "adapter/adapter_model.safetensors"
    assert statehash.adapter_moved(hashes, None, "moved", name)[0]
    assert not statehash.adapter_moved(hashes, None, "init", name)[0]  # lora_B all zero: the initial LoRA
    assert statehash.adapter_moved(hashes, "init", "moved", name)[0]
    assert not statehash.adapter_moved(hashes, "moved", "moved", name)[0]  # identical digests: nothing changed
    assert statehash.product_agrees(hashes, "moved", moved / "checkpoint.json")[0]
    assert not statehash.product_agrees(hashes, "moved", init / "checkpoint.json")[0]  # not the one hashed
    assert not statehash.same_files(hashes, "init", "moved", [name])[0]
    assert not statehash.hash_checkpoint(moved).tensors  # per-tensor digests only where a judge asks for them


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"\x05\x00", "shorter than a safetensors header length"),
        (struct.pack("<Q", 1 << 40) + b"{}", "does not fit the file"),
        (struct.pack("<Q", 3) + b"{x}", "not strict JSON"),
        (_safetensors({}, header=b"[1, 2]"), "not a JSON object"),
        (_safetensors({}, header=b'{"t": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}'), "does not fit"),
        (_safetensors({}, header=b'{"t": {"dtype": "Q4", "shape": [1], "data_offsets": [0, 1]}}') + b"x", "dtype"),
        (_safetensors({}, header=b'{"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}') + bytes(4), "shape"),
        (_safetensors({}, header=b'{"t": {"dtype": "F32", "shape": [1]}}'), "dtype/shape/data_offsets"),
    ],
)
def test_a_malformed_safetensors_file_is_refused_with_one_reason(tmp_path: Path, content: bytes, why: str) -> None:
    root = _checkpoint(tmp_path / "c", bytes(16))
    (root / "adapter" / "adapter_model.safetensors").write_bytes(content)
    with pytest.raises(statehash.StateHashError, match=why):
        statehash.hash_checkpoint(root, tensors=True)
    taken = statehash.write_state_hashes(tmp_path / "sh.json", {"c": root}, tensors=True)
    hashes = statehash.read_state_hashes(taken)
    assert hashes is not None and not hashes.checkpoints and why.split()[0] in hashes.refused["c"]
    assert not statehash.same_files(hashes, "c", "c", ["rng.safetensors"])[0]


def _optimizer(steps: list[tuple[str, list[int], bytes]], *, moments: int | None = None) -> bytes:
    """An AdamW state as the product lays it out (``state.<slot>.<key>``): each slot's step as given, and its
    two moments; ``moments`` slots have moments (default: as many as have steps)."""
    tensors = {f"state.{i}.step": step for i, step in enumerate(steps)}
    for i in range(len(steps) if moments is None else moments):
        tensors |= {f"state.{i}.exp_avg": ("F32", [2], bytes(8)), f"state.{i}.exp_avg_sq": ("F32", [2], bytes(8))}
    return _safetensors(tensors)


def _with_optimizer(root: Path, content: bytes) -> Path:
    (root / "optimizer.safetensors").write_bytes(content)
    doc = json.loads((root / "checkpoint.json").read_text())
    doc["files"]["optimizer.safetensors"] = {"bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    (root / "checkpoint.json").write_text(json.dumps(doc))
    return root


def test_the_optimizer_step_counters_are_read_from_the_bytes_hashed(tmp_path: Path) -> None:
    f32 = ("F32", [], struct.pack("<f", 8.0))
    content = _optimizer([f32, ("F64", [1], struct.pack("<d", 8.0)), ("I64", [], struct.pack("<q", 8))])
    root = _with_optimizer(_checkpoint(tmp_path / "c", bytes(16)), content)
    hashed = statehash.hash_checkpoint(root, steps=True)
    counters = hashed.optimizer_steps["optimizer.safetensors"]
    assert counters.sha256 == hashed.files["optimizer.safetensors"].sha256 == hashlib.sha256(content).hexdigest()
    assert counters.slots == 3 and [(t.value, t.slots) for t in counters.steps] == [(8.0, 3)]
    assert not statehash.hash_checkpoint(root).optimizer_steps  # read only where a judge counts them
    out = statehash.write_state_hashes(tmp_path / "sh.json", {"c": root})
    record = statehash.read_state_hashes(out)
    assert statehash.optimizer_step_count(record, "c", "optimizer.safetensors")[0] is None  # not read: not counted
    record = statehash.read_state_hashes(statehash.write_taken(tmp_path / "s.json", {"c": hashed}))
    assert statehash.optimizer_step_count(record, "c", "optimizer.safetensors")[0] == 8.0
    assert statehash.optimizer_step_count(record, "c", "critic_optimizer.safetensors")[0] is None
    other = hashed.model_copy(update={"optimizer_steps": {"optimizer.safetensors": counters.model_copy(
        update={"sha256": "e" * 64})}})  # fmt: skip
    record = statehash.read_state_hashes(statehash.write_taken(tmp_path / "o.json", {"c": other}))
    value, why = statehash.optimizer_step_count(record, "c", "optimizer.safetensors")
    assert value is None and "other bytes" in why


def test_optimizer_slots_that_disagree_count_nothing(tmp_path: Path) -> None:
    steps = [("F32", [], struct.pack("<f", 8.0)), ("BF16", [], struct.pack("<f", 7.0)[2:])]
    root = _with_optimizer(_checkpoint(tmp_path / "c", bytes(16)), _optimizer(steps))
    hashed = statehash.hash_checkpoint(root, steps=True)
    assert [(t.value, t.slots) for t in hashed.optimizer_steps["optimizer.safetensors"].steps] == [(7.0, 1), (8.0, 1)]
    record = statehash.read_state_hashes(statehash.write_taken(tmp_path / "s.json", {"c": hashed}))
    value, why = statehash.optimizer_step_count(record, "c", "optimizer.safetensors")
    assert value is None and "(7.0, 1), (8.0, 1)" in why


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (_optimizer([("F32", [2], bytes(8))]), "not one number"),
        (_optimizer([("BOOL", [], b"\x01")]), "not one number"),
        (_optimizer([("F32", [], struct.pack("<f", float("nan")))]), "not finite"),
        (_optimizer([("F32", [], struct.pack("<f", 1.0))], moments=2), "1 of 2 parameter slots have no step"),
        (b"\x05\x00", "shorter than a safetensors header length"),
    ],
)
def test_an_optimizer_file_without_one_step_per_slot_is_refused(tmp_path: Path, content: bytes, why: str) -> None:
    root = _with_optimizer(_checkpoint(tmp_path / "c", bytes(16)), content)
    with pytest.raises(statehash.StateHashError, match=why):
        statehash.hash_checkpoint(root, steps=True)
    taken = statehash.take(root, steps=True)
    assert isinstance(taken, str) and why.split()[0] in taken


def test_a_listed_file_outside_the_checkpoint_or_behind_a_symlink_is_refused(tmp_path: Path) -> None:
    root = _checkpoint(tmp_path / "c", bytes(16))
    (tmp_path / "elsewhere").write_bytes(b"x")
    (root / "rng.safetensors").unlink()
    (root / "rng.safetensors").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(statehash.StateHashError, match="symlink"):
        statehash.hash_checkpoint(root)
    doc = json.loads((root / "checkpoint.json").read_text())
    doc["files"]["../elsewhere"] = doc["files"].pop("rng.safetensors")
    (root / "checkpoint.json").write_text(json.dumps(doc))
    with pytest.raises(statehash.StateHashError, match="not a relative path"):
        statehash.hash_checkpoint(root)


@pytest.mark.parametrize("content", [b"", b"{}", b'{"kind": "harness.state-hashes", "extra": 1}', b"\xff"])
def test_a_state_hashes_file_that_is_not_one_reads_as_none(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "sh.json").write_bytes(content)
    assert statehash.read_state_hashes(tmp_path / "sh.json") is None
    assert not statehash.same_files(None, "a", "b", ["x"])[0]

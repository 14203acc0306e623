"""The v0.15 direct-config workload (native GRPO and PPO with 2 epochs x 2 mini-batches): its judge on the evidence
in tests/harness/full_fixtures/direct-config/ (laid out by archive member), one bad value per check, hostile
evidence; and its harness inputs (the examples' native GRPO 2x2 and PPO files, exact bytes).

The evidence is real: ``python -m harness workload direct-config --profile cpu-reference`` on a wheel of this branch
(with the multipass and nativeppo work merged), verl 0.9.1's venv for the diagnosis.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU, CUDA, HOSTILE, EvidenceKit

from harness.core import policy, registry
from harness.core.proc import HARNESS_DIR
from harness.qualify.full import direct_config
from harness.qualify.full import direct_config_layout as layout
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import WorkloadFailure
from harness.qualify.full.catalog import SUBORDINATE_FOLDERS, archive_members, implemented
from harness.qualify.full.scales import SCALES

W = direct_config.WORKLOAD
GRPO, PPO = layout.CONFIGS
ACTOR_OPT, CRITIC_OPT = layout.ACTOR_OPTIMIZER, layout.CRITIC_OPTIMIZER
KIT = EvidenceKit(W)
FIXTURE = KIT.fixture
CHECKS = policy.required_checks(CPU, W.name)
_edit_json, _edit_line, _exit, _digest, _set = KIT.edit_json, KIT.edit_line, KIT.exit, KIT.digest, KIT.set
Edit = Callable[[Path], None]


@pytest.mark.parametrize("profile", [CPU, CUDA], ids=["cpu", "cuda"])
def test_the_evidence_passes_every_required_check(profile: Any, tmp_path: Path) -> None:
    root = FIXTURE if profile is CPU else KIT.as_cuda(FIXTURE, tmp_path / "cuda")
    checks = KIT.judge(root, profile)
    assert set(checks) == set(policy.required_checks(profile, W.name)) == set(CHECKS)
    assert all(checks.values()), checks


def test_cpu_evidence_does_not_pass_for_a_cuda_profile() -> None:
    assert KIT.failed(FIXTURE, CUDA) == {"run_completed"}  # the plan ran on the CPU


def test_the_evidence_members_are_declared_small_and_portable() -> None:
    members = KIT.members()
    assert members == sorted(W.evidence.values())
    assert KIT.fixture_bytes() < 300_000
    for member in members:
        text = (FIXTURE / member).read_text()
        assert "/tmp/" not in text and "/work/" not in text and "/root" not in text, member


def test_it_is_registered_as_the_v015_subordinate_record() -> None:
    spec = registry.workload(W.name)
    assert spec.provided and spec.provided_by == "harness/qualify/full/direct_config.py" and implemented(W.name) is W
    assert spec.asset_role == "subordinate" and SUBORDINATE_FOLDERS[W.name] == "v015"
    assert archive_members()[policy.record_artifact_role(spec)] == "v015/direct-config.json"
    assert all(member.startswith("v015/direct-config/") for member in W.evidence.values())


@pytest.mark.parametrize("config", layout.CONFIGS, ids=lambda c: c.key)
def test_each_input_is_the_examples_exact_bytes(config: Any) -> None:
    example = HARNESS_DIR.parent / "examples" / config.native
    assert (layout.INPUTS / config.native).read_bytes() == example.read_bytes()


# Lines of each native file that fix its counts: verl's train_batch_size, and ppo_epochs / ppo_mini_batch_size of
# the actor (4 spaces deep) and the critic (2 spaces deep).
DECLARED = {
    "grpo": ["  train_batch_size: 2", "    ppo_epochs: 2", "    ppo_mini_batch_size: 1", "critic: {enable: false}"],
    "ppo": [
        "  train_batch_size: 2",
        "    ppo_epochs: 2",
        "    ppo_mini_batch_size: 1",
        "  ppo_epochs: 1",
        "  ppo_mini_batch_size: 1",
        "  adv_estimator: gae",
    ],
}


@pytest.mark.parametrize("config", layout.CONFIGS, ids=lambda c: c.key)
def test_each_input_declares_the_counts_the_judge_requires(config: Any) -> None:
    lines = (layout.INPUTS / config.native).read_text().splitlines()
    assert all(lines.count(line) == 1 for line in DECLARED[config.key]), DECLARED[config.key]
    assert (layout.ACTOR_EPOCHS, layout.ACTOR_MINI_BATCHES) == (2, 2 // 1)
    assert (layout.CRITIC_EPOCHS, layout.CRITIC_MINI_BATCHES) == (1, 2 // 1)


@pytest.mark.parametrize("config", layout.CONFIGS, ids=lambda c: c.key)
def test_the_replay_file_changes_exactly_one_line(tmp_path: Path, config: Any) -> None:
    native = (layout.INPUTS / config.native).read_bytes()
    replay = layout.one_line_changed(native, *layout.REPLAY_LINE, config.native)
    old, new = native.decode().splitlines(), replay.decode().splitlines()
    line, replacement = layout.REPLAY_LINE
    assert [(a, b) for a, b in zip(old, new, strict=True) if a != b] == [(line[:-1], replacement[:-1])]
    with pytest.raises(WorkloadFailure):
        layout.one_line_changed(native.replace(line.encode(), b""), line, replacement, "none")
    with pytest.raises(WorkloadFailure):  # twice is not once
        layout.one_line_changed(native + line.encode(), line, replacement, "twice")
    # whole lines: the actor's indented `ppo_epochs` is not the critic's
    assert native.count(b"\n  ppo_epochs: ") == (1 if config.critic else 0)


def _nested(role: str, keys: list[str], value: Any) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        node = doc
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return lambda root: _edit_json(root, role, change)


def _diff_entry(role: str, key: str, **values: Any) -> Edit:
    def change(doc: dict[str, Any]) -> None:
        for entry in doc["entries"]:
            if entry["key"] == key:
                entry.update(values)

    return lambda root: _edit_json(root, role, change)


def _diff_without(role: str, key: str) -> Edit:
    return lambda root: _edit_json(root, role, lambda d: d.update(entries=[e for e in d["entries"] if e["key"] != key]))


def _append(role: str, data: bytes) -> Edit:
    def edit(root: Path) -> None:
        KIT.path(root, role).write_bytes(KIT.path(root, role).read_bytes() + data)

    return edit


def _algo(role: str, index: int, **values: Any) -> Edit:
    """Metrics line ``index`` of ``role`` records ``values`` among its algorithm metrics (None: drops the key)."""

    def edit(root: Path) -> None:
        path = KIT.path(root, role)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        metrics = lines[index]["algorithm_metrics"]
        metrics.update(values)
        lines[index]["algorithm_metrics"] = {k: v for k, v in metrics.items() if v is not None}
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    return edit


def _plan_text(root: Path) -> None:
    _edit_json(
        root,
        "grpo_plan",
        lambda d: d["direct_config"]["native"].update(text=d["direct_config"]["native"]["text"] + " "),
    )


def _another_native_file(root: Path) -> None:
    """The PPO folder tells one story consistently, of a native file that is not the harness input (its records,
    bundle copy and bindings all agree with each other)."""
    native = KIT.path(root, "ppo_bundle_native")
    old = hashlib.sha256(native.read_bytes()).hexdigest()
    native.write_bytes(native.read_bytes() + b"# another file\n")
    new = hashlib.sha256(native.read_bytes()).hexdigest()
    for path in (root / layout.FOLDER / "ppo").rglob("*.json"):
        path.write_text(path.read_text().replace(old, new))
    _edit_json(root, "ppo_plan", lambda d: d["direct_config"]["native"].update(text=native.read_text()))
    manifest = hashlib.sha256(KIT.path(root, "ppo_bundle_manifest").read_bytes()).hexdigest()
    _edit_json(root, "ppo_handoff", lambda d: d.update(manifest_sha256=manifest))


def _without_critic_state(root: Path) -> None:
    """Both PPO checkpoints lack the critic's files, told consistently by the product and the harness."""
    for label in ("ppo_checkpoint_2", "ppo_replay_checkpoint_2"):

        def listing(doc: dict[str, Any]) -> None:
            for name in layout.CRITIC_STATE:
                doc["files"].pop(name)

        def hashes(doc: dict[str, Any], label: str = label) -> None:
            for name in layout.CRITIC_STATE:
                doc["checkpoints"][label]["files"].pop(name)

        _edit_json(root, label, listing)
        _edit_json(root, "state_hashes", hashes)
        KIT.forged(label, "rng.safetensors", product=False, harness=False)(root)  # rebinds the edited listing


def _counters(label: str, name: str, change: Callable[[dict[str, Any], dict[str, Any]], None]) -> Edit:
    """An edit of the harness's record of the step counters it read from file ``name`` of checkpoint ``label``
    (``change`` gets that record's entry and the checkpoint's)."""

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["checkpoints"][label]
        change(entry["optimizer_steps"][name], entry)

    return lambda root: _edit_json(root, "state_hashes", edit)


def _step_value(label: str, name: str, value: float) -> Edit:
    return _counters(label, name, lambda counters, _: counters["steps"][0].update(value=value))


def _counters_of(label: str, name: str, source_label: str, source_name: str) -> Edit:
    """Checkpoint ``label``'s counters of ``name`` are those read from ``source_name`` of ``source_label``, bound
    to ``name``'s sha256 (only the values are another file's)."""

    def edit(doc: dict[str, Any]) -> None:
        entry = doc["checkpoints"][label]
        other = dict(doc["checkpoints"][source_label]["optimizer_steps"][source_name])
        entry["optimizer_steps"][name] = other | {"sha256": entry["files"][name]["sha256"]}

    return lambda root: _edit_json(root, "state_hashes", edit)


def _counters_dropped(label: str, name: str) -> Edit:
    return lambda root: _edit_json(root, "state_hashes", lambda d: d["checkpoints"][label]["optimizer_steps"].pop(name))


def _counters_of_another_file(label: str, name: str) -> Edit:
    """The counters were read from other bytes (another run's file) than the sha256 the harness bound."""
    return _counters(label, name, lambda counters, _: counters.update(sha256="e" * 64))


def _slots_disagree(label: str, name: str) -> Edit:
    def change(counters: dict[str, Any], _: dict[str, Any]) -> None:
        tally = counters["steps"][0]
        counters["steps"] = [{"value": tally["value"] - 1, "slots": 1}, tally | {"slots": tally["slots"] - 1}]

    return _counters(label, name, change)


def _file_dropped(label: str, name: str) -> Edit:
    """Checkpoint ``label`` holds no file ``name``, told consistently by the product and the harness."""

    def edit(root: Path) -> None:
        _edit_json(root, label, lambda d: d["files"].pop(name))

        def hashes(doc: dict[str, Any]) -> None:
            doc["checkpoints"][label]["files"].pop(name)
            doc["checkpoints"][label]["optimizer_steps"].pop(name)

        _edit_json(root, "state_hashes", hashes)
        KIT.forged(label, "rng.safetensors", product=False, harness=False)(root)  # rebinds the edited listing

    return edit


def _file_added(label: str, name: str, source_label: str) -> Edit:
    """Checkpoint ``label`` holds file ``name`` as checkpoint ``source_label`` does, told consistently by the
    product and the harness (a GRPO checkpoint with a critic's optimizer)."""

    def edit(root: Path) -> None:
        record = json.loads(KIT.path(root, "state_hashes").read_text())
        hashed = record["checkpoints"][source_label]
        _edit_json(root, label, lambda d: d["files"].update({name: hashed["files"][name]}))

        def hashes(doc: dict[str, Any]) -> None:
            doc["checkpoints"][label]["files"][name] = hashed["files"][name]
            doc["checkpoints"][label]["optimizer_steps"][name] = hashed["optimizer_steps"][name]

        _edit_json(root, "state_hashes", hashes)
        KIT.forged(label, "rng.safetensors", product=False, harness=False)(root)

    return edit


def _optimizers_swapped(label: str) -> Edit:
    """Checkpoint ``label``'s actor and critic optimizer files trade places, told consistently by the product
    (checkpoint.json) and the harness (hashes and counters)."""
    names = (layout.ACTOR_OPTIMIZER, layout.CRITIC_OPTIMIZER)

    def swap(table: dict[str, Any]) -> None:
        table[names[0]], table[names[1]] = table[names[1]], table[names[0]]

    def edit(root: Path) -> None:
        _edit_json(root, label, lambda d: swap(d["files"]))

        def hashes(doc: dict[str, Any]) -> None:
            swap(doc["checkpoints"][label]["files"])
            swap(doc["checkpoints"][label]["optimizer_steps"])

        _edit_json(root, "state_hashes", hashes)
        KIT.forged(label, "rng.safetensors", product=False, harness=False)(root)

    return edit


def _listing_of(role: str, source: str) -> Edit:
    """The kept checkpoint.json of ``role`` is in fact ``source``'s (another checkpoint's, or another run's)."""
    return lambda root: KIT.path(root, role).write_bytes(KIT.path(root, source).read_bytes())


def _compiler(*roles: str) -> Edit:
    """Each file of ``roles`` names a compiler that is not verl's."""

    def edit(root: Path) -> None:
        for role in roles:
            _edit_json(root, role, lambda d: d.update(compiler="not-a-verl-compiler"))

    return edit


def _no_gradient_anywhere(root: Path) -> None:
    """Every GRPO update, straight and replayed alike, had a zero gradient."""
    for role, lines in (("grpo_metrics", 3), ("grpo_replay_metrics", 2)):
        for index in range(lines):
            _edit_line(root, role, index, "grad_norm", 0.0)


def _set_plan(role: str, section: str, **values: Any) -> Edit:
    return lambda root: _edit_json(root, role, lambda d: d["config"]["algorithm"][section].update(values))


BAD: dict[str, list[Edit]] = {
    "run_completed": [
        _exit("run_grpo", 1),
        _exit("inspect_3_ppo", 1),
        _exit("resume_extend_ppo", 124),
        _set("ppo_summary", "updates", 2),
        _set("ppo_summary", "algorithm", "grpo"),
        lambda root: _edit_json(
            root, "grpo_plan", lambda d: d["config"]["rollout"].update(samples_per_prompt=8)
        ),  # not the native file's rollout.n
        lambda root: _edit_json(root, "ppo_plan", lambda d: d["config"]["models"].update(device="auto")),
        _set("grpo_summary", "status", "failed"),
        _nested("ppo_resume_output", ["summary", "resumed_from_step"], None),
        _nested("grpo_run_output", ["summary", "updates"], 1),
        _set("ppo_inspect_3", "last_complete_step", 2),
        _nested("ppo_plan", ["config", "algorithm", "name"], "grpo"),
        lambda root: _edit_line(root, "grpo_metrics", 2, "loss", None),
    ],
    "native_bytes_unchanged": [
        _set("grpo_native_sha256", "sha256_after", "0" * 64),
        _set("ppo_native_sha256", "file", "verl-native-grpo.yaml"),
        _set("ppo_plan_output", "native_sha256", "1" * 64),
        _plan_text,
        _nested("ppo_inspect_2", ["direct_config", "native_sha256_verified"], False),
        _nested("grpo_inspect_3", ["direct_config", "native_sha256"], "2" * 64),
        _nested("ppo_handoff", ["direct_config", "native_sha256"], "3" * 64),
        _set("grpo_native_diff", "native_sha256", "4" * 64),
        _append("ppo_bundle_native", b"\n"),
        _another_native_file,
    ],
    "actor_passes": [
        _diff_entry("grpo_native_diff", "actor_rollout_ref.actor.ppo_epochs", native=1),
        _diff_entry("ppo_native_diff", "actor_rollout_ref.actor.ppo_mini_batch_size", native=2),
        _diff_entry("grpo_native_diff", "data.train_batch_size", status="changed"),
        _diff_without("ppo_native_diff", "actor_rollout_ref.actor.ppo_epochs"),
        _set_plan("grpo_plan", "grpo", ppo_epochs=1),
        _set_plan("ppo_plan", "ppo", mini_batches=1),
        _algo("grpo_metrics", 2, **{"actor/updates": 2.0}),
        _algo("ppo_metrics", 2, **{"actor/passes": 4.0}),
        _algo("grpo_metrics", 2, **{"actor/mini_batches": None}),
        lambda root: _edit_line(root, "ppo_metrics", 2, "grad_norm", None),
        _no_gradient_anywhere,
        lambda root: _edit_line(root, "grpo_metrics", 2, "adapter_delta_norm", None),
        _set("ppo_summary", "adapter_changed_each_update", False),
        # the optimizer state, as the harness read it from the files it hashed
        _step_value("grpo_checkpoint_2", ACTOR_OPT, 7.0),  # edited
        _step_value("ppo_checkpoint_3", ACTOR_OPT, 8.0),  # one update's steps short
        _counters_dropped("ppo_checkpoint_3", ACTOR_OPT),  # missing
        _file_dropped("grpo_checkpoint_1", ACTOR_OPT),
        _counters_of("ppo_checkpoint_2", ACTOR_OPT, "ppo_checkpoint_2", CRITIC_OPT),  # swapped: the critic's
        _counters_of("grpo_checkpoint_2", ACTOR_OPT, "grpo_checkpoint_1", ACTOR_OPT),  # swapped: checkpoint 1's
        _counters_of("ppo_checkpoint_3", ACTOR_OPT, "grpo_checkpoint_2", ACTOR_OPT),  # another run's, other step
        _counters_of_another_file("grpo_checkpoint_3", ACTOR_OPT),  # from another run
        KIT.harness_hash("ppo_checkpoint_3", ACTOR_OPT, "e" * 64),  # hashed other bytes than the product lists
        _listing_of("grpo_checkpoint_3", "grpo_checkpoint_2"),  # checkpoint 2's listing kept as 3's
        _listing_of("grpo_checkpoint_1", "ppo_checkpoint_1"),  # another run's listing
        _slots_disagree("grpo_checkpoint_1", ACTOR_OPT),
        KIT.forged("ppo_checkpoint_1", ACTOR_OPT, harness=False),  # the product lists another sha256 than hashed
    ],
    "critic_counts": [
        _diff_entry("ppo_native_diff", "critic.ppo_epochs", native=2),
        _diff_entry("ppo_native_diff", "critic.ppo_mini_batch_size", status="changed"),
        _diff_without("ppo_native_diff", "critic.ppo_epochs"),
        _set_plan("ppo_plan", "ppo", critic_ppo_epochs=2),
        _set_plan("ppo_plan", "ppo", critic_ppo_epochs=None),  # the actor's 2, not the critic's 1
        _algo("ppo_metrics", 2, **{"critic/updates": 4.0}),  # the actor's count
        _algo("ppo_metrics", 2, **{"critic/mini_batches": 1.0}),
        _algo("ppo_metrics", 2, **{"critic/updates": None}),
        _algo("ppo_metrics", 2, **{"critic/delta_norm": 0.0}),  # the critic did not move
        _algo("grpo_metrics", 2, **{"critic/updates": 2.0}),  # GRPO has no critic
        # the critic's optimizer state, as the harness read it from the files it hashed
        _step_value("ppo_checkpoint_2", CRITIC_OPT, 8.0),  # edited: the actor's count
        _step_value("ppo_checkpoint_1", CRITIC_OPT, 1.0),  # one mini-batch, not two
        _counters_dropped("ppo_checkpoint_3", CRITIC_OPT),  # missing
        _counters_of("ppo_checkpoint_3", CRITIC_OPT, "ppo_checkpoint_3", ACTOR_OPT),  # swapped: the actor's
        _counters_of("ppo_checkpoint_2", CRITIC_OPT, "ppo_checkpoint_1", CRITIC_OPT),  # swapped: checkpoint 1's
        _counters_of_another_file("ppo_checkpoint_2", CRITIC_OPT),  # from another run
        KIT.harness_hash("ppo_checkpoint_3", CRITIC_OPT, "e" * 64),  # hashed other bytes than the product lists
        _slots_disagree("ppo_checkpoint_1", CRITIC_OPT),
        _file_added("grpo_checkpoint_3", CRITIC_OPT, "ppo_checkpoint_3"),  # GRPO with a critic's optimizer
    ],
    "resume_tensor_exact": [
        KIT.forged("ppo_replay_checkpoint_2", "critic_params.safetensors"),  # the replay's critic holds other bytes
        KIT.forged("ppo_checkpoint_2", "critic_optimizer.safetensors"),
        KIT.forged("grpo_replay_checkpoint_2", "optimizer.safetensors"),
        KIT.forged("grpo_checkpoint_2", "adapter/adapter_model.safetensors"),
        KIT.forged("ppo_checkpoint_2", "rng.safetensors", product=False),  # the product misstates what it wrote
        KIT.refused("ppo_replay_checkpoint_2"),
        _digest("grpo_replay_checkpoint_2", "optimizer.safetensors"),
        KIT.forged("ppo_checkpoint_2", "critic_params.safetensors", harness=False),
        _set("ppo_replay_summary", "resumed_from_step", None),
        lambda root: _edit_line(root, "grpo_replay_metrics", 1, "reward_mean", 0.5),
        _exit("resume_replay_ppo", 1),
        _nested("grpo_replay_first_output", ["summary", "updates"], 2),
    ],
    "handoff_digests": [
        _set("grpo_handoff", "ir_digest", "0" * 64),
        _set("ppo_diagnose", "rules_digest", "1" * 64),
        _nested("ppo_plan_output", ["handoff", "compiler"], wt.VERL_COMPILER_GRPO),  # PPO to the GRPO compiler
        _nested("grpo_plan_output", ["handoff", "status"], "refused"),
        _nested("ppo_native_diff", ["counts", "changed"], 1),
        _set("grpo_native_diff", "semantically_equal", False),
        _nested("ppo_bundle_manifest", ["direct_config", "rules_digest"], "5" * 64),
        _exit("handoff_ppo", 1),
        # the compiler identity: each file alone, and all of them agreeing on a compiler that is not verl's
        _compiler("ppo_handoff"),
        _compiler("grpo_diagnose"),
        _compiler("ppo_bundle_manifest"),
        _compiler("grpo_handoff", "grpo_diagnose", "grpo_bundle_manifest"),
        _compiler(*(c.role(r) for c in layout.CONFIGS for r in ("handoff", "diagnose", "bundle_manifest"))),
        _nested("grpo_plan_output", ["handoff", "compiler"], "not-a-verl-compiler"),
        lambda root: (
            _compiler("ppo_handoff", "ppo_diagnose", "ppo_bundle_manifest")(root),
            _nested("ppo_plan_output", ["handoff", "compiler"], "not-a-verl-compiler")(root),
        ),
    ],
    "launch_status": [
        _set("ppo_diagnose", "launch_status", "compose_failed"),
        _set("grpo_diagnose", "blockers", ["ray_missing"]),
        _set("ppo_diagnose", "verl_version", "0.8.0"),
        _exit("diagnose_grpo", 1),
    ],
}


def test_every_check_is_seen_failing() -> None:
    assert set(BAD) == set(CHECKS)


@pytest.mark.parametrize(("check", "index"), [(c, i) for c, edits in BAD.items() for i in range(len(edits))])
def test_one_bad_value_fails_exactly_its_check(ev: Path, tmp_path: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert KIT.failed(ev) == {check}
    assert KIT.failed(KIT.as_cuda(ev, tmp_path / "cuda"), CUDA) == {check}


# Evidence wrong for both roles' counts at once (each fails both checks, and the critic's state also the replay).
BOTH_COUNTS: dict[str, tuple[Edit, set[str]]] = {
    "optimizers_swapped": (_optimizers_swapped("ppo_checkpoint_3"), set()),
    "checkpoint_1_listing_missing": (lambda root: KIT.path(root, "ppo_checkpoint_1").unlink(), set()),
    "checkpoint_3_not_hashed": (KIT.refused("ppo_checkpoint_3"), set()),
    "grpo_checkpoint_1_not_hashed": (KIT.refused("grpo_checkpoint_1"), set()),  # no critic state: unproven
    "no_state_hashes": (lambda root: KIT.path(root, "state_hashes").unlink(), {"resume_tensor_exact"}),
    "without_critic_state": (_without_critic_state, {"resume_tensor_exact"}),
    # the kept checkpoint.json edited after the harness read it: no longer the one hashed
    "listing_edited": (_digest("ppo_checkpoint_2", "critic_params.safetensors"), {"resume_tensor_exact"}),
}


@pytest.mark.parametrize("name", sorted(BOTH_COUNTS))
def test_optimizer_state_wrong_for_both_roles_fails_both_counts(ev: Path, name: str) -> None:
    edit, also = BOTH_COUNTS[name]
    edit(ev)
    failed = KIT.failed(ev)
    if name == "without_critic_state":  # the actor's optimizer is still there and counts right
        assert failed == {"critic_counts"} | also
    else:
        assert failed == {"actor_passes", "critic_counts"} | also


def test_the_counts_are_read_from_the_optimizer_state_the_harness_hashed() -> None:
    """At the straight run's checkpoints 1, 2, 3 AdamW counted 4 actor steps and 2 critic
    steps per update in every parameter slot, as the harness read them from the files whose sha256 it bound."""
    record = json.loads(KIT.path(FIXTURE, "state_hashes").read_text())
    for config in layout.CONFIGS:
        for role, step in layout.COUNTED:
            entry = record["checkpoints"][config.role(role)]
            assert entry["step"] == step
            names = {ACTOR_OPT: 4} | ({CRITIC_OPT: 2} if config.critic else {})
            assert set(entry["optimizer_steps"]) == set(names)
            for name, per_update in names.items():
                counters = entry["optimizer_steps"][name]
                assert counters["sha256"] == entry["files"][name]["sha256"]
                assert counters["slots"] > 0
                assert counters["steps"] == [{"value": float(step * per_update), "slots": counters["slots"]}]
    judged = W.judge(KIT.evidence(FIXTURE), CPU, SCALES["cpu-reference"])
    actor, critic = judged.checks["actor_passes"][1], judged.checks["critic_counts"][1]
    assert "checkpoint_3 (step 3): optimizer.safetensors" in actor and "at step 12 (want 12)" in actor
    assert "checkpoint_3 (step 3): critic_optimizer.safetensors" in critic and "at step 6 (want 6)" in critic


def test_without_verl_the_launch_is_not_diagnosed_and_fails(ev: Path) -> None:
    _edit_json(ev, "diagnose_environment", lambda d: d.update(verl_python=None, reason="no verl 0.9.1 given"))
    for config in layout.CONFIGS:
        KIT.path(ev, config.role("diagnose")).unlink()
    judged = W.judge(KIT.evidence(ev), CPU, SCALES["cpu-reference"])
    failed = {name for name, (ok, _) in judged.checks.items() if not ok}
    assert failed == {"launch_status", "handoff_digests"}
    assert "grpo: not diagnosed: no verl 0.9.1 given | ppo: not diagnosed" in judged.checks["launch_status"][1]


def test_a_nan_in_the_metrics_fails_without_raising(ev: Path) -> None:
    path = KIT.path(ev, "ppo_metrics")
    path.write_text(path.read_text().replace('"grad_norm":', '"grad_norm":NaN,"was":', 1))
    assert {"run_completed", "actor_passes", "resume_tensor_exact"} <= KIT.failed(ev)


def test_a_replay_line_that_is_not_json_fails_without_raising(ev: Path) -> None:
    _append("grpo_replay_metrics", b"{not json}\n")(ev)
    assert KIT.failed(ev) == {"resume_tensor_exact"}


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    KIT.spoil(ev, role, kind)
    assert KIT.failed(ev)


def test_no_evidence_at_all_fails_every_check() -> None:
    judged = W.judge({}, CPU, SCALES["cpu-reference"])
    assert {name for name, (ok, _) in judged.checks.items() if not ok} == set(CHECKS)


def test_the_details_say_the_steps_the_runtime_recorded() -> None:
    judged = W.judge(KIT.evidence(FIXTURE), CPU, SCALES["cpu-reference"])
    actor, critic = judged.checks["actor_passes"][1], judged.checks["critic_counts"][1]
    assert actor.count("recorded per line [(4.0, 2.0, 2.0), (4.0, 2.0, 2.0), (4.0, 2.0, 2.0)] (want (4, 2, 2)") == 2
    assert "ppo_epochs 2 x (train_batch_size 2 / ppo_mini_batch_size 1) = 4 (bundle = native for 3/3 keys)" in actor
    assert "grpo: no critic" in critic
    assert (
        "ppo: verl critic steps per training step: ppo_epochs 1 x (train_batch_size 2 / ppo_mini_batch_size 1)"
        in critic
    )
    assert "recorded per line [(2.0, 1.0, 2.0), (2.0, 1.0, 2.0), (2.0, 1.0, 2.0)] (want (2, 1, 2)" in critic
    assert json.loads(KIT.path(FIXTURE, "ppo_native_sha256").read_text())["file"] == PPO.native
    assert judged.metrics["ppo_line1_pg_clipfrac"] is not None  # the clip at work, shown in the record


def test_a_lone_surrogate_in_the_plans_native_text_fails_without_raising(ev: Path) -> None:
    path = KIT.path(ev, "ppo_plan")
    path.write_text(path.read_text().replace('"text": "', '"text": "\\ud800', 1))
    assert KIT.failed(ev) == {"native_bytes_unchanged"}

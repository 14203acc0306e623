"""The models each profile's scale declares (harness/qualify/full/scales.py), judged from the plans that ran.

The release card declares the seed's Qwen3-0.6B and DistilBERT SST-2 reward model at pinned hub revisions; the other
profiles declare SmolLM2 and the tiny classifier standing in, and the record says which stood in for which. A plan
that used another model, another revision, an unpinned hub model, a role's model in another role, or no plan at all
fails the check that trains or scores with it.
"""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from full_evidence import CPU

from harness.qualify.full import grpo_cycles, ppo_rm_handoff, runs
from harness.qualify.full.base import Judgement, Scale
from harness.qualify.full.scales import (
    SCALES,
    SEED_REWARD,
    SEED_REWARD_REVISION,
    SEED_STUDENT,
    SEED_STUDENT_REVISION,
)

FIXTURES = Path(__file__).parent / "full_fixtures"
RELEASE = SCALES["rtx4080-wsl2-cu130"]
FILES = "5" * 64


def _seed_plan() -> dict[str, Any]:
    """A plan as the release card's ppo-rm-handoff makes it: the seed's models at their revisions, pinned files."""
    return {
        "config": {
            "models": {
                "student": {"source": "hub", "model_id": SEED_STUDENT, "revision": SEED_STUDENT_REVISION},
                "reward": {"source": "hub", "model_id": SEED_REWARD, "revision": SEED_REWARD_REVISION},
            }
        },
        "models": {
            "student": {
                "source": "hub",
                "model_id": SEED_STUDENT,
                "revision": SEED_STUDENT_REVISION,
                "files_sha256": FILES,
            },
            "reward": {
                "role": "sequence_classifier",
                "source": "hub",
                "model_id": SEED_REWARD,
                "revision": SEED_REWARD_REVISION,
                "files_sha256": FILES,
            },
        },
    }


def _judge(plan: dict[str, Any] | None, scale: Scale = RELEASE) -> tuple[bool, str, Judgement]:
    j = Judgement()
    ok, why = runs.models_as_declared(j, plan, scale, ("student", "reward"))
    return ok, why, j


def test_the_release_card_declares_the_seed_models_and_the_others_stand_ins() -> None:
    assert [(m.role, m.used, m.stands_in) for m in RELEASE.models] == [
        ("student", f"{SEED_STUDENT}@{SEED_STUDENT_REVISION}", False),
        ("reward", f"{SEED_REWARD}@{SEED_REWARD_REVISION}", False),
    ]
    for name in ("cpu-reference", "h100-cu130", "h200-cu130"):
        assert [(m.role, m.requested, m.used, m.stands_in) for m in SCALES[name].models] == [
            ("student", SEED_STUDENT, "builtin:smollm2-135m-instruct", True),
            ("reward", SEED_REWARD, "tiny", True),
        ]
    assert runs.model_sets(RELEASE, ("student",)) == [
        "models.student.source=hub",
        f"models.student.model_id={SEED_STUDENT}",
        f"models.student.revision={SEED_STUDENT_REVISION}",
    ]
    assert runs.model_sets(SCALES["h100-cu130"], ("student", "reward")) == []


def test_the_seed_models_at_their_revisions_pass_and_the_record_says_none_stood_in() -> None:
    ok, why, j = _judge(_seed_plan())
    assert ok, why
    assert j.metrics["model_student_requested"] == SEED_STUDENT and j.metrics["model_student_stands_in"] is False
    assert j.metrics["model_reward_declared"] == f"{SEED_REWARD}@{SEED_REWARD_REVISION}"


def _identity(role: str, **changes: Any) -> Callable[[dict[str, Any]], None]:
    return lambda plan: plan["models"][role].update(changes)


BAD_PLANS: dict[str, Callable[[dict[str, Any]], None]] = {
    "another_revision": _identity("student", revision="0" * 40),
    "config_names_another_revision": lambda p: p["config"]["models"]["reward"].update(revision="1" * 40),
    "unpinned_files": lambda p: p["models"]["student"].pop("files_sha256"),
    "files_digest_not_hex": _identity("reward", files_sha256="not-a-digest"),
    "another_model": _identity("student", model_id="Qwen/Qwen3-1.7B"),
    "roles_swapped": lambda p: p["models"].update(student=p["models"]["reward"], reward=p["models"]["student"]),
    "the_stand_in": lambda p: p["models"].update(student={"source": "builtin", "name": "smollm2-135m-instruct"}),
    "tiny_reward": lambda p: p["models"].update(reward={"source": "tiny"}),
    "role_missing": lambda p: p["models"].pop("reward"),
}


@pytest.mark.parametrize("label", sorted(BAD_PLANS))
def test_a_plan_with_other_models_fails_on_the_release_card(label: str) -> None:
    plan = _seed_plan()
    BAD_PLANS[label](plan)
    ok, why, _ = _judge(plan)
    assert not ok and "NOT the declared model" in why, why


def test_no_plan_fails() -> None:
    ok, why, _ = _judge(None)
    assert not ok and why == "models: no readable plan"


def test_the_seed_models_are_not_accepted_where_the_scale_declares_stand_ins() -> None:
    ok, why, _ = _judge(_seed_plan(), SCALES["h100-cu130"])
    assert not ok and "the scale declares builtin:smollm2-135m-instruct (a stand-in)" in why


def _copy(workload: str, tmp_path: Path, evidence: dict[str, str]) -> dict[str, Path]:
    shutil.copytree(FIXTURES / workload, tmp_path / workload)
    return {role: tmp_path / workload / member for role, member in evidence.items()}


def _edit_plan(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    plan = json.loads(path.read_text())
    edit(plan)
    path.write_text(json.dumps(plan))


def test_grpo_cycles_on_the_cpu_evidence_records_the_stand_in_and_fails_it_on_the_release_card(tmp_path: Path):
    evidence = _copy("grpo-cycles", tmp_path, grpo_cycles.EVIDENCE)
    judged = grpo_cycles.judge(evidence, CPU, SCALES["cpu-reference"])
    ok, detail = judged.checks["two_updates_changed"]
    assert ok and "the scale declares builtin:smollm2-135m-instruct (a stand-in)" in detail, detail
    assert judged.metrics["model_student_stands_in"] is True
    # The same SmolLM2 run offered as the release card's: another run's evidence, not the seed's model.
    release = grpo_cycles.judge(evidence, CPU, RELEASE)
    ok, detail = release.checks["two_updates_changed"]
    assert not ok and "the plan used smollm2-135m-instruct - NOT the declared model" in detail, detail


def test_grpo_cycles_with_a_swapped_student_fails(tmp_path: Path) -> None:
    evidence = _copy("grpo-cycles", tmp_path, grpo_cycles.EVIDENCE)
    _edit_plan(evidence["plan"], lambda p: p["models"].update(student={"source": "tiny"}))
    ok, detail = grpo_cycles.judge(evidence, CPU, SCALES["cpu-reference"]).checks["two_updates_changed"]
    assert not ok and "NOT the declared model" in detail


@pytest.mark.parametrize(
    ("role", "check", "other"),
    [
        ("student", "actor_updates", {"source": "builtin", "name": "another"}),
        ("reward", "reward_model", copy.deepcopy(_seed_plan()["models"]["reward"])),
    ],
)
def test_ppo_rm_handoff_judges_the_declared_student_and_reward_model(
    tmp_path: Path, role: str, check: str, other: dict[str, Any]
) -> None:
    evidence = _copy("ppo-rm-handoff", tmp_path, ppo_rm_handoff.EVIDENCE)
    scale = SCALES["cpu-reference"]
    judged = ppo_rm_handoff.judge(evidence, CPU, scale)
    assert judged.checks[check][0], judged.checks[check]
    assert judged.metrics[f"model_{role}_stands_in"] is True and judged.metrics["reward_source"] == "tiny"
    _edit_plan(evidence["plan"], lambda p: p["models"].update({role: other}))
    edited = ppo_rm_handoff.judge(evidence, CPU, scale)
    assert not edited.checks[check][0] and "NOT the declared model" in edited.checks[check][1]
    untouched = {"actor_updates", "reward_model"} - {check}
    assert all(edited.checks[name][0] for name in untouched)

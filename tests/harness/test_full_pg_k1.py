"""The pg-k1 workload: its judge on real captured evidence, one bad value per check, hostile evidence."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import policy
from harness.full import pg_k1
from harness.full.scales import SCALES
from harness.profiles import PROFILES
from harness.records import Profile

FIXTURE = Path(__file__).parent / "full_fixtures" / "pg-k1"
CPU, CUDA = PROFILES["cpu-reference"], PROFILES["h200-cu130"]
W = pg_k1.WORKLOAD


def _evidence(root: Path) -> dict[str, Path]:
    return {role: root / member for role, member in W.evidence.items() if (root / member).exists()}


def _judge(root: Path, profile: Profile = CPU) -> dict[str, bool]:
    j = W.judge(_evidence(root), profile, SCALES[profile.name])
    return {name: ok for name, (ok, _) in j.checks.items()}


def _failed(root: Path, profile: Profile = CPU) -> set[str]:
    return {name for name, ok in _judge(root, profile).items() if not ok}


@pytest.fixture
def ev(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "ev")
    return tmp_path / "ev"


def _path(root: Path, role: str) -> Path:
    return root / W.evidence[role]


def _edit_json(root: Path, role: str, change: Callable[[dict[str, Any]], None]) -> None:
    path = _path(root, role)
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _edit_line(root: Path, role: str, index: int, key: str, value: Any) -> None:
    path = _path(root, role)
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    lines[index][key] = value
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def _exit(step: str, code: int) -> Callable[[Path], None]:
    def change(doc: dict[str, Any]) -> None:
        for inv in doc["invocations"]:
            if inv["step"] == step:
                inv["exit_code"] = code

    return lambda root: _edit_json(root, "transcript", change)


def _digest(role: str, name: str) -> Callable[[Path], None]:
    return lambda root: _edit_json(root, role, lambda d: d["files"][name].update(sha256="0" * 64))


def _set(role: str, key: str, value: Any) -> Callable[[Path], None]:
    return lambda root: _edit_json(root, role, lambda d: d.update({key: value}))


def test_the_real_cpu_evidence_passes_every_required_check() -> None:
    checks = _judge(FIXTURE)
    assert set(checks) == set(policy.required_checks(CPU, "pg-k1")) == set(policy.required_checks(CUDA, "pg-k1"))
    assert all(checks.values()), checks


def test_the_evidence_members_are_declared_and_small() -> None:
    members = sorted(p.relative_to(FIXTURE).as_posix() for p in FIXTURE.rglob("*") if p.is_file())
    assert members == sorted(W.evidence.values())
    assert sum((FIXTURE / m).stat().st_size for m in members) < 300_000


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
    ],
    "reward_varies_within_group": [
        lambda root: _edit_line(root, "metrics", 0, "reward_std_within_group_max", 0.0),
        lambda root: _edit_line(root, "metrics", 1, "reward_std_within_group_max", None),
    ],
    "nonzero_advantages": [
        lambda root: _edit_line(root, "metrics", 1, "nonzero_advantages", 0),
        lambda root: _edit_line(root, "metrics", 0, "nonzero_advantages", 2.5),
    ],
    "adapter_changed": [
        lambda root: _edit_line(root, "metrics", 1, "adapter_delta_norm", 0.0),
        _set("summary", "adapter_changed_each_update", False),
    ],
    "kl_measured": [
        lambda root: _edit_line(root, "metrics", 1, "kl", 0.0),
        lambda root: _edit_line(root, "metrics", 0, "kl", None),
        lambda root: _edit_line(root, "metrics", 1, "kl", "0.1"),
    ],
}


@pytest.mark.parametrize(
    ("check", "index"), [(check, i) for check, changes in BAD.items() for i in range(len(changes))]
)
def test_one_bad_value_fails_exactly_its_check(ev: Path, check: str, index: int) -> None:
    BAD[check][index](ev)
    assert _failed(ev) == {check}


def test_a_nan_in_the_metrics_fails_without_raising(ev: Path) -> None:
    path = _path(ev, "metrics")
    path.write_text(path.read_text().replace('"kl":', '"kl":NaN,"was_kl":', 1))
    assert {"kl_measured", "run_completed", "adapter_changed"} <= _failed(ev)


HOSTILE = ["missing", "directory", "garbled", "huge"]


@pytest.mark.parametrize("role", sorted(W.evidence))
@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_evidence_fails_checks_without_raising(ev: Path, role: str, kind: str) -> None:
    path = _path(ev, role)
    path.unlink()
    if kind == "directory":
        path.mkdir()
    elif kind == "garbled":
        path.write_bytes(b'{"files": {"a": \xff NaN')
    elif kind == "huge":
        with path.open("wb") as f:
            f.truncate(17 << 20)
    assert _failed(ev)

"""Every smoke check can fail: one bad value from the stand-in CLI fails exactly the check that reads it.

Each smoke run builds a fresh venv and installs the stand-in wheel (~5 s), so bad values that feed
different checks share one run (a group); a check appears at most once per group, and no value in a
group makes a step that another value's check depends on fail. Every group's qualification is
`failed`, each named check is executed with passed=false, and the auditor exits 1 on it.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import audit, audit_args, run_smoke_into

from harness.core.profiles import PROFILES
from harness.qualify.smoke_judge import read_metrics

# group -> (FAKE_MINIVERL_BAD name, the check it must fail)
GROUPS: dict[str, list[tuple[str, str]]] = {
    "a": [
        ("version", "cli_version"),
        ("doctor_verdict", "doctor"),
        ("model_identity", "model_fetch"),
        ("data_sha", "data_sample"),
        ("dry_run_status", "run_dry_run"),
        ("opd_cycles", "run_opd"),
        ("teacher_kl", "teacher_scoring"),
        ("opd_delta", "optimizer_update"),
        ("inspect_updates", "inspect"),
        ("reload_diff", "export_reload"),
        ("grpo_std", "grpo_cycle"),
    ],
    "b": [
        ("model_name", "model_fetch"),
        ("data_rows", "data_sample"),
        ("response_tokens", "teacher_scoring"),
        ("metrics_lines", "optimizer_update"),
        ("reload_manifest", "export_reload"),
        ("grpo_adv", "grpo_cycle"),
    ],
    "c": [("teacher_role", "teacher_scoring"), ("reload_tolerance", "export_reload"), ("grpo_delta", "grpo_cycle")],
    "d": [("metrics_nan", "teacher_scoring"), ("metrics_nan", "optimizer_update"), ("grpo_plan_data", "grpo_plan")],
    "e": [("plan_digest", "plan")],
}
CASES = [(group, bad, check) for group, pairs in GROUPS.items() for bad, check in pairs]
# The CPU smoke's CLI checks; teardown and peak_reserved are CUDA-only (tested below on the step itself).
CLI_CHECKS = {
    "cli_version",
    "doctor",
    "model_fetch",
    "data_sample",
    "plan",
    "run_dry_run",
    "run_opd",
    "teacher_scoring",
    "optimizer_update",
    "inspect",
    "export_reload",
    "grpo_plan",
    "grpo_cycle",
}


def _q(path: Path) -> dict[str, Any]:
    value: dict[str, Any] = json.loads((path / "qualification.json").read_bytes())
    return value


def _executed(q: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in q["checks"]["executed"]}


class Groups:
    """Runs each group's smoke (and the auditor on it) once, on first use."""

    def __init__(self, candidate: Path, repo: Path, known_good: Path, root: Path) -> None:
        self.candidate, self.repo, self.known_good, self.root = candidate, repo, known_good, root
        self.done: dict[str, tuple[int, dict[str, Any], int, str]] = {}

    def __call__(self, group: str) -> tuple[int, dict[str, Any], int, str]:
        if group not in self.done:
            out = self.root / group
            bad = ",".join(sorted({name for name, _ in GROUPS[group]}))
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("FAKE_MINIVERL_BAD", bad)
                rc = run_smoke_into(out, self.candidate, self.repo, self.known_good)
            audit_rc, _, stderr = audit(audit_args(self.candidate, out, self.known_good))
            self.done[group] = (rc, _q(out), audit_rc, stderr)
        return self.done[group]


@pytest.fixture(scope="module")
def groups(candidate: Path, fake_repo: Path, known_good: Path, tmp_path_factory: pytest.TempPathFactory) -> Groups:
    return Groups(candidate, fake_repo, known_good, tmp_path_factory.mktemp("bad"))


def test_the_groups_cover_every_cli_check_and_share_no_check() -> None:
    assert {check for _, _, check in CASES} == CLI_CHECKS
    for group, pairs in GROUPS.items():
        checks = [check for _, check in pairs]
        assert len(checks) == len(set(checks)), group


@pytest.mark.parametrize(("group", "bad", "check"), CASES, ids=[f"{b}-{c}" for _, b, c in CASES])
def test_one_bad_value_fails_its_check(groups: Groups, group: str, bad: str, check: str) -> None:
    rc, q, audit_rc, stderr = groups(group)
    executed = _executed(q)
    assert rc == 1 and q["status"] == "failed"
    assert check in executed, f"{check} was not executed: {q['checks']['skipped']}"
    assert executed[check]["passed"] is False, executed[check]
    assert any(r.startswith(f"check {check} failed") for r in q["reasons"]), q["reasons"]
    assert audit_rc == 1 and re.search(r"\[\w+\]", stderr) and "Traceback" not in stderr, stderr


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_a_bad_value_fails_only_the_checks_that_read_it(groups: Groups, group: str) -> None:
    """Within a group, every other CLI check still passes (or is skipped because its step failed)."""
    _, q, _, _ = groups(group)
    executed = _executed(q)
    failing = {check for _, check in GROUPS[group]}
    skipped = {c["name"] for c in q["checks"]["skipped"]}
    for check in CLI_CHECKS - failing:
        assert check in skipped or executed[check]["passed"], executed[check]
    if group == "e":  # a failed plan skips everything that runs the plan
        assert {"run_dry_run", "run_opd", "teacher_scoring", "grpo_cycle"} <= skipped
    else:
        assert skipped <= {"grpo_cycle"}


def test_the_honest_smoke_passes_every_check_on_concrete_values(smoke_qual: Path) -> None:
    q = _q(smoke_qual)
    executed = _executed(q)
    assert q["status"] == "passed"
    assert all(executed[c]["passed"] for c in CLI_CHECKS)
    assert "'dry_run_ok'" in executed["run_dry_run"]["detail"]
    assert "kl [0.125]" in executed["teacher_scoring"]["detail"]
    assert "adapter_delta_norm [0.01]" in executed["optimizer_update"]["detail"]
    assert "nonzero_advantages [4]" in executed["grpo_cycle"]["detail"]
    roles = {a["role"]: a["path"] for a in q["artifacts"]}
    assert roles["grpo_metrics"] == "evidence/grpo/metrics.jsonl" and "metrics" in roles
    lines, why = read_metrics(smoke_qual / "evidence" / "grpo" / "metrics.jsonl", "grpo")
    assert why is None and len(lines) == 1 and lines[0]["adapter_delta_norm"] > 0


def test_the_bad_value_names_are_the_stand_ins(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every name the groups use is one the stand-in knows (an unknown name makes the stand-in exit)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fake_cli", Path(__file__).parent / "fakeproj" / "miniverl" / "cli.py"
    )
    assert spec is not None and spec.loader is not None
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "fakeproj"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {bad for _, bad, _ in CASES} <= set(module.BAD_VALUES)


# --- read_metrics: strict, bounded ------------------------------------------------------------------

GOOD = {"algorithm": "opd", "step": 1, "kl": 0.1, "response_tokens": 3, "trajectories": 2, "adapter_delta_norm": 0.1}


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b"", "empty or its last line is unterminated"),
        (json.dumps(GOOD).encode(), "empty or its last line is unterminated"),
        (b'{"algorithm":"opd","kl":NaN}\n', "NaN"),
        (b'{"algorithm":"opd","kl":Infinity}\n', "Infinity"),
        (b'{"algorithm":"opd","algorithm":"opd"}\n', "duplicate key"),
        (b"[1, 2]\n", "not a JSON object"),
        (b"\n", "not valid UTF-8 JSON"),
        (b'{"algorithm":"grpo"}\n', "not 'opd'"),
        (b"\xff\n", "not valid UTF-8 JSON"),
        (b"[" * 100_000 + b"]" * 100_000 + b"\n", "line 1"),
        (b'{"algorithm":"opd","kl":' + b"9" * 5000 + b"}\n", "line 1"),
    ],
)
def test_read_metrics_refuses(tmp_path: Path, body: bytes, why: str) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_bytes(body)
    lines, reason = read_metrics(path, "opd")
    assert lines == [] and reason is not None and why in reason


def test_run_files_are_read_strictly(tmp_path: Path) -> None:
    from harness.qualify.steps import _load

    path = tmp_path / "summary.json"
    for body in (b'{"status":"completed","status":"failed"}', b'{"x":NaN}', b"[]", b"{", b"[" * 100_000):
        path.write_bytes(body)
        assert _load(path) is None, body
    path.write_bytes(b'{\n  "status": "completed"\n}\n')
    assert _load(path) == {"status": "completed"}
    os.mkfifo(tmp_path / "fifo.json")
    assert _load(tmp_path / "fifo.json") is None


def test_read_metrics_refuses_missing_oversize_and_non_regular(tmp_path: Path) -> None:
    from harness.qualify import smoke_judge

    assert read_metrics(tmp_path / "absent.jsonl", "opd")[1] == "absent.jsonl is missing"
    assert "not a regular file" in str(read_metrics(tmp_path, "opd")[1])
    link = tmp_path / "link.jsonl"
    (tmp_path / "real.jsonl").write_text(json.dumps(GOOD) + "\n")
    link.symlink_to(tmp_path / "real.jsonl")
    assert "not a regular file" in str(read_metrics(link, "opd")[1])
    big = tmp_path / "big.jsonl"
    with open(big, "wb") as handle:
        handle.truncate(smoke_judge.METRICS_LIMIT_BYTES + 1)
    assert "limit" in str(read_metrics(big, "opd")[1])
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.jsonl")
        assert "not a regular file" in str(read_metrics(tmp_path / "fifo.jsonl", "opd")[1])


@pytest.mark.parametrize(
    ("edit", "passes"),
    [
        ({}, True),
        ({"kl": 0.0}, False),
        ({"kl": -0.1}, False),
        ({"kl": None}, False),
        ({"kl": True}, False),
        ({"kl": "0.1"}, False),
        ({"response_tokens": 0}, False),
        ({"response_tokens": 2.5}, False),
        ({"trajectories": 0}, False),
    ],
)
def test_teacher_scoring_reads_every_metrics_line(edit: dict[str, Any], passes: bool) -> None:
    from harness.qualify.smoke_judge import SmokeVerdict, _teacher_scoring

    manifest = {"roles": {"runtime": "dual_model", "roles": {"student": {}, "teacher": {}}}}
    verdict = SmokeVerdict()
    _teacher_scoring(verdict, manifest, [GOOD, {**GOOD, "step": 2, **edit}], None)
    assert verdict.checks["teacher_scoring"][0] is passes
    verdict = SmokeVerdict()
    _teacher_scoring(verdict, manifest, [], None)
    assert not verdict.checks["teacher_scoring"][0]


@pytest.mark.parametrize(
    ("updates", "lines", "passes"),
    [
        (2, [GOOD, {**GOOD, "step": 2}], True),
        (2, [GOOD, {**GOOD, "step": 2, "adapter_delta_norm": 0.0}], False),
        (2, [GOOD, {**GOOD, "step": 2, "adapter_delta_norm": math.inf}], False),
        (2, [GOOD, {**GOOD, "step": 1}], False),
        (0, [], False),
        (True, [GOOD], False),
    ],
)
def test_optimizer_update_counts_lines_and_steps(updates: Any, lines: list[dict[str, Any]], passes: bool) -> None:
    from harness.qualify.smoke_judge import SmokeVerdict, _optimizer_update

    verdict = SmokeVerdict()
    _optimizer_update(verdict, {"updates": updates}, lines, None)
    assert verdict.checks["optimizer_update"][0] is passes


# --- CUDA-only checks: the CPU smoke cannot reach them, so the step is driven directly -----------------

CUDA_OK = {"baseline_allocated_bytes": 1000, "final_allocated_bytes": 1000, "peak_reserved_bytes": 5 << 30}


@pytest.mark.parametrize(
    ("edit", "teardown", "peak"),
    [
        ({}, True, True),
        ({"final_allocated_bytes": 1000 + (2 << 20) + 1}, False, True),  # above max(2 MiB, 2 % of baseline)
        ({"peak_reserved_bytes": int(14.5 * (1 << 30)) + 1}, True, False),  # above the 16 GiB card's limit
        ({"peak_reserved_bytes": 0}, True, False),  # nothing measured
        ({"final_allocated_bytes": None}, False, False),
    ],
)
def test_cuda_teardown_and_peak_reserved_read_the_summary(edit: dict[str, Any], teardown: bool, peak: bool) -> None:
    from harness.qualify.smoke_judge import SmokeVerdict, _cuda

    verdict = SmokeVerdict()
    _cuda(verdict, PROFILES["h200-cu130"], {"cuda": {**CUDA_OK, **edit}})
    assert set(verdict.checks) == {"teardown", "peak_reserved"}
    assert verdict.checks["teardown"][0] is teardown and verdict.checks["peak_reserved"][0] is peak
    verdict = SmokeVerdict()
    _cuda(verdict, PROFILES["h200-cu130"], {"cuda": None})
    assert not verdict.checks["teardown"][0] and not verdict.checks["peak_reserved"][0]

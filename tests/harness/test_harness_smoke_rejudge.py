"""The auditor re-judges every smoke check from the evidence the qualification binds.

Each case edits one evidence file of a real (stand-in CLI) smoke, then re-binds its bytes and sha256 in
qualification.json and in the smoke record, as a forger would: every hash then matches, the records still say
``passed``, and only re-judging the evidence can notice. The auditor must refuse with ``[smoke_rejudged]`` naming
the check. The install-phase checks are re-derived from the commands' captured output (``evidence/install/``), and the
record's own worktree, packages, Python, venv and GPU fields must say what that output says (judge-level cases for
every file: test_harness_install_judge.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import audit, audit_args, copy_tree
from harness_helpers import rebind_artifacts as _rebind

from harness.core.jsonio import canonical_bytes, sha256_file

Edit = Callable[[Any], None]


def _json(rel: str, edit: Edit) -> Callable[[Path], None]:
    def apply(q: Path) -> None:
        path = q / rel
        value = json.loads(path.read_bytes())
        edit(value)
        path.write_bytes(canonical_bytes(value) + b"\n")

    return apply


def _line(rel: str, index: int, edit: Edit) -> Callable[[Path], None]:
    def apply(q: Path) -> None:
        path = q / rel
        lines = [json.loads(line) for line in path.read_bytes().splitlines()]
        edit(lines[index])
        path.write_bytes(b"".join(canonical_bytes(line) + b"\n" for line in lines))

    return apply


def _origin(edit: Edit) -> Callable[[Path], None]:
    return _json("evidence/install/origin.json", edit)


def _outputs(edit: Edit) -> Callable[[Path], None]:
    return _json("evidence/cli-outputs.json", edit)


def _first_invocation(edit: Edit) -> Callable[[Path], None]:
    return _json("evidence/transcript.json", lambda t: edit(t["invocations"][0]))


def _qual(edit: Edit) -> Callable[[Path], None]:
    return _json("qualification.json", edit)


def _text(name: str, text: str) -> Callable[[Path], None]:
    def apply(q: Path) -> None:
        (q / "evidence" / "install" / name).write_text(text, encoding="utf-8")

    return apply


def _install_copy(q: Path, source: str, target: str) -> None:
    """Another command's output in ``target``'s place."""
    install = q / "evidence" / "install"
    (install / target).write_bytes((install / source).read_bytes())


def _bind_new(q: Path, role: str, rel: str, data: bytes) -> None:
    """A new evidence file, bound in qualification.json and the smoke record (re-hashed by the case's rebind)."""
    from harness.core.registry import SMOKE_RECORD

    (q / rel).write_bytes(data)
    for name in ("qualification.json", SMOKE_RECORD):
        _json(name, lambda r: r["artifacts"].append({"path": rel, "role": role, "bytes": 0, "sha256": ZEROS}))(q)


ZEROS = "0" * 64
CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "spliced_wheel": (_first_invocation(lambda i: i["installed"].update(wheel_sha256=ZEROS)), "candidate_bound"),
    "unbound_invocation": (_first_invocation(lambda i: i.update(installed=None)), "candidate_bound"),
    "other_executable": (
        _first_invocation(lambda i: i["installed"].update(executable="<path>/miniverl")),
        "candidate_bound",
    ),
    "origin_version": (_origin(lambda o: o.update(version="9.9.9")), "origin_installed_version"),
    "origin_not_isolated": (_origin(lambda o: o.update(isolated=False)), "origin_import_under_venv"),
    "origin_checkout": (_origin(lambda o: o.update(file="<checkout>/miniverl/__init__.py")), "origin_not_checkout"),
    "origin_editable": (_origin(lambda o: o["pth"].append("__editable__.miniverl.pth")), "origin_not_editable"),
    "origin_record": (_origin(lambda o: o.update(record_bad=1)), "origin_record_hashes"),
    "origin_wheel": (
        _origin(lambda o: o["direct_url"]["archive_info"].update(hashes={"sha256": ZEROS}, hash=f"sha256={ZEROS}")),
        "origin_wheel_hash",
    ),
    "origin_which": (_origin(lambda o: o.update(which="<path>/miniverl")), "origin_executable_under_venv"),
    "version": (_outputs(lambda o: o.update(version="0.0.0")), "cli_version"),
    "doctor": (
        _json("evidence/doctor.json", lambda d: d["capabilities"].update(cpu_training={"verdict": "fail"})),
        "doctor",
    ),
    "model_name": (_outputs(lambda o: o["model_fetch"].update(name="another-model")), "model_fetch"),
    "data_rows": (_outputs(lambda o: o["data_sample"].update(rows=7)), "data_sample"),
    "plan_data": (_json("evidence/run/plan.json", lambda p: p["data"].update(sha256=ZEROS)), "plan"),
    "dry_run_dir": (_outputs(lambda o: o.update(dry_run_dir_created=True)), "run_dry_run"),
    "opd_status": (_json("evidence/run/summary.json", lambda s: s.update(status="failed")), "run_opd"),
    "teacher_kl": (_line("evidence/run/metrics.jsonl", 0, lambda m: m.update(kl=0.0)), "teacher_scoring"),
    "opd_delta": (
        _line("evidence/run/metrics.jsonl", 0, lambda m: m.update(adapter_delta_norm=0.0)),
        "optimizer_update",
    ),
    "inspect_updates": (_outputs(lambda o: o["inspect"].update(updates=99)), "inspect"),
    "reload_failed": (_outputs(lambda o: o["export"]["reload"].update(passed=False)), "export_reload"),
    "grpo_plan_data": (_json("evidence/grpo/plan.json", lambda p: p["data"].update(sha256=ZEROS)), "grpo_plan"),
    "grpo_advantages": (
        _line("evidence/grpo/metrics.jsonl", 0, lambda m: m.update(nonzero_advantages=0)),
        "grpo_cycle",
    ),
    "local_path": (_outputs(lambda o: o.update(note="/home/someone/run")), "evidence_portable"),
    # the install phase, from the commands' captured output (harness/qualify/install_judge.py)
    "dirty_porcelain": (_text("git-status-porcelain.txt", " M miniverl/cli.py\n"), "clean_worktree"),
    "other_head": (_text("git-rev-parse-head.txt", "f" * 40 + "\n"), "clean_worktree"),
    "wheel_hash": (
        _text("wheel-sha256.txt", f"{ZEROS}  miniverl-0.0.1-py3-none-any.whl\n"),
        "wheel_sha256_before_install",
    ),
    "not_fresh": (_text("pip-freeze-before-install.txt", "pip==23.2.1\ntorch==2.13.0\n"), "fresh_venv"),
    "broken_requirement": (
        _text("pip-check.txt", "miniverl 0.0.1 requires pyyaml, which is not installed.\n"),
        "pip_check",
    ),
    "unpinned_dependency": (
        _json(
            "evidence/install/pip-inspect.json",
            lambda d: (
                d["installed"].append({"metadata": {"name": "PyYAML", "version": "6.0.4"}}),
                next(i for i in d["installed"] if i["metadata"]["name"] == "miniverl")["metadata"].update(
                    requires_dist=["pyyaml>=6"]
                ),
            ),
        ),
        "stack_matches_known_good",
    ),
    "other_python": (
        _text("python-version.txt", "3.12.13 (main, Jan  1 2026, 00:00:00) [GCC 13.2.0]\n"),
        "python_version",
    ),
    "swapped_pip_check": (lambda q: _install_copy(q, "python-version.txt", "pip-check.txt"), "pip_check"),
    "swapped_git_status": (
        lambda q: _install_copy(q, "wheel-sha256.txt", "git-status-porcelain.txt"),
        "clean_worktree",
    ),
    # the record's own fields must say what the captured output says (a record of another run does not)
    "record_dirty_tree": (_qual(lambda q: q["execution"]["worktree"].update(state="dirty")), "execution.worktree"),
    "record_unpinned_package": (
        _qual(lambda q: q["environment"]["packages"].update(extra="1.0")),
        "environment.packages",
    ),
    "record_python": (_qual(lambda q: q["environment"].update(python="3.12.13")), "environment.python"),
    "record_site_packages": (
        _qual(lambda q: q["execution"].update(system_site_packages=True)),
        "execution.system_site_packages",
    ),
    "nvidia_smi_the_record_lacks": (
        lambda q: _bind_new(
            q,
            "nvidia_smi",
            "evidence/install/nvidia-smi.csv",
            b"name, driver_version, memory.total [MiB]\nNVIDIA H200, 580.159.04, 143771 MiB\n",
        ),
        "environment.gpu",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_tampered_and_rebound_smoke_evidence_is_refused(
    case: str, smoke_qual: Path, candidate: Path, known_good: Path, tmp_path: Path
) -> None:
    edit, check = CASES[case]
    q = copy_tree(smoke_qual, tmp_path / "q")
    edit(q)
    _rebind(q)
    code, rv, err = audit(audit_args(candidate, q, known_good))
    assert code == 1, err
    assert "[smoke_rejudged]" in err and check in err, err
    assert rv.get("status", "failed") == "failed"


def test_the_untampered_smoke_is_rejudged_and_passes(
    smoke_qual: Path, candidate: Path, known_good: Path, tmp_path: Path
) -> None:
    q = copy_tree(smoke_qual, tmp_path / "q")
    _rebind(q)  # re-binding unchanged files changes nothing
    code, rv, err = audit(audit_args(candidate, q, known_good))
    assert code == 0, err
    rejudged = next(c for c in rv["checks"] if c["name"] == "smoke_rejudged")
    assert rejudged["passed"] and "re-derived from the evidence" in rejudged["detail"]


def test_evidence_over_its_bound_is_refused(
    smoke_qual: Path, candidate: Path, known_good: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evidence_bounded`` is re-derived from the files' sizes (the limit lowered in-process to stay cheap)."""
    from harness.audit.auditor import audit
    from harness.audit.request import AuditRequest
    from harness.qualify import smoke_judge

    monkeypatch.setattr(smoke_judge, "EVIDENCE_LIMIT_BYTES", 1000)
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    rv = audit(
        AuditRequest(
            candidate_dir=candidate,
            candidate_manifest=candidate / "candidate-manifest.json",
            qualification=smoke_qual / "qualification.json",
            commit=manifest["source_commit"],
            known_good_sha256=sha256_file(known_good / "cpu-reference.json"),
            required_gpu_name=None,
            level="release_smoke",
            known_good=known_good / "cpu-reference.json",
        )
    )
    failed = next(c for c in rv.checks if c.name == "smoke_rejudged")
    assert not failed.passed and "evidence_bounded" in failed.detail

"""The install phase judged from the commands' captured output (harness/qualify/install_judge.py).

Judge-level cases over a copy of a real smoke's ``evidence/install/``: each file missing, swapped (another
command's output in its place), edited, or from another run must fail the check it decides. The auditor-level
cases (edited and re-bound, the record disagreeing with the output) live in test_harness_smoke_rejudge.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.build.stacks import parse_nvidia_smi_csv
from harness.core.jsonio import canonical_bytes
from harness.core.profiles import PROFILES
from harness.qualify.install_judge import (
    INSTALL_FILES,
    REQUIRED_INSTALL_ROLES,
    InstallBasis,
    captured_gpu,
    installed_closure,
    judge_install,
    marker_holds,
)

H100_CSV = "name, driver_version, memory.total [MiB]\nNVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB\n"
# The check each captured file decides (a file that fails to read fails it).
DECIDES = {
    "git_head": "clean_worktree",
    "git_status": "clean_worktree",
    "wheel_sha256": "wheel_sha256_before_install",
    "pip_report": "install",
    "pyvenv_cfg": "fresh_venv",
    "venv_before_install": "fresh_venv",
    "pip_inspect": "stack_matches_known_good",
    "pip_check": "pip_check",
    "python_version": "python_version",
}
# Another command's output in each file's place.
SWAPPED_WITH = {
    "git_head": "wheel_sha256",
    "git_status": "python_version",
    "wheel_sha256": "git_head",
    "pip_report": "pip_inspect",
    "pyvenv_cfg": "python_version",
    "venv_before_install": "pip_check",
    "pip_inspect": "pip_report",
    "pip_check": "git_head",
    "python_version": "pip_check",
}


@pytest.fixture
def captured(smoke_qual: Path, tmp_path: Path) -> dict[str, Path]:
    shutil.copytree(smoke_qual / "evidence" / "install", tmp_path / "install")
    return {role: tmp_path / "install" / name for role, name in INSTALL_FILES.items() if role != "nvidia_smi"}


@pytest.fixture
def basis(candidate: Path, known_good: Path) -> InstallBasis:
    manifest = json.loads((candidate / "candidate-manifest.json").read_bytes())
    descriptor = json.loads((known_good / "cpu-reference.json").read_bytes())
    return InstallBasis(
        commit=manifest["source_commit"],
        version=manifest["version"],
        wheel_filename=manifest["wheel"]["filename"],
        wheel_sha256=manifest["wheel"]["sha256"],
        extras=tuple(PROFILES["cpu-reference"].install_extras),
        pins=descriptor["packages"],
        python_pin=descriptor["python"],
    )


def _failed(evidence: dict[str, Path], basis: InstallBasis) -> dict[str, str]:
    return {n: detail for n, (ok, detail) in judge_install(evidence, basis).checks.items() if not ok}


def test_the_real_captured_output_passes_every_install_check(captured: dict[str, Path], basis: InstallBasis) -> None:
    verdict = judge_install(captured, basis)
    assert set(verdict.checks) == set(DECIDES.values()) | {"pip_check"}
    assert _failed(captured, basis) == {}
    assert verdict.facts.head == basis.commit and verdict.facts.changed_paths == 0
    assert verdict.facts.packages == {} and verdict.facts.system_site_packages is False


@pytest.mark.parametrize("role", REQUIRED_INSTALL_ROLES)
def test_a_missing_file_fails_its_check(role: str, captured: dict[str, Path], basis: InstallBasis) -> None:
    del captured[role]
    assert DECIDES[role] in _failed(captured, basis)


@pytest.mark.parametrize("role", REQUIRED_INSTALL_ROLES)
def test_another_commands_output_in_its_place_fails_its_check(
    role: str, captured: dict[str, Path], basis: InstallBasis
) -> None:
    captured[role].write_bytes(captured[SWAPPED_WITH[role]].read_bytes())
    assert DECIDES[role] in _failed(captured, basis)


def _edit_json(path: Path, edit: object) -> None:
    value = json.loads(path.read_bytes())
    edit(value)  # type: ignore[operator]
    path.write_bytes(canonical_bytes(value))


def _miniverl(doc: dict[str, object], key: str) -> dict[str, object]:
    items = doc[key]
    assert isinstance(items, list)
    return next(i for i in items if i["metadata"]["name"] == "miniverl")


EDITS: dict[str, tuple[str, object, str]] = {
    "dirty_line": ("git_status", " M miniverl/cli.py\n", "clean_worktree"),
    "untracked_line": ("git_status", "?? stray.txt\n", "clean_worktree"),
    "other_head": ("git_head", "f" * 40 + "\n", "clean_worktree"),
    "wheel_hash": ("wheel_sha256", "0" * 64 + "  miniverl-0.0.1-py3-none-any.whl\n", "wheel_sha256_before_install"),
    "pip_report_hash": (
        "pip_report",
        lambda d: _miniverl(d, "install")["download_info"]["archive_info"]["hashes"].update(sha256="0" * 64),
        "wheel_sha256_before_install",
    ),
    "pip_report_editable": (
        "pip_report",
        lambda d: _miniverl(d, "install").update(download_info={"url": "file:///x", "dir_info": {"editable": True}}),
        "install",
    ),
    "inspect_other_version": (
        "pip_inspect",
        lambda d: _miniverl(d, "installed")["metadata"].update(version="9.9.9"),
        "install",
    ),
    "not_fresh": ("venv_before_install", "pip==23.2.1\nsetuptools==65.5.0\ntorch==2.13.0\n", "fresh_venv"),
    "broken_requirement": (
        "pip_check",
        "miniverl 0.0.1 requires pyyaml, which is not installed.\n",
        "pip_check",
    ),
    "wrong_version_requirement": (
        "pip_check",
        "miniverl 0.0.1 has requirement rich>=13, but you have rich 12.0.0.\n",
        "pip_check",
    ),
    "unpinned_dependency": (
        "pip_inspect",
        lambda d: (
            _miniverl(d, "installed")["metadata"].update(requires_dist=["pyyaml>=6.0", "torch; extra == 'cuda'"]),
            d["installed"].append({"metadata": {"name": "PyYAML", "version": "6.0.4"}}),
        ),
        "stack_matches_known_good",
    ),
    "required_not_installed": (
        "pip_inspect",
        lambda d: _miniverl(d, "installed")["metadata"].update(requires_dist=["rich>=13"]),
        "stack_matches_known_good",
    ),
    "other_python": ("python_version", "3.12.13 (main, Jan  1 2026, 00:00:00) [GCC 13.2.0]\n", "python_version"),
    "pip_saw_other_python": (
        "pip_inspect",
        lambda d: d["environment"].update(python_full_version="3.11.9"),
        "python_version",
    ),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_an_edited_file_fails_its_check(case: str, captured: dict[str, Path], basis: InstallBasis) -> None:
    role, edit, check = EDITS[case]
    if isinstance(edit, str):
        captured[role].write_text(edit, encoding="utf-8")
    else:
        _edit_json(captured[role], edit)
    assert check in _failed(captured, basis)


def test_a_pinned_dependency_at_its_pin_passes(captured: dict[str, Path], basis: InstallBasis) -> None:
    """The stack edit above fails for the unpinned version, not for the edit: at the pin it passes."""
    _edit_json(
        captured["pip_inspect"],
        lambda d: (
            _miniverl(d, "installed")["metadata"].update(requires_dist=["pyyaml>=6.0"]),
            d["installed"].append({"metadata": {"name": "PyYAML", "version": "6.0.4"}}),
        ),
    )
    pinned = InstallBasis(**{**basis.__dict__, "pins": {"pyyaml": "6.0.4"}})
    assert _failed(captured, pinned) == {}
    off = InstallBasis(**{**basis.__dict__, "pins": {"pyyaml": "6.0.3"}})
    assert "pyyaml is 6.0.4, known-good pins 6.0.3" in _failed(captured, off)["stack_matches_known_good"]


def test_the_python_pin_is_the_known_good_descriptors(captured: dict[str, Path], basis: InstallBasis) -> None:
    version = captured["python_version"].read_text().split()[0]
    assert "python_version" not in _failed(captured, InstallBasis(**{**basis.__dict__, "python_pin": version}))
    other = InstallBasis(**{**basis.__dict__, "python_pin": "3.12.13"})  # the release card's
    assert "pins Python 3.12.13" in _failed(captured, other)["python_version"]


def test_output_from_another_checkout_and_environment_fails(captured: dict[str, Path], basis: InstallBasis) -> None:
    """Real output of another run: this test checkout's git, and pip inspect of the interpreter running the tests."""
    root = Path(__file__).resolve().parents[2]
    head = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, check=True).stdout
    captured["git_head"].write_bytes(head)
    inspect = subprocess.run([sys.executable, "-m", "pip", "inspect"], capture_output=True, check=True).stdout
    captured["pip_inspect"].write_bytes(inspect)
    failed = _failed(captured, basis)
    assert {"clean_worktree", "install"} <= set(failed), failed


def test_nvidia_smi_csv_is_parsed_and_anything_else_refused(tmp_path: Path) -> None:
    gpu = parse_nvidia_smi_csv(H100_CSV)
    assert (gpu.name, gpu.count, gpu.driver, gpu.total_memory_bytes) == (
        "NVIDIA H100 80GB HBM3",
        1,
        "580.159.04",
        81559 << 20,
    )
    smi = tmp_path / "nvidia-smi.csv"
    assert captured_gpu({}) is None  # absent: the machine had no nvidia-smi
    for other in ("NVIDIA H100 80GB HBM3, 580.159.04, 81559\n", "3.11.7 (main) [GCC]\n", ""):
        smi.write_text(other)
        assert captured_gpu({"nvidia_smi": smi}) is None


def test_gpu_identity_uses_the_captured_nvidia_smi(smoke_qual: Path, tmp_path: Path) -> None:
    """On a CUDA profile, the smoke judge's nvidia-smi name is what the captured CSV names (absent: fails)."""
    from harness.qualify.qualification import SMOKE_EVIDENCE_PATHS
    from harness.qualify.smoke_judge import SmokeBasis, judge_smoke

    evidence = {r: smoke_qual / p for r, p in SMOKE_EVIDENCE_PATHS.items() if (smoke_qual / p).exists()}
    doctor = json.loads(evidence["doctor"].read_bytes())
    doctor.update(gpu_name="NVIDIA H100 80GB HBM3")
    (tmp_path / "doctor.json").write_bytes(canonical_bytes(doctor))
    evidence["doctor"] = tmp_path / "doctor.json"
    profile = PROFILES["h100-cu130"]

    def identity(csv: str | None) -> bool:
        found = dict(evidence)
        if csv is not None:
            (tmp_path / "nvidia-smi.csv").write_text(csv)
            found["nvidia_smi"] = tmp_path / "nvidia-smi.csv"
        smi = captured_gpu(found)
        verdict = judge_smoke(found, SmokeBasis(profile, "0", "0" * 64, smi.name if smi else None))
        return verdict.checks["gpu_identity"][0]

    assert identity(H100_CSV)
    assert not identity(H100_CSV.replace("H100 80GB HBM3", "H200"))  # another GPU
    assert not identity(None)  # missing
    assert not identity("3.12.3 (main) [GCC]\n")  # swapped


def test_markers_and_closure_follow_pep_508() -> None:
    env = {"python_version": "3.11", "python_full_version": "3.11.7", "sys_platform": "linux"}
    assert marker_holds("python_version >= '3.10' and sys_platform == 'linux'", {**env, "extra": ""})
    assert not marker_holds("python_version < '3.11'", {**env, "extra": ""})
    assert marker_holds("(sys_platform == 'win32') or extra == 'train'", {**env, "extra": "train"})
    assert not marker_holds('extra == "cuda"', {**env, "extra": "train"})
    assert marker_holds("python_full_version ~= '3.11.0'", {**env, "extra": ""})
    inspect = {
        "environment": env,
        "installed": [
            {"metadata": {"name": "root", "version": "1", "requires_dist": ["a[x]>=1", "b; extra == 'cuda'"]}},
            {
                "metadata": {
                    "name": "A",
                    "version": "2",
                    "requires_dist": ["c; extra == 'x'", "d; sys_platform == 'win32'"],
                }
            },
            {"metadata": {"name": "c", "version": "3"}},
            {"metadata": {"name": "d", "version": "4"}},
        ],
    }
    assert installed_closure(inspect, "root", ["train"]) == ({"a": "2", "c": "3"}, [])
    assert installed_closure(inspect, "root", ["cuda"]) == ({"a": "2", "c": "3"}, ["b"])


@pytest.mark.parametrize(("key", "name"), [("install", "pip-install-report.json"), ("installed", "pip-inspect.json")])
def test_pip_json_is_kept_without_descriptions_that_quote_paths(tmp_path: Path, key: str, name: str) -> None:
    """A package's README (pip's ``description``) may quote paths (torch's does): kept as printed, pip's report and
    inspect output would fail evidence_portable on any machine that installs such a package into the venv."""
    from harness.qualify.smoke import without_descriptions
    from harness.qualify.smoke_judge import portable

    item = {"metadata": {"name": "torch", "version": "2.11.0", "description": "cache in ~/.cache/torch\n/usr/lib"}}
    raw = json.dumps({"version": "1", key: [item]})
    printed = tmp_path / "printed" / name
    printed.parent.mkdir()
    printed.write_text(raw)
    assert not portable(printed)
    kept = tmp_path / name
    kept.write_text(without_descriptions(raw, key))
    assert portable(kept)
    assert json.loads(kept.read_text())[key][0]["metadata"] == {"name": "torch", "version": "2.11.0"}

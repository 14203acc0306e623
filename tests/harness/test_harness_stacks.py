"""Known-good stacks: descriptor integrity, mismatch rules, recording from a live venv."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from harness_helpers import REPO_ROOT, run_cli

from harness.build.stacks import load_known_good, stack_mismatches
from harness.core.errors import StackError
from harness.core.profiles import PROFILES


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_committed_stacks_are_consistent(name: str) -> None:
    descriptor, digest = load_known_good(PROFILES[name])
    assert descriptor.required_gpu_name == PROFILES[name].required_gpu_name
    assert descriptor.packages.get("torch", "").startswith("2.13.0" if name == "cpu-reference" else "2.11.0")
    assert len(digest) == 64
    if name == "rtx4080-wsl2-cu130":
        assert descriptor.status == "declared" and descriptor.python == "3.12.13"


def test_a_tampered_constraints_file_is_refused(tmp_path: Path) -> None:
    for suffix in ("txt", "json"):
        (tmp_path / f"cpu-reference.{suffix}").write_bytes(
            (REPO_ROOT / "known-good" / f"cpu-reference.{suffix}").read_bytes()
        )
    with (tmp_path / "cpu-reference.txt").open("a") as handle:
        handle.write("evil==1.0\n")
    with pytest.raises(StackError):
        load_known_good(PROFILES["cpu-reference"], tmp_path)


def test_mismatch_rules() -> None:
    pins = {"torch": "2.13.0", "numpy": "2.4.6", "pytest": "9.2.0"}
    assert stack_mismatches(pins, {"torch": "2.13.0+cpu", "numpy": "2.4.6"}) == []
    problems = stack_mismatches(pins, {"torch": "2.12.0", "Rich": "15.0.0"})
    assert problems == [
        "rich==15.0.0 is installed but not pinned by the known-good stack",
        "torch is 2.12.0, known-good pins 2.13.0",
    ]
    assert stack_mismatches({"torch": "2.11.0+cu130"}, {"torch": "2.11.0+cu128"})


def test_stack_record_writes_a_measured_pair(candidate: Path, tmp_path: Path) -> None:
    done = run_cli(
        "-m",
        "harness",
        "stack",
        "record",
        "--profile",
        "cpu-reference",
        "--candidate",
        str(candidate),
        "--base-python",
        sys.executable,
        "--known-good-dir",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr
    descriptor = json.loads((tmp_path / "cpu-reference.json").read_bytes())
    assert descriptor["status"] == "measured" and descriptor["required_gpu_name"] is None
    load_known_good(PROFILES["cpu-reference"], tmp_path)
    refused = run_cli(
        "-m",
        "harness",
        "stack",
        "record",
        "--profile",
        "h200-cu130",
        "--candidate",
        str(candidate),
        "--known-good-dir",
        str(tmp_path),
    )
    assert refused.returncode == 1 and "[gpu_identity]" in refused.stderr and refused.stderr.count("\n") == 1


def test_the_release_card_installs_and_pins_vllm() -> None:
    """The release card's policy requires vllm_boundary: its venv installs miniverl's vllm extra, and its known-good
    stack declares vLLM's measured closure (scripts/stacks/release_card_vllm.py --check finds the file current)."""
    card = PROFILES["rtx4080-wsl2-cu130"]
    assert card.install_extras == ["train", "cuda", "vllm"]
    assert all("vllm" not in p.install_extras for name, p in PROFILES.items() if name != card.name)
    descriptor, _ = load_known_good(card)
    assert descriptor.packages["vllm"] == "0.26.0" and descriptor.packages["numpy"] == "2.3.5"
    assert descriptor.packages["torchvision"] == "0.26.0+cu130"
    done = run_cli("scripts/stacks/release_card_vllm.py", "--check")
    assert done.returncode == 0, done.stderr

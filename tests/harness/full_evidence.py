"""Shared by the full-workload judge tests: a workload's captured evidence, and one-value edits of it."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.full import runs
from harness.full.base import Scale, Workload
from harness.full.scales import SCALES
from harness.profiles import PROFILES
from harness.records import Profile

FIXTURES = Path(__file__).parent / "full_fixtures"
CPU, CUDA = PROFILES["cpu-reference"], PROFILES["h200-cu130"]
HOSTILE = ["missing", "directory", "garbled", "huge", "deeply_nested", "not_an_object"]

# What a CUDA run's summary holds (docs/CLI-CONTRACT.md), within every profile's thresholds.
CUDA_FIGURES = {
    "baseline_allocated_bytes": 0,
    "final_allocated_bytes": 0,
    "peak_reserved_bytes": 1 << 30,
    "peak_allocated_bytes": 1 << 29,
    "teardown_returned_to_baseline": True,
    "teardown_tolerance_bytes": 2 << 20,
}
# The workloads whose runs train NF4 where the profile's scale says so (the others run bf16/fp32 LoRA).
NF4_WORKLOADS = {"grpo-cycles", "backend-matrix"}
# The workloads whose plans take the scale's rollout sizes (runs.declared_sizes), with their new-token floor.
SCALED_WORKLOADS = {
    "pg-k1": 32,
    "smollm2": 32,
    "grpo-cycles": 32,
    "direct-gkd": 0,
    "ppo-rm-handoff": 0,
    "product-workflows": 0,
}
CUDA_NULL = re.compile(rb'"cuda":(\s*)null')
NO_QUANTIZATION = re.compile(rb'"quantization":(\s*)"none"')
CPU_DEVICE = re.compile(rb'"device":(\s*)"cpu"')


def as_cuda_bytes(data: bytes, workload: str, role: str, scale: Scale) -> bytes:
    """CPU evidence as a CUDA run at ``scale`` records it: only the bytes that say "no CUDA" (`"cuda": null`
    becomes CUDA_FIGURES; in a plan, `"device": "cpu"` becomes "cuda"), NF4 where the scale trains it, and in a
    scaled workload's plan the scale's rollout sizes. Every other byte, digests and manifests included, stays: a test
    stand-in for evidence no CPU can produce, never written by harness code."""
    figures = json.dumps(CUDA_FIGURES, sort_keys=True).encode()
    data = CUDA_NULL.sub(lambda m: b'"cuda":' + m.group(1) + figures, data)
    if scale.quantization == "nf4" and workload in NF4_WORKLOADS:
        data = NO_QUANTIZATION.sub(lambda m: b'"quantization":' + m.group(1) + b'"nf4"', data)
    plan = role == "plan" or role.endswith("_plan")
    if plan:  # a plan's device; elsewhere (a bundle manifest's bindings, say) a hash binds the bytes
        data = CPU_DEVICE.sub(lambda m: b'"device":' + m.group(1) + b'"cuda"', data)
    if workload in SCALED_WORKLOADS and plan:
        for key, value in runs.declared_sizes(scale, min_new_tokens=SCALED_WORKLOADS[workload]).items():
            pattern = re.compile(rb'"' + key.encode() + rb'":(\s*)\d+')
            data = pattern.sub(lambda m, k=key, v=value: f'"{k}":'.encode() + m.group(1) + str(v).encode(), data)
    return data


@dataclass(frozen=True)
class EvidenceKit:
    """``workload``'s real cpu-reference evidence (tests/harness/full_fixtures/<name>/) and edits of one value."""

    workload: Workload

    @property
    def fixture(self) -> Path:
        return FIXTURES / self.workload.name

    def copy(self, dest: Path) -> Path:
        shutil.copytree(self.fixture, dest)
        return dest

    def as_cuda(self, root: Path, dest: Path, profile: Profile = CUDA) -> Path:
        """A copy of ``root`` as a CUDA run on ``profile`` records it (:func:`as_cuda_bytes`)."""
        for role, member in self.workload.evidence.items():
            if (root / member).is_file():
                (dest / member).parent.mkdir(parents=True, exist_ok=True)
                data = (root / member).read_bytes()
                (dest / member).write_bytes(as_cuda_bytes(data, self.workload.name, role, SCALES[profile.name]))
        return dest

    def plans_on(self, root: Path, profile: Profile = CUDA) -> None:
        """Rewrite ``root``'s plans in place as planned on ``profile`` (its device, its scale's sizes)."""
        for role, member in self.workload.evidence.items():
            if (role == "plan" or role.endswith("_plan")) and (root / member).is_file():
                data = (root / member).read_bytes()
                (root / member).write_bytes(as_cuda_bytes(data, self.workload.name, role, SCALES[profile.name]))

    def evidence(self, root: Path) -> dict[str, Path]:
        return {role: root / m for role, m in self.workload.evidence.items() if (root / m).exists()}

    def judge(self, root: Path, profile: Profile = CPU) -> dict[str, bool]:
        j = self.workload.judge(self.evidence(root), profile, SCALES[profile.name])
        return {name: ok for name, (ok, _) in j.checks.items()}

    def failed(self, root: Path, profile: Profile = CPU) -> set[str]:
        return {name for name, ok in self.judge(root, profile).items() if not ok}

    def path(self, root: Path, role: str) -> Path:
        return root / self.workload.evidence[role]

    def edit_json(self, root: Path, role: str, change: Callable[[dict[str, Any]], None]) -> None:
        path = self.path(root, role)
        doc = json.loads(path.read_text())
        change(doc)
        path.write_text(json.dumps(doc))

    def edit_line(self, root: Path, role: str, index: int, key: str, value: Any) -> None:
        path = self.path(root, role)
        lines = [json.loads(x) for x in path.read_text().splitlines()]
        lines[index][key] = value
        path.write_text("".join(json.dumps(x) + "\n" for x in lines))

    def exit(self, step: str, code: int) -> Callable[[Path], None]:
        """An edit: every invocation of ``step`` in the transcript exits ``code``."""

        def change(doc: dict[str, Any]) -> None:
            for inv in doc["invocations"]:
                if inv["step"] == step:
                    inv["exit_code"] = code

        return lambda root: self.edit_json(root, "transcript", change)

    def digest(self, role: str, name: str) -> Callable[[Path], None]:
        """An edit: checkpoint manifest ``role`` lists another sha256 for file ``name``."""
        return lambda root: self.edit_json(root, role, lambda d: d["files"][name].update(sha256="0" * 64))

    def spoil(self, root: Path, role: str, kind: str) -> None:
        """Hostile evidence for ``role``: one of HOSTILE (no file, a directory, garbled bytes, 17 MiB, brackets
        nested past any parser's depth, JSON that is not an object)."""
        path = self.path(root, role)
        path.unlink()
        if kind == "directory":
            path.mkdir()
        elif kind == "garbled":
            path.write_bytes(b'{"files": {"a": \xff NaN')
        elif kind == "huge":
            with path.open("wb") as f:
                f.truncate(17 << 20)
        elif kind == "deeply_nested":
            path.write_bytes(b"[" * 200_000)
        elif kind == "not_an_object":
            path.write_text("[1, 2]\n")

    def cuda(
        self, *roles: str, baseline: int = 100 << 20, final: int = 100 << 20, peak: int = 2 << 30
    ) -> Callable[[Path], None]:
        """An edit: each summary in ``roles`` holds the cuda block a CUDA run records (teardown within 2 MiB)."""
        block = {
            "baseline_allocated_bytes": baseline,
            "final_allocated_bytes": final,
            "peak_reserved_bytes": peak,
            "peak_allocated_bytes": peak // 2,
            "teardown_returned_to_baseline": True,
            "teardown_tolerance_bytes": 2 << 20,
        }

        def change(root: Path) -> None:
            for role in roles:
                self.edit_json(root, role, lambda d: d.update(cuda=dict(block)))

        return change

    def set(self, role: str, key: str, value: Any) -> Callable[[Path], None]:
        """An edit: JSON evidence ``role`` holds ``value`` at ``key``."""
        return lambda root: self.edit_json(root, role, lambda d: d.update({key: value}))

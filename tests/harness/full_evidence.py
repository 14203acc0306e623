"""Shared by the full-workload judge tests: a workload's captured evidence, and one-value edits of it."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core import policy
from harness.core.proc import Redactor
from harness.core.profiles import PROFILES
from harness.core.records import Profile
from harness.qualify.full import runs
from harness.qualify.full.base import Scale, Workload
from harness.qualify.full.runner import RunnerOptions
from harness.qualify.full.scales import SCALES

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
# `handoff --json` of an unquantized run (canonical JSON), and of the same run trained NF4 (not carried over).
HANDOFF_UNQUANTIZED = b'"quantization":{"carried_over":true,"handed_off":"none","trained":"none"}'
HANDOFF_NF4 = b'"quantization":{"carried_over":false,"handed_off":"none","trained":"nf4"}'


def as_cuda_bytes(data: bytes, workload: str, role: str, scale: Scale) -> bytes:
    """CPU evidence as a CUDA run at ``scale`` records it: only the bytes that say "no CUDA" (`"cuda": null`
    becomes CUDA_FIGURES; in a plan, `"device": "cpu"` becomes "cuda"), NF4 where the scale trains it (and a
    handoff's quantization object: trained nf4, not carried over), and in a scaled workload's plan the scale's
    rollout sizes. Every other byte, digests and manifests included, stays: a test stand-in for evidence no CPU
    can produce, never written by harness code."""
    figures = json.dumps(CUDA_FIGURES, sort_keys=True).encode()
    data = CUDA_NULL.sub(lambda m: b'"cuda":' + m.group(1) + figures, data)
    if scale.quantization == "nf4" and workload in NF4_WORKLOADS:
        data = NO_QUANTIZATION.sub(lambda m: b'"quantization":' + m.group(1) + b'"nf4"', data)
        data = data.replace(HANDOFF_UNQUANTIZED, HANDOFF_NF4)
    plan = role == "plan" or role.endswith("_plan")
    if plan:  # a plan's device; elsewhere (a bundle manifest's bindings, say) a hash binds the bytes
        data = CPU_DEVICE.sub(lambda m: b'"device":' + m.group(1) + b'"cuda"', data)
    if workload in SCALED_WORKLOADS and plan:
        for key, value in runs.declared_sizes(scale, min_new_tokens=SCALED_WORKLOADS[workload]).items():
            pattern = re.compile(rb'"' + key.encode() + rb'":(\s*)\d+')
            data = pattern.sub(lambda m, k=key, v=value: f'"{k}":'.encode() + m.group(1) + str(v).encode(), data)
    return data


def forge_checkpoint(
    state_hashes: Path, listing: Path, label: str, name: str, sha256: str, *, product: bool, harness: bool
) -> None:
    """File ``name`` of checkpoint ``label`` gets ``sha256`` in the product's checkpoint.json (``product``) and/or
    in the harness's state-hashes record (``harness``); the record's binding to that checkpoint.json is forged to
    match, so only what the two say about the file is changed."""
    if product:
        doc = json.loads(listing.read_text())
        doc["files"][name]["sha256"] = sha256
        listing.write_text(json.dumps(doc))
    record = json.loads(state_hashes.read_text())
    entry = record["checkpoints"][label]
    entry["checkpoint_json_sha256"] = hashlib.sha256(listing.read_bytes()).hexdigest()
    if harness:
        entry["files"][name]["sha256"] = sha256
        if name in entry.get("optimizer_steps", {}):  # the counters were read from the bytes hashed
            entry["optimizer_steps"][name]["sha256"] = sha256
    state_hashes.write_text(json.dumps(record))


Edit = Callable[[Path], None]


def runner_options(tmp: Path, venv: Path, redact: dict[str, Path], wheel_sha256: str = "0" * 64) -> RunnerOptions:
    """What the runner needs to run a workload on the cpu-reference profile under ``tmp``: a stand-in data file, no
    model wheel, no verl environment."""
    data = tmp / "prompts.parquet"
    data.write_bytes(b"PAR1")
    return RunnerOptions(
        venv=venv,
        root=tmp / "full",
        redact=Redactor(redact),
        extra_env={},
        profile=CPU,
        scale=SCALES[CPU.name],
        data_source=data,
        model_wheel=None,
        verl_python=None,
        installed=None,
        wheel_sha256=wheel_sha256,
    )


def edit_json_file(path: Path, edit: Callable[[Any], None]) -> None:
    """``edit`` the JSON document at ``path`` in place."""
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def edit_jsonl_line(path: Path, index: int, edit: Callable[[dict[str, Any]], None]) -> None:
    """``edit`` line ``index`` of the JSON-lines file at ``path`` in place."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    edit(lines[index])
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def bad_value_cases(bad: dict[str, list[Edit]]) -> list[tuple[str, int]]:
    """``(check, index)`` of every edit of ``bad`` (check -> the edits that must fail exactly it), to parametrize."""
    return [(check, i) for check, changes in bad.items() for i in range(len(changes))]


def same_rewards(rows: list[dict[str, Any]]) -> None:
    """Trajectories whose rewards do not vary (edit for :meth:`EvidenceKit.forge_trajectories`)."""
    for row in rows:
        row["reward"] = 0.5


def one_advantage_zero(rows: list[dict[str, Any]]) -> None:
    """One nonzero advantage set to zero (edit for :meth:`EvidenceKit.forge_trajectories`)."""
    next(row for row in rows if row["advantage"] != 0)["advantage"] = 0.0


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

    def evidence_copy(self, dest: Path) -> dict[str, Path]:
        """A fresh copy of the fixture at ``dest``, as the evidence a judge is given."""
        return self.evidence(self.copy(dest))

    def members(self) -> list[str]:
        """The fixture's files, as archive members (sorted)."""
        return sorted(p.relative_to(self.fixture).as_posix() for p in self.fixture.rglob("*") if p.is_file())

    def fixture_bytes(self) -> int:
        return sum((self.fixture / m).stat().st_size for m in self.members())

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

    def judged(self, evidence: dict[str, Path], profile: Profile = CPU) -> dict[str, tuple[bool, str]]:
        """The judge's checks of ``evidence`` on ``profile``, which must be exactly the profile's required ones."""
        checks = self.workload.judge(evidence, profile, SCALES[profile.name]).checks
        assert set(checks) == set(policy.required_checks(profile, self.workload.name))
        return checks

    def failed_checks(self, evidence: dict[str, Path], profile: Profile = CPU) -> set[str]:
        return {name for name, (ok, _) in self.judged(evidence, profile).items() if not ok}

    def failed_after(self, tmp: Path, mutate: Callable[[dict[str, Path]], None], profile: Profile = CPU) -> set[str]:
        """The checks that fail on a fresh copy of the fixture (under ``tmp``) once ``mutate`` edited it."""
        evidence = self.evidence_copy(tmp / "evidence")
        mutate(evidence)
        return self.failed_checks(evidence, profile)

    def failed_when_spoiled(self, tmp: Path, role: str, kind: str) -> set[str]:
        """The checks that fail on a fresh copy of the fixture (under ``tmp``) whose ``role`` file is spoiled as
        ``kind`` (one of :data:`HOSTILE`)."""
        root = self.copy(tmp / "evidence")
        self.spoil(root, role, kind)
        return self.failed_checks(self.evidence(root))

    def assert_small_and_portable(self) -> None:
        """The fixture is under 300 kB and no JSON file of it names a local path."""
        assert self.fixture_bytes() < 300_000
        for path in self.fixture.rglob("*.json"):
            assert "/tmp/" not in path.read_text() and "/work/" not in path.read_text(), path

    def path(self, root: Path, role: str) -> Path:
        return root / self.workload.evidence[role]

    def edit_json(self, root: Path, role: str, change: Callable[[dict[str, Any]], None]) -> None:
        edit_json_file(self.path(root, role), change)

    def edit_line(self, root: Path, role: str, index: int, key: str, value: Any) -> None:
        edit_jsonl_line(self.path(root, role), index, lambda line: line.update({key: value}))

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

    def harness_hash(self, label: str, name: str, sha256: str = "0" * 64) -> Callable[[Path], None]:
        """An edit: the harness's own hash of file ``name`` in checkpoint ``label`` (state-hashes.json) is
        ``sha256`` (a checkpoint whose bytes differ from what the other run, or the product, holds)."""

        def change(doc: dict[str, Any]) -> None:
            entry = doc["checkpoints"][label]
            entry["files"][name]["sha256"] = sha256
            if name in entry.get("optimizer_steps", {}):  # the counters were read from the bytes hashed
                entry["optimizer_steps"][name]["sha256"] = sha256

        return lambda root: self.edit_json(root, "state_hashes", change)

    def forged(self, label: str, name: str, sha256: str = "f" * 64, *, product: bool = True, harness: bool = True
               ) -> Callable[[Path], None]:  # fmt: skip
        """An edit (:func:`forge_checkpoint`): with both, a checkpoint that really holds other bytes, told
        consistently; with ``product`` alone, a product that misstates a file the harness hashed."""
        return lambda root: forge_checkpoint(
            self.path(root, "state_hashes"), self.path(root, label), label, name, sha256, product=product,
            harness=harness,
        )  # fmt: skip

    def tensors_as(
        self, label: str, source: str, name: str = "adapter/adapter_model.safetensors"
    ) -> Callable[[Path], None]:
        """An edit: checkpoint ``label``'s per-tensor digests of adapter ``name`` are those of ``source`` (an
        update that left every adapter tensor as it was)."""

        def change(doc: dict[str, Any]) -> None:
            doc["checkpoints"][label]["tensors"][name] = doc["checkpoints"][source]["tensors"][name]

        return lambda root: self.edit_json(root, "state_hashes", change)

    def refused(self, label: str) -> Callable[[Path], None]:
        """An edit: the harness could not hash checkpoint ``label`` (recorded with its reason)."""

        def change(doc: dict[str, Any]) -> None:
            del doc["checkpoints"][label]
            doc["refused"][label] = "adapter_model.safetensors: safetensors header length 9 does not fit the file"

        return lambda root: self.edit_json(root, "state_hashes", change)

    def zero_lora_b(self, label: str, name: str = "adapter/adapter_model.safetensors") -> Callable[[Path], None]:
        """An edit: every lora_B tensor of checkpoint ``label``'s adapter hashes as all-zero bytes (the initial
        LoRA: an update that did not move it)."""

        def change(doc: dict[str, Any]) -> None:
            for tensor, entry in doc["checkpoints"][label]["tensors"][name].items():
                if "lora_B" in tensor:
                    entry["sha256"] = hashlib.sha256(bytes(entry["bytes"])).hexdigest()

        return lambda root: self.edit_json(root, "state_hashes", change)

    def forge_trajectories(
        self, step: int, change: Callable[[list[dict[str, Any]]], None], checkpoint: str = "checkpoint_2"
    ) -> Callable[[Path], None]:
        """An edit: update ``step``'s kept trajectories changed by ``change``, with the chain of digests above it
        forged to match (the checkpoint.json names the new file's sha256, and the harness's record names that
        checkpoint.json's): only what the rows say is wrong."""

        def edit(root: Path) -> None:
            path = self.path(root, f"trajectories_{step}")
            rows = [json.loads(x) for x in path.read_text().splitlines()]
            change(rows)
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            self.edit_json(root, checkpoint, lambda d: d["trajectories"].update({f"cycle-{step:06d}.jsonl": digest}))
            listing = hashlib.sha256(self.path(root, checkpoint).read_bytes()).hexdigest()
            self.edit_json(
                root, "state_hashes", lambda d: d["checkpoints"][checkpoint].update(checkpoint_json_sha256=listing)
            )

        return edit

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

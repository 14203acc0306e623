"""Shared by the full-workload judge tests: a workload's captured evidence, and one-value edits of it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.full.base import Workload
from harness.full.scales import SCALES
from harness.profiles import PROFILES
from harness.records import Profile

FIXTURES = Path(__file__).parent / "full_fixtures"
CPU, CUDA = PROFILES["cpu-reference"], PROFILES["h200-cu130"]
HOSTILE = ["missing", "directory", "garbled", "huge"]


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
        """Hostile evidence for ``role``: one of HOSTILE (no file, a directory, garbled bytes, 17 MiB)."""
        path = self.path(root, role)
        path.unlink()
        if kind == "directory":
            path.mkdir()
        elif kind == "garbled":
            path.write_bytes(b'{"files": {"a": \xff NaN')
        elif kind == "huge":
            with path.open("wb") as f:
                f.truncate(17 << 20)

    def set(self, role: str, key: str, value: Any) -> Callable[[Path], None]:
        """An edit: JSON evidence ``role`` holds ``value`` at ``key``."""
        return lambda root: self.edit_json(root, role, lambda d: d.update({key: value}))

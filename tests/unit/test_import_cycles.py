"""The import-cycle check (scripts/check_import_cycles.py): it finds planted cycles of every kind it claims to."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.import_check import SCRIPT, load_check

REPO = Path(__file__).resolve().parents[2]

check = load_check()


def _package(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _run(root: Path, *packages: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(root), *packages], capture_output=True, text=True, check=False
    )


def test_a_clean_package_passes(tmp_path: Path) -> None:
    _package(tmp_path, {"p/__init__.py": "", "p/a.py": "from p import b\n", "p/b.py": "import json\n"})
    done = _run(tmp_path, "p")
    assert done.returncode == 0, done.stdout
    assert done.stdout.startswith("no import cycles: 3 modules, 1 imports")


@pytest.mark.parametrize(
    ("a_text", "b_text"),
    [
        ("import p.b\n", "import p.a\n"),
        ("from p import b\n", "from p.a import thing\n"),
        ("from . import b\n", "from .a import thing\n"),
        ("def late():\n    from p.b import x\n", "from p import a\n"),
        ("import json\nclass C:\n    def m(self):\n        import p.b\n", "from .a import C\n"),
    ],
    ids=["import", "from-module", "relative", "function-level", "method-level"],
)
def test_a_two_module_cycle_is_found(tmp_path: Path, a_text: str, b_text: str) -> None:
    _package(tmp_path, {"p/__init__.py": "", "p/a.py": a_text, "p/b.py": b_text})
    done = _run(tmp_path, "p")
    assert done.returncode == 1
    assert done.stdout.strip() == "import cycle (2 modules): p.a <-> p.b"


def test_a_cycle_across_subpackages_and_packages_is_found(tmp_path: Path) -> None:
    _package(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/sub/__init__.py": "from .deep import f\n",
            "p/sub/deep.py": "from ..top import g\n",
            "p/top.py": "from q.mod import h\n",
            "q/__init__.py": "",
            "q/mod.py": "from p.sub import f\n",
        },
    )
    done = _run(tmp_path, "p", "q")
    assert done.returncode == 1
    assert done.stdout.strip() == "import cycle (4 modules): p.sub <-> p.sub.deep <-> p.top <-> q.mod"


@pytest.mark.parametrize(
    "guard",
    ["from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n", "import typing\nif typing.TYPE_CHECKING:\n"],
    ids=["name", "attribute"],
)
def test_a_type_only_import_closes_a_cycle_too(tmp_path: Path, guard: str) -> None:
    """A cycle through ``if TYPE_CHECKING:`` never runs, but the two modules still need each other: it counts."""
    _package(
        tmp_path,
        {"p/__init__.py": "", "p/a.py": f"{guard}    from p.b import B\n", "p/b.py": "from p.a import A\n"},
    )
    done = _run(tmp_path, "p")
    assert done.returncode == 1
    assert done.stdout.strip() == "import cycle (2 modules): p.a <-> p.b"


def test_an_import_in_the_else_of_a_type_checking_guard_counts(tmp_path: Path) -> None:
    _package(
        tmp_path,
        {
            "p/__init__.py": "",
            "p/a.py": "TYPE_CHECKING = False\nif TYPE_CHECKING:\n    pass\nelse:\n    from p import b\n",
            "p/b.py": "from p import a\n",
        },
    )
    assert _run(tmp_path, "p").returncode == 1


def test_a_missing_package_is_one_error_line(tmp_path: Path) -> None:
    done = _run(tmp_path, "nothere")
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "not a package" in done.stderr


def test_three_separate_cycles_are_reported_largest_first() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d"}, "f": {"f"}, "g": set()}
    assert check.cycles(graph) == [["a", "b", "c"], ["d", "e"]]


def test_miniverl_and_the_harness_have_no_import_cycles() -> None:
    done = _run(REPO, "miniverl", "harness")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("no import cycles: ")
    # the CLI sits at the top: only the ``python -m miniverl`` entry point may import it
    graph = check.import_graph(REPO, ["miniverl"])
    assert sorted(m for m, targets in graph.items() if "miniverl.cli" in targets) == ["miniverl.__main__"]

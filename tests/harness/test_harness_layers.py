"""The harness is laid out by stage, and its imports point one way: gate -> audit -> evidence -> qualify -> install
-> build -> core. The graph comes from the source (scripts/check_import_cycles.py; function-level imports count)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers.import_check import load_check

REPO = Path(__file__).resolve().parents[2]
# Lowest first: a module of a stage may import its own stage and the stages before it, never one after it.
STAGES = ("core", "build", "install", "qualify", "evidence", "audit", "gate")
TOP_LEVEL_MODULES = {"__init__.py", "__main__.py", "cli.py"}

check = load_check()


def stage_of(module: str) -> str | None:
    """The stage a ``harness.*`` module belongs to, or None for the top level (``harness``, ``harness.cli``, ...)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in STAGES) else None


def layer_violations(root: Path) -> list[str]:
    """Every import of the ``harness`` package under ``root`` that leaves the stage order: a stage module importing
    a later stage, the top-level modules (``cli``, ``__main__``) or a module in no stage."""
    graph = check.import_graph(root, ["harness"])
    found = []
    for source, targets in sorted(graph.items()):
        here = stage_of(source)
        if here is None:
            continue  # the top level (the CLI) may import every stage
        for target in sorted(targets):
            there = stage_of(target)
            if target == "harness":
                continue  # the root package holds a docstring only
            if there not in STAGES or STAGES.index(there) > STAGES.index(here):
                found.append(f"{source} ({here}) imports {target} ({there or 'top level'})")
    return found


def misplaced_modules(root: Path) -> list[str]:
    """Modules at harness/'s top level besides __init__, __main__ and cli, and packages that are no stage."""
    base = root / "harness"
    flat = [p.name for p in sorted(base.glob("*.py")) if p.name not in TOP_LEVEL_MODULES]
    packages = [p.name for p in sorted(base.iterdir()) if (p / "__init__.py").is_file() and p.name not in STAGES]
    return flat + [f"{name}/ (not a stage)" for name in packages]


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_every_import_between_stages_points_down() -> None:
    assert layer_violations(REPO) == []


def test_the_harness_has_no_import_cycle() -> None:
    assert check.cycles(check.import_graph(REPO, ["harness"])) == []


def test_no_module_stays_at_the_top_level() -> None:
    assert misplaced_modules(REPO) == []
    assert {p.name for p in (REPO / "harness").glob("*.py")} == TOP_LEVEL_MODULES


def test_each_stage_says_what_it_owns_and_may_import() -> None:
    for stage in STAGES:
        init = REPO / "harness" / stage / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc and "import" in doc.lower(), f"harness/{stage}/__init__.py: no docstring saying what it may import"


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    packages = {f"harness/{s}/__init__.py": '"""stage"""\n' for s in STAGES}
    _tree(
        tmp_path,
        {
            "harness/__init__.py": "",
            "harness/cli.py": "from harness.gate import main\n",
            **packages,
            "harness/gate/main.py": "from harness.core import errors\n",
            "harness/core/errors.py": "import json\n",
            "harness/qualify/judge.py": "from harness.build.candidate import x\n",
            "harness/build/candidate.py": "def late():\n    from harness.audit.chain import audit\n",
            "harness/audit/chain.py": "from harness.qualify import judge\n",
        },
    )
    assert layer_violations(tmp_path) == ["harness.build.candidate (build) imports harness.audit.chain (audit)"]


def test_a_stage_importing_the_cli_is_found(tmp_path: Path) -> None:
    packages = {f"harness/{s}/__init__.py": "" for s in STAGES}
    _tree(
        tmp_path,
        {"harness/__init__.py": "", "harness/cli.py": "", **packages, "harness/core/x.py": "import harness.cli\n"},
    )
    assert layer_violations(tmp_path) == ["harness.core.x (core) imports harness.cli (top level)"]


def test_a_flat_module_and_a_package_outside_the_stages_are_found(tmp_path: Path) -> None:
    packages = {f"harness/{s}/__init__.py": "" for s in STAGES}
    _tree(
        tmp_path,
        {
            "harness/__init__.py": "",
            "harness/cli.py": "",
            **packages,
            "harness/policy.py": "",
            "harness/misc/__init__.py": "",
        },
    )
    assert misplaced_modules(tmp_path) == ["policy.py", "misc/ (not a stage)"]

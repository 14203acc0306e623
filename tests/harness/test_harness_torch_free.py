"""The harness never imports torch or miniverl; the auditor runs in a real venv that has no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from harness_helpers import NO_TORCH_GUARD, REPO_ROOT, audit_args


def test_no_harness_module_imports_torch_or_miniverl() -> None:
    for path in [*sorted((REPO_ROOT / "harness").glob("*.py")), REPO_ROOT / "scripts" / "validate_release_chain.py"]:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in {"torch", "miniverl", "transformers", "peft"}, (path.name, name)


def test_the_auditor_runs_in_a_venv_without_torch(
    candidate: Path, smoke_qual: Path, known_good: Path, tmp_path: Path
) -> None:
    venv = tmp_path / "audit-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    install = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-input",
            "-r",
            str(REPO_ROOT / "harness" / "requirements-audit.txt"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    probe = subprocess.run([python, "-I", "-c", "import torch"], capture_output=True, text=True, check=False)
    assert probe.returncode != 0 and "No module named 'torch'" in probe.stderr
    # Belt and braces: a meta-path guard makes any attempt to import torch or miniverl fatal.
    guard = NO_TORCH_GUARD + (
        "sys.argv = ['validate_release_chain.py'] + sys.argv[1:]\n"
        f"sys.path.insert(0, {str(REPO_ROOT)!r})\n"
        "from harness.audit.cli import main\n"
        "raise SystemExit(main())\n"
    )
    done = subprocess.run(
        [python, "-I", "-c", guard, *audit_args(candidate, smoke_qual, known_good)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert '"status":"passed"' in done.stdout
    script = subprocess.run(
        [
            python,
            "-I",
            str(REPO_ROOT / "scripts" / "validate_release_chain.py"),
            *audit_args(candidate, smoke_qual, known_good),
        ],
        capture_output=True,
        text=True,
    )
    assert script.returncode == 0, script.stderr

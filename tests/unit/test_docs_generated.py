"""The site's generated reference pages are current (issue 36): `scripts/docs/generate.py --check` passes on the
committed docs/, and names the page when one is edited by hand, missing, or an error class goes undocumented."""

from __future__ import annotations

import contextlib
import io
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.docs_generator import load_generator

REPO = Path(__file__).resolve().parents[2]


GENERATE = load_generator()


@dataclass
class Result:
    returncode: int
    stderr: str


def _run(*args: str) -> Result:
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        code = GENERATE.main(list(args))
    return Result(code, stderr.getvalue())


def _check(docs: Path) -> Result:
    return _run("--check", "--docs-dir", str(docs))


def test_committed_reference_pages_are_current() -> None:
    result = _check(REPO / "docs")
    assert result.returncode == 0, result.stderr


def _copy_of_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    (docs / "reference").mkdir(parents=True)
    for page in (REPO / "docs" / "reference").glob("*.md"):
        shutil.copy2(page, docs / "reference" / page.name)
    shutil.copy2(REPO / "docs" / "troubleshooting.md", docs / "troubleshooting.md")
    assert _check(docs).returncode == 0
    return docs


def test_an_edited_page_is_named_stale(tmp_path: Path) -> None:
    docs = _copy_of_docs(tmp_path)
    page = docs / "reference" / "config.md"
    page.write_text(page.read_text().replace("`1e-4`", "`3e-4`").replace("`0.0001`", "`0.0003`"))
    result = _check(docs)
    assert result.returncode == 1
    assert "reference/config.md is stale" in result.stderr
    assert "cli.md" not in result.stderr  # only the edited page is named


def test_a_missing_page_is_named(tmp_path: Path) -> None:
    docs = _copy_of_docs(tmp_path)
    (docs / "reference" / "handoff-refusals.md").unlink()
    result = _check(docs)
    assert result.returncode == 1 and "reference/handoff-refusals.md is missing" in result.stderr
    assert not (docs / "reference" / "handoff-refusals.md").exists()  # --check writes nothing


def test_an_error_class_missing_from_troubleshooting_is_named(tmp_path: Path) -> None:
    docs = _copy_of_docs(tmp_path)
    page = docs / "troubleshooting.md"
    page.write_text(page.read_text().replace("`MemoryLimitError`", "MemoryLimit"))
    result = _check(docs)
    assert result.returncode == 1 and "MemoryLimitError" in result.stderr


def test_writing_regenerates_a_stale_page(tmp_path: Path) -> None:
    docs = _copy_of_docs(tmp_path)
    page = docs / "reference" / "cli.md"
    expected = page.read_text()
    page.write_text("edited\n")
    written = _run("--docs-dir", str(docs))
    assert written.returncode == 0, written.stderr
    assert page.read_text() == expected


def test_an_interpreter_inside_the_checkout_is_still_the_python_placeholder(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI runs the suite from a nox venv under the checkout: its interpreter must read `<python>`, not a path under
    `<checkout>` (the CLI page's `--base-python` default would differ from the committed page)."""
    inside = str(REPO / ".nox" / "tests" / "bin" / "python")
    monkeypatch.setattr(sys, "executable", inside)
    assert GENERATE._portable(f"default {inside}; root {REPO}") == "default <python>; root <checkout>"

"""What the rollout and GRPO benchmarks share: versions for the report, and the partial file a killed run leaves."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.canonical import atomic_write_json


def package_version(name: str) -> str | None:
    """The installed version of ``name``, or None when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def save_partial(path: Path, fmt: str, cells: list[dict[str, Any]]) -> None:
    """The cells measured so far (the caller removes ``path`` once the full report is written): a killed run
    keeps its figures."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"format": fmt, "cells": cells}, pretty=True)

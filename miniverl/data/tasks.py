"""Built-in prompt tasks and ``sample_dataset`` (what ``miniverl data sample`` runs)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from miniverl.data.prompts import write_prompts
from miniverl.data.sqlite_recovery import generate_sqlite_recovery
from miniverl.errors import UsageError
from miniverl.rewards.calculator import generate_calculator_problems
from miniverl.rewards.formatting import generate_formatting_prompts

#: task name → generator ``(rows, seed) -> list of row dicts``
TASKS: dict[str, Callable[[int, int], list[dict[str, str]]]] = {
    "calculator": generate_calculator_problems,
    "formatting": generate_formatting_prompts,
    "sqlite_recovery": generate_sqlite_recovery,
}

#: the reward each task is meant to be scored with (a default, not a constraint)
DEFAULT_REWARDS: dict[str, str] = {
    "calculator": "calculator_exact",
    "formatting": "target_length",
    "sqlite_recovery": "sql_result_match",
}


def sample_dataset(task: str, rows: int, seed: int, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Generate ``rows`` prompts of ``task`` from ``seed`` and write them atomically to ``out``.

    Returns ``{"path": out as given, "rows", "sha256", "task", "seed"}``. Deterministic: the same
    arguments write the same bytes (for a given pyarrow version).
    """
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}; known tasks: {', '.join(sorted(TASKS))}")
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise UsageError(f"--rows must be a positive integer, got {rows!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise UsageError(f"--seed must be a non-negative integer, got {seed!r}")
    digest = write_prompts(out, TASKS[task](rows, seed))
    return {"path": os.fspath(out), "rows": rows, "sha256": digest, "task": task, "seed": seed}

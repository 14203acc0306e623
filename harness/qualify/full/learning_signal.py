"""GRPO's learning signal, judged from a run's metrics lines and, where the workload kept them, re-derived from its
trajectories: rewards that vary within a group, and advantages that are not zero."""

from __future__ import annotations

import math
import statistics
from typing import Any

from harness.qualify.full.base import Judgement
from harness.qualify.full.reading import finite
from harness.qualify.full.runs import Run, positive_each, short


def _group_std_max(rows: list[dict[str, Any]]) -> float | None:
    groups: dict[str, list[float]] = {}
    for row in rows:
        reward, group = finite(row.get("reward")), row.get("group_id")
        if reward is None or not isinstance(group, str):
            return None
        groups.setdefault(group, []).append(reward)
    return max(statistics.pstdev(values) for values in groups.values()) if groups else None


def _nonzero(rows: list[dict[str, Any]]) -> int | None:
    advantages = [finite(row.get("advantage")) for row in rows]
    return None if any(a is None for a in advantages) else sum(a != 0 for a in advantages if a is not None)


def reward_varies(
    j: Judgement, run: Run, trajectories: dict[int, list[dict[str, Any]]] | None = None, *, kept: str | None = None
) -> None:
    """Every update's largest within-group reward std is > 0; where the workload ``kept`` its trajectories
    (``trajectories``: None when they are missing or unreadable), re-derived from their rewards (population std
    per group_id) and equal to what the metrics line says."""
    ok, values = positive_each(run, "reward_std_within_group_max")
    detail = f"per update, the largest within-group reward std {values}"
    if kept is not None:
        derived = [_group_std_max(rows) for _, rows in sorted((trajectories or {}).items())]
        agree = len(derived) == len(run.lines) and all(
            d is not None and d > 0 and math.isclose(d, finite(v) or -1.0, rel_tol=1e-9, abs_tol=1e-12)
            for d, v in zip(derived, run.column("reward_std_within_group_max"), strict=False)
        )
        ok = ok and agree
        detail += f"; {kept}: re-derived {[short(d) for d in derived][:8]} ({'agree' if agree else 'DISAGREE'})"
    j.check("reward_varies_within_group", ok, detail)


def nonzero_advantages(
    j: Judgement, run: Run, trajectories: dict[int, list[dict[str, Any]]] | None = None, *, kept: str | None = None
) -> None:
    """Every update has trajectories with a nonzero advantage; where the workload ``kept`` its trajectories,
    counted from their advantages and equal to the metrics line's count."""
    ok, values = positive_each(run, "nonzero_advantages")
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in run.column("nonzero_advantages"))
    detail = f"per update, trajectories with a nonzero advantage {values}"
    if kept is not None:
        derived = [_nonzero(rows) for _, rows in sorted((trajectories or {}).items())]
        agree = derived == run.column("nonzero_advantages") and all((d or 0) > 0 for d in derived)
        ok = ok and agree
        detail += f"; {kept}: counted {derived[:8]} ({'agree' if agree else 'DISAGREE'})"
    j.check("nonzero_advantages", ok and ints, detail)

"""What the rollout and GRPO benchmarks share: versions for the report, the partial file a killed run leaves, the
seeded random prompts and the spread of timed samples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from miniverl.canonical import atomic_write_json

MIN_REPEATS_FOR_A_RESULT = 5  # a figure from fewer timed steps is an anecdote, not a result


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


def spread(values: list[float]) -> dict[str, float]:
    """Range and quartiles of timed samples (inclusive method): the spread that goes beside every median."""
    import statistics

    ordered = sorted(values)
    q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1 else (ordered[0],) * 3
    return {"min": ordered[0], "q1": q1, "q3": q3, "max": ordered[-1]}


def random_prompt_ids(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    """``count`` prompts of ``length`` token ids drawn from ``seed``, above the first 8 ids (kept for specials)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids: list[list[int]] = torch.randint(8, vocab, (count, length), generator=gen).tolist()
    return ids

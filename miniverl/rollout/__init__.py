"""Rollout: generation backends (``miniverl.rollout.hf``, needs torch) and trajectory records (torch-free).

``from miniverl.rollout import generate_group`` imports torch lazily; the records do not need it.
"""

from typing import Any

from miniverl.rollout.records import TrajectoryRecord, read_trajectories_jsonl, write_trajectories_jsonl

_LAZY = {
    "generate_group",
    "PromptInput",
    "RolloutReport",
    "Trajectory",
    "encode_prompt",
    "resolve_eos_ids",
    "resolve_pad_id",
}

__all__ = ["TrajectoryRecord", "read_trajectories_jsonl", "write_trajectories_jsonl", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from miniverl.rollout import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'miniverl.rollout' has no attribute {name!r}")

"""The trajectory record (one line of ``trajectories.jsonl``) and its JSONL reader/writer.

Torch-free: records are plain pydantic models; the rollout backend converts its in-memory
``Trajectory`` objects with :meth:`TrajectoryRecord.from_trajectory`.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from miniverl.canonical import atomic_write_text, canonical_json
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import DataError


class TokenGae(BaseModel):
    """One trajectory's row of the ``[N, T]`` tensors a PPO update gave :func:`~miniverl.algorithms.gae_advantages`
    and what it computed from them, so that a reader can recompute GAE without the models.

    ``T`` is the longest response of the update: ``mask`` is 1 on this trajectory's response tokens and 0 on the
    padding after them. ``rewards`` (the score on the last response token, minus any KL-in-reward penalty) and
    ``values`` (the critic's :math:`V_{old}`) are the inputs; ``advantages`` and ``returns`` the GAE outputs,
    unwhitened, in float64; ``whitened_advantages`` what the actor trained on, whitened over the whole update's
    masked tokens (``None`` with ``whiten_advantages: false``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mask: list[Literal[0, 1]] = Field(min_length=1)
    rewards: list[float]
    values: list[float]
    advantages: list[float]
    returns: list[float]
    whitened_advantages: list[float] | None = None

    @model_validator(mode="after")
    def _one_value_per_position(self) -> TokenGae:
        rows = [self.rewards, self.values, self.advantages, self.returns]
        if self.whitened_advantages is not None:
            rows.append(self.whitened_advantages)
        if any(len(row) != len(self.mask) for row in rows):
            raise ValueError(f"every GAE row must have the mask's {len(self.mask)} positions")
        return self


class TrajectoryRecord(BaseModel):
    """One sampled response: its tokens, sampling log-probs, provenance, and (later) its scores.

    ``sampled_logprobs[i]`` is the log-probability of ``response_token_ids[i]`` under the
    distribution it was drawn from (temperature-scaled, top-k/top-p-filtered); ``seed`` is the
    per-sample seed that drew it. ``reward``/``advantage`` stay ``None`` until scored.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    prompt_id: str = Field(min_length=1)
    group_id: str = Field(min_length=1)
    sample_index: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    seed: int = Field(ge=0)
    prompt_token_ids: list[int] = Field(min_length=1)
    response_token_ids: list[int]
    sampled_logprobs: list[float]
    finish_reason: Literal["eos", "length"]
    response_text: str
    reward: float | None = None
    reward_components: dict[str, float] = Field(default_factory=dict)
    advantage: float | None = None
    #: PPO only: this trajectory's GAE inputs and outputs (written only when present)
    gae: TokenGae | None = None
    #: a foreign backend's samples only (written only when set): the engine that sampled it, its version, and
    #: the trainer's recomputed log-prob of each response token
    rollout_backend: Literal["vllm"] | None = None
    rollout_backend_version: str | None = Field(default=None, min_length=1)
    old_logprobs: list[float] | None = None

    @model_validator(mode="after")
    def _one_logprob_per_token(self) -> TrajectoryRecord:
        if len(self.sampled_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"{len(self.sampled_logprobs)} sampled_logprobs for "
                f"{len(self.response_token_ids)} response tokens; need one per token"
            )
        if self.old_logprobs is not None and len(self.old_logprobs) != len(self.response_token_ids):
            raise ValueError(
                f"{len(self.old_logprobs)} old_logprobs for {len(self.response_token_ids)} response tokens"
            )
        if (self.rollout_backend is None) != (self.rollout_backend_version is None):
            raise ValueError("rollout_backend and rollout_backend_version come together")
        if any(lp > 0.0 for lp in self.sampled_logprobs):
            raise ValueError("sampled_logprobs must be <= 0")
        n = len(self.response_token_ids)
        if self.gae is not None and self.gae.mask != [1] * n + [0] * (len(self.gae.mask) - n):
            raise ValueError(f"gae.mask must select exactly the {n} response tokens, then padding")
        return self

    @classmethod
    def from_trajectory(
        cls,
        trajectory: Any,
        *,
        reward: float | None = None,
        reward_components: Mapping[str, float] | None = None,
        advantage: float | None = None,
        gae: TokenGae | None = None,
    ) -> TrajectoryRecord:
        """A record from a rollout ``Trajectory`` (duck-typed: same attribute names)."""
        return cls(
            prompt_id=trajectory.prompt_id,
            group_id=trajectory.group_id,
            sample_index=trajectory.sample_index,
            policy_version=trajectory.policy_version,
            seed=trajectory.seed,
            prompt_token_ids=list(trajectory.prompt_token_ids),
            response_token_ids=list(trajectory.response_token_ids),
            sampled_logprobs=list(trajectory.sampled_logprobs),
            finish_reason=trajectory.finish_reason,
            response_text=trajectory.response_text,
            reward=reward,
            reward_components=dict(reward_components or {}),
            advantage=advantage,
            gae=gae,
            rollout_backend=getattr(trajectory, "rollout_backend", None),
            rollout_backend_version=getattr(trajectory, "rollout_backend_version", None),
            old_logprobs=None if getattr(trajectory, "old_logprobs", None) is None else list(trajectory.old_logprobs),
        )


#: fields written only when set, so records without them keep the bytes they always had (no ``"gae": null`` on the
#: lines of algorithms without GAE; the in-process engines' records keep their layout)
OPTIONAL_FIELDS = ("gae", "rollout_backend", "rollout_backend_version", "old_logprobs")


def _dumped(record: TrajectoryRecord) -> dict[str, Any]:
    out = record.model_dump(mode="json")
    for key in OPTIONAL_FIELDS:
        if out[key] is None:
            del out[key]
    return out


def write_trajectories_jsonl(path: str | os.PathLike[str], records: Iterable[TrajectoryRecord]) -> int:
    """Write one canonical-JSON record per line, atomically; returns the number of records."""
    lines = [canonical_json(_dumped(record)) + "\n" for record in records]
    atomic_write_text(path, "".join(lines))
    return len(lines)


def read_trajectories_jsonl(path: str | os.PathLike[str]) -> list[TrajectoryRecord]:
    """Every record of a trajectories JSONL file; a DataError names the first bad line."""
    source = Path(path)
    if not source.is_file():
        raise DataError(f"trajectory file not found: {os.fspath(path)}")
    records = []
    with open(source, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                records.append(TrajectoryRecord.model_validate(loads_json(line)))
            except StrictFormatError as exc:
                raise DataError(f"{os.fspath(path)} line {number}: {exc}") from None
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "record"
                raise DataError(f"{os.fspath(path)} line {number}: {where}: {first['msg']}") from None
    return records

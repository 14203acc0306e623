"""Rollout/trainer agreement: how far the sampler's log-prob of each response token is from the trainer's.

Per response token ``delta = trainer - sampler`` (the trainer's recomputed ``old_logp`` minus the rollout's
``sampled_logprobs``); the step records the fraction of tokens whose probability ratio ``exp(delta)`` lies
outside :data:`MISMATCH_RATIO_BAND`, the max and the mean of ``|delta|`` and the token count
(:func:`mismatch_metrics`). Every GRPO and PPO metrics line carries them, whatever the backend: the controller
measures a foreign backend's (vLLM) with its own forward, the in-process engines (``fast``, ``hf``) are measured
from the log-probs the update computes anyway (:func:`agreement_metrics`), never from a second forward.

``sampled_logprobs`` are of the distribution the token was drawn from; the trainer's are at temperature 1,
unfiltered. Under plain sampling (temperature 1, no top-k/top-p) the difference is numerics alone (kernels,
precision, batching); otherwise it also holds the sampling transform.

Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

#: the metrics keys of the rollout/trainer mismatch (per step, over every response token of the cycle)
OLD_LOGP_MAX_ABS_DIFF = "actor/old_logp_max_abs_diff"
MISMATCH_MEAN_ABS_DIFF = "rollout/mismatch_mean_abs_logp_diff"
MISMATCH_OUTSIDE_FRACTION = "rollout/mismatch_ratio_outside_frac"
MISMATCH_TOKENS = "rollout/mismatch_tokens"
MISMATCH_KEYS = (OLD_LOGP_MAX_ABS_DIFF, MISMATCH_MEAN_ABS_DIFF, MISMATCH_OUTSIDE_FRACTION, MISMATCH_TOKENS)
#: the probability ratio trainer / sampler a token may have and still count as matched
MISMATCH_RATIO_BAND = (0.9, 1.1)


def mismatch_metrics(sampled: Sequence[Sequence[float]], old: Sequence[Sequence[float]]) -> dict[str, float]:
    """The rollout/trainer mismatch of one step: per response token, ``delta = old - sampled`` (trainer minus
    sampler log-prob); the fraction of tokens whose ratio ``exp(delta)`` lies outside
    :data:`MISMATCH_RATIO_BAND`, the max and the mean of ``|delta|``. ValueError where it cannot be measured
    (other lengths, no token, a log-prob that is not finite)."""
    if len(sampled) != len(old):
        raise ValueError(f"{len(sampled)} sampled trajectories, {len(old)} recomputed")
    deltas: list[float] = []
    for number, (s, o) in enumerate(zip(sampled, old, strict=True), start=1):
        if len(s) != len(o):
            raise ValueError(f"trajectory {number}: {len(s)} sampled log-probs, {len(o)} recomputed")
        deltas += [b - a for a, b in zip(s, o, strict=True)]
    if not deltas:
        raise ValueError("no response tokens: the mismatch is undefined")
    if not all(math.isfinite(d) for d in deltas):
        raise ValueError("a log-prob is not finite")
    low, high = MISMATCH_RATIO_BAND
    outside = sum(1 for d in deltas if not low <= math.exp(d) <= high)
    magnitudes = [abs(d) for d in deltas]
    return {
        OLD_LOGP_MAX_ABS_DIFF: max(magnitudes),
        MISMATCH_MEAN_ABS_DIFF: sum(magnitudes) / len(magnitudes),
        MISMATCH_OUTSIDE_FRACTION: outside / len(deltas),
        MISMATCH_TOKENS: float(len(deltas)),
    }


def agreement_metrics(sampled: Sequence[Sequence[float]], trainer: Sequence[Sequence[float]]) -> dict[str, float]:
    """:func:`mismatch_metrics` for a training step's metrics line, or nothing where it cannot be measured (no
    response token, a log-prob that is not finite): an update never fails over its agreement, and an
    unmeasured agreement is absent, never a made-up zero. Other lengths are a bug and still raise."""
    values = [v for row in (*sampled, *trainer) for v in row]
    if not values or not all(math.isfinite(v) for v in values):
        return {}
    return mismatch_metrics(sampled, trainer)

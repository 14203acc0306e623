"""The rollout/trainer agreement math (:mod:`miniverl.rollout.agreement`), shared by every backend."""

from __future__ import annotations

import math

import pytest

from miniverl.rollout.agreement import (
    MISMATCH_KEYS,
    MISMATCH_MEAN_ABS_DIFF,
    MISMATCH_OUTSIDE_FRACTION,
    MISMATCH_TOKENS,
    OLD_LOGP_MAX_ABS_DIFF,
    agreement_metrics,
    mismatch_metrics,
)


def test_mismatch_metrics_count_tokens_outside_the_ratio_band() -> None:
    sampled = [[-1.0, -2.0], [-0.5]]
    old = [[-1.0 + math.log(1.2), -2.0 + math.log(0.95)], [-0.5 - math.log(1.05)]]
    got = mismatch_metrics(sampled, old)
    assert got[MISMATCH_OUTSIDE_FRACTION] == pytest.approx(1 / 3)  # only exp(delta) = 1.2 is outside [0.9, 1.1]
    assert got[OLD_LOGP_MAX_ABS_DIFF] == pytest.approx(math.log(1.2))
    assert got[MISMATCH_MEAN_ABS_DIFF] == pytest.approx((math.log(1.2) - math.log(0.95) + math.log(1.05)) / 3)
    assert got[MISMATCH_TOKENS] == 3.0
    assert mismatch_metrics([[-1.0]], [[-1.0]])[MISMATCH_OUTSIDE_FRACTION] == 0.0
    assert mismatch_metrics([[-1.0]], [[-1.0 + math.log(0.85)]])[MISMATCH_OUTSIDE_FRACTION] == 1.0


@pytest.mark.parametrize(
    ("sampled", "old", "message"),
    [
        ([[-1.0]], [[-1.0], [-1.0]], "1 sampled trajectories, 2 recomputed"),
        ([[-1.0, -1.0]], [[-1.0]], "trajectory 1: 2 sampled log-probs, 1 recomputed"),
        ([[]], [[]], "no response tokens"),
        ([[-1.0]], [[math.nan]], "not finite"),
    ],
)
def test_mismatch_metrics_refuse_what_they_cannot_measure(
    sampled: list[list[float]], old: list[list[float]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        mismatch_metrics(sampled, old)


def test_the_band_edges_count_as_matched_and_just_past_them_does_not() -> None:
    low, high = math.log(0.9), math.log(1.1)
    inside = mismatch_metrics([[0.0, 0.0]], [[low * 0.999, high * 0.999]])
    assert inside[MISMATCH_OUTSIDE_FRACTION] == 0.0
    outside = mismatch_metrics([[0.0, 0.0]], [[low * 1.001, high * 1.001]])
    assert outside[MISMATCH_OUTSIDE_FRACTION] == 1.0
    assert outside[OLD_LOGP_MAX_ABS_DIFF] == pytest.approx(-low * 1.001)


def test_the_sign_is_trainer_minus_sampler() -> None:
    """A trainer 1.2x as likely as the sampler is outside; so is a sampler 1.2x as likely (ratio 1/1.2 < 0.9)."""
    for trainer in (math.log(1.2), -math.log(1.2)):
        got = mismatch_metrics([[-3.0]], [[-3.0 + trainer]])
        assert got[OLD_LOGP_MAX_ABS_DIFF] == pytest.approx(math.log(1.2))
        assert got[OLD_LOGP_MAX_ABS_DIFF] == got[MISMATCH_MEAN_ABS_DIFF]
    assert mismatch_metrics([[-3.0]], [[-3.0 + math.log(1.05)]])[MISMATCH_OUTSIDE_FRACTION] == 0.0
    assert mismatch_metrics([[-3.0]], [[-3.0 - math.log(1.05)]])[MISMATCH_OUTSIDE_FRACTION] == 0.0


def test_agreement_metrics_match_mismatch_metrics_where_measurable() -> None:
    sampled, trainer = [[-1.0, -2.5], [-0.25]], [[-1.1, -2.5], [-0.2]]
    assert agreement_metrics(sampled, trainer) == mismatch_metrics(sampled, trainer)
    assert set(agreement_metrics(sampled, trainer)) == set(MISMATCH_KEYS)


@pytest.mark.parametrize(
    ("sampled", "trainer"),
    [([[]], [[]]), ([], []), ([[-1.0]], [[math.nan]]), ([[-math.inf]], [[-1.0]])],
    ids=["no tokens", "no trajectories", "nan", "-inf"],
)
def test_agreement_metrics_record_nothing_they_could_not_measure(
    sampled: list[list[float]], trainer: list[list[float]]
) -> None:
    assert agreement_metrics(sampled, trainer) == {}


def test_agreement_metrics_still_refuse_other_lengths() -> None:
    with pytest.raises(ValueError, match="trajectory 1: 2 sampled log-probs, 1 recomputed"):
        agreement_metrics([[-1.0, -1.0]], [[-1.0]])

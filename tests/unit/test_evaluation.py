"""The evaluation summaries: per-component means, accuracy for 0/1 components, differences."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from miniverl.evaluation import difference, flat_metrics, summarize
from miniverl.rewards import RewardScore


def _traj(prompt_id: str, tokens: int) -> SimpleNamespace:
    return SimpleNamespace(prompt_id=prompt_id, response_token_count=tokens)


def test_summary_accuracy_only_for_binary_components() -> None:
    trajectories = [_traj("a", 2), _traj("a", 4), _traj("b", 6)]
    scores = [
        RewardScore(total=1.5, components={"exact": 1.0, "length": 0.5}),
        RewardScore(total=0.25, components={"exact": 0.0, "length": 0.25}),
        RewardScore(total=1.0, components={"exact": 1.0, "length": 0.0}),
    ]
    summary = summarize(trajectories, scores)  # type: ignore[arg-type]
    assert summary["trajectories"] == 3 and summary["prompts"] == 2
    assert summary["reward_mean"] == pytest.approx(2.75 / 3)
    assert summary["response_tokens_mean"] == pytest.approx(4.0)
    assert summary["components"]["exact"] == {"mean": pytest.approx(2 / 3), "fraction_positive": pytest.approx(2 / 3)}
    assert summary["components"]["length"] == {"mean": pytest.approx(0.25), "fraction_positive": None}
    flat = flat_metrics(summary, "eval/")
    assert set(flat) == {"eval/reward_mean", "eval/response_tokens_mean", "eval/exact/mean",
                         "eval/exact/fraction_positive", "eval/length/mean"}  # fmt: skip

    base = summarize(trajectories[:1], scores[1:2])  # type: ignore[arg-type]
    diff = difference(base, summary)
    assert diff["reward_mean"] == pytest.approx(summary["reward_mean"] - 0.25)
    assert diff["response_tokens_mean"] == pytest.approx(2.0)
    assert diff["components"]["exact"]["fraction_positive"] == pytest.approx(2 / 3)
    assert diff["components"]["length"]["fraction_positive"] is None

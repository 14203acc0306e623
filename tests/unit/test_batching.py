"""Physical batch plans: sequential, fixed length buckets, and the cost-minimizing ``auto``."""

from __future__ import annotations

import itertools
import random

import pytest

from miniverl.runtime.batching import AutoPolicy, padding_tokens, plan_physical_batches


def _cost(lengths: list[int], batches: list[list[int]], policy: AutoPolicy) -> int:
    return len(batches) * policy.overhead_tokens + sum(len(b) * max(lengths[i] for i in b) for b in batches)


def test_one_is_sequential_in_row_order() -> None:
    assert plan_physical_batches([5, 3, 9], 1) == [[0], [1], [2]]


def test_fixed_k_buckets_sort_by_length_then_index() -> None:
    lengths = [50, 10, 30, 10, 40]
    assert plan_physical_batches(lengths, 2) == [[1, 3], [2, 4], [0]]
    assert plan_physical_batches(lengths, 4) == [[1, 3, 2, 4], [0]]
    assert plan_physical_batches(lengths, 8) == [[1, 3, 2, 4, 0]]


def test_every_row_exactly_once_and_deterministic() -> None:
    rng = random.Random(0)
    lengths = [rng.randint(1, 400) for _ in range(23)]
    for size in (1, 2, 3, 4, 7, 64, "auto"):
        plan = plan_physical_batches(lengths, size)
        assert sorted(itertools.chain.from_iterable(plan)) == list(range(23))
        assert plan == plan_physical_batches(list(lengths), size)


def test_padding_tokens_counts_only_added_positions() -> None:
    lengths = [4, 2, 3]
    assert padding_tokens(lengths, [[0], [1], [2]]) == 0
    assert padding_tokens(lengths, [[1, 2, 0]]) == (4 - 2) + (4 - 3)


@pytest.mark.parametrize("policy", [AutoPolicy(16, 4096), AutoPolicy(512, 4096), AutoPolicy(2048, 8192)])
def test_auto_is_never_costlier_than_any_fixed_bucketing_within_budget(policy: AutoPolicy) -> None:
    rng = random.Random(1)
    for _ in range(40):
        lengths = [rng.randint(60, 400) for _ in range(rng.randint(1, 12))]
        auto = plan_physical_batches(lengths, "auto", auto=policy)
        auto_cost = _cost(lengths, auto, policy)
        for k in range(1, len(lengths) + 1):
            fixed = plan_physical_batches(lengths, k)
            within = all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= policy.max_tokens for b in fixed)
            if within:
                assert auto_cost <= _cost(lengths, fixed, policy)
        for b in auto:
            assert len(b) == 1 or len(b) * max(lengths[i] for i in b) <= policy.max_tokens


def test_auto_does_not_pad_everything_when_lengths_spread() -> None:
    lengths = [60, 62, 65, 70, 390, 395, 398, 400]
    plan = plan_physical_batches(lengths, "auto", auto=AutoPolicy(overhead_tokens=256, max_tokens=8192))
    assert plan == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert padding_tokens(lengths, plan) < padding_tokens(lengths, [list(range(8))])


def test_auto_respects_the_token_budget_but_runs_a_long_row_alone() -> None:
    plan = plan_physical_batches([500, 500, 10], "auto", auto=AutoPolicy(overhead_tokens=10_000, max_tokens=400))
    assert sorted(map(sorted, plan)) == [[0], [1], [2]]


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "big"])
def test_bad_batch_sizes_are_refused(bad: object) -> None:
    with pytest.raises(ValueError):
        plan_physical_batches([3, 4], bad)  # type: ignore[arg-type]


def test_empty_rows_are_refused() -> None:
    with pytest.raises(ValueError):
        plan_physical_batches([3, 0], 2)


def test_auto_keeps_the_best_fixed_bucketing_unless_the_optimum_is_clearly_better() -> None:
    lengths = [10, 10, 10, 400, 400, 400, 400, 400]
    near = AutoPolicy(overhead_tokens=100, max_tokens=8192)  # optimum 2230 vs fixed k=3 2330: within 5 %
    assert plan_physical_batches(lengths, "auto", auto=near) == plan_physical_batches(lengths, 3)
    clear = AutoPolicy(overhead_tokens=200, max_tokens=8192)  # optimum 2430 vs fixed k=3 2630: 7.6 % better
    assert plan_physical_batches(lengths, "auto", auto=clear) == [[0, 1, 2], [3, 4, 5, 6, 7]]
    exact = AutoPolicy(overhead_tokens=100, max_tokens=8192, prefer_fixed_margin=0.0)
    assert plan_physical_batches(lengths, "auto", auto=exact) == [[0, 1, 2], [3, 4, 5, 6, 7]]

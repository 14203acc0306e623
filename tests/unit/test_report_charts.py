"""The report's chart primitives: round ticks, the moving average, gridlines and units (no run needed)."""

from __future__ import annotations

import math
import random
import re

import pytest

from miniverl.artifacts.svg import line_chart, moving_average, nice_step, nice_ticks, smoothing_window, tick_label


def _is_round(step: float) -> bool:
    mantissa = step / 10.0 ** math.floor(math.log10(step) + 1e-9)
    return any(math.isclose(mantissa, m) for m in (1.0, 2.0, 5.0))


def test_ticks_the_issue_complained_about_are_round() -> None:
    ticks = nice_ticks(0.133, 0.265)
    assert ticks == [0.1, 0.15, 0.2, 0.25, 0.3]
    assert [tick_label(t, 0.05) for t in ticks] == ["0.10", "0.15", "0.20", "0.25", "0.30"]
    assert nice_ticks(0.11, 0.42) == [0.1, 0.2, 0.3, 0.4, 0.5]
    assert [tick_label(t, 0.1) for t in nice_ticks(0.11, 0.42)] == ["0.1", "0.2", "0.3", "0.4", "0.5"]
    assert nice_ticks(1, 36, integer=True) == [0, 10, 20, 30, 40]
    assert nice_ticks(1, 2, integer=True) == [1, 2]


@pytest.mark.parametrize("seed", range(20))
def test_ticks_are_round_multiples_that_cover_the_range(seed: int) -> None:
    rng = random.Random(seed)
    scale = 10.0 ** rng.randint(-5, 9)
    low = rng.uniform(-1, 1) * scale
    high = low + rng.uniform(1e-3, 3) * scale
    ticks = nice_ticks(low, high)
    step = ticks[1] - ticks[0]
    assert _is_round(nice_step(high - low)) and math.isclose(step, nice_step(high - low), rel_tol=1e-6)
    assert ticks[0] <= low and ticks[-1] >= high and 3 <= len(ticks) <= 12
    for tick in ticks:
        assert math.isclose(tick / step, round(tick / step), abs_tol=1e-6)


def test_a_flat_series_still_gets_an_axis() -> None:
    ticks = nice_ticks(0.5, 0.5)
    assert ticks[0] < 0.5 < ticks[-1]


def test_moving_average_is_the_trailing_mean_of_full_windows() -> None:
    points = [(1, 1.0), (2, 2.0), (3, 6.0), (4, 3.0)]
    assert moving_average(points, 2) == [(2, 1.5), (3, 4.0), (4, 4.5)]
    assert moving_average(points, 1) == points
    assert moving_average(points, 5) == []
    assert [smoothing_window(n) for n in (1, 7, 8, 36, 400)] == [1, 1, 2, 9, 10]


def test_chart_draws_raw_points_the_average_gridlines_and_units() -> None:
    points = [(float(i), 0.1 + 0.01 * i + (0.05 if i % 2 else 0.0)) for i in range(1, 37)]
    svg = line_chart("reward mean", {"reward_mean": points}, y_label="reward", window=9)
    assert svg.count('class="pt"') == 36
    assert svg.count('class="ma"') == 1
    averaged = re.search(r'class="ma"[^>]*points="([^"]+)"', svg)
    assert averaged is not None and len(averaged.group(1).split()) == 36 - 9 + 1
    assert svg.count('class="grid"') >= 6 and 'stroke="#e6e6e6"' in svg
    assert ">reward</text>" in svg and ">update</text>" in svg and "moving average over 9 points" in svg
    labels = re.findall(r'text-anchor="end" font-size="10"[^>]*>([^<]+)</text>', svg)
    assert labels == ["0.1", "0.2", "0.3", "0.4", "0.5"]  # 0.11 .. 0.50 on round ticks


def test_chart_without_smoothing_has_no_average_line() -> None:
    svg = line_chart("loss", {"loss": [(1, 0.5), (2, 0.4)]}, window=1)
    assert 'class="ma"' not in svg and svg.count('class="pt"') == 2


def test_chart_escapes_names() -> None:
    svg = line_chart("<b>", {"<script>": [(1, 1.0)]})
    assert "<script>" not in svg and "<b>" not in svg

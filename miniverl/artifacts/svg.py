"""Small, dependency-free SVG line charts for the run report (one chart per metric).

Each series is drawn as its raw points (light) and, when ``window`` > 1, its trailing moving average
(a bold line). Both axes have round ticks (1, 2 or 5 times a power of ten) and light gridlines.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 440, 240
LEFT, RIGHT, TOP, BOTTOM = 62, 12, 26, 36
INSET = 6
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
FONT = 'font-family="sans-serif"'

Points = Sequence[tuple[float, float]]


def nice_step(span: float, target: int = 5) -> float:
    """The round step (1, 2 or 5 times a power of ten) that cuts ``span`` into about ``target`` intervals."""
    if span <= 0 or not math.isfinite(span):
        return 1.0
    raw = span / target
    power = 10.0 ** math.floor(math.log10(raw))
    for factor in (1.0, 2.0, 5.0, 10.0):
        if raw <= factor * power * (1 + 1e-9):
            return factor * power
    return 10.0 * power


def nice_ticks(low: float, high: float, target: int = 5, *, integer: bool = False) -> list[float]:
    """Round ticks from a multiple of the step at or below ``low`` to one at or above ``high``."""
    if high < low:
        low, high = high, low
    if high == low:
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = nice_step(high - low, target)
    if integer:
        step = max(1.0, round(step))
    first = math.floor(low / step + 1e-9) * step
    last = math.ceil(high / step - 1e-9) * step
    count = round((last - first) / step)
    return [_clean(first + i * step, step) for i in range(count + 1)]


def _clean(value: float, step: float) -> float:
    """``value`` rounded to the step's decimals (0.30000000000000004 is 0.3)."""
    return round(value, max(0, -math.floor(math.log10(step))) + 1)


def tick_label(value: float, step: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6 or step < 1e-4:
        return f"{value:.3g}"
    decimals = max(0, -math.floor(math.log10(step) + 1e-6))
    return f"{value:.{decimals}f}"


def moving_average(points: Points, window: int) -> list[tuple[float, float]]:
    """Trailing mean over ``window`` points, one value per full window (at the window's last x)."""
    if window < 1:
        raise ValueError("window must be at least 1")
    out = []
    for end in range(window, len(points) + 1):
        chunk = points[end - window : end]
        out.append((chunk[-1][0], math.fsum(y for _, y in chunk) / window))
    return out


def smoothing_window(count: int) -> int:
    """About a quarter of the points, at most 10 (1: no smoothing, for runs of fewer than 8 points)."""
    return max(1, min(10, count // 4))


def line_chart(
    title: str,
    series: Mapping[str, Points],
    *,
    x_label: str = "update",
    y_label: str = "",
    window: int = 1,
) -> str:
    """An SVG with, per named series of ``(x, y)`` points, a ``<circle class="pt">`` per raw point (so a test
    or a reader can count them) and, when ``window`` > 1, a ``<polyline class="ma">`` of its moving average.

    Points with a non-finite y are left out.
    """
    finite = {name: [(x, y) for x, y in values if math.isfinite(y)] for name, values in series.items()}
    points = [p for values in finite.values() for p in values]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13" {FONT}>{escape(title)}</text>',
    ]
    if not points:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12">no data</text>')
        return "".join(parts) + "</svg>"
    y_ticks = nice_ticks(min(p[1] for p in points), max(p[1] for p in points))
    # y spans whole round ticks; x spans the updates run (no empty room after the last), ticked where round
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    x_ticks = [t for t in nice_ticks(x0, x1, integer=True) if x0 <= t <= x1]
    y0, y1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:  # a few pixels in from the frame, so the first and last points show whole
        return LEFT + INSET + (x - x0) / (x1 - x0) * (plot_w - 2 * INSET)

    def sy(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    y_step = y_ticks[1] - y_ticks[0]
    for tick in y_ticks:
        y = sy(tick)
        parts.append(
            f'<line class="grid" x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#e6e6e6"/>'
        )
        parts.append(
            f'<text x="{LEFT - 5}" y="{y + 3.5:.1f}" text-anchor="end" font-size="10" {FONT}>'
            f"{tick_label(tick, y_step)}</text>"
        )
    for tick in x_ticks:
        x = sx(tick)
        parts.append(f'<line class="grid" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="#e6e6e6"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 13}" text-anchor="middle" font-size="10" {FONT}>{tick:g}</text>'
        )
    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999" stroke-width="1"/>'
    )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 5}" text-anchor="middle" font-size="10" {FONT}>'
        f"{escape(x_label)}</text>"
    )
    if y_label:
        middle = TOP + plot_h / 2
        parts.append(
            f'<text x="12" y="{middle:.1f}" text-anchor="middle" font-size="10" {FONT} '
            f'transform="rotate(-90 12 {middle:.1f})">{escape(y_label)}</text>'
        )
    for index, (name, values) in enumerate(finite.items()):
        color = COLORS[index % len(COLORS)]
        smooth = moving_average(values, window) if 1 < window <= len(values) else []
        raw_opacity = "0.35" if smooth else "1"
        if len(values) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in values)
            parts.append(
                f'<polyline class="raw" fill="none" stroke="{color}" stroke-opacity="{raw_opacity}" '
                f'stroke-width="1" points="{path}"/>'
            )
        for x, y in values:
            parts.append(
                f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{color}" '
                f'fill-opacity="{raw_opacity}"><title>{escape(name)} {x:g}: {y:.6g}</title></circle>'
            )
        if len(smooth) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in smooth)
            parts.append(f'<polyline class="ma" fill="none" stroke="{color}" stroke-width="2.5" points="{path}"/>')
        if len(finite) > 1:
            ly = TOP + 12 + 12 * index
            parts.append(f'<rect x="{LEFT + 6}" y="{ly - 8}" width="8" height="8" fill="{color}"/>')
            parts.append(f'<text x="{LEFT + 18}" y="{ly}" font-size="10" {FONT}>{escape(name)}</text>')
    if window > 1:
        parts.append(
            f'<text x="{LEFT + plot_w - 4}" y="{TOP + plot_h - 5}" text-anchor="end" font-size="9" fill="#666" '
            f"{FONT}>line: moving average over {window} points</text>"
        )
    return "".join(parts) + "</svg>"

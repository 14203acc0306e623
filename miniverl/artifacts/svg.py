"""Small, dependency-free SVG line charts for the run report (one chart per metric)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape

WIDTH, HEIGHT = 420, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 26, 34
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _ticks(low: float, high: float) -> list[float]:
    if high == low:
        return [low]
    return [low + (high - low) * i / 4 for i in range(5)]


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    magnitude = abs(value)
    if magnitude >= 1000 or magnitude < 0.01:
        return f"{value:.2e}"
    return f"{value:.3g}"


def line_chart(title: str, series: Mapping[str, Sequence[tuple[float, float]]], *, x_label: str = "update") -> str:
    """An SVG with one polyline (and a circle per point) per named series of ``(x, y)`` points.

    Points with a non-finite y are left out. Each point is a ``<circle class="pt">`` so a test
    (or a reader) can count them.
    """
    points = [(x, y) for values in series.values() for x, y in values if math.isfinite(y)]
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
        f'<text x="{WIDTH / 2}" y="16" text-anchor="middle" font-size="13" font-family="sans-serif">'
        f"{escape(title)}</text>",
    ]
    if not points:
        parts.append(f'<text x="{WIDTH / 2}" y="{HEIGHT / 2}" text-anchor="middle" font-size="12">no data</text>')
        return "".join(parts) + "</svg>"
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if y0 == y1:
        pad = abs(y0) * 0.1 or 1.0
        y0, y1 = y0 - pad, y1 + pad
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return TOP + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts.append(
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999" stroke-width="1"/>'
    )
    for tick in _ticks(y0, y1):
        y = sy(tick)
        parts.append(f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{LEFT}" y2="{y:.1f}" stroke="#999"/>')
        parts.append(
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" text-anchor="end" font-size="10" font-family="sans-serif">'
            f"{_fmt(tick)}</text>"
        )
    for tick in sorted({round(t) for t in _ticks(x0, x1)}):
        x = sx(tick)
        parts.append(
            f'<text x="{x:.1f}" y="{TOP + plot_h + 14}" text-anchor="middle" font-size="10" '
            f'font-family="sans-serif">{tick}</text>'
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 4}" text-anchor="middle" font-size="10" '
        f'font-family="sans-serif">{escape(x_label)}</text>'
    )
    for index, (name, values) in enumerate(series.items()):
        color = COLORS[index % len(COLORS)]
        finite = [(x, y) for x, y in values if math.isfinite(y)]
        if len(finite) > 1:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in finite)
            parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{path}"/>')
        for x, y in finite:
            parts.append(
                f'<circle class="pt" cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}">'
                f"<title>{escape(name)} {x:g}: {y:.6g}</title></circle>"
            )
        if len(series) > 1:
            ly = TOP + 12 + 12 * index
            parts.append(f'<rect x="{LEFT + 6}" y="{ly - 8}" width="8" height="8" fill="{color}"/>')
            parts.append(
                f'<text x="{LEFT + 18}" y="{ly}" font-size="10" font-family="sans-serif">{escape(name)}</text>'
            )
    return "".join(parts) + "</svg>"

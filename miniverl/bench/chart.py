"""What the rollout and GRPO bench reports share in their rendering: a figure as text, the goals table, and the SVG
of horizontal bars (one per measured cell) that each report draws."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

BAR, GAP, TOP = 18, 6, 40
HIGHLIGHT, PLAIN = "#2a6f97", "#999999"


def figure(value: Any, digits: int = 3) -> str:
    """``value`` for a report table: ``digits`` significant digits, thousands separated from 1000 up, or ``n/a``."""
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def goals_table(goals: list[dict[str, Any]], digits: int = 3) -> list[str]:
    """The markdown lines of a report's goals (name, observed figure, target, status), a blank line first."""
    rows = [f"| {g['name']} | {figure(g['observed'], digits)} | {g['target']} | {g['status']} |" for g in goals]
    return ["", "| goal | observed | target | status |", "|---|---:|---|---|", *rows]


def horizontal_bars_svg(title: str, bars: list[tuple[str, float, Any, bool]], *, width: int, left: int) -> str:
    """An SVG with ``title`` over one bar per ``(label, length in px, value, highlighted)``, labels right-aligned at
    ``left``, each bar at least 1 px long and followed by its value (:func:`figure`)."""
    height = TOP + len(bars) * (BAR + GAP) + 30
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
        'font-size="12">',
        f'<text x="{left}" y="20">{escape(title)}</text>',
    ]
    for i, (label, length, value, highlighted) in enumerate(bars):
        y = TOP + i * (BAR + GAP)
        parts.append(f'<text x="{left - 6}" y="{y + BAR - 5}" text-anchor="end">{escape(label)}</text>')
        w = max(length, 1.0)
        fill = HIGHLIGHT if highlighted else PLAIN
        parts.append(f'<rect x="{left}" y="{y}" width="{w:.1f}" height="{BAR}" fill="{fill}"/>')
        parts.append(f'<text x="{left + w + 4:.1f}" y="{y + BAR - 5}">{figure(value)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

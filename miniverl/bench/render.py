"""Benchmark goals (computed from the measured cells), the markdown table and the SVG Pareto plot."""

from __future__ import annotations

from typing import Any
from xml.sax.saxutils import escape

SEED_NF4_DUAL_BATCH4_GIB = 3.035
AUTO_NOISE_BAND = 0.02  # auto may trail the best fixed batch by at most 2 % (timing noise)


def _cell(cells: list[dict[str, Any]], runtime: str, batch: Any) -> dict[str, Any] | None:
    return next((c for c in cells if c["runtime"] == runtime and c["trajectory_batch_size"] == batch), None)


def _goal(name: str, observed: float | None, target: str, passed: bool | None, **extra: Any) -> dict[str, Any]:
    status = "not_measured" if passed is None else ("met" if passed else "not_met")
    return {"name": name, "observed": observed, "target": target, "status": status, **extra}


def evaluate_goals(cells: list[dict[str, Any]], *, quantization: str, device: str) -> list[dict[str, Any]]:
    """Issue 4's performance goals, each with its observed figure and met / not_met / not_measured."""
    goals = []
    d1, d4, s4 = _cell(cells, "dual_model", 1), _cell(cells, "dual_model", 4), _cell(cells, "shared_backbone", 4)
    if d1 and d4:
        ratio = d4["trajectories_per_second"] / d1["trajectories_per_second"]
        goals.append(_goal("dual batch-4 throughput / batch-1", ratio, ">= 1.6", ratio >= 1.6))
    if d4 and s4:
        if d4["peak_reserved_gib"] is not None and s4["peak_reserved_gib"] is not None:
            saving = 1.0 - s4["peak_reserved_gib"] / d4["peak_reserved_gib"]
            goals.append(_goal("shared peak-memory saving at batch-4", saving, ">= 0.25", saving >= 0.25))
        else:
            goals.append(_goal("shared peak-memory saving at batch-4", None, ">= 0.25", None))
        ratio = s4["trajectories_per_second"] / d4["trajectories_per_second"]
        goals.append(_goal("shared throughput / dual at batch-4", ratio, ">= 0.95", ratio >= 0.95))
    for runtime in ("dual_model", "shared_backbone"):
        auto = _cell(cells, runtime, "auto")
        fixed = [c for c in (_cell(cells, runtime, b) for b in (1, 2, 4)) if c is not None]
        if auto and fixed:
            best = max(fixed, key=lambda c: c["trajectories_per_second"])
            ratio = auto["trajectories_per_second"] / best["trajectories_per_second"]
            goals.append(
                _goal(
                    f"{runtime} auto throughput / best fixed batch",
                    ratio,
                    f">= {1 - AUTO_NOISE_BAND:.2f}",
                    ratio >= 1 - AUTO_NOISE_BAND,
                    best_fixed_batch=best["trajectory_batch_size"],
                )
            )
    if quantization == "nf4" and d4 is not None:
        peak = d4["peak_reserved_gib"]
        goals.append(
            _goal(
                "NF4 dual batch-4 peak reserved GiB",
                peak,
                f"<= {SEED_NF4_DUAL_BATCH4_GIB}",
                None if peak is None or device != "cuda" else peak <= SEED_NF4_DUAL_BATCH4_GIB,
            )
        )
    return goals


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _batch_label(cell: dict[str, Any]) -> str:
    if cell["trajectory_batch_size"] == "auto":
        return f"auto ({'+'.join(str(n) for n in cell['physical_batch_sizes'])})"
    return str(cell["trajectory_batch_size"])


def render_markdown(report: dict[str, Any]) -> str:
    opts = report["options"]
    lines = [
        f"# Runtime benchmark: {opts['model']} ({opts['quantization']}, {opts['dtype']} compute) on "
        f"{report['device_name']}",
        "",
        f"{report['trajectories']['count']} trajectories, lengths {report['trajectories']['lengths']}; "
        f"{report['objective']}; medians of {opts['repeats']} updates after {opts['warmup']} warmup.",
        "",
        "| runtime | physical batch | physical forwards | padding | trajectories/s | peak reserved GiB "
        "| median update s | role switch ms |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cells"]:
        name = "dual model" if c["runtime"] == "dual_model" else "shared backbone"
        lines.append(
            f"| {name} | {_batch_label(c)} | {c['physical_forwards']} | {c['padding_tokens']:,} "
            f"| {_fmt(c['trajectories_per_second'])} | {_fmt(c['peak_reserved_gib'])} "
            f"| {_fmt(c['median_update_seconds'], 4)} | {_fmt(c['role_switch_ms'], 3)} |"
        )
    lines += ["", "| goal | observed | target | status |", "|---|---:|---|---|"]
    for g in report["goals"]:
        lines.append(f"| {g['name']} | {_fmt(g['observed'])} | {g['target']} | {g['status']} |")
    if report.get("profiler_summary_sha256"):
        lines += ["", f"Profiler summary ({opts['profile_cell']}): sha256 {report['profiler_summary_sha256']}"]
    return "\n".join(lines) + "\n"


def render_pareto_svg(report: dict[str, Any], width: int = 640, height: int = 420) -> str:
    """Throughput (y) against peak reserved GiB (x); the Pareto frontier is drawn as a line.

    Without memory figures (CPU) x is the padded-token count instead, and the axis says so.
    """
    cells = report["cells"]
    has_memory = all(c["peak_reserved_gib"] is not None for c in cells)
    xs = [float(c["peak_reserved_gib"] if has_memory else c["padding_tokens"]) for c in cells]
    ys = [float(c["trajectories_per_second"]) for c in cells]
    left, right, top, bottom = 70, 20, 40, 60
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = 0.0, max(ys) * 1.1 or 1.0
    x_span = (x_hi - x_lo) or 1.0
    x_lo, x_hi = x_lo - 0.08 * x_span, x_hi + 0.08 * x_span

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * (width - left - right)

    def py(y: float) -> float:
        return height - bottom - (y - y_lo) / (y_hi - y_lo) * (height - top - bottom)

    colors = {"dual_model": "#1f77b4", "shared_backbone": "#d62728"}
    x_label = "peak reserved GiB" if has_memory else "padding tokens (memory not measured on CPU)"
    title = f"{report['options']['model']} {report['options']['quantization']} {report['options']['dtype']}"
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="14">'
        f"{escape(title)}: throughput vs memory</text>",
        f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="black"/>',
        f'<text x="{(left + width - right) / 2}" y="{height - 18}" text-anchor="middle">{escape(x_label)}</text>',
        f'<text x="18" y="{(top + height - bottom) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {(top + height - bottom) / 2})">trajectories / s</text>',
    ]
    for i in range(5):
        xv, yv = x_lo + (x_hi - x_lo) * i / 4, y_lo + (y_hi - y_lo) * i / 4
        out.append(f'<text x="{px(xv):.1f}" y="{height - bottom + 16}" text-anchor="middle">{xv:.3g}</text>')
        out.append(f'<text x="{left - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.3g}</text>')
    frontier = sorted(
        (
            p
            for p in zip(xs, ys, strict=True)
            if not any(q[0] <= p[0] and q[1] > p[1] for q in zip(xs, ys, strict=True))
        ),
    )
    if len(frontier) > 1:
        points = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in frontier)
        out.append(f'<polyline points="{points}" fill="none" stroke="#888" stroke-dasharray="4 3"/>')
    for c, x, y in zip(cells, xs, ys, strict=True):
        color = colors.get(c["runtime"], "black")
        out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="5" fill="{color}"/>')
        out.append(f'<text x="{px(x) + 7:.1f}" y="{py(y) - 6:.1f}" fill="{color}">{escape(_batch_label(c))}</text>')
    for i, (name, color) in enumerate(colors.items()):
        out.append(f'<circle cx="{width - 150}" cy="{top + 10 + 18 * i}" r="5" fill="{color}"/>')
        out.append(f'<text x="{width - 140}" y="{top + 14 + 18 * i}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

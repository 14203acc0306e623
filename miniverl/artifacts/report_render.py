"""Rendering the run report's data (:func:`miniverl.artifacts.report.build_report`) as HTML and Markdown.

The answer comes first (the headline, then the curves and the held-out evaluation), the time next, sample
trajectories after, identities and hashes last. Every text from the run (prompts, model output, names) is
escaped: HTML entities in the page; in Markdown an inline code span, so no image, link or HTML from data renders.
"""

from __future__ import annotations

from html import escape
from typing import Any


def _identity_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    ident = report["identities"]
    rows = [
        ("run", f"{report['run_id']} ({report['status']}, {report['algorithm']}, {report['runtime']})"),
        ("plan_digest", ident["plan_digest"]),
        ("config_digest", ident["config_digest"]),
        ("data", f"sha256 {ident['data_sha256']} ({ident['data_rows']} rows)"),
        ("miniverl", ident["miniverl_version"]),
    ]
    for role, identity in sorted(ident["models"].items()):
        rows.append((f"model: {role}", ", ".join(f"{k}={v}" for k, v in sorted(identity.items()))))
    if ident["overrides"]:
        rows.append(("overrides", " ".join(ident["overrides"])))
    return rows


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _time_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    time = report["time"]
    rows = []
    if time["cycle_seconds_total"] is not None:
        rows.append(
            (
                "training time, all segments",
                f"{_duration(time['cycle_seconds_total'])}: the sum of the {time['cycles_timed']} cycles' "
                "cycle_seconds, every resume and extension included (model loading excluded)",
            )
        )
    if time["last_segment_wall_seconds"] is not None:
        rows.append(
            (
                "last segment wall time",
                f"{_duration(time['last_segment_wall_seconds'])} on {time['device']} (model loading included)",
            )
        )
    return rows


def _fmt(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


EvalRow = tuple[str, str, str, str, str, str]


def _eval_row(mode_name: str, size: str, metric: str, base: Any, trained: Any, difference: Any) -> EvalRow:
    return mode_name, metric, _fmt(base), _fmt(trained), _fmt(difference, True), size


def _eval_rows(record: dict[str, Any]) -> list[EvalRow]:
    """(mode, metric, base, trained, trained - base, responses) for one eval record."""
    rows = []
    for mode_name, mode in sorted(record["modes"].items()):
        base, trained, diff = mode["base"], mode["trained"], mode["difference"]
        size = f"{trained['trajectories']} ({trained['prompts']} prompts \u00d7 {mode['decoding']['samples']})"
        rows.append(_eval_row(mode_name, size, "reward (total)", *(m["reward_mean"] for m in (base, trained, diff))))
        for name in sorted(trained["components"]):
            for key, label in (("mean", "mean"), ("fraction_positive", "accuracy (> 0)")):
                value = trained["components"][name][key]
                was = base["components"].get(name, {}).get(key)
                if key == "fraction_positive" and value is None and was is None:
                    continue
                rows.append(_eval_row(mode_name, size, f"{name} {label}", was, value, diff["components"][name][key]))
        tokens = (m["response_tokens_mean"] for m in (base, trained, diff))
        rows.append(_eval_row(mode_name, size, "response tokens", *tokens))
    return rows


def _eval_caption(record: dict[str, Any]) -> str:
    data = record["data"]
    temperatures = ", ".join(
        f"{name} T={mode['decoding']['temperature']:g}" for name, mode in sorted(record["modes"].items())
    )
    return (
        f"Step {record['step']}: base (adapter off) vs trained on {data['name']} ({data['rows']} rows, sha256 "
        f"{data['sha256']}), seed {record['seed']}, {temperatures}, {record['seconds']:.1f} s"
    )


CSS = (
    "body{font-family:sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
    "vertical-align:top;text-align:left;font-size:13px}td.mono{font-family:monospace;word-break:break-all}"
    "td.num{text-align:right;font-family:monospace}"
    ".headline{font-size:18px;line-height:1.5;background:#f4f7fb;border-left:4px solid #1f77b4;padding:8px 12px}"
    ".headline p{margin:0}.charts{display:flex;flex-wrap:wrap;gap:8px}.charts figure{margin:0}"
    "pre{white-space:pre-wrap;margin:0}"
)
EVAL_HEAD = ("mode", "metric", "base", "trained", "trained \u2212 base", "responses")


def render_html(report: dict[str, Any]) -> str:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>miniverl report: {escape(report['run_id'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {escape(report['run_id'])}</h1><div class='headline' id='headline'>",
    ]
    parts += [f"<p>{escape(line)}</p>" for line in report["headline"]]
    parts.append(f"</div><h2>Curves ({report['updates']} updates)</h2><div class='charts'>")
    for chart in report["charts"]:
        parts.append(f"<figure id='chart-{escape(chart['key'])}'>{chart['svg']}</figure>")
    parts.append("</div>")
    if report["absent"]:
        parts.append(f"<p>Not recorded by this run (absent, not plotted): {escape(', '.join(report['absent']))}.</p>")
    parts.append("<h2 id='eval'>Held-out evaluation</h2>")
    if not report["evals"]:
        parts.append("<p>No eval in this run yet: <code>miniverl eval RUN --data HELDOUT.parquet</code> adds one.</p>")
    for record in report["evals"]:
        parts.append(f"<p>{escape(_eval_caption(record))}</p><table class='eval'><tr>")
        parts += [f"<th>{escape(head)}</th>" for head in EVAL_HEAD]
        parts.append("</tr>")
        for cells in _eval_rows(record):
            parts.append(
                f"<tr><td>{escape(cells[0])}</td><td>{escape(cells[1])}</td>"
                + "".join(f"<td class='num'>{escape(cell)}</td>" for cell in cells[2:5])
                + f"<td>{escape(cells[5])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Time</h2><table>")
    for key, value in _time_rows(report):
        parts.append(f"<tr><th>{escape(key)}</th><td>{escape(value)}</td></tr>")
    parts.append("</table>")
    for cycle in sorted(report["samples"]):
        parts.append(f"<h2>Sample trajectories, cycle {cycle}</h2><table>")
        parts.append("<tr><th>prompt</th><th>response</th><th>reward</th><th>advantage</th><th>finish</th></tr>")
        for row in report["samples"][cycle]:
            parts.append(
                f"<tr><td><pre>{escape(row['prompt'])}</pre></td><td><pre>{escape(row['response'])}</pre></td>"
                f"<td>{row['reward']}</td><td>{row['advantage']}</td><td>{escape(row['finish'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("<h2>Identities</h2><table>")
    for key, value in _identity_rows(report):
        parts.append(f"<tr><th>{escape(key)}</th><td class='mono'>{escape(value)}</td></tr>")
    parts.append("</table></body></html>\n")
    return "".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_text(text: str) -> str:
    """Untrusted text (prompts, model output, anything from data) made inert in Markdown: an inline code span,
    whose content no viewer turns into an image, a link, an autolink or raw HTML. Its fence is one backtick longer
    than the longest run of backticks inside; newlines become spaces and ``|`` is escaped for the table."""
    flat = " ".join(text.splitlines()) if text else ""
    if not flat:
        return ""
    longest = run = 0
    for char in flat:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    return f"{fence} {flat.replace('|', chr(92) + '|')} {fence}"


def render_markdown(report: dict[str, Any], chart_files: dict[str, str]) -> str:
    lines = [f"# Run {report['run_id']}", ""]
    lines += [f"**{_md_text(line)}**  " for line in report["headline"]]
    lines += ["", f"## Curves ({report['updates']} updates)", ""]
    lines += [f"![{chart['title']}]({chart_files[chart['key']]})" for chart in report["charts"]]
    if report["absent"]:
        lines += ["", f"Not recorded by this run (absent, not plotted): {_md_text(', '.join(report['absent']))}."]
    lines += ["", "## Held-out evaluation", ""]
    if not report["evals"]:
        lines.append("No eval in this run yet: `miniverl eval RUN --data HELDOUT.parquet` adds one.")
    for record in report["evals"]:
        lines += [_md_text(_eval_caption(record)), "", "| " + " | ".join(EVAL_HEAD) + " |", "|---" * 6 + "|"]
        lines += ["| " + " | ".join(_md_text(cell) for cell in row) + " |" for row in _eval_rows(record)]
        lines.append("")
    lines += ["", "## Time", "", "| | |", "|---|---|"]
    lines += [f"| {_md_cell(k)} | {_md_cell(v)} |" for k, v in _time_rows(report)]
    for cycle in sorted(report["samples"]):
        lines += ["", f"## Sample trajectories, cycle {cycle}", ""]
        lines += ["| prompt | response | reward | advantage | finish |", "|---|---|---|---|---|"]
        for row in report["samples"][cycle]:
            lines.append(
                f"| {_md_text(row['prompt'])} | {_md_text(row['response'])} | {row['reward']} | "
                f"{row['advantage']} | {_md_text(row['finish'])} |"
            )
    lines += ["", "## Identities", "", "| | |", "|---|---|"]
    lines += [f"| {_md_text(k)} | {_md_text(v)} |" for k, v in _identity_rows(report)]
    return "\n".join(lines) + "\n"

"""``miniverl report RUN``: one self-contained ``report.html`` and a ``report.md`` beside it.

Everything comes from the run directory's files (no torch, no network): the plan's identities,
``metrics.jsonl`` (plotted against the update) and the trajectories of the first and last cycle.
A metric the run did not record is listed as absent, never drawn or invented. The HTML holds
inline SVG and inline CSS only (no scripts, no external links); the markdown embeds the same
charts as ``.svg`` files written next to it.
"""

from __future__ import annotations

import math
import statistics
from html import escape
from pathlib import Path
from typing import Any

from miniverl.artifacts.rundir import read_jsonl_text, read_manifest, read_plan, read_summary, require_run_dir
from miniverl.artifacts.svg import line_chart
from miniverl.canonical import atomic_write_text
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError

#: (metrics.jsonl key, chart title). Derived series (from trajectories) are added in ``_series``.
METRICS: tuple[tuple[str, str], ...] = (
    ("reward_mean", "reward mean"),
    ("reward_std_within_group_max", "within-group reward std (max over groups)"),
    ("kl", "KL (the algorithm's divergence / penalty)"),
    ("entropy", "entropy"),
    ("loss", "loss (the objective the update minimized)"),
    ("grad_norm", "gradient norm (before clipping)"),
    ("adapter_delta_norm", "adapter change per update (L2)"),
    ("clip_fraction", "clip fraction"),
)
TIMES = ("rollout_seconds", "update_seconds", "cycle_seconds")
SAMPLES_PER_CYCLE = 4


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    content = read_jsonl_text(path)
    if content is None:
        return []
    out = []
    for number, text in enumerate(content.splitlines(), start=1):
        if not text.strip():
            continue
        try:
            value = loads_json(text)
        except StrictFormatError as exc:
            raise UsageError(f"{path} line {number}: {exc}") from None
        if not isinstance(value, dict):
            raise UsageError(f"{path} line {number} is not a JSON object")
        out.append(value)
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _points(metrics: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []
    for line in metrics:
        value = _number(line.get(key))
        if value is not None:
            out.append((float(line.get("step", len(out) + 1)), value))
    return out


#: The trajectory fields the report reads: the JSON type each must have when present, and its name.
TRAJECTORY_TYPES: dict[str, tuple[type, str]] = {
    "prompt_id": (str, "a string"),
    "group_id": (str, "a string"),
    "response_token_ids": (list, "a list"),
    "sampled_logprobs": (list, "a list"),
    "reward_components": (dict, "an object"),
    "response_text": (str, "a string"),
    "finish_reason": (str, "a string"),
}


def _checked_trajectory(record: dict[str, Any], path: Path, number: int) -> dict[str, Any]:
    for key, (kind, wanted) in TRAJECTORY_TYPES.items():
        value = record.get(key)
        if value is not None and not isinstance(value, kind):
            raise UsageError(f"{path} line {number}: {key!r} must be {wanted}, got {type(value).__name__}")
    return record


def _trajectory_series(run_dir: Path) -> tuple[dict[str, list[tuple[float, float]]], dict[int, list[dict[str, Any]]]]:
    """Per-cycle series computed from the trajectory files, and the trajectories by cycle."""
    by_cycle: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "trajectories").glob("cycle-*.jsonl")):
        try:
            cycle = int(path.stem.removeprefix("cycle-"))
        except ValueError:
            continue
        by_cycle[cycle] = [_checked_trajectory(r, path, n) for n, r in enumerate(_read_jsonl(path), start=1)]
    series: dict[str, list[tuple[float, float]]] = {}
    for cycle, records in sorted(by_cycle.items()):
        if not records:
            continue
        lengths = [len(r.get("response_token_ids", [])) for r in records]
        series.setdefault("response length (mean tokens)", []).append((cycle, statistics.fmean(lengths)))
        logprobs = [lp for r in records for lp in r.get("sampled_logprobs", []) if _number(lp) is not None]
        if logprobs:
            # E[-log p(x)] over tokens drawn from p is a Monte-Carlo estimate of p's entropy
            series.setdefault("sampled-token NLL (estimate of rollout entropy)", []).append(
                (cycle, -statistics.fmean(logprobs))
            )
        components: dict[str, list[float]] = {}
        for record in records:
            for name, value in (record.get("reward_components") or {}).items():
                number = _number(value)
                if number is not None:
                    components.setdefault(name, []).append(number)
        for name, values in components.items():
            series.setdefault(f"reward component: {name}", []).append((cycle, statistics.fmean(values)))
    return series, by_cycle


def build_report(run_dir: Path) -> dict[str, Any]:
    """Everything the report shows, as plain data (charts as SVG strings)."""
    require_run_dir(run_dir)
    plan = read_plan(run_dir)
    manifest = read_manifest(run_dir)
    summary = read_summary(run_dir)
    metrics = _read_jsonl(run_dir / "metrics.jsonl")
    charts: list[dict[str, Any]] = []
    absent: list[str] = []
    for key, title in METRICS:
        points = _points(metrics, key)
        if points:
            charts.append({"key": key, "title": title, "svg": line_chart(title, {key: points}), "points": len(points)})
        else:
            absent.append(key)
    derived, by_cycle = _trajectory_series(run_dir)
    components = {k.removeprefix("reward component: "): v for k, v in derived.items() if k.startswith("reward comp")}
    if components:
        title = "reward per component (mean over the cycle's trajectories)"
        charts.insert(1, {"key": "reward_components", "title": title, "svg": line_chart(title, components),
                          "points": sum(len(v) for v in components.values())})  # fmt: skip
    else:
        absent.append("reward_components")
    for name, points in derived.items():
        if not name.startswith("reward comp"):
            charts.append({"key": name, "title": name, "svg": line_chart(name, {name: points}), "points": len(points)})
    times = {key.removesuffix("_seconds"): _points(metrics, key) for key in TIMES}
    times = {k: v for k, v in times.items() if v}
    if times:
        title = "seconds per phase"
        charts.append({"key": "time_per_phase", "title": title, "svg": line_chart(title, times),
                       "points": sum(len(v) for v in times.values())})  # fmt: skip
    else:
        absent.append("time_per_phase")
    cycles = sorted(by_cycle)
    chosen = sorted({cycles[0], cycles[-1]}) if cycles else []
    samples = {cycle: _spread(by_cycle[cycle]) for cycle in chosen}
    return {
        "run_id": manifest.run_id,
        "status": summary.status if summary is not None else "incomplete",
        "algorithm": manifest.algorithm,
        "runtime": manifest.runtime,
        "updates": len(metrics),
        "identities": {
            "plan_digest": plan.plan_digest,
            "config_digest": plan.config_digest,
            "data_sha256": plan.data.sha256,
            "data_rows": plan.data.rows,
            "miniverl_version": plan.miniverl_version,
            "models": plan.models,
            "overrides": plan.overrides,
        },
        "summary": summary.model_dump(mode="json") if summary is not None else None,
        "charts": charts,
        "absent": absent,
        "samples": samples,
        "prompts": _prompt_texts(
            plan.data.path,
            plan.config["data"].get("columns"),
            {r.get("prompt_id") for s in samples.values() for r in s},
        ),
    }


def _spread(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Up to SAMPLES_PER_CYCLE trajectories, taking groups in turn (every prompt before a second sample)."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for record in records:
        groups.setdefault(record.get("group_id"), []).append(record)
    out: list[dict[str, Any]] = []
    depth = 0
    while len(out) < min(SAMPLES_PER_CYCLE, len(records)):
        out += [members[depth] for members in groups.values() if depth < len(members)]
        depth += 1
    return out[:SAMPLES_PER_CYCLE]


def _prompt_texts(data_path: str, columns: Any, ids: set[Any]) -> dict[str, str]:
    """Prompt texts for the sampled ids, when the plan's data file is still readable from here."""
    from miniverl.data import load_prompts
    from miniverl.errors import MiniverlError

    try:
        rows = load_prompts(data_path, columns)
    except MiniverlError:
        return {}
    return {row.prompt_id: row.prompt for row in rows if row.prompt_id in ids}


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
    summary = report["summary"]
    if summary is not None:
        rows.append(("wall", f"{summary['wall_seconds']:.1f} s on {summary['device']}"))
    return rows


def _sample_rows(report: dict[str, Any], cycle: int) -> list[dict[str, str]]:
    out = []
    for record in report["samples"][cycle]:
        reward = _number(record.get("reward"))
        advantage = _number(record.get("advantage"))
        out.append(
            {
                "prompt": report["prompts"].get(record.get("prompt_id"), f"(prompt {record.get('prompt_id')})"),
                "response": str(record.get("response_text", "")),
                "reward": "absent" if reward is None else f"{reward:.3f}",
                "advantage": "absent" if advantage is None else f"{advantage:.3f}",
                "finish": str(record.get("finish_reason", "")),
            }
        )
    return out


CSS = (
    "body{font-family:sans-serif;max-width:960px;margin:2em auto;padding:0 1em;color:#222}"
    "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #ccc;padding:4px 8px;"
    "vertical-align:top;text-align:left;font-size:13px}td.mono{font-family:monospace;word-break:break-all}"
    ".charts{display:flex;flex-wrap:wrap;gap:8px}.charts figure{margin:0}pre{white-space:pre-wrap;margin:0}"
)


def render_html(report: dict[str, Any]) -> str:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>miniverl report: {escape(report['run_id'])}</title><style>{CSS}</style></head><body>",
        f"<h1>Run {escape(report['run_id'])}</h1><h2>Identities</h2><table>",
    ]
    for key, value in _identity_rows(report):
        parts.append(f"<tr><th>{escape(key)}</th><td class='mono'>{escape(value)}</td></tr>")
    parts.append(f"</table><h2>Metrics ({report['updates']} updates)</h2><div class='charts'>")
    for chart in report["charts"]:
        parts.append(f"<figure id='chart-{escape(chart['key'])}'>{chart['svg']}</figure>")
    parts.append("</div>")
    if report["absent"]:
        parts.append(f"<p>Not recorded by this run (absent, not plotted): {escape(', '.join(report['absent']))}.</p>")
    for cycle in sorted(report["samples"]):
        parts.append(f"<h2>Sample trajectories, cycle {cycle}</h2><table>")
        parts.append("<tr><th>prompt</th><th>response</th><th>reward</th><th>advantage</th><th>finish</th></tr>")
        for row in _sample_rows(report, cycle):
            parts.append(
                f"<tr><td><pre>{escape(row['prompt'])}</pre></td><td><pre>{escape(row['response'])}</pre></td>"
                f"<td>{row['reward']}</td><td>{row['advantage']}</td><td>{escape(row['finish'])}</td></tr>"
            )
        parts.append("</table>")
    parts.append("</body></html>\n")
    return "".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _md_text(text: str) -> str:
    """A table cell of untrusted text (model output, prompts): Markdown viewers render raw HTML, so escape it."""
    return _md_cell(escape(text, quote=False))


def render_markdown(report: dict[str, Any], chart_files: dict[str, str]) -> str:
    lines = [f"# Run {report['run_id']}", "", "## Identities", "", "| | |", "|---|---|"]
    lines += [f"| {_md_cell(k)} | `{_md_cell(v)}` |" for k, v in _identity_rows(report)]
    lines += ["", f"## Metrics ({report['updates']} updates)", ""]
    lines += [f"![{chart['title']}]({chart_files[chart['key']]})" for chart in report["charts"]]
    if report["absent"]:
        lines += ["", f"Not recorded by this run (absent, not plotted): {', '.join(report['absent'])}."]
    for cycle in sorted(report["samples"]):
        lines += ["", f"## Sample trajectories, cycle {cycle}", ""]
        lines += ["| prompt | response | reward | advantage | finish |", "|---|---|---|---|---|"]
        for row in _sample_rows(report, cycle):
            lines.append(
                f"| {_md_text(row['prompt'])} | {_md_text(row['response'])} | {row['reward']} | "
                f"{row['advantage']} | {_md_text(row['finish'])} |"
            )
    return "\n".join(lines) + "\n"


def write_report(run_dir: Path, out: Path | None = None) -> dict[str, Any]:
    """Write ``report.html``, ``report.md`` and ``charts/*.svg`` into ``out`` (default ``RUN/report``)."""
    from miniverl.artifacts.rundir import check_writable_dir

    target = out if out is not None else run_dir / "report"
    report = build_report(run_dir)
    # the default target and charts/ are created by report; a symlink there would send the files elsewhere
    for place in ([target] if out is None else []) + [target / "charts"]:
        if place.is_symlink():
            raise UsageError(f"{place} is a symlink; report writes only into real directories (remove the link)")
    check_writable_dir(target, option="--out")
    chart_files = {}
    for index, chart in enumerate(report["charts"], start=1):
        safe = "".join(c if c.isalnum() else "-" for c in chart["key"]).strip("-")
        name = f"charts/{index:02d}-{safe}.svg"
        atomic_write_text(target / name, chart["svg"] + "\n")
        chart_files[chart["key"]] = name
    atomic_write_text(target / "report.md", render_markdown(report, chart_files))
    atomic_write_text(target / "report.html", render_html(report))
    return {
        "html": str(target / "report.html"),
        "markdown": str(target / "report.md"),
        "charts": {chart["key"]: chart["points"] for chart in report["charts"]},
        "absent": report["absent"],
    }

"""``miniverl report RUN``: one self-contained ``report.html`` and a ``report.md`` beside it.

Everything comes from the run directory's files (no torch, no network): the plan's identities,
``metrics.jsonl`` (plotted against the update, with a moving average), the trajectories of the first
and last cycle, and the held-out evaluations ``miniverl eval`` kept in ``RUN/eval/``. The headline
compares the first and last moving-average points of the training reward, and the base with the
trained adapter on the latest eval. A metric the run did not record is listed as absent, never drawn
or invented. The HTML holds inline SVG and inline CSS only (no scripts, no external links); the
markdown embeds the same charts as ``.svg`` files written next to it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from miniverl.artifacts.report_render import render_html, render_markdown
from miniverl.artifacts.rundir import (
    finished_lines,
    read_jsonl_text,
    read_manifest,
    read_metrics,
    read_plan,
    read_summary,
    require_run_dir,
)
from miniverl.artifacts.svg import line_chart, moving_average, smoothing_window
from miniverl.config.strict import StrictFormatError, loads_json
from miniverl.errors import UsageError
from miniverl.outputs import write_files

#: (chart key, title, y-axis unit, where metrics.jsonl holds it: a top-level key or ``algorithm_metrics``' name).
METRICS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("reward_mean", "reward mean", "reward", ("reward_mean",)),
    ("reward_std_within_group_max", "within-group reward std (max over groups)", "reward",
     ("reward_std_within_group_max",)),
    ("kl", "KL (the algorithm's divergence / penalty)", "nats per token", ("kl",)),
    ("entropy", "policy entropy on the trained tokens", "nats per token", ("entropy", "actor/entropy")),
    ("loss", "loss (the objective the update minimized)", "loss", ("loss",)),
    ("grad_norm", "gradient norm (before clipping)", "L2 norm", ("grad_norm",)),
    ("adapter_delta_norm", "adapter change per update (L2)", "L2 norm", ("adapter_delta_norm",)),
    ("clip_fraction", "clip fraction", "fraction of tokens", ("clip_fraction", "actor/pg_clipfrac")),
)  # fmt: skip
TIMES = ("rollout_seconds", "update_seconds", "cycle_seconds")
SAMPLES_PER_CYCLE = 4
EVAL_PREFIX = "eval/"


def _read_jsonl(path: Path, *, live: bool = False) -> list[dict[str, Any]]:
    content = read_jsonl_text(path)
    if content is None:
        return []
    out = []
    for number, text in enumerate(finished_lines(content, live=live), start=1):
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


def _read_metrics(run_dir: Path, *, live: bool = False) -> list[dict[str, Any]]:
    """``metrics.jsonl`` checked as ``inspect`` checks it (the metrics schema), and each line's ``step`` its own
    update number: a hand-edited step ("x", null, 10**60) is one line and exit 2, never plotted. ``live``: the run
    is being written, so a last line without its newline is still in flight, not damage."""
    path = run_dir / "metrics.jsonl"
    checked = read_metrics(run_dir, live=live)
    for number, line in enumerate(checked, start=1):
        if line.step != number:
            raise UsageError(f"{path}: update {number} records step {str(line.step)[:24]}; steps count 1, 2, 3...")
    return [line.model_dump(mode="json") for line in checked]


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _lookup(line: dict[str, Any], key: str) -> Any:
    """A metrics line's top-level ``key``, else the algorithm's own metric of that name."""
    if key in line:
        return line[key]
    extra = line.get("algorithm_metrics")
    return extra.get(key) if isinstance(extra, dict) else None


def _points(metrics: list[dict[str, Any]], *keys: str) -> list[tuple[float, float]]:
    """``(update, value)`` of the first of ``keys`` each line records as a finite number."""
    out: list[tuple[float, float]] = []
    for index, line in enumerate(metrics, start=1):
        for key in keys:
            value = _number(_lookup(line, key))
            if value is not None:
                step = _number(line.get("step"))
                out.append((index if step is None else step, value))
                break
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


def _trajectory_series(
    run_dir: Path, *, live_cycles: int | None = None
) -> tuple[dict[str, list[tuple[float, float]]], dict[int, list[dict[str, Any]]]]:
    """Per-cycle series computed from the trajectory files, and the trajectories by cycle. ``live_cycles``
    (a running run): only the cycles its metrics already log, the one being written left out."""
    by_cycle: dict[int, list[dict[str, Any]]] = {}
    for path in sorted((run_dir / "trajectories").glob("cycle-*.jsonl")):
        try:
            cycle = int(path.stem.removeprefix("cycle-"))
        except ValueError:
            continue
        if live_cycles is not None and cycle > live_cycles:
            continue
        records = _read_jsonl(path, live=live_cycles is not None)
        by_cycle[cycle] = [_checked_trajectory(r, path, n) for n, r in enumerate(records, start=1)]
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


def _chart(key: str, title: str, series: dict[str, list[tuple[float, float]]], unit: str) -> dict[str, Any]:
    count = max(len(v) for v in series.values())
    window = smoothing_window(count)
    svg = line_chart(title, series, y_label=unit, window=window)
    return {"key": key, "title": title, "svg": svg, "points": sum(len(v) for v in series.values()), "window": window}


def _first_last(points: list[tuple[float, float]]) -> tuple[float, float, int] | None:
    """The first and last moving-average values of ``points`` (the means of the first and last windows)."""
    if not points:
        return None
    window = smoothing_window(len(points))
    smooth = moving_average(points, window)
    return smooth[0][1], smooth[-1][1], window


def _eval_series(metrics: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """The greedy held-out figures ``algorithm.eval_every`` recorded: total reward and per-component accuracy."""
    names = sorted({k for line in metrics for k in (line.get("algorithm_metrics") or {}) if k.startswith(EVAL_PREFIX)})
    wanted = [k for k in names if k == "eval/reward_mean" or k.endswith("/fraction_positive")]
    series = {}
    for key in wanted:
        label = key.removeprefix(EVAL_PREFIX).replace("/fraction_positive", " accuracy")
        points = _points(metrics, key)
        if points:
            series[label] = points
    return series


def build_report(run_dir: Path, *, live: bool = False) -> dict[str, Any]:
    """Everything the report shows, as plain data (charts as SVG strings). ``live``: the run is being trained
    now (read without its lock): a snapshot of the cycles it has logged so far."""
    from miniverl.evaluation.record import read_evals

    require_run_dir(run_dir)
    plan = read_plan(run_dir)
    manifest = read_manifest(run_dir)
    summary = read_summary(run_dir)
    metrics = _read_metrics(run_dir, live=live)
    evals = read_evals(run_dir)
    for record in evals:
        if record.run_id != manifest.run_id:
            raise UsageError(
                f"{run_dir}/eval/step-{record.step:06d}.json is an eval of run {record.run_id!r}, not of "
                f"{manifest.run_id!r}; remove it or rerun `miniverl eval` on this run"
            )
    charts: list[dict[str, Any]] = []
    absent: list[str] = []
    for key, title, unit, sources in METRICS:
        points = _points(metrics, *sources)
        if points:
            charts.append(_chart(key, title, {key: points}, unit))
        else:
            absent.append(key)
    cycles_logged = max((int(c) for line in metrics if isinstance(c := line.get("cycle"), int)), default=0)
    derived, by_cycle = _trajectory_series(run_dir, live_cycles=cycles_logged if live else None)
    components = {k.removeprefix("reward component: "): v for k, v in derived.items() if k.startswith("reward comp")}
    if components:
        title = "reward per component (mean over the cycle's trajectories)"
        charts.insert(1, _chart("reward_components", title, components, "reward"))
    else:
        absent.append("reward_components")
    held_out = _eval_series(metrics)
    if held_out:
        charts.insert(2, _chart("eval_every", "held-out, greedy (algorithm.eval_every)", held_out, "reward / accuracy"))
    for name, points in derived.items():
        if not name.startswith("reward comp"):
            unit = "tokens" if name.startswith("response length") else "nats per token"
            charts.append(_chart(name, name, {name: points}, unit))
    times = {key.removesuffix("_seconds"): _points(metrics, key) for key in TIMES}
    times = {k: v for k, v in times.items() if v}
    if times:
        charts.append(_chart("time_per_phase", "seconds per phase", times, "seconds"))
    else:
        absent.append("time_per_phase")
    cycles = sorted(by_cycle)
    chosen = sorted({cycles[0], cycles[-1]}) if cycles else []
    spread = {cycle: _spread(by_cycle[cycle]) for cycle in chosen}
    columns = plan.config["data"].get("columns")
    prompts = _prompt_texts(plan.data.path, columns, {r.get("prompt_id") for s in spread.values() for r in s})
    cycle_seconds = [y for _, y in _points(metrics, "cycle_seconds")]
    status: str = summary.status if summary is not None else "incomplete"
    if live:
        status = f"running: update {len(metrics)} of {plan.updates} logged, a snapshot"
    return {
        "run_id": manifest.run_id,
        "status": status,
        "running": live,
        "algorithm": manifest.algorithm,
        "runtime": manifest.runtime,
        "updates": len(metrics),
        "headline": ([f"running: {len(metrics)} of {plan.updates} updates logged so far"] if live else [])
        + _headline(metrics, components, evals),
        "time": {
            "cycle_seconds_total": math.fsum(cycle_seconds) if cycle_seconds else None,
            "cycles_timed": len(cycle_seconds),
            "last_segment_wall_seconds": summary.wall_seconds if summary is not None else None,
            "device": summary.device if summary is not None else None,
        },
        "evals": [record.model_dump(mode="json") for record in evals],
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
        "samples": {cycle: _sample_rows(records, prompts) for cycle, records in spread.items()},
    }


def _headline(
    metrics: list[dict[str, Any]], components: dict[str, list[tuple[float, float]]], evals: list[Any]
) -> list[str]:
    """The answer to "did it learn?": training reward first -> last (moving averages), then held-out figures."""
    lines = []
    updates = len(metrics)
    reward = _first_last(_points(metrics, "reward_mean"))
    if reward is not None:
        first, last, window = reward
        smoothed = f" (moving average over {window} updates)" if window > 1 else ""
        lines.append(f"training reward {first:.3g} \u2192 {last:.3g} over {updates} updates{smoothed}")
        moved = []
        for name, points in sorted(components.items()):
            pair = _first_last(points)
            if pair is not None:
                moved.append(f"{name} {pair[0]:.3g} \u2192 {pair[1]:.3g}")
        if moved:
            lines.append("per reward component: " + "; ".join(moved))
    else:
        loss = _first_last(_points(metrics, "loss"))
        if loss is not None:
            lines.append(
                f"loss {loss[0]:.3g} \u2192 {loss[1]:.3g} over {updates} updates (this algorithm has no reward)"
            )
        else:
            lines.append("no update recorded yet")
    if not evals:
        lines.append(
            "held-out: not evaluated (run `miniverl eval RUN --data HELDOUT.parquet`; the report then shows it)"
        )
        return lines
    latest = evals[-1]
    mode = latest.modes["greedy"]
    accuracy = next(
        (
            name
            for name in latest.rewards
            if name in mode.trained.components
            and mode.trained.components[name].fraction_positive is not None
            and name in mode.base.components
            and mode.base.components[name].fraction_positive is not None
        ),
        None,
    )
    where = f"greedy, {mode.trained.prompts} held-out prompts, base \u2192 step {latest.step}"
    if accuracy is not None:
        base = mode.base.components[accuracy].fraction_positive
        trained = mode.trained.components[accuracy].fraction_positive
        lines.append(f"held-out accuracy ({accuracy}) {base:.3g} \u2192 {trained:.3g} ({where})")
    elif mode.base.reward_mean is not None and mode.trained.reward_mean is not None:
        lines.append(f"held-out reward {mode.base.reward_mean:.3g} \u2192 {mode.trained.reward_mean:.3g} ({where})")
    return lines


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


def _sample_rows(records: list[dict[str, Any]], prompts: dict[str, str]) -> list[dict[str, str]]:
    out = []
    for record in records:
        reward = _number(record.get("reward"))
        advantage = _number(record.get("advantage"))
        out.append(
            {
                "prompt": prompts.get(str(record.get("prompt_id")), f"(prompt {record.get('prompt_id')})"),
                "response": str(record.get("response_text", "")),
                "reward": "absent" if reward is None else f"{reward:.3f}",
                "advantage": "absent" if advantage is None else f"{advantage:.3f}",
                "finish": str(record.get("finish_reason", "")),
            }
        )
    return out


def write_report(run_dir: Path, out: Path | None = None, *, live: bool = False) -> dict[str, Any]:
    """Write ``report.html``, ``report.md`` and ``charts/*.svg`` into ``out`` (default ``RUN/report``).

    ``live``: the run is training now; the report is a snapshot of its logged cycles (the run never writes
    ``RUN/report``, so the two do not meet)."""
    from miniverl.artifacts.rundir import check_writable_dir

    target = out if out is not None else run_dir / "report"
    report = build_report(run_dir, live=live)
    # the default target and charts/ are created by report; a symlink there would send the files elsewhere
    for place in ([target] if out is None else []) + [target / "charts"]:
        if place.is_symlink():
            raise UsageError(f"{place} is a symlink; report writes only into real directories (remove the link)")
    check_writable_dir(target, option="--out")
    chart_files, outputs = {}, {}
    for index, chart in enumerate(report["charts"], start=1):
        safe = "".join(c if c.isalnum() else "-" for c in chart["key"]).strip("-")
        name = f"charts/{index:02d}-{safe}.svg"
        outputs[target / name] = (chart["svg"] + "\n").encode("utf-8")
        chart_files[chart["key"]] = name
    outputs[target / "report.md"] = render_markdown(report, chart_files).encode("utf-8")
    outputs[target / "report.html"] = render_html(report).encode("utf-8")
    write_files(outputs, what="report")  # every target checked before the first is written
    return {
        "html": str(target / "report.html"),
        "markdown": str(target / "report.md"),
        "headline": report["headline"],
        "charts": {chart["key"]: chart["points"] for chart in report["charts"]},
        "absent": report["absent"],
        "evals": [record["step"] for record in report["evals"]],
        "time": report["time"],
        "running": live,
        "updates": report["updates"],
    }

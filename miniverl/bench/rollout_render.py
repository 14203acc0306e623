"""Goals, markdown table and SVG bar chart of ``miniverl bench rollout`` (from the measured cells only)."""

from __future__ import annotations

from typing import Any

from miniverl.bench.chart import figure, goals_table, horizontal_bars_svg

#: Issue 21's decode targets (H200, Qwen3-0.6B shape, LoRA folded): (batch, most ms per decode step, least % of the
#: bandwidth bound that counts weights and KV reads)
DECODE_TARGETS = ((64, 1.4, 40.0), (16, 1.0, None))


def _cell(report: dict[str, Any], path: str, batch: int) -> dict[str, Any] | None:
    return next(
        (c for c in report["cells"] if c["path"] == path and c["batch"] == batch and c["status"] == "measured"), None
    )


def ratio(report: dict[str, Any], path: str, other: str, batch: int) -> float | None:
    a, b = _cell(report, path, batch), _cell(report, other, batch)
    if a is None or b is None:
        return None
    return float(a["tokens_per_second"]) / float(b["tokens_per_second"])


def _goal(name: str, observed: float | None, target: str, met: bool) -> dict[str, Any]:
    return {"name": name, "observed": observed, "target": target,
            "status": "not_measured" if observed is None else ("met" if met else "not_met")}  # fmt: skip


def evaluate_rollout_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its observed figure and ``met`` / ``not_met`` / ``not_measured`` (only the Qwen3-0.6B shape
    with a folded LoRA is the targets' workload; any other run reports them ``not_measured``)."""
    opts = report.get("options") or {}
    target_workload = opts.get("model") == "qwen3-0.6b-shape" and bool(opts.get("lora_rank"))
    goals = []
    # the default engine (torch kernels) and the Triton-fused one are judged each by name, never the better of two
    for path in ("fast", "fast_triton"):
        for batch, max_ms, min_pct in DECODE_TARGETS:
            cell = _cell(report, path, batch) if target_workload else None
            if cell is None and path != "fast":
                continue  # a path the run did not time is no goal of this run
            ms = None if cell is None else float(cell["ms_per_decode_step"])
            goals.append(_goal(f"{path} ms per decode step at batch {batch}", ms, f"<= {max_ms:g}", ms is not None
                               and ms <= max_ms))  # fmt: skip
            if min_pct is not None:
                pct = None if cell is None else float(cell["pct_of_bandwidth_bound"])
                goals.append(_goal(f"{path} % of the weights+KV bandwidth bound at batch {batch}", pct,
                                   f">= {min_pct:g}", pct is not None and pct >= min_pct))  # fmt: skip
    if report.get("device") != "cuda":
        for goal in goals:  # the targets are H200 targets; a CPU run measures but cannot meet them
            goal["status"] = "not_measured" if goal["observed"] is None else "informational_cpu"
    return goals


def render_rollout_markdown(report: dict[str, Any]) -> str:
    opts = report["options"]
    lines = [
        f"# miniverl bench rollout: {opts['model']} on {report['device_name']} ({report['dtype']})",
        "",
        f"{opts['new_tokens']} new tokens per row (fixed), {opts['prompt_tokens']}-token prompts, temperature 1. "
        f"Copy bandwidth {report['copy_bandwidth_bytes_per_second'] / 1e12:.3g} TB/s; rollout weights "
        f"{report['rollout_weight_bytes'] / 1e9:.3g} GB (weights alone bound a step at "
        f"{report['weight_bandwidth_bound_ms_per_step']:.3g} ms; the % column also counts each cell's KV reads); "
        f"LoRA rank {opts.get('lora_rank', 0)}, folded in each fast call; first fold {report['fold_seconds']:.3g} s.",
        "",
        "| path | batch | tokens/s | ms / decode step | % of weights+KV bound | x hf_generate | peak reserved GiB "
        "| first call s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cells"]:
        if c["status"] != "measured":
            lines.append(f"| {c['path']} | {c['batch']} | {c['status']}: {c['reason']} | | | | | |")
            continue
        versus = ratio(report, c["path"], "hf_generate", c["batch"])
        lines.append(
            f"| {c['path']} | {c['batch']} | {figure(c['tokens_per_second'])} | {figure(c['ms_per_decode_step'])} | "
            f"{figure(c.get('pct_of_bandwidth_bound'))} | {figure(versus)} | "
            f"{figure(c['peak_reserved_gib'])} | {figure(c['first_call_seconds'])} |"
        )
    comparisons = report.get("comparisons") or []
    if comparisons:
        lines += [
            "",
            "Interleaved pairs (A then B, repeated; the ratio is A's tokens/s over B's in each pair):",
            "",
            "| A / B | batch | pairs | median ratio | min | q1 | q3 | max |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
    for c in comparisons:
        if c["status"] != "measured":
            lines.append(f"| {c['a']} / {c['b']} | {c['batch']} | {c['status']}: {c['reason']} | | | | | |")
            continue
        figures = " | ".join(figure(c[k]) for k in ("median_ratio", "min_ratio", "q1_ratio", "q3_ratio", "max_ratio"))
        lines.append(f"| {c['a']} / {c['b']} | {c['batch']} | {len(c['pairs'])} | {figures} |")
    lines += goals_table(report["goals"])
    return "\n".join(lines) + "\n"


def render_rollout_svg(report: dict[str, Any], width: int = 640) -> str:
    """Horizontal bars of tokens/s (log scale), one per measured (path, batch) cell."""
    import math

    cells = [c for c in report["cells"] if c["status"] == "measured"]
    left = 170
    best = max((c["tokens_per_second"] for c in cells), default=1.0)
    low = min((c["tokens_per_second"] for c in cells), default=1.0)
    lo, hi = math.log10(max(low / 2, 1e-9)), math.log10(best * 1.2)

    def length(value: float) -> float:
        return (width - left - 20) * (math.log10(value) - lo) / max(hi - lo, 1e-9)

    bars = [
        (f"{c['path']} b{c['batch']}", length(c["tokens_per_second"]), c["tokens_per_second"], c["path"] == "fast")
        for c in cells
    ]
    title = f"decode tokens/s (log scale), {report['device_name']}"
    return horizontal_bars_svg(title, bars, width=width, left=left)

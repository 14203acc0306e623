"""Goals, markdown tables and SVG bar chart of ``miniverl bench grpo`` (from the measured cells only)."""

from __future__ import annotations

from typing import Any

from miniverl.bench.chart import figure, goals_table, horizontal_bars_svg
from miniverl.bench.common import MIN_REPEATS_FOR_A_RESULT

# Issue 33's targets (issue 21's for the fast step): (ratio key, bound, what it measures)
SPEED_TARGETS = (
    ("step_speed_miniverl_fast_vs_trl", 15.0, "GRPO step completion tokens/s, miniverl fast / TRL GRPOTrainer"),
    ("step_speed_miniverl_lean_vs_trl", 20.0, "GRPO step completion tokens/s, miniverl lean (as training) / TRL"),
    ("step_speed_miniverl_lean_liger_vs_trl", 20.0, "GRPO step tokens/s, miniverl lean + liger-kernel / TRL"),
    ("update_speed_miniverl_update_bf16_vs_naive_hf_peft", 2.0, "update time, naive HF+PEFT / miniverl (bf16)"),
    ("update_speed_miniverl_update_bf16_liger_vs_naive_hf_peft", 2.0, "update time, naive / miniverl bf16 + liger"),
)
MEMORY_TARGETS = (
    ("step_memory_miniverl_fast_vs_trl", 1.0, "GRPO step peak reserved, miniverl fast / TRL"),
    ("step_memory_miniverl_lean_vs_trl", 1.0, "GRPO step peak reserved, miniverl lean (as training) / TRL"),
    ("step_memory_miniverl_lean_liger_vs_trl", 1.0, "GRPO step peak reserved, miniverl lean + liger-kernel / TRL"),
    ("update_memory_miniverl_update_bf16_vs_naive_hf_peft", 0.5, "update peak reserved, miniverl (bf16) / naive"),
    ("update_memory_miniverl_update_bf16_liger_vs_naive_hf_peft", 0.5, "update peak reserved, bf16 + liger / naive"),
)


def evaluate_grpo_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with its observed ratio and ``met`` / ``not_met`` / ``not_measured`` (a run of fewer than
    MIN_REPEATS_FOR_A_RESULT timed steps per cell: ``too_few_repeats``)."""
    ratios = report["ratios"]
    goals = []
    for key, minimum, name in SPEED_TARGETS:
        observed = ratios.get(key)
        status = "not_measured" if observed is None else ("met" if observed >= minimum else "not_met")
        goals.append({"name": name, "key": key, "observed": observed, "target": f">= {minimum:g}", "status": status})
    for key, maximum, name in MEMORY_TARGETS:
        observed = ratios.get(key)
        status = "not_measured" if observed is None else ("met" if observed <= maximum else "not_met")
        goals.append({"name": name, "key": key, "observed": observed, "target": f"<= {maximum:g}", "status": status})
    few = int(report.get("options", {}).get("repeats", 0)) < MIN_REPEATS_FOR_A_RESULT
    for goal in goals:
        if goal["observed"] is None:
            continue
        if report.get("device") != "cuda":  # H200 targets: a CPU run measures but cannot meet them
            goal["status"] = "informational_cpu"
        elif few:
            goal["status"] = "too_few_repeats"
    return goals


def _range_ms(spread: dict[str, float] | None) -> str:
    return "n/a" if spread is None else f"{spread['min'] * 1e3:.3g}-{spread['max'] * 1e3:.3g}"


def render_grpo_markdown(report: dict[str, Any]) -> str:
    opts = report["options"]
    batch, length = opts["update_shape"]
    lines = [
        f"# miniverl bench grpo: {opts['model']} on {report['device_name']} ({report['dtype']})",
        "",
        f"GRPO step: {opts['prompts']} prompts x {opts['samples']} samples x {opts['new_tokens']} completion tokens "
        f"(fixed), {opts['prompt_tokens']}-token prompts, rollout batch {opts['rollout_batch']}, LoRA r16 on all "
        f"linear layers. Update: B={batch}, T={length}. Median of {opts['repeats']} steps (and their range) after "
        f"{opts['warmup']} "
        f"warm-up; torch {report['torch']}, transformers {report['transformers']}, peft {report['peft']}, "
        f"trl {report['trl'] or 'not installed'}, {report['threads']} CPU threads.",
        "",
        "| section | path | completion tokens/s | ms / step | step ms min-max | rollout ms | update ms "
        "| peak reserved GiB | first call s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in report["cells"]:
        if c.get("status") != "measured":
            lines.append(f"| {c['section']} | {c['path']} | {c.get('status')}: {c.get('reason', '')} | | | | | | |")
            continue
        rollout = c.get("median_rollout_seconds")
        update = c.get("median_update_seconds")
        lines.append(
            f"| {c['section']} | {c['path']} | {figure(c.get('completion_tokens_per_second'))} | "
            f"{figure(c['ms_per_step'])} | {_range_ms(c.get('spread_step_seconds'))} | "
            f"{figure(None if rollout is None else rollout * 1e3)} | "
            f"{figure(None if update is None else update * 1e3)} | {figure(c['peak_reserved_gib'])} | "
            f"{figure(c['first_call_seconds'])} |"
        )
    lines += ["", "| ratio | value |", "|---|---:|"]
    for key, value in report["ratios"].items():
        lines.append(f"| {key} | {figure(value, 4)} |")
    lines += goals_table(report["goals"], digits=4)
    return "\n".join(lines) + "\n"


def render_grpo_svg(report: dict[str, Any], width: int = 640) -> str:
    """Horizontal bars of ms per step (linear), one per measured cell, grouped by section."""
    cells = [c for c in report["cells"] if c.get("status") == "measured"]
    left = 200
    longest = max((c["ms_per_step"] for c in cells), default=1.0)
    bars = [
        (c["section"] + " " + c["path"], (width - left - 80) * c["ms_per_step"] / longest, c["ms_per_step"],
         c["path"].startswith("miniverl"))
        for c in cells
    ]  # fmt: skip
    title = f"ms per step (shorter is faster), {report['device_name']}"
    return horizontal_bars_svg(title, bars, width=width, left=left)

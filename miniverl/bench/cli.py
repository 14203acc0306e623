"""``miniverl bench runtime|rollout``: argument adapters between the CLI and the benchmark modules."""

from __future__ import annotations

import argparse
from typing import Any

from miniverl.bench.oracle_workload import padding_note
from miniverl.bench.render import render_markdown
from miniverl.bench.runtime import BenchOptions, run_runtime_bench
from miniverl.gate.cli import model_choice


def run_bench_command(args: argparse.Namespace) -> dict[str, Any]:
    opts = BenchOptions(
        model=model_choice(args.model),
        device=args.device,
        quantization=args.quantization,
        dtype=args.dtype,
        rows=args.rows,
    )
    report = run_runtime_bench(opts, args.out)
    rows = report["trajectories"]
    note = padding_note(rows["source"], rows["lengths"], rows["tokens"])
    report["message"] = (
        render_markdown(report) + "\n" + note + f"\nwrote bench.json, bench.md, pareto.svg, profiler.json to {args.out}"
    )
    return report


def run_rollout_bench_command(args: argparse.Namespace) -> dict[str, Any]:
    from miniverl.bench.rollout import options_from_args, run_rollout_bench
    from miniverl.bench.rollout_render import render_rollout_markdown

    report = run_rollout_bench(options_from_args(args), args.out)
    report["message"] = render_rollout_markdown(report) + f"\nwrote rollout.json, rollout.md, rollout.svg to {args.out}"
    return report

"""``miniverl gate equivalence`` and ``miniverl bench runtime|rollout|grpo``: gates and benchmarks."""

from __future__ import annotations

import argparse
import json

from miniverl.cli.output import emit, reporter, writable_out


def cmd_gate(args: argparse.Namespace) -> int:
    from miniverl.gate.cli import run_gate_command

    writable_out(args)
    report = run_gate_command(args)
    emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0 if report.get("status") == "passed" else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.cli import run_bench_command

    writable_out(args, ("bench.json", "bench.md", "pareto.svg", "profiler.json"))
    with progress.active(reporter(args)):
        report = run_bench_command(args)
    emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0


def cmd_bench_rollout(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.cli import run_rollout_bench_command

    writable_out(args, ("rollout.json", "rollout.md", "rollout.svg", "rollout-profiler.json", "rollout.partial.json"))
    with progress.active(reporter(args)):
        report = run_rollout_bench_command(args)
    emit(args, report, report["message"])
    return 0


def cmd_bench_grpo(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.grpo import options_from_args, run_grpo_bench
    from miniverl.bench.grpo_render import render_grpo_markdown

    writable_out(args, ("grpo.json", "grpo.md", "grpo.svg", "grpo.partial.json"))
    with progress.active(reporter(args)):
        report = run_grpo_bench(options_from_args(args), args.out)
    emit(args, report, render_grpo_markdown(report) + f"\nwrote grpo.json, grpo.md, grpo.svg to {args.out}")
    return 0

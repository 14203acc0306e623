"""``miniverl inspect``, ``report``, ``export`` and ``eval``: what is read from (or made of) a run directory."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from miniverl.cli.output import emit, follow, reporter, torch_threads
from miniverl.errors import UsageError


def cmd_inspect(args: argparse.Namespace) -> int:
    from miniverl.artifacts.inspect import inspect_run, render_inspection

    def snapshot() -> tuple[dict[str, Any], str, bool]:
        report = inspect_run(Path(args.run_dir))
        return report, render_inspection(report), bool(report["running"])

    return follow(args, snapshot)


def cmd_report(args: argparse.Namespace) -> int:
    from miniverl.artifacts.report import write_report
    from miniverl.artifacts.runlock import run_writer, writer_pid

    run_dir = Path(args.run_dir)

    def snapshot() -> tuple[dict[str, Any], str, bool]:
        from miniverl.artifacts.inspect import run_activity

        if (run_dir / "run.json").is_file() and writer_pid(run_dir) is not None and run_activity(run_dir)["running"]:
            # a running run: a read-only snapshot of its logged cycles, without its lock (the run never writes
            # RUN/report, so the report's files and the run's do not meet)
            result = write_report(run_dir, Path(args.out) if args.out else None, live=True)
        else:
            with run_writer(run_dir, what="the report", optional=True):
                result = write_report(run_dir, Path(args.out) if args.out else None)
        human = "\n".join([*result["headline"], f"wrote {result['html']} and {result['markdown']}"])
        return result, human, bool(result["running"])

    return follow(args, snapshot)


def cmd_export(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.artifacts.export import export_run
    from miniverl.artifacts.rundir import check_writable_dir

    check_writable_dir(Path(args.out), option="--out")
    from miniverl.artifacts.runlock import run_writer

    with run_writer(Path(args.run_dir), what="the export", optional=True), progress.active(reporter(args)):
        result = export_run(Path(args.run_dir), Path(args.out), step=args.step)
    reload = result["reload"]
    human = (
        f"exported step {result['step']} adapter to {args.out}; PEFT reload max |Δlogit| "
        f"{reload['max_abs_logit_diff']:.3g} <= {reload['tolerance']:g}"
    )
    emit(args, result, human)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.evaluation.runner import evaluate, render_table

    source, data = Path(args.source), Path(args.data)
    if not source.is_dir():
        raise UsageError(f"{source} is not a directory: give a run directory or a PEFT adapter directory")
    if not data.is_file():
        raise UsageError(
            f"--data {data} is not a file: give held-out prompts (.parquet, .jsonl or .csv; see `miniverl data sample`)"
        )
    if args.config is not None and not Path(args.config).is_file():
        raise UsageError(f"--config {args.config} is not a file: give a plan.json or a config YAML")
    threads, origin = torch_threads(args)
    from miniverl.artifacts.runlock import run_writer

    run_dir = (source / "run.json").is_file()  # a run's checkpoints must not be pruned while evaluated
    if run_dir:  # where the record goes: checked before the model loads
        from miniverl.outputs import check_dir_target

        check_dir_target(source / "eval", what="eval record")
    lock = run_writer(source, what="the eval", optional=True) if run_dir else contextlib.nullcontext()
    with lock, progress.active(reporter(args)):
        result = evaluate(
            source,
            data,
            config_path=Path(args.config) if args.config else None,
            step=args.step,
            samples=args.samples,
            seed=args.seed,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            columns=args.columns,
        )
        if run_dir:
            from miniverl.evaluation.record import keep_in_run

            result["written"] = keep_in_run(source, result)
    result["torch_threads"] = {"threads": threads, "from": origin}
    emit(args, result, render_table(result))
    return 0

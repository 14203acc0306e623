"""``miniverl run``: train a plan in a run directory (fresh, ``--resume``, ``--resume --extend N``, ``--dry-run``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from miniverl.cli.output import emit, reporter, torch_threads
from miniverl.errors import UsageError


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
            from miniverl.artifacts.rundir.lifecycle import settle_completed_run

            settle_completed_run(output / args.run_id, plan, config, Path(args.plan))
            payload = {
                "status": summary.status,
                "run_dir": str(output / args.run_id),
                "updates": summary.updates,
                "cycles": summary.cycles,
                "summary": summary.model_dump(mode="json"),
                "resumed": False,
            }
            emit(args, payload, f"run {args.run_id} is already complete ({summary.updates} updates); nothing to do")
            return 0
    threads, origin = (None, None) if args.dry_run else torch_threads(args)
    from miniverl.training.entry import run_from_plan

    with progress.active(reporter(args)):
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
    emit(args, result, result["message"])
    return 0 if result["status"] in ("completed", "dry_run_ok") else 1

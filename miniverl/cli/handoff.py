"""``miniverl handoff`` and ``miniverl diagnose``: a verl launch bundle, and its check against the installed verl."""

from __future__ import annotations

import argparse

from miniverl.cli.output import emit, reporter


def cmd_handoff(args: argparse.Namespace) -> int:
    from miniverl import progress
    from miniverl.handoff.cli import run_handoff

    with progress.active(reporter(args)):
        return run_handoff(args, emit)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from miniverl.handoff.cli import run_diagnose

    return run_diagnose(args, emit)

"""What every ``miniverl`` command shares: the parser that fails in one line, printing, progress, ``--out`` checks."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from miniverl.errors import UsageError


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def emit(args: argparse.Namespace, payload: dict[str, Any], human: str) -> None:
    if getattr(args, "json", False):
        sys.stdout.write(json.dumps(payload, sort_keys=True, allow_nan=False) + "\n")
    else:
        sys.stdout.write(human.rstrip("\n") + "\n")


def is_quiet(args: argparse.Namespace) -> bool:
    """``--json`` or ``--quiet``: no progress on stderr."""
    return bool(getattr(args, "json", False) or getattr(args, "quiet", False))


def show_progress(args: argparse.Namespace) -> bool:
    return not is_quiet(args) and sys.stderr.isatty() and not os.environ.get("CI")


def reporter(args: argparse.Namespace) -> Any:
    from miniverl import progress

    return progress.choose(quiet=is_quiet(args))


def torch_threads(args: argparse.Namespace) -> tuple[int, str]:
    from miniverl.threads import apply_threads

    return apply_threads(args.threads)


def follow(args: argparse.Namespace, snapshot: Callable[[], tuple[dict[str, Any], str, bool]]) -> int:
    """Emit ``snapshot()`` once, or with ``--follow``/``--watch`` SECONDS again whenever it changes, until the run
    is no longer running (one JSON object per line with ``--json``)."""
    interval: float | None = getattr(args, "follow", None)
    payload, human, running = snapshot()
    emit(args, payload, human)
    shown = human
    while interval is not None and running:
        sys.stdout.flush()
        time.sleep(interval)
        payload, human, running = snapshot()
        if human != shown:
            if not getattr(args, "json", False):
                sys.stdout.write("\n")
            emit(args, payload, human)
            shown = human
    return 0


def writable_out(args: argparse.Namespace, files: Sequence[str] = ()) -> None:
    """A command's ``--out DIR`` is, or can be made, a directory, and each of the ``files`` it will write there is
    absent or a regular file (checked before any work, writing nothing)."""
    from miniverl.artifacts.rundir import check_writable_dir
    from miniverl.outputs import check_file_target

    check_writable_dir(Path(args.out), option="--out")
    for name in files:
        check_file_target(Path(args.out) / name, what="--out")


def writable_out_file(args: argparse.Namespace, *, suffix: str, why: str) -> None:
    """A command's ``--out FILE`` can be written as a file and ends in ``suffix`` (``why`` says what the command
    writes there); checked before any work, writing nothing."""
    from miniverl.artifacts.rundir import check_writable_file

    check_writable_file(Path(args.out), option="--out")
    if Path(args.out).suffix.lower() != suffix:
        raise UsageError(f"--out {args.out}: {why}; give a file name ending in {suffix}")

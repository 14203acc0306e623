"""The ``miniverl`` command line: parse, call, print. Work lives in the modules it calls.

:mod:`~miniverl.cli.parser` builds the parser; one module per command group holds the actions
(:mod:`~miniverl.cli.project`, :mod:`~miniverl.cli.plan`, :mod:`~miniverl.cli.run`, :mod:`~miniverl.cli.runs`,
:mod:`~miniverl.cli.bench`, :mod:`~miniverl.cli.handoff`); here :func:`main` turns every failure into one line
and an exit status.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from miniverl.cli.failures import ENVIRONMENT_EXIT, environment_advice, interrupted_message
from miniverl.cli.parser import build_parser
from miniverl.errors import MiniverlError

__all__ = ["ENVIRONMENT_EXIT", "INTERRUPTED_EXIT", "build_parser", "entry", "main"]

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
        sys.stderr.write(interrupted_message(args) + "\n")
        return INTERRUPTED_EXIT
    except OSError as exc:
        advice = environment_advice(exc)
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
        advice = environment_advice(behind) if behind is not None else None
        if advice is not None:
            sys.stderr.write(f"miniverl: error: {advice}\n")
            return ENVIRONMENT_EXIT
        if os.environ.get("MINIVERL_DEBUG"):
            raise
        sys.stderr.write(f"miniverl: internal error: {exc.__class__.__name__}: {exc} (MINIVERL_DEBUG=1 shows more)\n")
        return 1

"""What the ``miniverl`` command says when it cannot finish: the environment's fault (full disk, read-only
path), or a stop (Ctrl-C, SIGTERM) with the command that continues the run."""

from __future__ import annotations

import argparse
import errno
import shlex
from pathlib import Path

ENVIRONMENT_ADVICE = {
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


def environment_advice(exc: OSError) -> str | None:
    """One line for an OSError the environment caused (full disk, read-only mount, ...); None for others."""
    advice = ENVIRONMENT_ADVICE.get(exc.errno or 0)
    if advice is None:
        return None
    where = f" ({exc.filename})" if exc.filename else ""
    return f"{advice}{where}; a run interrupted by it can be continued with `miniverl run ... --resume`"


def interrupted_message(args: argparse.Namespace | None) -> str:
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

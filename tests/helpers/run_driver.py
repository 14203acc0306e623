"""``python -m tests.helpers.run_driver ACTION PHASE INDEX -- MINIVERL_ARGS...``: the real CLI, in its own
process, with the environment broken mid-run at one cycle phase (tests of issue #20).

At ``on_phase(PHASE, INDEX)`` (see :data:`miniverl.training.controller.PHASES`) ACTION is done:

- ``fsize:BYTES``: lower the file size limit (``ulimit -f``), so the next larger write fails with EFBIG;
- ``readonly:DIR``: make DIR read-only: a read-only bind mount over itself when root (the process must run in
  its own mount namespace, ``unshare -m``: the mount dies with it), else ``chmod a-w`` on DIR and its folders;
- ``sigkill``: SIGKILL this process (no handler, no cleanup, as a power cut or the OOM killer).

Then ``miniverl.cli.main(MINIVERL_ARGS)`` runs as ``python -m miniverl`` would, and its exit code is ours.
"""

from __future__ import annotations

import os
import resource
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any


def make_read_only(directory: Path) -> None:
    if os.geteuid() == 0:  # root writes through any mode bits: only a read-only mount stops it
        for argv in (
            ["mount", "--bind", str(directory), str(directory)],
            ["mount", "-o", "remount,bind,ro", str(directory)],
        ):
            subprocess.run(argv, check=True, capture_output=True)
        return
    for folder in [directory, *(p for p in directory.rglob("*") if p.is_dir() and not p.is_symlink())]:
        folder.chmod(stat.S_IMODE(folder.stat().st_mode) & ~0o222)


def act(action: str) -> None:
    kind, _, value = action.partition(":")
    if kind == "fsize":
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(value), hard))
    elif kind == "readonly":
        make_read_only(Path(value))
    elif kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        raise SystemExit(f"run_driver: unknown action {action!r}")


def main(argv: list[str]) -> int:
    action, phase, index, separator, *cli_args = argv
    assert separator == "--", argv
    from miniverl import cli
    from miniverl.training import entry

    original = entry.run_from_plan

    def on_phase(name: str, at: int) -> None:
        if (name, at) == (phase, int(index)):
            act(action)

    def run_from_plan(*args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs, on_phase=on_phase)

    entry.run_from_plan = run_from_plan  # cli imports it from entry when the command runs
    return cli.main(cli_args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

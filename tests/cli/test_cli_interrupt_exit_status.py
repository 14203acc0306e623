"""A stopped run exits 130, not by SIGINT: CPython marks a KeyboardInterrupt that crossed a ``PyRun_*`` frame (C
code running a Python snippet, as torch does) as unhandled even after it was caught, and a plain ``sys.exit``
then ends ``python -m`` by SIGINT (status -2). ``miniverl.cli.entry`` leaves with the status itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# main() as a stopped run ends: the interrupt went through a PyRun_String frame, was caught, and 130 returned
_STOPPED_MAIN = textwrap.dedent(
    """
    import ctypes
    import miniverl.cli as cli

    def stopped_main(argv=None):
        run = ctypes.pythonapi.PyRun_String
        run.restype = ctypes.py_object
        run.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.py_object, ctypes.py_object]
        try:
            run(b"raise KeyboardInterrupt", 257, {}, {})
        except KeyboardInterrupt:
            print("miniverl: interrupted", file=cli.sys.stderr)
        return cli.INTERRUPTED_EXIT

    cli.main = stopped_main
    """
)


def _run_module(tmp_path: Path, body: str) -> subprocess.CompletedProcess[str]:
    package = tmp_path / "stopped"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text(_STOPPED_MAIN + body)
    env = {"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "stopped"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )


def test_a_plain_sys_exit_after_such_an_interrupt_dies_by_sigint(tmp_path: Path) -> None:
    done = _run_module(tmp_path, "raise SystemExit(cli.main())\n")
    assert done.returncode == -2  # the CPython behaviour entry() exists for; if this changes, entry may too


def test_entry_exits_130_with_one_line(tmp_path: Path) -> None:
    done = _run_module(tmp_path, "cli.entry()\n")
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "miniverl: interrupted\n")


def test_entry_passes_every_other_status_through(tmp_path: Path) -> None:
    package_body = "cli.main = lambda argv=None: 2\ncli.entry()\n"
    assert _run_module(tmp_path, package_body).returncode == 2

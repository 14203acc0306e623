"""Subprocess, environment and redaction helpers shared by the harness steps."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path

from harness.core.errors import SourceError

HARNESS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = HARNESS_DIR.parent

_STRIP_ENV = (
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PIP_USER",
    "VIRTUAL_ENV",
    "__PYVENV_LAUNCHER__",
)


def clean_env(extra: Mapping[str, str] | None = None, *, path_prefix: Path | None = None) -> dict[str, str]:
    """The environment for child processes: PYTHONPATH/PYTHONHOME and friends cleared, user site off."""
    env = {k: v for k, v in os.environ.items() if k not in _STRIP_ENV}
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if path_prefix is not None:
        env["PATH"] = os.pathsep.join([str(path_prefix), env.get("PATH", "")])
    if extra:
        env.update(extra)
    return env


def run(
    argv: Sequence[str | Path],
    *,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    input_bytes: bytes | None = None,
) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=dict(env) if env is not None else clean_env(),
        capture_output=True,
        timeout=timeout,
        input=input_bytes,
        check=False,
    )


def last_line(data: bytes, limit: int = 300) -> str:
    lines = [ln for ln in data.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][:limit] if lines else ""


def git(repo: Path, *args: str) -> str:
    try:
        done = run(["git", "-C", repo, *args], env=clean_env({"GIT_TERMINAL_PROMPT": "0"}))
    except FileNotFoundError:
        raise SourceError("git is not installed; the candidate is built from a git export of HEAD") from None
    if done.returncode != 0:
        raise SourceError(f"git {' '.join(args)} failed in the checkout: {last_line(done.stderr)}")
    return done.stdout.decode().strip()


def utc_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Redactor:
    """Replace machine paths (longest first) with stable placeholders such as ``<venv>`` and ``<work>``."""

    def __init__(self, roots: Mapping[str, Path | str]) -> None:
        pairs: list[tuple[str, str]] = []
        for label, root in roots.items():
            for variant in {str(root), str(Path(root).resolve())}:
                if variant and variant != "/":
                    pairs.append((variant.rstrip("/"), f"<{label}>"))
        home = str(Path.home())
        if home != "/":
            pairs.append((home, "<home>"))
        pairs.append((sys.prefix, "<python>"))
        pairs.append((sys.base_prefix, "<python>"))
        self._pairs = sorted(set(pairs), key=lambda p: -len(p[0]))

    def text(self, value: str) -> str:
        for root, label in self._pairs:
            value = value.replace(root, label)
        # Anything still absolute becomes <path>/<basename>. A URL's "//host/path" is not a path of this machine (an
        # index URL must stay whole); file:///local/path is, and is redacted from its third slash.
        return re.sub(r"(?<![\w<>.])(?<!:)(?<!:/)/(?:[^\s/'\"]+/)+([^\s/'\"]*)", r"<path>/\1", value)

    def argv(self, argv: Sequence[str | Path]) -> list[str]:
        return [self.text(str(a)) for a in argv]

"""Drive the installed ``miniverl`` executable and record every invocation."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.jsonio import sha256_bytes
from harness.proc import Redactor, clean_env
from harness.records import Invocation, Transcript


@dataclass
class CliResult:
    invocation: Invocation
    stdout: bytes
    stderr: bytes

    @property
    def ok(self) -> bool:
        return self.invocation.exit_code == 0 and not self.invocation.timed_out

    def json(self) -> dict[str, Any] | None:
        """The one JSON object a ``--json`` command prints, or None if stdout is not exactly that."""
        try:
            value = json.loads(self.stdout.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return None
        return value if isinstance(value, dict) else None

    def why(self) -> str:
        inv = self.invocation
        if inv.timed_out:
            return f"`{' '.join(inv.argv[:3])}` timed out after {inv.duration_seconds:.0f}s"
        return f"`{' '.join(inv.argv[:3])}` exited {inv.exit_code}: {inv.stderr_last_line or 'no stderr'}"


@dataclass
class CliDriver:
    """Runs ``<venv>/bin/miniverl`` from ``work`` with a clean environment; argv recorded redacted."""

    venv: Path
    work: Path
    redact: Redactor
    extra_env: dict[str, str] = field(default_factory=dict)
    results: list[CliResult] = field(default_factory=list)

    def __call__(self, step: str, args: list[str], *, timeout: float = 600) -> CliResult:
        exe = self.venv / "bin" / "miniverl"
        env = clean_env(self.extra_env, path_prefix=self.venv / "bin")
        start = time.monotonic()
        timed_out = False
        try:
            done = subprocess.run(
                [str(exe), *args], cwd=self.work, env=env, capture_output=True, timeout=timeout, check=False
            )
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            timed_out, code = True, 124
            out, err = exc.stdout or b"", exc.stderr or b""
        except OSError as exc:
            code, out, err = 127, b"", f"cannot execute miniverl: {exc.strerror}".encode()
        duration = time.monotonic() - start
        lines = [ln for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
        invocation = Invocation(
            step=step,
            argv=["miniverl", *self.redact.argv(args)],
            exit_code=code,
            duration_seconds=round(duration, 3),
            timed_out=timed_out,
            stdout_bytes=len(out),
            stdout_sha256=sha256_bytes(out),
            stderr_bytes=len(err),
            stderr_sha256=sha256_bytes(err),
            stderr_last_line=self.redact.text(lines[-1][:300]) if lines else "",
        )
        result = CliResult(invocation, out, err)
        self.results.append(result)
        return result

    def transcript(self) -> Transcript:
        return Transcript(
            kind="miniverl.transcript",
            schema_version=1,
            cwd="<work>",
            executable="<venv>/bin/miniverl",
            invocations=[r.invocation for r in self.results],
        )

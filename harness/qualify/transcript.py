"""Drive the installed ``miniverl`` executable and record every invocation."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness.core.jsonio import sha256_bytes
from harness.core.proc import Redactor, clean_env
from harness.core.records import InstalledFrom, Invocation, Transcript
from harness.qualify.quiet import QuietGate

#: where a failed step's output is kept, under the driver's work dir (``scripts/device/qualify.sh`` brings it back)
FAILED_STEPS = "failed-steps"
MAX_KEPT_OUTPUT = 1 << 20  # the last MiB of each stream


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


@dataclass(frozen=True)
class Interruption:
    """A CLI child that was started, waited on until a file appeared (or its stderr printed a line), then signalled
    (see ``CliDriver.interrupt``).

    ``result`` is its recorded invocation (exit code, output hashes); ``signalled`` is True only when the
    signal was sent while the child still ran, after ``wait_for`` (relative to the work dir) existed or a stderr
    line held ``wait_for_line``, ``appeared_after_seconds`` after the start; ``event`` is that stderr line.
    """

    result: CliResult
    wait_for: str
    signal: str
    signalled: bool
    appeared_after_seconds: float | None
    event: str | None = None


def _line_with(data: bytes, marker: str) -> str | None:
    """The first complete line of ``data`` that holds ``marker`` (decoded), or None."""
    for line in data.split(b"\n")[:-1]:  # the last piece is not a finished line yet
        text = line.decode("utf-8", "replace")
        if marker in text:
            return text
    return None


@dataclass(frozen=True)
class Captured:
    code: int
    out: bytes
    err: bytes
    seconds: float
    timed_out: bool


def run_captured(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> Captured:
    """Run ``argv`` to the end with its output captured: exit 124 when it outran ``timeout``, 127 when it could not
    start (the reason as its stderr)."""
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, timeout=timeout, check=False)
        return Captured(done.returncode, done.stdout, done.stderr, time.monotonic() - start, False)
    except subprocess.TimeoutExpired as exc:
        return Captured(124, exc.stdout or b"", exc.stderr or b"", time.monotonic() - start, True)
    except OSError as exc:
        why = f"cannot execute {Path(argv[0]).name}: {exc.strerror}".encode()
        return Captured(127, b"", why, time.monotonic() - start, False)


@dataclass
class CliDriver:
    """Runs ``<venv>/bin/miniverl`` from ``work`` with a clean environment; argv recorded redacted."""

    venv: Path
    work: Path
    redact: Redactor
    installed: InstalledFrom | None  # what the origin proof found installed in ``venv`` (stamped on every invocation)
    extra_env: dict[str, str] = field(default_factory=dict)
    results: list[CliResult] = field(default_factory=list)
    # Shared by the workloads of one concurrent run: each invocation holds a slot (timed steps alone).
    gate: QuietGate | None = None
    workload: str = ""

    def slot(self, step: str) -> AbstractContextManager[None]:
        return self.gate.slot(self.workload, step) if self.gate is not None else nullcontext()

    def fork(self, work: Path | None = None) -> CliDriver:
        """A driver with this one's settings and gate and a transcript of its own (for steps run side by side)."""
        return replace(self, work=work or self.work, results=[])

    def __call__(self, step: str, args: list[str], *, timeout: float = 600) -> CliResult:
        exe = self.venv / "bin" / "miniverl"
        env = clean_env(self.extra_env, path_prefix=self.venv / "bin")
        with self.slot(step):
            ran = run_captured([str(exe), *args], cwd=self.work, env=env, timeout=timeout)
        return self._record(step, args, ran.code, ran.out, ran.err, ran.seconds, ran.timed_out)

    def interrupt(
        self,
        step: str,
        args: list[str],
        *,
        wait_for: Path | None = None,
        wait_for_line: str | None = None,
        signum: signal.Signals = signal.SIGTERM,
        timeout: float = 600,
        poll_seconds: float = 0.02,
    ) -> Interruption:
        """Start ``miniverl ARGS`` as a child, wait until ``wait_for`` (relative to ``work``) exists, or until a
        line of its stderr holds ``wait_for_line`` (one of the two), send it ``signum`` and wait for it to exit;
        recorded in the transcript as one invocation like any other.

        The child is signalled only if the file (the line) appeared while it was still running (``signalled``); a
        child that exits first is recorded as it exited. A child still running after ``timeout`` is killed and
        recorded as timed out (exit 124), as ``__call__`` does.
        """
        if (wait_for is None) == (wait_for_line is None):
            raise ValueError("interrupt: give exactly one of wait_for and wait_for_line")
        with self.slot(step):
            return self._interrupt(step, args, wait_for, wait_for_line, signum, timeout, poll_seconds)

    def _interrupt(
        self,
        step: str,
        args: list[str],
        wait_for: Path | None,
        wait_for_line: str | None,
        signum: signal.Signals,
        timeout: float,
        poll_seconds: float,
    ) -> Interruption:
        exe = self.venv / "bin" / "miniverl"
        env = clean_env(self.extra_env, path_prefix=self.venv / "bin")
        target = self.work / wait_for if wait_for is not None else None
        waited = wait_for.as_posix() if wait_for is not None else f"stderr line holding {wait_for_line!r}"
        start = time.monotonic()
        appeared: float | None = None
        event: str | None = None
        signalled = timed_out = False
        with tempfile.TemporaryFile() as out_file, tempfile.TemporaryFile() as err_file:
            try:
                child = subprocess.Popen([str(exe), *args], cwd=self.work, env=env, stdout=out_file, stderr=err_file)
            except OSError as exc:
                code, out, err = 127, b"", f"cannot execute miniverl: {exc.strerror}".encode()
                result = self._record(step, args, code, out, err, time.monotonic() - start, False)
                return Interruption(result, waited, signum.name, False, None)
            try:
                while child.poll() is None:
                    if time.monotonic() - start > timeout:
                        break
                    if wait_for_line is not None:
                        event = _line_with(os.pread(err_file.fileno(), 1 << 20, 0), wait_for_line)
                    if (target is not None and target.exists()) or event is not None:
                        appeared = time.monotonic() - start
                        child.send_signal(signum)
                        signalled = True
                        break
                    time.sleep(poll_seconds)
                remaining = max(1.0, timeout - (time.monotonic() - start))
                code = child.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
                timed_out, code = True, 124
            finally:
                if child.poll() is None:  # an exception above: never leave the child behind
                    child.kill()
                    child.wait()
            out_file.seek(0)
            err_file.seek(0)
            out, err = out_file.read(), err_file.read()
        result = self._record(step, args, code, out, err, time.monotonic() - start, timed_out)
        return Interruption(
            result,
            waited,
            signum.name,
            signalled,
            round(appeared, 3) if appeared is not None else None,
            self.redact.text(event) if event is not None else None,
        )

    def _record(
        self, step: str, args: list[str], code: int, out: bytes, err: bytes, duration: float, timed_out: bool
    ) -> CliResult:
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
            installed=self.installed,
        )
        result = CliResult(invocation, out, err)
        self.results.append(result)
        if code != 0:
            self._keep_failed_output(step, out, err)
        return result

    def _keep_failed_output(self, step: str, out: bytes, err: bytes) -> None:
        """A failed step's whole output, beside the work (never evidence: unredacted, and no judge reads it), so
        that a failure on a lent machine can be diagnosed from what comes back (``failed-steps/<step>.*``)."""
        folder = self.work / FAILED_STEPS
        try:
            folder.mkdir(exist_ok=True)
            for suffix, data in (("stdout", out), ("stderr", err)):
                (folder / f"{step}.{suffix}").write_bytes(data[-MAX_KEPT_OUTPUT:])
        except OSError:
            pass  # a diagnosis aid only: the transcript still records the step

    def transcript(self) -> Transcript:
        return Transcript(
            kind="miniverl.transcript",
            schema_version=1,
            cwd="<work>",
            executable="<venv>/bin/miniverl",
            invocations=[r.invocation for r in self.results],
        )

"""Progress while a run works: one small interface the controller calls, three ways to show it.

The training code calls the module functions (:func:`phase`, :func:`start_cycles`,
:func:`cycle_done`); other long work (eval, export, handoff, models fetch, bench) calls
:func:`phase` and, where it can count its items, :func:`task` then :func:`advance`. They go to the
reporter the CLI made active with :func:`active`, and do nothing when none is (library use, tests).
The CLI picks the reporter with :func:`choose`:

- ``rich``: a live line on a terminal (current phase, cycles done, elapsed, ETA) plus one log
  line per finished cycle;
- ``plain``: timestamped lines (UTC, ISO 8601) when stderr is not a terminal (a pipe, a log file,
  CI), one per phase and one per cycle with its ETA; counted work gives a line at its start, then
  at most one every :data:`PLAIN_EVERY_SECONDS` and one at its end, each with done/total and ETA;
- ``silent``: nothing, for ``--json`` and ``--quiet``.

Progress goes to stderr only; stdout stays for the command's result.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, Protocol, TextIO


class CycleLine(Protocol):
    """What a reporter reads from a finished cycle's metrics line."""

    loss: float
    reward_mean: float | None
    kl: float | None
    response_tokens: int
    cycle_seconds: float


#: a plain reporter's counted work prints at most one line this often (the start and the end always)
PLAIN_EVERY_SECONDS = 10.0


class Reporter:
    """The silent reporter; the others override what they show."""

    def __init__(self) -> None:
        self.total = 0
        self.done = 0
        self.first_step = 0
        self.started = time.perf_counter()
        self.cycle_seconds: list[float] = []
        self.work = Work("", 0, "", time.perf_counter())

    def task(self, label: str, total: int, unit: str) -> None:
        """Counted work begins: ``total`` ``unit`` (e.g. 256 responses) to do, none done."""
        self.work = Work(label, total, unit, time.perf_counter())

    def advance(self, done: int, label: str | None = None) -> None:
        """``done`` of the task's items are finished (a running count, not an increment)."""
        self.work.done = done
        if label is not None:
            self.work.label = label

    def phase(self, name: str, detail: str = "") -> None:
        """A phase begins: ``load``, ``rollout``, ``score``, ``update``, ``checkpoint``, ..."""

    def start_cycles(self, done: int, total: int) -> None:
        self.done, self.total, self.first_step = done, total, done

    def cycle_done(self, step: int, total: int, line: CycleLine) -> None:
        self.done, self.total = step, total
        self.cycle_seconds.append(float(line.cycle_seconds))

    def eta_seconds(self) -> float | None:
        """Remaining cycles x the mean cycle time measured in this process (None before the first)."""
        if not self.cycle_seconds:
            return None
        return (self.total - self.done) * sum(self.cycle_seconds) / len(self.cycle_seconds)

    def close(self) -> None:
        """Stop any live display."""


class Work:
    """Counted work in progress: what, how much, how far, since when."""

    def __init__(self, label: str, total: int, unit: str, started: float) -> None:
        self.label, self.total, self.unit, self.started, self.done = label, total, unit, started, 0

    def eta_seconds(self, now: float) -> float | None:
        """Remaining items x the mean seconds per item so far (None before the first)."""
        if self.done <= 0:
            return None
        return (now - self.started) / self.done * max(0, self.total - self.done)

    def describe(self, now: float) -> str:
        elapsed = format_duration(now - self.started)
        return (
            f"{self.label}: {self.done}/{self.total} {self.unit}, elapsed {elapsed}, "
            f"ETA {format_duration(self.eta_seconds(now))}"
        )


def describe_cycle(step: int, total: int, line: CycleLine) -> str:
    parts = [f"cycle {step}/{total}", f"loss {line.loss:.4f}"]
    if line.reward_mean is not None:
        parts.append(f"reward {line.reward_mean:.3f}")
    if line.kl is not None:
        parts.append(f"kl {line.kl:.4f}")
    rate = line.response_tokens / line.cycle_seconds if line.cycle_seconds > 0 else 0.0
    parts.append(f"{line.response_tokens} tokens ({rate:.1f}/s)")
    parts.append(f"{line.cycle_seconds:.1f}s")
    return "  ".join(parts)


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


class PlainReporter(Reporter):
    """Timestamped lines: ``2026-12-01T04:00:00Z miniverl: rollout 8 sequences ...``."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.stream = stream

    def _line(self, text: str) -> None:
        stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        self.stream.write(f"{stamp} miniverl: {text}\n")
        self.stream.flush()

    def phase(self, name: str, detail: str = "") -> None:
        where = f"cycle {self.done + 1}/{self.total} " if self.total and name != "load" else ""
        self._line(f"{where}{name}" + (f": {detail}" if detail else ""))

    def start_cycles(self, done: int, total: int) -> None:
        super().start_cycles(done, total)
        self._line(f"training: {total - done} cycle(s) to run" + (f", resuming after {done}" if done else ""))

    def cycle_done(self, step: int, total: int, line: CycleLine) -> None:
        super().cycle_done(step, total, line)
        self._line(f"{describe_cycle(step, total, line)}  ETA {format_duration(self.eta_seconds())}")

    def task(self, label: str, total: int, unit: str) -> None:
        super().task(label, total, unit)
        self.last_line = self.work.started
        self._line(f"{label}: 0/{total} {unit}")

    def advance(self, done: int, label: str | None = None) -> None:
        super().advance(done, label)
        now = time.perf_counter()
        if done >= self.work.total or now - self.last_line >= PLAIN_EVERY_SECONDS:
            self.last_line = now
            self._line(self.work.describe(now))


class RichReporter(Reporter):
    """A live progress line on a terminal (rich), with a log line per finished cycle."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(file=stream, log_path=False)
        self.bar = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA {task.fields[eta]}"),
            console=self.console,
            transient=True,
        )
        self.bar_task = self.bar.add_task("starting", total=None, eta="?")
        self.bar.start()

    def phase(self, name: str, detail: str = "") -> None:
        where = f"cycle {self.done + 1}/{self.total} " if self.total and name != "load" else ""
        self.bar.update(self.bar_task, description=f"{where}[bold]{name}[/bold] {detail}".rstrip())

    def start_cycles(self, done: int, total: int) -> None:
        super().start_cycles(done, total)
        self.bar.update(self.bar_task, total=total, completed=done)

    def cycle_done(self, step: int, total: int, line: CycleLine) -> None:
        super().cycle_done(step, total, line)
        self.bar.update(self.bar_task, completed=step, eta=format_duration(self.eta_seconds()))
        self.console.log(describe_cycle(step, total, line))

    def task(self, label: str, total: int, unit: str) -> None:
        super().task(label, total, unit)
        self.bar.reset(self.bar_task, total=total, completed=0, description=f"{label} ({unit})", eta="?")

    def advance(self, done: int, label: str | None = None) -> None:
        super().advance(done, label)
        eta = format_duration(self.work.eta_seconds(time.perf_counter()))
        self.bar.update(self.bar_task, completed=done, description=f"{self.work.label} ({self.work.unit})", eta=eta)

    def close(self) -> None:
        self.bar.stop()


def choose(*, quiet: bool, stream: TextIO | None = None) -> Reporter:
    """``rich`` on a terminal, ``plain`` otherwise, silent when ``quiet`` (``--json``/``--quiet``)."""
    target = sys.stderr if stream is None else stream
    if quiet:
        return Reporter()
    isatty = getattr(target, "isatty", None)
    if callable(isatty) and isatty():
        return RichReporter(target)
    return PlainReporter(target)


_current: Reporter = Reporter()


@contextmanager
def active(reporter: Reporter) -> Iterator[Reporter]:
    """Make ``reporter`` the one the module functions talk to, for the duration of the block."""
    global _current
    previous, _current = _current, reporter
    try:
        yield reporter
    finally:
        _current = previous
        reporter.close()


def phase(name: str, detail: str = "") -> None:
    _current.phase(name, detail)


def start_cycles(done: int, total: int) -> None:
    _current.start_cycles(done, total)


def cycle_done(step: int, total: int, line: Any) -> None:
    _current.cycle_done(step, total, line)


def task(label: str, total: int, unit: str) -> None:
    _current.task(label, total, unit)


def advance(done: int, label: str | None = None) -> None:
    _current.advance(done, label)

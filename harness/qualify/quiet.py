"""Timed CLI steps run alone while the other workloads' steps run side by side.

A full qualification on a dedicated GPU runs its workloads concurrently: every check but one judges per-process
figures (peak memory from the process's own allocator, tensors, exit codes) that another process cannot change.
The one that reads the wall clock, the backend matrix's interleaved speed pairs, must see a quiet machine. The
gate knows those timed steps before anything starts: until each has run (or its workload has ended without it),
no step of another workload starts, and while one runs, nothing else does.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class QuietGate:
    """A readers-writer gate whose writers (timed steps) are declared up front and go first."""

    def __init__(self, timed: Iterable[tuple[str, str]] = ()) -> None:
        self._pending: set[tuple[str, str]] = set(timed)  # (workload, step) still to run alone
        self._shared = 0
        self._alone = False
        self._cond = threading.Condition()

    @property
    def pending(self) -> frozenset[tuple[str, str]]:
        with self._cond:
            return frozenset(self._pending)

    @contextmanager
    def slot(self, workload: str, step: str) -> Iterator[None]:
        """Hold the GPU for one CLI step: alone if it is a declared timed step, else beside the other untimed ones
        once no timed step is pending."""
        key = (workload, step)
        with self._cond:
            alone = key in self._pending
            if alone:
                self._cond.wait_for(lambda: self._shared == 0 and not self._alone)
                self._alone = True
            else:
                # A workload that still owes a timed step runs its earlier steps (never beside that step: a
                # workload's steps run one after another); every other workload waits for the timed steps.
                self._cond.wait_for(lambda: not self._alone and self._owes_nothing_else(workload))
                self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                if alone:
                    self._alone = False
                    self._pending.discard(key)
                else:
                    self._shared -= 1
                self._cond.notify_all()

    def _owes_nothing_else(self, workload: str) -> bool:
        return all(owner == workload for owner, _ in self._pending)

    def finished(self, workload: str) -> None:
        """``workload`` ended: a timed step it never ran no longer holds the others back."""
        with self._cond:
            self._pending = {key for key in self._pending if key[0] != workload}
            self._cond.notify_all()

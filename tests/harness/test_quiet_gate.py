"""The quiet gate: a timed step runs alone and before every other workload's step; untimed steps overlap."""

from __future__ import annotations

import threading
import time

from harness.qualify.quiet import QuietGate


def _spans(gate: QuietGate, plan: dict[str, list[str]]) -> dict[tuple[str, str], tuple[float, float]]:
    spans: dict[tuple[str, str], tuple[float, float]] = {}
    lock = threading.Lock()

    def workload(name: str) -> None:
        try:
            for step in plan[name]:
                with gate.slot(name, step):
                    began = time.monotonic()
                    time.sleep(0.05)
                    with lock:
                        spans[(name, step)] = (began, time.monotonic())
        finally:
            gate.finished(name)

    threads = [threading.Thread(target=workload, args=(name,)) for name in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert not any(t.is_alive() for t in threads), "the gate deadlocked"
    return spans


def test_the_timed_step_runs_alone_before_the_others_which_overlap() -> None:
    plan = {"matrix": ["bench", "gate"], "a": ["plan", "run"], "b": ["plan", "run"], "c": ["run"]}
    spans = _spans(QuietGate([("matrix", "bench")]), plan)
    _bench_start, bench_end = spans[("matrix", "bench")]
    others = {key: span for key, span in spans.items() if key != ("matrix", "bench")}
    assert all(start >= bench_end for start, _ in others.values()), "a step started before the timed one ended"
    firsts = [spans[(name, plan[name][0])] for name in ("a", "b", "c")]
    assert max(start for start, _ in firsts) < min(end for _, end in firsts), "untimed steps did not overlap"


def test_a_workload_that_ends_without_its_timed_step_releases_the_others() -> None:
    plan = {"matrix": [], "a": ["run"]}
    spans = _spans(QuietGate([("matrix", "bench")]), plan)
    assert set(spans) == {("a", "run")}


def test_the_owner_runs_its_earlier_steps_then_its_timed_step_alone() -> None:
    plan = {"matrix": ["fetch", "bench"], "a": ["run"]}
    spans = _spans(QuietGate([("matrix", "bench")]), plan)
    assert spans[("a", "run")][0] >= spans[("matrix", "bench")][1]
    assert spans[("matrix", "bench")][0] >= spans[("matrix", "fetch")][1]

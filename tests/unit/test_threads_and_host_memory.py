"""The torch-thread default on shared machines, and the host-memory helpers a run records (issue #37)."""

from __future__ import annotations

import pytest

from miniverl import threads
from miniverl.runtime import host_memory


@pytest.mark.parametrize(
    ("cores", "load", "expected"),
    [
        (1, None, 1),
        (2, 0.0, 1),  # a 2-core machine: 1, busy or not
        (2, 3.0, 1),
        (8, 0.2, 4),  # idle: half the cores
        (8, 5.5, 2),  # 2.5 cores free -> 2
        (8, 9.0, 1),  # over-loaded: never below 1
        (64, 0.0, 8),  # never above 8
        (16, None, 8),  # no load average (not on this OS): half the cores
    ],
)
def test_default_threads_follow_the_free_cores(
    monkeypatch: pytest.MonkeyPatch, cores: int, load: float | None, expected: int
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr(threads, "load_average", lambda: load)
    monkeypatch.delenv("MINIVERL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.choose_threads(None) == (expected, "default (half the usable cores, fewer under load, 1..8)")
    assert threads.choose_threads(3) == (3, "--threads")  # an explicit count is kept


def test_peak_rss_grows_with_an_allocation_and_trim_keeps_values() -> None:
    before = host_memory.peak_rss_bytes()
    block = bytearray(64 * 2**20)
    block[::4096] = b"\x01" * len(block[::4096])  # touch every page: resident
    assert host_memory.peak_rss_bytes() >= before and host_memory.peak_rss_bytes() > 64 * 2**20
    trimmed = host_memory.trim_host_allocator()
    assert isinstance(trimmed, bool) and block[4096] == 1

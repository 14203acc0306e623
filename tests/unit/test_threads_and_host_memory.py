"""The torch-thread default on shared machines, and the host-memory helpers a run records (issue #37)."""

from __future__ import annotations

import pytest

from miniverl import threads
from miniverl.runtime import host_memory


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        (1, 1),
        (2, 1),  # a 2-core machine: 1
        (8, 4),  # half the cores
        (64, 8),  # never above 8
    ],
)
def test_default_threads_are_half_the_cores_whatever_the_load(
    monkeypatch: pytest.MonkeyPatch, cores: int, expected: int
) -> None:
    monkeypatch.setattr(threads, "usable_cores", lambda: cores)
    monkeypatch.setattr("os.getloadavg", lambda: (float(cores * 3),) * 3, raising=False)  # a busy machine
    monkeypatch.delenv("MINIVERL_THREADS", raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads.choose_threads(None) == (expected, "default (half the usable cores, 1..8)")
    assert threads.choose_threads(3) == (3, "--threads")  # an explicit count is kept


def test_peak_rss_grows_with_an_allocation_and_trim_keeps_values() -> None:
    before = host_memory.peak_rss_bytes()
    block = bytearray(64 * 2**20)
    block[::4096] = b"\x01" * len(block[::4096])  # touch every page: resident
    assert host_memory.peak_rss_bytes() >= before and host_memory.peak_rss_bytes() > 64 * 2**20
    trimmed = host_memory.trim_host_allocator()
    assert isinstance(trimmed, bool) and block[4096] == 1

"""The torch-thread default on shared machines, and the host-memory helpers a run records (issue #37)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_a_child_reports_its_own_peak_not_its_parents(tmp_path: Path) -> None:
    """``ru_maxrss`` survives exec: a CLI started from a large process would report the parent's peak. The child
    here loads host_memory by path (stdlib only, no torch) while this process holds 1 GiB it touched."""
    held = bytearray(1 << 30)
    held[:: 1 << 12] = b"\1" * len(held[:: 1 << 12])
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.spec_from_file_location('host_memory', sys.argv[1])\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(module.peak_rss_bytes())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, host_memory.__file__], capture_output=True, text=True, check=True, timeout=60
    )
    assert int(done.stdout) < 256 * 2**20 < len(held)

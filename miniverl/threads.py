"""CPU threads for torch: a default that does not oversubscribe a shared machine.

torch's own default (one thread per core) made generation ~10x slower on a busy 2-core machine
than one thread did, and on a shared 2-core machine a 3-cycle plan took 264 s with 2 threads and
121-135 s with 1 (issue 37). The default here is half the cores this process may use
(``sched_getaffinity``), at least 1 and at most 8: on a machine of 2 cores or fewer, 1. It never follows
the machine's load: on CPU the thread count can change a run's float sums, and a run, its resume and its
replay must compute the same numbers wherever and whenever they run.
``--threads N`` or ``MINIVERL_THREADS`` choose another; an explicit ``OMP_NUM_THREADS`` is
respected. The number used is recorded in ``summary.json`` (``torch_threads``).
"""

from __future__ import annotations

import os

from miniverl.errors import UsageError

MAX_DEFAULT = 8


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def default_threads() -> int:
    """Half the usable cores, 1..8."""
    return max(1, min(MAX_DEFAULT, usable_cores() // 2))


def choose_threads(requested: int | None) -> tuple[int, str]:
    """The thread count and where it came from: ``--threads``, an env variable, or the default."""
    if requested is not None:
        if requested < 1:
            raise UsageError(f"--threads must be at least 1, got {requested}")
        return requested, "--threads"
    for name in ("MINIVERL_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value:
            if not value.isdigit() or int(value) < 1:
                raise UsageError(f"{name}={value!r} must be a positive integer")
            return int(value), name
    return default_threads(), "default (half the usable cores, 1..8)"


def apply_threads(requested: int | None) -> tuple[int, str]:
    """Set torch's intra-op threads (when torch is installed); returns what was chosen."""
    count, origin = choose_threads(requested)
    try:
        import torch
    except ImportError:
        return count, origin
    torch.set_num_threads(count)
    return count, origin

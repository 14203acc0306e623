"""Peak RSS of a command by phase: sample its RSS every 20 ms, cut at each stderr line (miniverl's phase lines).

    python rss_by_phase.py python -m miniverl run --plan plan.json --output runs --run-id one --threads 1

Prints, per stderr line, the peak RSS since the previous line ("peak-before") and the RSS at that moment ("now").
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import psutil


def main(command: list[str]) -> None:
    start = time.time()
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    watched = psutil.Process(proc.pid)
    events: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            events.append((time.time() - start, line.rstrip()[-90:]))

    reader = threading.Thread(target=read)
    reader.start()
    peak = since = 0
    marks: list[tuple[float, int, int, str]] = []
    seen = 0
    while proc.poll() is None:
        try:
            rss = watched.memory_info().rss
        except psutil.Error:
            break
        peak, since = max(peak, rss), max(since, rss)
        if len(events) != seen:
            marks += [(t, since, rss, line) for t, line in events[seen:]]
            since, seen = rss, len(events)
        time.sleep(0.02)
    reader.join()
    marks += [(t, since, 0, line) for t, line in events[seen:]]
    for t, before, now, line in marks:
        print(f"{t:7.1f}s  peak-before {before / 2**20:6.0f} now {now / 2**20:6.0f} MiB | {line}")
    print(f"overall peak {peak / 2**20:.0f} MiB")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Watching a run while it trains (issue #37): ``inspect`` and ``report`` read a running run without its lock.

The run trains in this process (it holds ``RUN/.lock``); at the rollout of its third cycle, two cycles are logged
and none is checkpointed yet (``checkpoint.every_updates: 3``), and other processes inspect and report it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CliResult, tiny_config

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not Path("/proc/locks").exists(), reason="the writer is found in /proc/locks")


def _miniverl(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "miniverl", *argv], capture_output=True, text=True, env=env, timeout=300, check=False
    )


def test_inspect_and_report_of_a_running_run(
    workdir: Path, prompts: Path, tiny_model_dir: Path, write_config: Callable[..., Path], one_torch_thread: None,
    cli: Callable[..., CliResult],
) -> None:  # fmt: skip
    from miniverl.training.entry import run_from_plan

    write_config(tiny_config(tiny_model_dir, checkpoint={"every_updates": 3, "keep_last": 1}))
    assert cli("plan", "config.yaml", "--out", "three.json", "--set", "train.cycles=3", "-q").code == 0
    seen: dict[str, subprocess.CompletedProcess[str]] = {}

    def peek(name: str, at: int) -> None:
        if (name, at) != ("rollout", 2):
            return
        # a half-written line at the end of metrics.jsonl is one being appended: left out, not an error
        with open("runs/w/metrics.jsonl", "a", encoding="utf-8") as handle:
            handle.write('{"step": 3, "cyc')
        seen["inspect"] = _miniverl("inspect", "runs/w", "--json")
        seen["report"] = _miniverl("report", "runs/w", "--json")
        lines = Path("runs/w/metrics.jsonl").read_text().splitlines(keepends=True)
        Path("runs/w/metrics.jsonl").write_text("".join(lines[:-1]))

    run_from_plan(Path("three.json"), output=Path("runs"), run_id="w", on_phase=peek)

    from miniverl.artifacts.inspect import render_inspection

    for name in ("inspect", "report"):
        assert seen[name].returncode == 0 and seen[name].stderr == "", (name, seen[name].stderr)
    live = json.loads(seen["inspect"].stdout)
    assert live["status"] == "running" and live["running"] and live["writer_pid"] == os.getpid()
    assert (live["updates"], live["logged_updates"], live["checkpointed_updates"]) == (2, 2, 0)
    assert live["planned_updates"] == 3 and len(live["loss_by_update"]) == 2
    text = render_inspection(live)
    assert f"running (pid {os.getpid()}), update 2 of 3" in text and "2 logged, 0 checkpointed" in text
    report = json.loads(seen["report"].stdout)
    assert report["running"] and report["updates"] == 2
    assert report["headline"][0] == "running: 2 of 3 updates logged so far"

    # finished: the lock is gone, the same commands read the completed run (and report takes the lock again)
    done = json.loads(cli("inspect", "runs/w", "--json").out)
    assert (done["status"], done["running"]) == ("completed", False)
    assert done["updates"] == done["checkpointed_updates"] == 3
    final = cli("report", "runs/w", "--json")
    assert final.code == 0 and not json.loads(final.out)["running"]
    assert "running" not in Path("runs/w/report/report.md").read_text().split("\n", 3)[0]


def test_follow_needs_a_positive_interval(cli: Callable[..., CliResult], workdir: Path) -> None:
    result = cli("inspect", "runs/none", "--follow", "0")
    assert result.code == 2 and result.err.count("\n") == 1 and "outside 0.1 .. 86400" in result.err

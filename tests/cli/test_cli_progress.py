"""Progress for the long commands besides ``run``: eval, export, handoff from a run, bench, models fetch.

In a pipe they write timestamped lines with done/total and an ETA; ``--json`` keeps stderr empty. The
commands run as subprocesses, as a user's pipe or CI log would see them.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import tiny_config

REPO = Path(__file__).resolve().parents[2]
STAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ miniverl: ")


def _miniverl(cwd: Path, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})}
    environment.pop("CI", None)
    return subprocess.run(
        [sys.executable, "-m", "miniverl", *argv], cwd=cwd, env=environment, capture_output=True, text=True,
        timeout=600, check=False,
    )  # fmt: skip


def _lines(err: str, *, others: bool = False) -> list[str]:
    """Our progress lines, without their stamps; every line is one unless ``others`` (a library's own warning)."""
    lines = err.splitlines()
    ours = [line for line in lines if STAMP.match(line)]
    assert ours and (others or ours == lines), err
    return [STAMP.sub("", line) for line in ours]


@pytest.fixture(scope="module")
def run_root(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path) -> Path:
    from miniverl.data import sample_dataset

    root = tmp_path_factory.mktemp("progress")
    sample_dataset("calculator", 4, 0, root / "prompts.parquet")
    config = tiny_config(tiny_model_dir)
    config["train"]["cycles"] = 1
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    assert _miniverl(root, "plan", "config.yaml", "--out", "plan.json", "--quiet").returncode == 0
    done = _miniverl(root, "run", "--plan", "plan.json", "--run-id", "first", "--threads", "1", "--quiet")
    assert done.returncode == 0, done.stderr
    return root


def test_eval_in_a_pipe_counts_responses_with_an_eta(run_root: Path) -> None:
    args = ("eval", "runs/first", "--data", "prompts.parquet", "--samples", "2", "--threads", "1")
    done = _miniverl(run_root, *args)
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stderr)
    # 4 prompts: greedy 4 + sampled 8, for base and trained
    assert lines[0].startswith("load: student for eval on cpu") and "eval: 0/24 responses" in lines
    assert lines[-1].startswith("eval sampled trained: 24/24 responses, elapsed ") and lines[-1].endswith("ETA 0m00s")
    quiet = _miniverl(run_root, *args, "--json")
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_export_and_handoff_from_a_run_say_what_they_do(run_root: Path) -> None:
    export = _miniverl(run_root, "export", "runs/first", "--out", "adapter")
    assert export.returncode == 0, export.stderr
    assert [line.split(":")[0] for line in _lines(export.stderr)] == ["reload", "write"]
    handoff = _miniverl(run_root, "handoff", "runs/first", "--out", "bundle")
    assert handoff.returncode == 0, handoff.stderr
    phases = [line.split(":")[0] for line in _lines(handoff.stderr)]
    assert phases == ["reload", "write", "write", "sync"], handoff.stderr
    # the run's adapter goes through export's own phases (PEFT reload checked, written), then the bundle's


def test_bench_in_a_pipe_counts_cells(tmp_path: Path) -> None:
    args = ["bench", "rollout", "--model", "tiny", "--device", "cpu", "--batches", "2", "--new-tokens", "3",
            "--paths", "fast,hf_generate", "--no-profile", "--pairs", "1"]  # fmt: skip
    done = _miniverl(tmp_path, *args, "--out", "b")
    assert done.returncode == 0, done.stderr
    lines = _lines(done.stderr, others=True)  # bitsandbytes may warn on import that its CPU kernels are missing
    assert lines[0] == "bench rollout: 0/2 cells" and "pairs: 1 interleaved pairs at batch 2" in lines
    assert lines[-1].startswith("bench rollout: 2/2 cells, elapsed ") and lines[-1].endswith("ETA 0m00s")
    quiet = _miniverl(tmp_path, *args, "--out", "c", "--json")
    assert quiet.returncode == 0 and "miniverl:" not in quiet.stderr, quiet.stderr


def test_models_fetch_of_a_cached_model_says_it_verifies(tmp_path: Path) -> None:
    cache = os.environ.get("MINIVERL_CACHE")
    if not cache or not (Path(cache) / "models" / "smollm2-135m-instruct").is_dir():
        pytest.skip("needs MINIVERL_CACHE with smollm2-135m-instruct fetched (no network in tests)")
    done = _miniverl(tmp_path, "models", "fetch", "smollm2-135m-instruct")
    assert done.returncode == 0, done.stderr
    assert _lines(done.stderr)[0].startswith("verify: cached smollm2-135m-instruct")
    quiet = _miniverl(tmp_path, "models", "fetch", "smollm2-135m-instruct", "--json")
    assert quiet.returncode == 0 and quiet.stderr == ""


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_plain_counted_work_is_throttled_and_ends_with_eta_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    from miniverl import progress

    clock = _Clock()
    monkeypatch.setattr(progress.time, "perf_counter", clock)
    stream = io.StringIO()
    reporter = progress.PlainReporter(stream)
    with progress.active(reporter):
        progress.task("eval", 10, "responses")
        clock.now += 2
        progress.advance(2, "eval greedy base")  # too soon after the last line: no line
        clock.now += progress.PLAIN_EVERY_SECONDS
        progress.advance(5)
        clock.now += 3
        progress.advance(10, "eval greedy trained")
    lines = [STAMP.sub("", line) for line in stream.getvalue().splitlines()]
    assert lines == [
        "eval: 0/10 responses",
        "eval greedy base: 5/10 responses, elapsed 0m12s, ETA 0m12s",
        "eval greedy trained: 10/10 responses, elapsed 0m15s, ETA 0m00s",
    ]
    progress.advance(3)  # no reporter active: nothing happens


def test_rich_counted_work_shows_a_bar() -> None:
    from miniverl import progress

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    rich: Any = progress.choose(quiet=False, stream=stream)
    assert isinstance(rich, progress.RichReporter)
    with progress.active(rich):
        progress.task("bench grpo", 4, "cells")
        progress.advance(1, "bench grpo, measuring step fast")
        assert rich.bar.tasks[0].total == 4 and rich.bar.tasks[0].completed == 1
        rich.bar.refresh()
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", stream.getvalue())
    assert "bench grpo, measuring step fast (cells)" in shown and "1/4" in shown

"""``miniverl bench rollout`` on the tiny model (CPU): every path measured or marked, fixed lengths, outputs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.bench.rollout import RolloutBenchOptions, run_rollout_bench
from miniverl.canonical import sha256_file
from miniverl.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("rollout-bench")
    try:
        opts = RolloutBenchOptions(model="tiny", device="cpu", batches=(2, 3), new_tokens=6, prompt_tokens=5, repeats=2)
        report = run_rollout_bench(opts, out)
    finally:
        torch.set_num_threads(threads)
    return report, out


def test_every_path_is_measured_or_marked(bench: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench
    by = {(c["path"], c["batch"]): c for c in report["cells"]}
    assert len(by) == 2 * 6
    for batch in (2, 3):
        for path in ("fast", "fast_eager", "hf_loop", "hf_generate"):
            cell = by[(path, batch)]
            assert cell["status"] == "measured", cell
            assert cell["generated_tokens"] == batch * 6  # fixed lengths, checked on every timed call
            assert cell["tokens_per_second"] == pytest.approx(batch * 6 / cell["median_seconds"])
            assert cell["ms_per_decode_step"] == pytest.approx(cell["median_seconds"] / 6 * 1e3)
            expected = 100 * report["weight_bandwidth_bound_ms_per_step"] / cell["ms_per_decode_step"]
            assert cell["pct_of_weight_bandwidth_bound"] == pytest.approx(expected)
            assert cell["peak_reserved_gib"] is None  # CPU
        assert len(by[("fast", batch)]["seconds"]) == 2 and len(by[("hf_loop", batch)]["seconds"]) == 1
        assert all(by[(path, batch)]["calls_per_sample"] >= 1 for path in ("fast", "hf_loop"))
        assert by[("fast", batch)]["engine_stats"]["folds"] == 1
        assert by[("trl", batch)]["status"] == "not_run" and by[("fast_compiled", batch)]["status"] == "not_run"
    assert report["rollout_weight_bytes"] > 0 and report["copy_bandwidth_bytes_per_second"] > 0
    assert {g["status"] for g in report["goals"]} == {"not_measured"}  # the targets are at batch 16 and 64


def test_outputs_are_written_with_checksums(bench: tuple[dict[str, Any], Path]) -> None:
    report, out = bench
    assert sorted(p.name for p in out.iterdir()) == [
        "rollout-profiler.json",
        "rollout.json",
        "rollout.md",
        "rollout.svg",
    ]
    assert json.loads((out / "rollout.json").read_text())["cells"] == report["cells"]
    for name, digest in report["artifacts"].items():
        assert sha256_file(out / name) == digest
    table = (out / "rollout.md").read_text()
    assert table.count("| fast |") == 2 and "not_run: trl" in table
    assert (out / "rollout.svg").read_text().count("<rect") == 8


def test_cli_bench_rollout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "rollout", "--model", "tiny", "--device", "cpu", "--batches", "2", "--new-tokens", "3",
            "--paths", "fast,hf_generate", "--no-profile", "--out", str(tmp_path / "b"), "--json"]  # fmt: skip
    assert cli_main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["path"] for c in report["cells"]] == ["fast", "hf_generate"]
    assert cli_main([*args[:-3], "--paths", "fast,vllm", "--out", str(tmp_path / "c")]) == 2
    assert "unknown path" in capsys.readouterr().err


def test_a_timed_sample_repeats_a_short_call_until_it_lasts_long_enough() -> None:
    import time

    from miniverl.bench.rollout import MIN_SAMPLE_SECONDS, measure

    calls = []

    def run() -> int:
        calls.append(1)
        time.sleep(0.01)
        return 8

    cell = measure(run, warmup=1, repeats=3, device=torch.device("cpu"), expected_tokens=8)
    per_sample = cell["calls_per_sample"]
    assert MIN_SAMPLE_SECONDS / 0.02 <= per_sample <= MIN_SAMPLE_SECONDS / 0.01  # ~20 calls of 10 ms
    assert len(calls) == 1 + 3 * per_sample and len(cell["seconds"]) == 3
    assert all(0.009 < s < 0.05 for s in cell["seconds"])  # per call, not per sample


def test_a_call_of_another_length_fails_the_measurement() -> None:
    from miniverl.bench.rollout import measure

    lengths = iter([8, 8, 8, 7] + [8] * 1000)
    with pytest.raises(RuntimeError, match="fixed lengths broken"):
        measure(lambda: next(lengths), warmup=1, repeats=3, device=torch.device("cpu"), expected_tokens=8)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batches", "0"], "argument --batches: 0 must be at least 1"),
        (["--batches", ","], "give at least one integer"),
        (["--new-tokens", "-1"], "argument --new-tokens: -1 must be at least 1"),
        (["--repeats", "0"], "argument --repeats: 0 must be at least 1"),
        (["--paths", "fast,vllm"], "unknown path(s) vllm"),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path: Path, argv: list[str], message: str) -> None:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["bench", "rollout", "--device", "cpu", "--out", str(tmp_path / "o"), *argv])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "o").exists()

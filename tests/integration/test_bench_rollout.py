"""``miniverl bench rollout`` on the tiny model (CPU): every path measured or marked, fixed lengths, outputs."""

from __future__ import annotations

import json
from collections.abc import Callable
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
        opts = RolloutBenchOptions(
            model="tiny", device="cpu", batches=(2, 3), new_tokens=6, prompt_tokens=5, repeats=2,
            pair=("fast", "hf_loop"), pairs=3,
        )  # fmt: skip
        report = run_rollout_bench(opts, out)
    finally:
        torch.set_num_threads(threads)
    return report, out


def test_every_path_is_measured_or_marked(bench: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench
    by = {(c["path"], c["batch"]): c for c in report["cells"]}
    assert len(by) == 2 * 8
    for batch in (2, 3):
        assert by[("hf_generate_static", batch)]["compiled"] is False  # CPU: the static cache, uncompiled
        for path in ("fast", "fast_eager", "hf_loop", "hf_generate", "hf_generate_static"):
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
        fast = by[("fast", batch)]  # a fold per policy version: the cell's own, then one per call
        assert fast["engine_stats"]["folds"] == 1 + 1 + 2 * fast["calls_per_sample"]
        assert fast["kv_read_bytes_per_step"] == 2 * 2 * 2 * 16 * 4 * batch * (5 + 5 / 2)  # 2 layers, K+V, tiny
        weights_and_kv = report["rollout_weight_bytes"] + fast["kv_read_bytes_per_step"]
        bound_ms = weights_and_kv / report["copy_bandwidth_bytes_per_second"] * 1e3
        assert fast["bandwidth_bound_ms_per_step"] == pytest.approx(bound_ms)
        assert fast["pct_of_bandwidth_bound"] == pytest.approx(100 * bound_ms / fast["ms_per_decode_step"])
        assert by[("trl", batch)]["status"] == "not_run" and by[("fast_compiled", batch)]["status"] == "not_run"
        assert by[("fast_triton", batch)]["status"] == "not_run" and "CUDA only" in by[("fast_triton", batch)]["reason"]
    assert report["rollout_weight_bytes"] > 0 and report["copy_bandwidth_bytes_per_second"] > 0
    assert {g["status"] for g in report["goals"]} == {"not_measured"}  # the targets are at batch 16 and 64


def test_each_batch_times_the_pair_interleaved_and_records_every_pair(bench: tuple[dict[str, Any], Path]) -> None:
    report, out = bench
    assert [(c["a"], c["b"], c["batch"], c["status"]) for c in report["comparisons"]] == [
        ("fast", "hf_loop", 2, "measured"),
        ("fast", "hf_loop", 3, "measured"),
    ]
    for c in report["comparisons"]:
        assert c["order"] == "ABAB" and c["generated_tokens"] == c["batch"] * 6 and len(c["pairs"]) == 3
        assert all(p["ratio"] == p["b_seconds"] / p["a_seconds"] > 0 for p in c["pairs"])
        ratios = sorted(p["ratio"] for p in c["pairs"])
        assert c["median_ratio"] == ratios[1] and (c["min_ratio"], c["max_ratio"]) == (ratios[0], ratios[-1])
        assert c["min_ratio"] <= c["q1_ratio"] <= c["median_ratio"] <= c["q3_ratio"] <= c["max_ratio"]
        assert c["calls_per_sample"]["a"] >= 1 and c["calls_per_sample"]["b"] >= 1
    assert json.loads((out / "rollout.json").read_text())["comparisons"] == report["comparisons"]
    assert "| fast / hf_loop | 2 | 3 |" in (out / "rollout.md").read_text()


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
    assert (out / "rollout.svg").read_text().count("<rect") == 10  # 5 measured paths x 2 batches


def test_cli_bench_rollout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", "rollout", "--model", "tiny", "--device", "cpu", "--batches", "2", "--new-tokens", "3",
            "--paths", "fast,hf_generate", "--no-profile", "--out", str(tmp_path / "b"), "--json"]  # fmt: skip
    assert cli_main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert [c["path"] for c in report["cells"]] == ["fast", "hf_generate"]
    # by default fast and hf_generate are also timed in 5 interleaved pairs
    assert report["options"]["pairs"] == 5 and [len(c["pairs"]) for c in report["comparisons"]] == [5]
    assert cli_main([*args[:-3], "--paths", "fast", "--pairs", "0", "--out", str(tmp_path / "d"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["comparisons"] == []
    assert cli_main([*args[:-3], "--paths", "fast", "--out", str(tmp_path / "e"), "--json"]) == 0
    (comparison,) = json.loads(capsys.readouterr().out)["comparisons"]
    assert comparison["status"] == "not_run" and "hf_generate is not among the measured paths" in comparison["reason"]
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
        (["--pairs", "-1"], "argument --pairs: -1 must be 0 or more"),
        (["--pair", "fast"], "--pair fast: give two different paths A,B"),
        (["--pair", "fast,fast"], "--pair fast,fast: give two different paths A,B"),
        (["--pair", "fast,trl"], "--pair fast,trl: give two different paths A,B"),
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


# -- interleaved pairs: what machine load can and cannot do to the ratio ---------------------------------------------
class LoadedMachine:
    """A fake clock on a machine whose load comes and goes: path A takes 10 ms a call and B 15 ms (A is 1.5x B's
    tokens/s), each stretched by the load while it runs (x3: two busy loops beside one bench thread on 2 cores, and
    some of the neighbour's cache). Load switches on and off at random times, 0.3-3 s apart."""

    def __init__(self, seed: int) -> None:
        import random

        rng = random.Random(seed)
        self.now, self.switches, t = 0.0, [], 0.0
        while t < 120:
            t += rng.uniform(0.3, 3.0)
            self.switches.append(t)
        self.on_first = rng.random() < 0.5

    def load(self) -> float:
        import bisect

        on = (bisect.bisect(self.switches, self.now) % 2 == 0) == self.on_first
        return 3.0 if on else 1.0

    def path(self, ms: float) -> Callable[[], int]:
        def run() -> int:
            self.now += ms / 1e3 * self.load()
            return 8

        return run

    def clock(self) -> float:
        return self.now


def _sequential_ratio(machine: LoadedMachine, repeats: int = 3) -> float:
    """The old way: A's cell (warm-up, then samples of 0.2 s), then B's; the ratio of their medians."""
    import statistics

    medians = []
    for run in (machine.path(10), machine.path(15)):
        run()
        samples = []
        for _ in range(repeats):
            start = machine.clock()
            for _ in range(20):
                run()
            samples.append((machine.clock() - start) / 20)
        medians.append(statistics.median(samples))
    return medians[1] / medians[0]


def test_load_that_comes_and_goes_cannot_flip_the_median_of_interleaved_pairs() -> None:
    """On 200 load patterns, the median of 9 interleaved pairs stays within 2 % of the true 1.5 (a floor at 1.2, say,
    never flips), while timing one path's cell after the other's flips that verdict on many of the same patterns."""
    from miniverl.bench.pairs import measure_pairs

    medians, flipped_sequential = [], 0
    for seed in range(200):
        machine = LoadedMachine(seed)
        result = measure_pairs(
            machine.path(10), machine.path(15), pairs=9, warmup=1, expected_tokens=8, clock=machine.clock
        )
        assert [p["ratio"] for p in result["pairs"]] == [p["b_seconds"] / p["a_seconds"] for p in result["pairs"]]
        medians.append(result["median_ratio"])
        flipped_sequential += _sequential_ratio(LoadedMachine(seed)) < 1.2
    assert all(1.47 <= m <= 1.53 for m in medians), (min(medians), max(medians))
    assert flipped_sequential >= 20  # the fault the pairs remove: a burst on one path's cell only


def test_steady_load_cancels_in_every_pair() -> None:
    from miniverl.bench.pairs import measure_pairs

    machine = LoadedMachine(0)
    machine.switches = []  # loaded throughout
    machine.on_first = True
    result = measure_pairs(
        machine.path(10), machine.path(15), pairs=5, warmup=2, expected_tokens=8, clock=machine.clock
    )
    assert result["min_ratio"] == pytest.approx(1.5) and result["max_ratio"] == pytest.approx(1.5)
    assert result["calls_per_sample"] == {"a": 7, "b": 5}  # 0.2 s / (30 ms, 45 ms) from the call after warm-up


def test_pairs_refuse_a_broken_length_and_a_clock_that_does_not_advance() -> None:
    from miniverl.bench.pairs import measure_pairs

    lengths = iter([8, 8, 8, 8, 7] + [8] * 1000)
    with pytest.raises(RuntimeError, match="fixed lengths broken"):
        measure_pairs(lambda: next(lengths), lambda: 8, pairs=3, warmup=1, expected_tokens=8, clock=time_steps())
    with pytest.raises(RuntimeError, match="did not advance"):
        measure_pairs(lambda: 8, lambda: 8, pairs=3, warmup=1, expected_tokens=8, clock=lambda: 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        measure_pairs(lambda: 8, lambda: 8, pairs=0, warmup=1, expected_tokens=8)


def time_steps() -> Callable[[], float]:
    ticks = iter(range(10**6))
    return lambda: float(next(ticks))

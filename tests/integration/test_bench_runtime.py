"""The runtime benchmark on the tiny model: 8 cells, outputs written, goals computed from figures.

The module fixture runs the default rows (the 8 RecoveryBench oracle trajectories); the CLI entry
test runs ``--rows synthetic``, the seed's padding profile.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.bench.render import evaluate_goals, render_pareto_svg
from miniverl.bench.runtime import BenchOptions, calibrate_overhead_tokens, main, run_runtime_bench
from miniverl.canonical import sha256_file, sha256_json

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("bench")
    try:
        report = run_runtime_bench(BenchOptions(model="tiny", device="cpu", repeats=1, warmup=1, switch_trials=2), out)
    finally:
        torch.set_num_threads(threads)
    return report, out


def test_bench_writes_every_output_with_checksums(bench: tuple[dict[str, Any], Path]) -> None:
    report, out = bench
    assert sorted(p.name for p in out.iterdir()) == ["bench.json", "bench.md", "pareto.svg", "profiler.json"]
    assert json.loads((out / "bench.json").read_text())["cells"] == report["cells"]
    for name, digest in report["artifacts"].items():
        assert sha256_file(out / name) == digest
    profiler = json.loads((out / "profiler.json").read_text())
    assert profiler["sha256"] == sha256_json({k: v for k, v in profiler.items() if k != "sha256"})
    assert profiler["ops"] and profiler["sort_by"] == "self_cpu_time"
    svg = (out / "pareto.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<circle") == 8 + 2
    table = (out / "bench.md").read_text()
    assert table.count("| dual model |") == 4 and table.count("| shared backbone |") == 4


def test_bench_cells_report_plans_padding_and_cpu_memory_as_null(bench: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench
    assert len(report["cells"]) == 8
    lengths = report["trajectories"]["lengths"]
    for cell in report["cells"]:
        assert cell["peak_reserved_gib"] is None  # CPU: not measured, never invented
        assert cell["trajectories_per_second"] > 0
        assert cell["physical_forwards"] == len(cell["plan"])
        padding = sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in cell["plan"])
        assert cell["padding_tokens"] == padding
        if cell["trajectory_batch_size"] == "auto":
            assert cell["auto_policy"]["source"] in ("calibrated", "device_default")
    shared = [c for c in report["cells"] if c["runtime"] == "shared_backbone"]
    assert all(c["role_switches_per_update"] == 2 for c in shared)  # one teacher block per update
    memory = next(g for g in report["goals"] if "memory" in g["name"])
    assert memory["status"] == "not_measured" and memory["observed"] is None


def _cell(runtime: str, batch: Any, tps: float, peak: float | None, forwards: int, padding: int) -> dict[str, Any]:
    return {
        "runtime": runtime,
        "trajectory_batch_size": batch,
        "trajectories_per_second": tps,
        "peak_reserved_gib": peak,
        "physical_forwards": forwards,
        "padding_tokens": padding,
        "median_update_seconds": 8 / tps,
        "physical_batch_sizes": [1] * forwards,
    }


def test_goals_are_computed_from_the_figures() -> None:
    cells = [
        _cell("dual_model", 1, 2.0, 2.5, 8, 0),
        _cell("dual_model", 2, 3.0, 2.8, 4, 270),
        _cell("dual_model", 4, 3.4, 3.0, 2, 616),
        _cell("dual_model", "auto", 3.5, 3.0, 2, 616),
        _cell("shared_backbone", 1, 1.9, 1.8, 8, 0),
        _cell("shared_backbone", 2, 2.9, 1.9, 4, 270),
        _cell("shared_backbone", 4, 3.3, 2.0, 2, 616),
        _cell("shared_backbone", "auto", 3.0, 2.0, 2, 616),
    ]
    goals = {g["name"]: g for g in evaluate_goals(cells, quantization="nf4", device="cuda")}
    assert goals["dual batch-4 throughput / batch-1"]["observed"] == pytest.approx(1.7)
    assert goals["dual batch-4 throughput / batch-1"]["status"] == "met"
    assert goals["shared peak-memory saving at batch-4"]["observed"] == pytest.approx(1 / 3)
    assert goals["shared throughput / dual at batch-4"]["status"] == "met"
    assert goals["shared_backbone auto throughput / best fixed batch"]["status"] == "not_met"
    assert goals["NF4 dual batch-4 peak reserved GiB"]["status"] == "met"
    report = {"cells": cells, "options": {"model": "m", "quantization": "nf4", "dtype": "float32"}}
    assert "peak reserved GiB" in render_pareto_svg(report)


def test_calibration_reproduces_the_fixed_cells() -> None:
    lengths = [100] * 8
    per_forward, per_token, const = 0.03, 2e-5, 0.1
    cells = [_cell("dual_model", b, 1.0, None, f, p) for b, f, p in ((1, 8, 0), (2, 4, 50), (4, 2, 150))]
    for c in cells:
        c["median_update_seconds"] = (
            const + per_forward * c["physical_forwards"] + per_token * (800 + c["padding_tokens"])
        )
    fit = calibrate_overhead_tokens(cells, lengths)
    assert fit is not None and fit["overhead_tokens"] == round(per_forward / per_token)


def test_cli_entry_runs_the_synthetic_rows_with_the_seeds_padding(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from miniverl.bench.oracle_workload import SEED_PADDING, padding_by_batch
    from miniverl.gate.workload import synthetic_workload

    argv = ["--model", "tiny", "--device", "cpu", "--repeats", "1", "--warmup", "0", "--profile-cell", "none"]
    code = main([*argv, "--rows", "synthetic", "--out", str(tmp_path / "b")])
    assert code == 0 and "| dual model |" in capsys.readouterr().out
    assert not (tmp_path / "b" / "profiler.json").exists()
    trajectories = json.loads((tmp_path / "b" / "bench.json").read_text())["trajectories"]
    assert trajectories["source"] == "synthetic" and trajectories["tokens"] == "random ids"
    # the seed's lengths at the tiny model's 1/8 scale; at full scale they give the seed's padding exactly
    assert trajectories["lengths"] == synthetic_workload(128, scale=0.125).lengths
    assert padding_by_batch(synthetic_workload(128).lengths) == SEED_PADDING == trajectories["seed_padding"]
    assert "synthetic rows with the seed's length profile" in (tmp_path / "b" / "bench.md").read_text()


def _recording(seen: list[BenchOptions], report: dict[str, Any]) -> Any:
    """A stand-in for ``run_runtime_bench``: keeps the options it is given, returns ``report``."""

    def run(opts: BenchOptions, _out: Any) -> dict[str, Any]:
        seen.append(opts)
        return report

    return run


def test_the_default_rows_are_the_oracle_sql_trajectories(
    bench: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from miniverl.bench import runtime
    from miniverl.cli import build_parser

    assert BenchOptions().rows == "oracle-sql"
    assert build_parser().parse_args(["bench", "runtime", "--out", "unused"]).rows == "oracle-sql"
    seen: list[BenchOptions] = []
    monkeypatch.setattr(runtime, "run_runtime_bench", _recording(seen, bench[0]))
    assert runtime.main(["--out", "unused"]) == 0 and seen[0].rows == "oracle-sql"
    assert "| dual model |" in capsys.readouterr().out


def test_bench_runs_on_the_oracle_sql_trajectories_by_default_and_records_their_padding(
    bench: tuple[dict[str, Any], Path],
) -> None:
    from miniverl.bench.oracle_workload import SEED_PADDING, hashed_encoder, oracle_workload, padding_by_batch
    from miniverl.data.sqlite_recovery import oracle_trajectories

    report, out = bench
    assert report["options"]["rows"] == "oracle-sql"
    work = oracle_workload(hashed_encoder(128))
    trajectories = report["trajectories"]
    assert trajectories["source"] == "oracle-sql" and trajectories["digest"] == work.digest()
    assert trajectories["lengths"] == work.lengths and len(work.lengths) == 8
    prompts = oracle_trajectories()
    for row, positions, trajectory in zip(work.rows.input_ids, work.rows.selected_positions, prompts, strict=True):
        response = hashed_encoder(128)(trajectory.response)
        assert list(row[-len(response) :]) == response and len(positions) == len(response)
    assert trajectories["padding"] == padding_by_batch(work.lengths) and trajectories["seed_padding"] == SEED_PADDING
    by_batch = {
        c["trajectory_batch_size"]: c["padding_tokens"] for c in report["cells"] if c["runtime"] == "dual_model"
    }
    assert (
        by_batch[1] == 0 and by_batch[2] == trajectories["padding"]["2"] and by_batch[4] == trajectories["padding"]["4"]
    )
    note = (out / "bench.md").read_text()
    assert (
        "RecoveryBench oracle trajectories" in note
        and f"batch 8: {trajectories['padding']['8']:,} (seed 1,636)" in note
    )


def test_oracle_rows_refuse_another_trajectory_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"8 oracle trajectories.*--rows synthetic"):
        run_runtime_bench(BenchOptions(model="tiny", device="cpu", trajectories=4), tmp_path / "x")
    assert main(["--trajectories", "4", "--device", "cpu", "--out", str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("miniverl bench runtime: error: --rows oracle-sql is the 8")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_the_cli_message_carries_the_padding_note(
    bench: tuple[dict[str, Any], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from miniverl.bench import cli as bench_cli
    from miniverl.cli import build_parser

    report, out = bench
    seen: list[BenchOptions] = []
    monkeypatch.setattr(bench_cli, "run_runtime_bench", _recording(seen, dict(report)))
    args = build_parser().parse_args(["bench", "runtime", "--model", "tiny", "--device", "cpu", "--out", str(out)])
    message = bench_cli.run_bench_command(args)["message"]
    assert seen[0].rows == "oracle-sql" and report["trajectories"]["source"] == "oracle-sql"
    assert "Padding tokens by length bucket: batch 2: " in message and "(seed 1,636)" in message
    assert "RecoveryBench oracle trajectories" in message
    synthetic = build_parser().parse_args(["bench", "runtime", "--rows", "synthetic", "--out", str(out)])
    bench_cli.run_bench_command(synthetic)
    assert seen[1].rows == "synthetic"
    assert message.splitlines()[-1].startswith("wrote bench.json")

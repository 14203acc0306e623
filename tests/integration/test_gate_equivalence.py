"""The equivalence gate on the tiny model: the 24 cells {dual, shared} x {1, 2, 4, auto} x {sft, kd, opd}, every
declared comparison computed; the default (opd alone) keeps today's 8 cells and report format."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.gate.equivalence import (
    BATCHES,
    OBJECTIVE_TOLERANCES,
    OBJECTIVES,
    RUNTIMES,
    TOLERANCES,
    cell_observations,
    compare_cells,
    run_equivalence_gate,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("gate") / "report.json"
        result = run_equivalence_gate(model="tiny", device="cpu", out=out, objectives=OBJECTIVES)
    finally:
        torch.set_num_threads(threads)
    result["_path"] = str(out)
    return result


def test_gate_passes_on_the_tiny_model(report: dict[str, Any]) -> None:
    assert report["status"] == "passed", report["reasons"]
    assert report["declared_comparisons"] == report["passed_comparisons"] == 12 * len(OBJECTIVES)
    assert report["objectives"] == list(OBJECTIVES)
    cells = {(c["objective"], c["runtime"], c["trajectory_batch_size"]) for c in report["cells"]}
    assert cells == {(o, r, b) for o in OBJECTIVES for r in RUNTIMES for b in BATCHES}
    assert len(report["cells"]) == 24
    on_disk = json.loads(Path(report["_path"]).read_text())
    assert on_disk["comparisons"] == report["comparisons"]


def test_objectives_are_the_runtime_objectives(report: dict[str, Any]) -> None:
    specs = report["objective_specs"]
    assert specs["sft"]["kind"] == "sft"
    assert (specs["kd"]["kind"], specs["kd"]["variant"], specs["kd"]["divergence"]) == (
        "divergence",
        "topk_tail",
        "forward_kl",
    )
    assert (specs["opd"]["variant"], specs["opd"]["divergence"]) == ("exact", "reverse_kl")
    by_objective: dict[str, set[Any]] = {}
    for cell in report["cells"]:
        by_objective.setdefault(cell["objective"], set()).add(cell["target_digest"])
        assert cell["wall_seconds"] >= cell["update_seconds"] > 0
    assert by_objective["sft"] == {None}  # SFT has no teacher
    kd, opd = by_objective["kd"], by_objective["opd"]
    assert len(kd) == len(opd) == 1 and kd != opd  # fixed top-k targets vs online exact targets
    losses = {o: {c["loss"] for c in report["cells"] if c["objective"] == o} for o in OBJECTIVES}
    assert min(losses["sft"]) > 1.0 > max(losses["kd"])  # NLL over a 128 vocab vs a small divergence


def test_per_cell_observations_rejudge_the_comparisons(report: dict[str, Any]) -> None:
    """The per-cell observations are enough to recompute every comparison (what the harness does)."""
    for objective in OBJECTIVES:
        cells = [c for c in report["cells"] if c["objective"] == objective]
        comparisons = {c["name"]: c for c in report["comparisons"] if c["objective"] == objective}
        for name in TOLERANCES:
            assert max(c["observations"][name] for c in cells) == comparisons[name]["observed"]
            assert comparisons[name]["tolerance"] == OBJECTIVE_TOLERANCES[objective][name]
        reference = cells[0]
        assert (reference["runtime"], reference["trajectory_batch_size"]) == ("dual_model", 1)
        assert reference["observations"]["loss_abs_diff"] == 0.0
        for cell in cells:
            pair = cell["observations"]["vs_other_runtime"]
            assert pair["runtime"] != cell["runtime"] and pair["same_physical_plan"] is True
            assert pair["loss_abs_diff"] == pair["grad_max_abs_diff"] == pair["updated_logit_max_abs_diff"] == 0.0


def test_gate_tolerances_are_the_preregistered_ones(report: dict[str, Any]) -> None:
    """harness/preregistration/backend-matrix-v2.json (committed before any measurement) declares what the gate uses."""
    prereg = json.loads((Path(__file__).parents[2] / "harness/preregistration/backend-matrix-v2.json").read_text())
    assert prereg["tolerances"] == OBJECTIVE_TOLERANCES == report["tolerances"]
    assert prereg["objectives"] == list(OBJECTIVES) == report["objectives"]
    cells = [(c["objective"], c["runtime"], c["trajectory_batch_size"]) for c in report["cells"]]
    assert [(c["objective"], c["runtime"], c["trajectory_batch_size"]) for c in prereg["cells"]] == cells
    assert prereg["gate_argv"] == ["gate", "equivalence", "--objectives", ",".join(OBJECTIVES)]


def test_default_gate_keeps_the_8_opd_cells(tmp_path: Path) -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        result = run_equivalence_gate(model="tiny", device="cpu", out=tmp_path / "r.json")
    finally:
        torch.set_num_threads(threads)
    assert result["status"] == "passed", result["reasons"]
    assert result["objectives"] == ["opd"] and len(result["cells"]) == 8
    assert result["declared_comparisons"] == result["passed_comparisons"] == 12
    assert result["objective"]["divergence"] == "reverse_kl"
    assert {c["name"] for c in result["comparisons"]} >= set(TOLERANCES)


def test_gate_cells_use_the_plans_they_claim(report: dict[str, Any]) -> None:
    lengths = report["trajectories"]["lengths"]
    for cell in report["cells"]:
        rows = sorted(i for b in cell["plan"] for i in b)
        assert rows == list(range(len(lengths)))
        assert cell["physical_forwards"] == len(cell["plan"])
        padding = sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in cell["plan"])
        assert cell["padding_tokens"] == padding
        if cell["trajectory_batch_size"] == 1:
            assert cell["padding_tokens"] == 0 and cell["physical_forwards"] == len(lengths)


def test_observed_maxima_are_reported_within_tolerance(report: dict[str, Any]) -> None:
    by_name = {c["name"]: c for c in report["comparisons"]}
    for name, tolerance in TOLERANCES.items():
        assert by_name[name]["tolerance"] == tolerance
        assert 0.0 <= by_name[name]["observed"] <= tolerance
    assert by_name["loss_abs_diff"]["observed"] > 0 or by_name["grad_max_abs_diff"]["observed"] >= 0


def _fake_cells() -> list[dict[str, Any]]:
    cells = []
    for batch in BATCHES:
        for runtime in RUNTIMES:
            cells.append(
                {
                    "record": {
                        "runtime": runtime,
                        "trajectory_batch_size": batch,
                        "plan": [[0], [1]],
                        "trajectory_digest": "t",
                        "target_digest": "g",
                        "student_init_digest": "s",
                    },
                    "grads": {"w": torch.ones(3)},
                    "logits": torch.ones(2, 4),
                    "loss": 1.0,
                }
            )
    return cells


def test_comparisons_are_computed_and_catch_a_deviation() -> None:
    assert all(c["passed"] for c in compare_cells(_fake_cells()))
    assert all(c["objective"] == "kd" for c in compare_cells(_fake_cells(), objective="kd"))
    cells = _fake_cells()
    cells[5] = copy.deepcopy(cells[5])  # shared_backbone, batch 4
    cells[5]["grads"]["w"] = torch.tensor([1.0, 1.0, 1.01])
    cells[5]["record"]["target_digest"] = "other"
    failed = {c["name"] for c in compare_cells(cells) if not c["passed"]}
    assert failed == {
        "grad_max_abs_diff",
        "grad_max_rel_to_reference_max",
        "dual_equals_shared_exactly[batch=4]",
        "target_digest_identical_across_cells",
    }
    observations = cell_observations(cells)
    assert observations[5]["grad_max_abs_diff"] == pytest.approx(0.01, abs=1e-6)
    assert observations[4]["vs_other_runtime"]["grad_max_abs_diff"] == pytest.approx(0.01, abs=1e-6)
    assert observations[3]["vs_other_runtime"]["grad_max_abs_diff"] == 0.0


@pytest.mark.slow
def test_gate_passes_with_nf4_weights_on_the_tiny_model(tmp_path: Path) -> None:
    pytest.importorskip("bitsandbytes")
    result = run_equivalence_gate(model="tiny", device="cpu", quantization="nf4", out=tmp_path / "nf4.json")
    assert result["status"] == "passed", result["reasons"]


def test_gate_cli_adapter_refuses_low_precision_and_names_the_report(tmp_path: Path) -> None:
    import argparse

    from miniverl.errors import UsageError
    from miniverl.gate.cli import model_choice, objectives_choice, report_path, run_gate_command

    args = argparse.Namespace(model="tiny", device="cpu", quantization="none", dtype="bfloat16", out=str(tmp_path))
    with pytest.raises(UsageError, match="float32"):
        run_gate_command(args)
    assert report_path(str(tmp_path), "r.json") == tmp_path / "r.json"
    assert report_path(str(tmp_path / "x.json"), "r.json") == tmp_path / "x.json"
    assert model_choice("smollm2-135m-instruct") == "smollm2"
    with pytest.raises(UsageError, match="unknown model"):
        model_choice("gpt2")
    assert objectives_choice(None) == ["opd"]
    assert objectives_choice("sft,kd,opd") == ["sft", "kd", "opd"]
    for bad in ("", "sft,sft", "rl", "sft,,grpo"):
        with pytest.raises(UsageError, match="--objectives"):
            objectives_choice(bad)


def test_gate_cli_refuses_unknown_objectives_in_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "miniverl", "gate", "equivalence", "--objectives", "sft,rl", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and done.stderr.startswith("miniverl: error:")
    assert "Traceback" not in done.stderr

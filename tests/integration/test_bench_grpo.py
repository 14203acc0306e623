"""``miniverl bench grpo`` on the tiny model (CPU): every path measured or marked, fixed lengths, outputs."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from miniverl.bench.grpo import GrpoBenchOptions, ratios, run_grpo_bench
from miniverl.bench.grpo_render import evaluate_grpo_goals
from miniverl.canonical import sha256_file
from miniverl.cli import main as cli_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _trl_importable() -> bool:
    try:
        import trl  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("grpo-bench")
    try:
        opts = GrpoBenchOptions(
            model="tiny", device="cpu", prompts=2, samples=2, new_tokens=5, prompt_tokens=4, rollout_batch=4,
            warmup=1, repeats=2, update_shape=(2, 12),
        )  # fmt: skip
        report = run_grpo_bench(opts, out)
    finally:
        torch.set_num_threads(threads)
    return report, out


def test_every_path_is_measured_or_marked(bench: tuple[dict[str, Any], Path]) -> None:
    report, _ = bench
    by = {(c["section"], c["path"]): c for c in report["cells"]}
    assert len(by) == 5 + 3
    for key in (("step", "miniverl_fast"), ("step", "miniverl_hf"), ("update", "naive_hf_peft"),
                ("update", "miniverl_update")):  # fmt: skip
        cell = by[key]
        assert cell["status"] == "measured", cell
        assert len(cell["step_seconds"]) == 2 and cell["peak_reserved_gib"] is None  # CPU
        assert cell["ms_per_step"] == pytest.approx(cell["median_step_seconds"] * 1e3)
    for path in ("miniverl_fast", "miniverl_lean", "miniverl_hf"):
        cell = by[("step", path)]
        assert cell["completion_tokens"] == 2 * 2 * 5  # fixed lengths (checked on every step)
        assert cell["completion_tokens_per_second"] == pytest.approx(20 / cell["median_step_seconds"])
        assert cell["median_rollout_seconds"] > 0 and cell["median_update_seconds"] > 0
    assert by[("step", "miniverl_fast_bf16")]["status"] == "not_run"  # needs a bf16 model
    # the memory plan's estimate beside every measured miniverl cell (the measurement is CUDA's)
    assert (
        by[("step", "miniverl_lean")]["estimated_peak_gib"] > 0
        and by[("update", "miniverl_update")]["estimated_peak_gib"] > 0
    )
    assert by[("update", "naive_hf_peft")]["estimated_peak_gib"] is None
    assert "memory_plan" not in by[("step", "miniverl_lean")]  # no --memory-budget-gib: training's defaults
    assert by[("update", "miniverl_update_bf16")]["status"] == "not_run"
    trl = by[("step", "trl")]
    assert trl["status"] != "passed"
    if not _trl_importable():
        assert trl["status"] == "not_run" and "not importable" in trl["reason"]
    speed = report["ratios"]["step_speed_miniverl_fast_vs_miniverl_hf"]
    assert speed == pytest.approx(by[("step", "miniverl_hf")]["median_step_seconds"]
                                  / by[("step", "miniverl_fast")]["median_step_seconds"])  # fmt: skip
    assert {g["status"] for g in report["goals"]} <= {"not_measured", "informational_cpu"}  # CPU cannot meet them
    for cell in report["cells"]:
        if cell["status"] == "measured":
            times = cell["step_seconds"]
            assert cell["spread_step_seconds"]["min"] == min(times) and cell["spread_step_seconds"]["max"] == max(times)


def test_outputs_are_written_and_checksummed(bench: tuple[dict[str, Any], Path]) -> None:
    report, out = bench
    assert json.loads((out / "grpo.json").read_text())["cells"] == report["cells"]
    for name in ("grpo.md", "grpo.svg"):
        assert report["artifacts"][name] == sha256_file(out / name)
    assert "| step | miniverl_fast |" in (out / "grpo.md").read_text()
    assert (out / "grpo.svg").read_text().startswith("<svg")
    assert not (out / "grpo.partial.json").exists()


def test_goals_follow_the_ratios() -> None:
    cells = [
        {"section": "update", "path": "naive_hf_peft", "status": "measured", "median_step_seconds": 2.0,
         "peak_reserved_gib": 10.0},
        {"section": "update", "path": "miniverl_update_bf16", "status": "measured", "median_step_seconds": 1.0,
         "peak_reserved_gib": 6.0},
        {"section": "step", "path": "trl", "status": "not_run", "reason": "trl is not importable"},
    ]  # fmt: skip
    report = {"device": "cuda", "ratios": ratios(cells), "options": {"repeats": 5}}
    goals = {g["key"]: g["status"] for g in evaluate_grpo_goals(report)}
    assert goals["update_speed_miniverl_update_bf16_vs_naive_hf_peft"] == "met"  # 2.0 >= 2
    assert goals["update_memory_miniverl_update_bf16_vs_naive_hf_peft"] == "not_met"  # 0.6 > 0.5
    assert goals["step_speed_miniverl_fast_vs_trl"] == "not_measured"  # TRL not run: never met
    cells[1]["peak_reserved_gib"] = 5.0
    report = {"device": "cuda", "ratios": ratios(cells), "options": {"repeats": 5}}
    goals = {g["key"]: g["status"] for g in evaluate_grpo_goals(report)}
    assert goals["update_memory_miniverl_update_bf16_vs_naive_hf_peft"] == "met"
    report["options"] = {"repeats": 3}  # fewer than 5 timed steps: no verdict either way
    goals = {g["key"]: g["status"] for g in evaluate_grpo_goals(report)}
    assert goals["update_memory_miniverl_update_bf16_vs_naive_hf_peft"] == "too_few_repeats"
    assert goals["step_speed_miniverl_fast_vs_trl"] == "not_measured"


def test_the_lean_path_runs_what_training_runs_under_the_memory_plan(tmp_path: Path) -> None:
    """bf16 model on CPU: bf16_master (training's TrainedParameters) and, with a budget, the memory plan's
    checkpointing and micro-batch applied; the plan is recorded in the cell and its estimate beside it."""
    opts = GrpoBenchOptions(
        model="tiny", device="cpu", dtype="bfloat16", prompts=2, samples=2, new_tokens=5, prompt_tokens=4,
        rollout_batch=4, warmup=1, repeats=1, paths=("miniverl_lean",), update_paths=(), memory_budget_gib=1e-4,
    )  # fmt: skip
    report = run_grpo_bench(opts, tmp_path / "o")
    (cell,) = report["cells"]
    assert cell["status"] == "measured", cell
    plan = cell["memory_plan"]
    assert plan["memory_plan/budget_gib"] == pytest.approx(1e-4) and plan["memory_plan/fits"] == 0.0
    assert plan["memory_plan/checkpointed_layers"] >= 1 and plan["memory_plan/micro_rows"] == 1
    assert cell["estimated_peak_gib"] == pytest.approx(plan["memory_plan/estimated_peak_gib"])


def test_a_budget_of_trl_runs_trl_first_and_plans_the_lean_path_under_its_peak(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--memory-budget-gib trl``: TRL's cell runs first, and the lean cell's plan takes TRL's measured peak as
    its budget; without a measured peak (here a stand-in TRL cell that could not measure) the lean cell is not
    run, never run under some other budget."""
    import miniverl.bench.grpo as grpo_bench

    def stand_in_trl(peak: float | None) -> Any:
        def cell(*_: Any, **__: Any) -> dict[str, Any]:
            if peak is None:
                return {"status": "not_run", "reason": "stand-in: no peak"}
            return {
                "status": "measured", "peak_reserved_gib": peak, "median_step_seconds": 1.0, "step_seconds": [1.0],
                "first_call_seconds": 1.0, "spread_step_seconds": {"min": 1.0, "q1": 1.0, "q3": 1.0, "max": 1.0},
            }  # fmt: skip

        return cell

    opts = GrpoBenchOptions(
        model="tiny", device="cpu", dtype="bfloat16", prompts=2, samples=2, new_tokens=5, prompt_tokens=4,
        rollout_batch=4, warmup=1, repeats=1, paths=("miniverl_lean", "trl"), update_paths=(),
        memory_budget_gib="trl",
    )  # fmt: skip
    monkeypatch.setattr(grpo_bench, "trl_cell", stand_in_trl(2e-4))
    cells = run_grpo_bench(opts, tmp_path / "a")["cells"]
    assert [c["path"] for c in cells] == ["trl", "miniverl_lean"]
    lean = cells[1]
    assert lean["status"] == "measured" and lean["memory_budget_from"] == "trl"
    assert lean["memory_plan"]["memory_plan/budget_gib"] == pytest.approx(2e-4) == lean["memory_budget_gib"]

    monkeypatch.setattr(grpo_bench, "trl_cell", stand_in_trl(None))
    cells = run_grpo_bench(opts, tmp_path / "b")["cells"]
    assert cells[1]["status"] == "not_run" and "TRL's peak reserved was not measured" in cells[1]["reason"]


def test_the_spread_goes_beside_every_median() -> None:
    from miniverl.bench.common import spread

    assert spread([5.0, 1.0, 3.0, 2.0, 4.0]) == {"min": 1.0, "q1": 2.0, "q3": 4.0, "max": 5.0}
    assert spread([7.0]) == {"min": 7.0, "q1": 7.0, "q3": 7.0, "max": 7.0}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--paths", "miniverl_fast,vllm"], "unknown path(s) vllm"),
        (["--update-paths", "deepspeed"], "unknown path(s) deepspeed"),
        (["--samples", "0"], "argument --samples: 0 must be at least 1"),
        (["--warmup", "-1"], "argument --warmup: -1 must be 0 or more"),
        (["--repeats", "x"], "argument --repeats: 'x' is not an integer"),
        (["--update-shape", "8"], "give B,T (two integers)"),
        (["--update-shape", "8,2"], "--update-shape 8,2"),
        (["--memory-budget-gib", "0"], "--memory-budget-gib must be > 0"),
        (["--memory-budget-gib", "nan"], "--memory-budget-gib must be > 0"),
        (["--memory-budget-gib", "lots"], "'lots' is neither a number of GiB nor 'trl'"),
        (["--memory-budget-gib", "trl", "--paths", "miniverl_lean"], "--memory-budget-gib trl needs the trl path"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path: Path, argv: list[str], message: str) -> None:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(["bench", "grpo", "--device", "cpu", "--out", str(tmp_path / "o"), *argv])
    assert code != 0
    lines = err.getvalue().strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("miniverl: error: ") and message in lines[0], lines
    assert "Traceback" not in err.getvalue()


@pytest.mark.parametrize(
    "command", [["bench", "grpo"], ["bench", "rollout"], ["bench", "runtime"], ["gate", "equivalence"]]
)
def test_an_out_that_is_a_file_is_one_error_line_and_the_file_is_kept(tmp_path: Path, command: list[str]) -> None:
    taken = tmp_path / "results.txt"
    taken.write_text("kept")
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main([*command, "--device", "cpu", "--out", str(taken)])
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1 and "is a file, not a directory" in lines[0], lines
    assert taken.read_text() == "kept"


def test_fused_update_paths_that_cannot_run_here_are_marked_not_run(tmp_path: Path) -> None:
    """liger-kernel runs on CUDA only; ours needs triton (and on CPU its interpreter): never a failure or a pass."""
    opts = GrpoBenchOptions(
        model="tiny", device="cpu", dtype="bfloat16", warmup=1, repeats=1, update_shape=(2, 12),
        update_paths=("miniverl_update_bf16_liger",), paths=("trl_liger",),
    )  # fmt: skip
    for cell in run_grpo_bench(opts, tmp_path / "o")["cells"]:
        assert cell["status"] == "not_run", cell
        assert "CUDA only" in cell["reason"] or "trl is not importable" in cell["reason"], cell


def test_trls_liger_switch_is_the_one_its_grpo_config_has() -> None:
    """TRL < 1.0 had ``use_liger_loss``; TRL 1.x removed it (passing it raised TypeError on the H100) and keeps
    transformers' ``use_liger_kernel``."""
    import dataclasses

    from miniverl.bench.grpo_trl import trl_liger_options

    old = dataclasses.make_dataclass("Old", [("use_liger_loss", bool, False), ("use_liger_kernel", bool, False)])
    new = dataclasses.make_dataclass("New", [("use_liger_kernel", bool, False)])
    neither = dataclasses.make_dataclass("Neither", [("seed", int, 0)])
    assert trl_liger_options(old) == {"use_liger_loss": True}
    assert trl_liger_options(new) == {"use_liger_kernel": True}
    with pytest.raises(ValueError, match="neither"):
        trl_liger_options(neither)


def test_the_nf4_lean_cell_quantizes_a_qwen3_shape_and_the_plan_counts_it(tmp_path: Path) -> None:
    """``miniverl_lean_nf4``: the student is bitsandbytes' NF4 (CPU here), the plan's workload is quantized (a
    smaller estimate than the bf16 student's at the same budget); SmolLM2's Llama shape is not_run with why."""
    pytest.importorskip("bitsandbytes")
    opts = GrpoBenchOptions(
        model="tiny", device="cpu", dtype="bfloat16", prompts=2, samples=2, new_tokens=4, prompt_tokens=4,
        rollout_batch=4, warmup=0, repeats=1, paths=("miniverl_lean", "miniverl_lean_nf4"), update_paths=(),
        memory_budget_gib=1e-4,
    )  # fmt: skip
    bf16, nf4 = run_grpo_bench(opts, tmp_path / "o")["cells"]
    assert nf4["status"] == "measured", nf4
    assert nf4["estimated_peak_gib"] < bf16["estimated_peak_gib"]
    smollm2 = dataclasses.replace(opts, model="smollm2-shape", paths=("miniverl_lean_nf4",))
    (cell,) = run_grpo_bench(smollm2, tmp_path / "s")["cells"]
    assert cell["status"] == "not_run" and "Qwen3 shape" in cell["reason"]


def test_the_compiled_update_path_compiles_every_decoder_layer_of_the_student() -> None:
    """``miniverl_update_bf16_compiled`` (a probe): each decoder layer goes through torch.compile, lazily (nothing is
    compiled until the bench's warm-up calls it)."""
    from miniverl.bench.grpo_models import RandomLoader, role_runtime
    from miniverl.bench.grpo_update import compile_decoder_layers
    from miniverl.runtime.loading import decoder_of

    runtime = role_runtime(RandomLoader("tiny", 0), torch.device("cpu"), "float32", train_batch=2)
    layers = list(decoder_of(runtime._student_model()).layers)
    assert compile_decoder_layers(runtime._student_model()) == len(layers) > 0
    assert all(layer._compiled_call_impl is not None for layer in layers)

"""``miniverl bench runtime``: the systems benchmark of the role runtimes.

The 8-cell matrix {dual_model, shared_backbone} x physical batch {1, 2, 4, auto}, each cell one
strict-OPD update (exact reverse KL) on the same 8 deterministic trajectories: the teacher scores
the rows (one role switch, batched, ``no_grad``), the student runs forward + backward per physical
batch, AdamW steps. Per cell: the median of ``repeats`` measured updates after ``warmup`` updates
of wall time (CUDA-synchronized), trajectories/s and peak reserved GiB (CUDA only; ``null`` on
CPU), plus physical forwards, padding tokens and the adapter-role switch time. One cell
(shared/auto by default) is profiled with ``torch.profiler``; the operator summary (top self-time
ops on the device, CPU self time on CPU) is stored as checksummed JSON.

Writes ``bench.json``, ``bench.md``, ``pareto.svg`` (throughput against peak memory) and
``profiler.json`` under ``--out``. The performance goals are evaluated from the measured figures.

``--rows`` picks the 8 trajectories: ``oracle-sql`` (the default: the 8 pinned RecoveryBench oracle
trajectories, see :mod:`miniverl.bench.oracle_workload`, as the seed's benchmark ran on its own) or
``synthetic`` (random tokens whose lengths reproduce the seed's padding exactly; the only choice for
another ``--trajectories`` count). Either way the report and ``bench.md`` give the padding that
length buckets of 2, 4 and 8 add, beside the seed's (270, 616, 1,636).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from miniverl import progress
from miniverl.bench.argtypes import non_negative_int, positive_int
from miniverl.bench.oracle_workload import (
    ROW_SOURCES,
    SEED_PADDING,
    hashed_encoder,
    oracle_workload,
    padding_by_batch,
    padding_note,
)
from miniverl.bench.render import evaluate_goals, render_markdown, render_pareto_svg
from miniverl.canonical import atomic_write_json, atomic_write_text, sha256_file, sha256_json
from miniverl.gate.models import MODEL_CHOICES, PreparedModel, prepare_model
from miniverl.gate.workload import Workload, models_section, set_student_init, synthetic_workload
from miniverl.models.loading import resolve_device
from miniverl.runtime import AutoPolicy, build_runtime
from miniverl.runtime.base import BatchSize, RoleRuntime
from miniverl.runtime.handles import release_device_memory
from miniverl.runtime.loading import DTYPES
from miniverl.runtime.objectives import ObjectiveResult, ObjectiveSpec, accumulate_objective, score_teacher

FORMAT = "miniverl-runtime-bench/v1"
BATCHES: tuple[BatchSize, ...] = (1, 2, 4, "auto")
RUNTIMES = ("dual_model", "shared_backbone")
GIB = float(1 << 30)


@dataclass
class BenchOptions:
    model: str = "tiny"
    device: str = "auto"
    quantization: str = "none"
    dtype: str = "float32"
    trajectories: int = 8
    warmup: int = 1
    repeats: int = 3
    chunk_size: int = 64
    activation_checkpointing: int = 1
    auto_overhead_tokens: int | None = None
    auto_max_tokens: int | None = None
    auto_calibrate: bool = True
    learning_rate: float = 1e-4
    profile_cell: str = "shared_backbone:auto"
    switch_trials: int = 20
    seed: int = 0
    rows: str = "oracle-sql"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def one_update(
    runtime: RoleRuntime, work: Workload, objective: ObjectiveSpec, batch: BatchSize, optimizer: torch.optim.Optimizer
) -> ObjectiveResult:
    """Teacher scoring + student forward/backward per physical batch + optimizer step."""
    optimizer.zero_grad(set_to_none=True)
    targets = score_teacher(runtime, work.rows, objective, trajectory_batch_size=batch)
    result = accumulate_objective(
        runtime, work.rows, objective, trajectory_batch_size=batch, targets=targets, token_weights=work.token_weights
    )
    optimizer.step()
    return result


def measure_switch_ms(runtime: RoleRuntime, device: torch.device, trials: int) -> float:
    """Mean wall time of one role switch (student -> teacher or back), synchronized."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(trials):
        with runtime.use("teacher"):
            pass
    _sync(device)
    return (time.perf_counter() - start) / (2 * max(trials, 1)) * 1e3


def profile_update(runtime: RoleRuntime, run: Any, device: torch.device, top: int = 20) -> dict[str, Any]:
    """One extra update under ``torch.profiler``: the top self-time operators, checksummed."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        run()
        _sync(device)
    events = prof.key_averages()
    on_device = device.type == "cuda"

    def self_time(e: Any) -> float:
        if on_device:
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))
        return float(e.self_cpu_time_total)

    rows = sorted(events, key=self_time, reverse=True)
    total = sum(self_time(e) for e in events) or 1.0
    matmul = sum(self_time(e) for e in events if _is_matmul(e.key))
    ops = [
        {
            "name": e.key,
            "calls": int(e.count),
            "self_time_us": round(self_time(e), 3),
            "share": round(self_time(e) / total, 6),
            "self_cpu_time_us": round(float(e.self_cpu_time_total), 3),
        }
        for e in rows[:top]
    ]
    summary: dict[str, Any] = {
        "format": "miniverl-profiler-summary/v1",
        "sort_by": "self_device_time" if on_device else "self_cpu_time",
        "total_self_time_us": round(total, 3),
        "matmul_share": round(matmul / total, 6),
        "ops": ops,
    }
    summary["sha256"] = sha256_json(summary)
    return summary


def _is_matmul(name: str) -> bool:
    lowered = name.lower()
    return lowered in ("aten::mm", "aten::bmm", "aten::addmm", "aten::matmul", "aten::linear") or any(
        k in lowered for k in ("gemm", "cutlass", "sm90_xmma", "ampere_sgemm", "cublas", "nvjet")
    )


def calibrate_overhead_tokens(cells: list[dict[str, Any]], lengths: list[int]) -> dict[str, Any] | None:
    """Fit ``update_s = c + a * forwards + b * padded_tokens`` through the fixed-batch cells (1, 2, 4).

    ``a / b`` is the per-forward overhead in padded tokens, the one number ``auto``'s cost model
    needs. With three cells the fit is exact, so the model reproduces each fixed cell's measured
    time and ``auto``'s modelled optimum cannot be worse than the measured best fixed batch.
    A non-positive per-token cost with a positive per-forward cost means padding is free here:
    the overhead is then capped at 1e6 tokens (fewest forwards within the token budget). With a
    non-positive per-forward cost the fit is degenerate and ``overhead_tokens`` is ``None``.
    """
    fixed = [c for c in cells if c["trajectory_batch_size"] in (1, 2, 4)]
    if len(fixed) < 3:
        return None
    real = sum(lengths)
    rows = [[1.0, float(c["physical_forwards"]), float(real + c["padding_tokens"])] for c in fixed]
    times = [float(c["median_update_seconds"]) for c in fixed]
    a = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(times, dtype=torch.float64).unsqueeze(1)
    const, per_forward, per_token = (float(x) for x in torch.linalg.lstsq(a, y).solution.squeeze(1))
    fit = {"seconds_constant": const, "seconds_per_forward": per_forward, "seconds_per_padded_token": per_token}
    cap = 1_000_000
    if per_forward <= 0:
        return {"fit": fit, "overhead_tokens": None}
    if per_token <= 0:
        return {"fit": fit, "overhead_tokens": cap}
    return {"fit": fit, "overhead_tokens": min(round(per_forward / per_token), cap)}


def auto_policy_for(
    opts: BenchOptions, device: torch.device, calibration: dict[str, Any] | None
) -> tuple[AutoPolicy, str]:
    default = AutoPolicy.for_device(device, DTYPES[opts.dtype])
    max_tokens = opts.auto_max_tokens if opts.auto_max_tokens is not None else default.max_tokens
    if opts.auto_overhead_tokens is not None:
        return AutoPolicy(opts.auto_overhead_tokens, max_tokens), "option"
    if opts.auto_calibrate and calibration is not None and calibration.get("overhead_tokens") is not None:
        return AutoPolicy(int(calibration["overhead_tokens"]), max_tokens), "calibrated"
    return AutoPolicy(default.overhead_tokens, max_tokens), "device_default"


def measure_cell(
    prepared: PreparedModel,
    runtime_name: str,
    batch: BatchSize,
    work: Workload,
    opts: BenchOptions,
    device: torch.device,
    *,
    profile: bool,
    auto: AutoPolicy,
) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    section = models_section(
        runtime_name,
        student=prepared.student,
        adapter=prepared.adapter,
        dtype=opts.dtype,
        quantization=opts.quantization,
    )
    build_start = time.perf_counter()
    runtime = build_runtime(
        section,
        device=device,
        loader=prepared.loader,
        auto=auto,
        activation_checkpointing=opts.activation_checkpointing,
    )
    build_seconds = time.perf_counter() - build_start
    try:
        set_student_init(runtime, seed=opts.seed + 1)
        params = runtime.trainable_parameters()
        optimizer = torch.optim.AdamW(params, lr=opts.learning_rate, weight_decay=0.0)
        objective = ObjectiveSpec(
            kind="divergence", variant="exact", divergence="reverse_kl", chunk_size=opts.chunk_size
        )
        for _ in range(opts.warmup):
            one_update(runtime, work, objective, batch, optimizer)
        seconds, peaks, losses = [], [], []
        result = None
        switches_before = getattr(runtime, "switch_count", 0)
        for _ in range(opts.repeats):
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            _sync(device)
            start = time.perf_counter()
            result = one_update(runtime, work, objective, batch, optimizer)
            _sync(device)
            seconds.append(time.perf_counter() - start)
            losses.append(result.loss)
            if device.type == "cuda":
                peaks.append(torch.cuda.max_memory_reserved(device) / GIB)
        assert result is not None
        switches = (getattr(runtime, "switch_count", 0) - switches_before) / max(opts.repeats, 1)
        switch_ms = measure_switch_ms(runtime, device, opts.switch_trials)
        median = statistics.median(seconds)
        record: dict[str, Any] = {
            "runtime": runtime_name,
            "trajectory_batch_size": batch,
            "plan": [list(b) for b in result.plan],
            "physical_batch_sizes": [len(b) for b in result.plan],
            "physical_forwards": result.physical_forwards,
            "padding_tokens": result.padding_tokens,
            "update_seconds": seconds,
            "median_update_seconds": median,
            "trajectories_per_second": len(work.rows.input_ids) / median,
            "peak_reserved_gib": statistics.median(peaks) if peaks else None,
            "peak_reserved_gib_samples": peaks or None,
            "role_switches_per_update": switches,
            "role_switch_ms": switch_ms,
            "loss": losses,
            "build_seconds": build_seconds,
        }
        if profile:
            record["profiler"] = profile_update(
                runtime, lambda: one_update(runtime, work, objective, batch, optimizer), device
            )
        return record
    finally:
        runtime.close()
        release_device_memory(device)


def check_rows(opts: BenchOptions) -> None:
    """Refuse, before any model loads, rows that ``opts`` cannot have."""
    if opts.rows not in ROW_SOURCES:
        raise ValueError(f"unknown rows {opts.rows!r}; choose one of {', '.join(ROW_SOURCES)}")
    if opts.rows == "oracle-sql" and opts.trajectories != 8:
        raise ValueError(
            "--rows oracle-sql is the 8 oracle trajectories; leave --trajectories at 8 or pass --rows synthetic"
        )


def bench_workload(opts: BenchOptions, prepared: PreparedModel) -> tuple[Workload, str]:
    """The 8 trajectories ``opts.rows`` names, and how their tokens were made."""
    if opts.rows == "synthetic":
        work = synthetic_workload(prepared.vocab_size, trajectories=opts.trajectories, scale=prepared.workload_scale)
        return work, "random ids"
    check_rows(opts)
    if prepared.name == "smollm2":
        return oracle_workload(_smollm2_encoder(prepared)), "the SmolLM2 tokenizer (plain text, no chat template)"
    return oracle_workload(hashed_encoder(prepared.vocab_size)), "pre-tokenizer pieces hashed into the vocab"


def _smollm2_encoder(prepared: PreparedModel) -> Any:
    from miniverl.config.schema import ModelSpec
    from miniverl.models.loading import load_tokenizer
    from miniverl.models.sources import resolve

    resolved = resolve(ModelSpec.model_validate(prepared.student))
    if resolved.path is None or not resolved.path.is_dir():
        raise ValueError("the SmolLM2 tokenizer is not cached; run `miniverl models fetch smollm2-135m-instruct`")
    tokenizer = load_tokenizer(resolved.path)

    def encode(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    return encode


def run_runtime_bench(opts: BenchOptions, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Run the matrix and write ``bench.json``, ``bench.md``, ``pareto.svg`` and ``profiler.json``."""
    if opts.model not in MODEL_CHOICES:
        raise ValueError(f"unknown model {opts.model!r}; choose one of {', '.join(MODEL_CHOICES)}")
    check_rows(opts)
    device = resolve_device(opts.device)
    out_dir = Path(out)
    started = time.perf_counter()
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="miniverl-bench-") as work_dir:
        progress.phase("load", f"{opts.model} on {device}")
        prepared = prepare_model(opts.model, work_dir)
        work, tokens = bench_workload(opts, prepared)
        try:
            progress.task("bench runtime", len(BATCHES) * len(RUNTIMES), "cells")
            for batch in BATCHES:
                for name in RUNTIMES:
                    progress.advance(len(cells), f"bench runtime, measuring {name} x batch {batch}")
                    profile = opts.profile_cell == f"{name}:{batch}"
                    mine = [c for c in cells if c["runtime"] == name]
                    calibration = calibrate_overhead_tokens(mine, work.lengths) if batch == "auto" else None
                    auto, source = auto_policy_for(opts, device, calibration)
                    cell = measure_cell(prepared, name, batch, work, opts, device, profile=profile, auto=auto)
                    if batch == "auto":
                        cell["auto_policy"] = {**asdict(auto), "source": source, "calibration": calibration}
                    cells.append(cell)
            progress.advance(len(cells), "bench runtime")
        finally:
            prepared.close()
    profiler = next((c.pop("profiler") for c in cells if "profiler" in c), None)
    report: dict[str, Any] = {
        "format": FORMAT,
        "options": asdict(opts),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "cuda_alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "trajectories": {
            "count": len(work.rows.input_ids),
            "lengths": work.lengths,
            "digest": work.digest(),
            "selected_positions": sum(work.rows.selected_counts),
            "source": opts.rows,
            "tokens": tokens,
            "padding": padding_by_batch(work.lengths),
            "seed_padding": SEED_PADDING,
        },
        "objective": "strict OPD, exact reverse KL, one update (teacher scoring + student fwd/bwd + AdamW)",
        "cells": cells,
        "goals": evaluate_goals(cells, quantization=opts.quantization, device=device.type),
        "seconds": time.perf_counter() - started,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts: dict[str, str] = {}
    if profiler is not None:
        profiler["cell"] = opts.profile_cell
        profiler["sha256"] = sha256_json({k: v for k, v in profiler.items() if k != "sha256"})
        atomic_write_json(out_dir / "profiler.json", profiler, pretty=True)
        artifacts["profiler.json"] = sha256_file(out_dir / "profiler.json")
        report["profiler_summary_sha256"] = profiler["sha256"]
    atomic_write_text(out_dir / "pareto.svg", render_pareto_svg(report))
    note = padding_note(opts.rows, work.lengths, tokens)
    atomic_write_text(out_dir / "bench.md", render_markdown(report).rstrip("\n") + "\n\n" + note)
    artifacts["pareto.svg"] = sha256_file(out_dir / "pareto.svg")
    artifacts["bench.md"] = sha256_file(out_dir / "bench.md")
    report["artifacts"] = artifacts
    atomic_write_json(out_dir / "bench.json", report, pretty=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miniverl bench runtime", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODEL_CHOICES, default="tiny")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--quantization", choices=["none", "nf4"], default="none")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--trajectories", type=positive_int, default=8)
    parser.add_argument("--warmup", type=non_negative_int, default=1)
    parser.add_argument("--repeats", type=positive_int, default=3)
    parser.add_argument("--chunk-size", type=positive_int, default=64, help="rows per [chunk, V] projection")
    parser.add_argument(
        "--activation-checkpointing", type=non_negative_int, default=1, help="every n-th layer; 0 = off"
    )
    parser.add_argument("--auto-overhead-tokens", type=non_negative_int, default=None)
    parser.add_argument("--auto-max-tokens", type=positive_int, default=None)
    parser.add_argument(
        "--no-auto-calibrate", action="store_true", help="auto uses the device default cost model, not the fitted one"
    )
    parser.add_argument("--profile-cell", default="shared_backbone:auto")
    parser.add_argument(
        "--rows", choices=ROW_SOURCES, default="oracle-sql", help="which trajectories (synthetic: the seed's padding)"
    )
    parser.add_argument("--out", required=True, help="output directory")
    args = parser.parse_args(argv)
    opts = BenchOptions(
        model=args.model,
        device=args.device,
        quantization=args.quantization,
        dtype=args.dtype,
        trajectories=args.trajectories,
        warmup=args.warmup,
        repeats=args.repeats,
        chunk_size=args.chunk_size,
        activation_checkpointing=args.activation_checkpointing,
        auto_overhead_tokens=args.auto_overhead_tokens,
        auto_max_tokens=args.auto_max_tokens,
        auto_calibrate=not args.no_auto_calibrate,
        profile_cell=args.profile_cell,
        rows=args.rows,
    )
    try:
        check_rows(opts)
    except ValueError as refused:
        sys.stderr.write(f"{parser.prog}: error: {refused}\n")
        return 2
    report = run_runtime_bench(opts, args.out)
    sys.stdout.write(render_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

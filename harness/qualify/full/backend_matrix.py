"""Full workload ``backend-matrix`` (issue #11, v0.11): the preregistered 24-cell runtime matrix, conformance, the
rollout speed thresholds, CUDA teardown, and (from :mod:`harness.qualify.full.refresh`) the policy refreshes per rollout
backend, grouped trajectory identity and the vLLM boundary.

``run`` drives the installed CLI only: ``miniverl gate equivalence --objectives sft,kd,opd`` on the scale's matrix
model and the profile's device, then ``miniverl bench rollout --json`` at the preregistered size, the fast path and
its baseline timed in the preregistered number of interleaved pairs. ``judge`` reads the cells, tolerances and
thresholds from the preregistration committed in the harness (:data:`PREREGISTRATION`, a path fixed in code; never a
copy from the evidence) and re-judges every comparison from the observed values in the gate's report: the gate's own
verdict must agree, but it is not trusted alone. The speed figure is the median of the per-pair ratios, recomputed
from every pair's recorded timings; it is a threshold only where the policy requires ``speed_thresholds`` (a
dedicated machine), and elsewhere recorded, shown and ``not_applicable``.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.core.jsonio import canonical_bytes
from harness.qualify.full.backend_matrix_judge import judge
from harness.qualify.full.backend_matrix_layout import (
    BENCH_OUT,
    BENCH_STEP,
    COMPARISONS,
    FOLDER,
    GATE_OUT,
    GATE_STEP,
    NAME,
    PREREGISTRATION,
    PREREGISTRATION_SCHEMA,
    BackendMatrixPreregistration,
    load_preregistration,
    refresh_evidence,
    refresh_module,
)
from harness.qualify.full.base import Context, Workload
from harness.qualify.full.reading import read_json

__all__ = [
    "BENCH_STEP",
    "COMPARISONS",
    "EVIDENCE",
    "GATE_STEP",
    "NAME",
    "PREREGISTRATION",
    "PREREGISTRATION_SCHEMA",
    "WORKLOAD",
    "BackendMatrixPreregistration",
    "bench_argv",
    "judge",
    "load_preregistration",
    "run",
]


# -- run -----------------------------------------------------------------------------------------------------------
def _redacted(value: Any, ctx: Context) -> Any:
    if isinstance(value, str):
        return ctx.cli.redact.text(value)
    if isinstance(value, dict):
        return {str(k): _redacted(v, ctx) for k, v in value.items()}
    if isinstance(value, list):
        return [_redacted(v, ctx) for v in value]
    return value


#: v3 was preregistered on a bare model: the bench's LoRA-and-fold default (a later bench) would change its work
LORA_RANK_V3 = ("--lora-rank", "0")


def bench_argv(prereg: BackendMatrixPreregistration, device: str) -> list[str]:
    b = prereg.speed.bench
    return [
        "bench",
        "rollout",
        "--model",
        b.model,
        "--device",
        device,
        "--batches",
        str(b.batch),
        "--new-tokens",
        str(b.new_tokens),
        "--prompt-tokens",
        str(b.prompt_tokens),
        "--warmup",
        str(b.warmup),
        "--repeats",
        str(b.repeats),
        "--slow-repeats",
        str(b.slow_repeats),
        "--paths",
        f"{b.fast_path},{b.baseline_path}",
        "--pair",
        f"{b.fast_path},{b.baseline_path}",
        "--pairs",
        str(b.pairs),
        "--no-profile",
        *LORA_RANK_V3,
        "--out",
        BENCH_OUT,
        "--json",
    ]


def run(ctx: Context) -> dict[str, Path]:
    prereg, _ = load_preregistration()
    device = ctx.profile.device
    evidence: dict[str, Path] = {}
    # The timed step first: where workloads run side by side it runs alone, before anything else starts.
    bench = ctx.cli(BENCH_STEP, bench_argv(prereg, device), timeout=1800)
    printed = bench.json()
    if printed is not None:
        path = ctx.work / "rollout-bench.json"
        path.write_bytes(canonical_bytes(_redacted(printed, ctx)) + b"\n")
        evidence["rollout_bench"] = path
    # The 24-cell gate and the refresh runs share nothing but the work directory (distinct files in it).
    jobs = [_gate_run, _refresh_runs]
    forks = [replace(ctx, cli=ctx.cli.fork()) for _ in jobs]
    if ctx.scale.side_by_side:
        with ThreadPoolExecutor(max_workers=len(jobs), thread_name_prefix="backend-matrix") as pool:
            found = list(pool.map(lambda job, fork: job(fork, prereg), jobs, forks))
    else:
        found = [job(fork, prereg) for job, fork in zip(jobs, forks, strict=True)]
    for fork, files in zip(forks, found, strict=True):
        ctx.cli.results.extend(fork.cli.results)
        evidence.update(files)
    return evidence


def _gate_run(ctx: Context, prereg: BackendMatrixPreregistration) -> dict[str, Path]:
    device = ctx.profile.device
    ctx.cli(
        GATE_STEP,
        [*prereg.gate_argv, "--model", ctx.scale.matrix_model, "--device", device, "--out", GATE_OUT, "--json"],
        timeout=3600,
    )
    report = ctx.work / GATE_OUT
    if not report.is_file():  # the gate writes it whether or not every comparison passed
        return {}
    doc = read_json(report)
    if doc is not None:
        report.write_bytes(canonical_bytes(_redacted(doc, ctx)) + b"\n")
    return {"gate_report": report}


def _refresh_runs(ctx: Context, prereg: BackendMatrixPreregistration) -> dict[str, Path]:
    module = refresh_module()
    return module.run_refreshes(ctx) if module is not None else {}


EVIDENCE = {
    "gate_report": f"{FOLDER}/equivalence-report.json",
    "rollout_bench": f"{FOLDER}/rollout-bench.json",
    "transcript": f"{FOLDER}/transcript.json",
    **refresh_evidence(),
}

WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge, timed_steps=frozenset({BENCH_STEP}))

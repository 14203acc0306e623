"""The runtime equivalence gate: 8 cells, {dual_model, shared_backbone} x physical batch {1, 2, 4, auto}.

Every cell builds its runtime from scratch and runs one update on the same ordered trajectories
(unpadded sequences, selected positions, token weights), the same seeded student LoRA init, the
same teacher targets, the same AdamW settings and the same objective (strict OPD: exact reverse
KL by default). fp32 compute, eager attention, deterministic algorithms.

Each cell records its loss, its complete trainable gradient and the student's logits at probe
positions after the update. The reference cell is ``dual_model`` / batch 1. Declared comparisons:

* across all cells, against the reference: loss abs diff <= 1e-5; gradient max abs diff <= 3e-4;
  gradient max abs diff / reference max <= 3e-3; updated-logit max abs diff <= 3e-3 and, relative to
  the reference max, <= 3e-3;
* for each physical batch, dual and shared match exactly (loss, every gradient element, every
  probe logit) and run the same physical plan;
* trajectory, teacher-target and student-init digests are identical across cells.

Teacher targets are scored by each cell's own teacher role at batch 1, so the target digest check
proves that both runtimes score bit-identically; how far the cell's batched teacher scoring drifts
from that is reported (informational). Every observed value is computed; nothing is hard-coded.
"""

from __future__ import annotations

import os
import platform
import tempfile
import time
from typing import Any

import torch

from miniverl.canonical import atomic_write_json
from miniverl.gate.models import prepare_model
from miniverl.gate.workload import Workload, deterministic_torch, models_section, set_student_init, synthetic_workload
from miniverl.models.loading import resolve_device
from miniverl.runtime import AutoPolicy, build_runtime
from miniverl.runtime.base import BatchSize, RoleRuntime, SequenceRows
from miniverl.runtime.objectives import ObjectiveSpec, accumulate_objective, score_teacher

FORMAT = "miniverl-equivalence-gate/v1"
BATCHES: tuple[BatchSize, ...] = (1, 2, 4, "auto")
RUNTIMES = ("dual_model", "shared_backbone")
TOLERANCES = {
    "loss_abs_diff": 1e-5,
    "grad_max_abs_diff": 3e-4,
    "grad_max_rel_to_reference_max": 3e-3,
    "updated_logit_max_abs_diff": 3e-3,
    "updated_logit_max_rel_to_reference_max": 3e-3,
}
PROBE_ROWS, PROBE_POSITIONS = 2, 32


def _probe_rows(rows: SequenceRows) -> SequenceRows:
    n = min(PROBE_ROWS, len(rows.input_ids))
    return SequenceRows(rows.input_ids[:n], tuple(p[:PROBE_POSITIONS] for p in rows.selected_positions[:n]))


@torch.no_grad()
def _probe_logits(runtime: RoleRuntime, rows: SequenceRows) -> torch.Tensor:
    with runtime.use("student") as handle:
        hidden = handle.selected_hidden(_probe_rows(rows), trajectory_batch_size=1)
        head = handle.head_weight
        return (hidden.float() @ head.float().t()).cpu()


def run_cell(
    runtime: RoleRuntime,
    workload: Workload,
    objective: ObjectiveSpec,
    batch: BatchSize,
    *,
    init_seed: int,
    learning_rate: float,
) -> dict[str, Any]:
    """One update in one cell; returns tensors (``_tensors``) and the cell's JSON-able record."""
    init_digest = set_student_init(runtime, seed=init_seed)
    targets = score_teacher(runtime, workload.rows, objective, trajectory_batch_size=1)
    batched = score_teacher(
        runtime, workload.rows, ObjectiveSpec(kind="divergence", variant="exact"), trajectory_batch_size=batch
    )
    reference_hidden = targets.hidden if targets.hidden is not None else None
    drift = None
    if reference_hidden is not None and batched.hidden is not None:
        drift = float((batched.hidden - reference_hidden).abs().max())
    params = sorted(runtime.named_trainable_parameters())
    for _, p in params:
        p.grad = None
    start = time.perf_counter()
    result = accumulate_objective(
        runtime,
        workload.rows,
        objective,
        trajectory_batch_size=batch,
        targets=targets,
        token_weights=workload.token_weights,
    )
    grads = {name: p.grad.detach().float().cpu().clone() for name, p in params if p.grad is not None}
    optimizer = torch.optim.AdamW(
        [p for _, p in params], lr=learning_rate, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0
    )
    optimizer.step()
    seconds = time.perf_counter() - start
    logits = _probe_logits(runtime, workload.rows)
    record = {
        "runtime": runtime.runtime,
        "trajectory_batch_size": batch,
        "plan": [list(b) for b in result.plan],
        "physical_forwards": result.physical_forwards,
        "padding_tokens": result.padding_tokens,
        "loss": result.loss,
        "grad_abs_max": max(float(g.abs().max()) for g in grads.values()),
        "trainable_tensors": len(params),
        "trajectory_digest": workload.digest(),
        "target_digest": targets.digest(),
        "student_init_digest": init_digest,
        "teacher_batched_hidden_max_abs_diff": drift,
        "update_seconds": seconds,
    }
    return {"record": record, "grads": grads, "logits": logits, "loss": result.loss}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    if a.keys() != b.keys():
        return float("inf")
    return max((float((a[k] - b[k]).abs().max()) for k in a), default=0.0)


def _comparison(name: str, observed: float, tolerance: float | None, passed: bool, **extra: Any) -> dict[str, Any]:
    value: float | None = observed if observed == observed and abs(observed) != float("inf") else None
    return {"name": name, "observed": value, "tolerance": tolerance, "passed": bool(passed), **extra}


def compare_cells(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The declared comparisons over finished cells (the first cell is the reference)."""
    ref = cells[0]
    ref_grad_max = max(float(g.abs().max()) for g in ref["grads"].values())
    ref_logit_max = float(ref["logits"].abs().max())
    loss = max(abs(c["loss"] - ref["loss"]) for c in cells)
    grad = max(_max_diff(c["grads"], ref["grads"]) for c in cells)
    logit = max(float((c["logits"] - ref["logits"]).abs().max()) for c in cells)
    observed = {
        "loss_abs_diff": loss,
        "grad_max_abs_diff": grad,
        "grad_max_rel_to_reference_max": grad / ref_grad_max if ref_grad_max > 0 else float("inf"),
        "updated_logit_max_abs_diff": logit,
        "updated_logit_max_rel_to_reference_max": logit / ref_logit_max if ref_logit_max > 0 else float("inf"),
    }
    out = [_comparison(k, v, TOLERANCES[k], v <= TOLERANCES[k]) for k, v in observed.items()]
    by_key = {(c["record"]["runtime"], c["record"]["trajectory_batch_size"]): c for c in cells}
    for batch in BATCHES:
        dual, shared = by_key.get(("dual_model", batch)), by_key.get(("shared_backbone", batch))
        if dual is None or shared is None:
            out.append(_comparison(f"dual_equals_shared_exactly[batch={batch}]", float("inf"), 0.0, False))
            continue
        diffs = {
            "loss": abs(dual["loss"] - shared["loss"]),
            "grad": _max_diff(dual["grads"], shared["grads"]),
            "logits": float((dual["logits"] - shared["logits"]).abs().max()),
        }
        same_plan = dual["record"]["plan"] == shared["record"]["plan"]
        worst = max(diffs.values())
        out.append(
            _comparison(
                f"dual_equals_shared_exactly[batch={batch}]",
                worst,
                0.0,
                worst == 0.0 and same_plan,
                max_abs_diffs=diffs,
                same_physical_plan=same_plan,
            )
        )
    for digest in ("trajectory_digest", "target_digest", "student_init_digest"):
        distinct = sorted({c["record"][digest] for c in cells})
        out.append(_comparison(f"{digest}_identical_across_cells", float(len(distinct)), 1.0, len(distinct) == 1))
    return out


def run_equivalence_gate(
    *,
    model: str = "tiny",
    device: str = "cpu",
    quantization: str = "none",
    out: str | os.PathLike[str] | None = None,
    objective: ObjectiveSpec | None = None,
    trajectories: int = 8,
    learning_rate: float = 1e-4,
    seed: int = 0,
) -> dict[str, Any]:
    """Run all 8 cells and return the report (also written to ``out`` as JSON when given)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch_device = resolve_device(device)
    if torch_device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    objective = objective or ObjectiveSpec(kind="divergence", variant="exact", divergence="reverse_kl", chunk_size=256)
    cells: list[dict[str, Any]] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="miniverl-gate-") as work, deterministic_torch():
        prepared = prepare_model(model, work)
        workload = synthetic_workload(prepared.vocab_size, trajectories=trajectories, scale=prepared.workload_scale)
        try:
            for batch in BATCHES:
                for name in RUNTIMES:
                    section = models_section(
                        name,
                        student=prepared.student,
                        adapter=prepared.adapter,
                        dtype="float32",
                        quantization=quantization,
                    )
                    runtime = build_runtime(
                        section,
                        device=torch_device,
                        loader=prepared.loader,
                        auto=AutoPolicy.for_device(torch_device, torch.float32),
                    )
                    try:
                        cells.append(
                            run_cell(
                                runtime, workload, objective, batch, init_seed=seed + 1, learning_rate=learning_rate
                            )
                        )
                    finally:
                        runtime.close()
        finally:
            prepared.close()
    comparisons = compare_cells(cells)
    failed = [c["name"] for c in comparisons if not c["passed"]]
    report = {
        "format": FORMAT,
        "status": "passed" if not failed else "failed",
        "reasons": [f"comparison {name} failed" for name in failed],
        "model": model,
        "device": torch_device.type,
        "device_name": torch.cuda.get_device_name(torch_device) if torch_device.type == "cuda" else platform.machine(),
        "quantization": quantization,
        "compute_dtype": "float32",
        "attention": "eager",
        "torch": torch.__version__,
        "objective": {k: getattr(objective, k) for k in objective.__dataclass_fields__},
        "optimizer": {"name": "AdamW", "lr": learning_rate, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0},
        "trajectories": {
            "count": trajectories,
            "lengths": workload.lengths,
            "digest": workload.digest(),
            "selected_positions": sum(workload.rows.selected_counts),
        },
        "cells": [c["record"] for c in cells],
        "comparisons": comparisons,
        "declared_comparisons": len(comparisons),
        "passed_comparisons": sum(c["passed"] for c in comparisons),
        "seconds": time.perf_counter() - started,
    }
    if out is not None:
        atomic_write_json(out, report, pretty=True)
    return report


def main(argv: list[str] | None = None) -> int:
    """``python -m miniverl.gate.equivalence``: exit 0 when every comparison passed, 1 otherwise."""
    import argparse
    import json
    import sys

    from miniverl.gate.models import MODEL_CHOICES

    parser = argparse.ArgumentParser(prog="miniverl gate equivalence", description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODEL_CHOICES, default="tiny")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu")
    parser.add_argument("--quantization", choices=["none", "nf4"], default="none")
    parser.add_argument("--out", required=True, help="report JSON path")
    args = parser.parse_args(argv)
    report = run_equivalence_gate(model=args.model, device=args.device, quantization=args.quantization, out=args.out)
    summary = {c["name"]: {"observed": c["observed"], "passed": c["passed"]} for c in report["comparisons"]}
    sys.stdout.write(json.dumps({"status": report["status"], "comparisons": summary}, indent=2) + "\n")
    return 0 if report["status"] == "passed" else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""``miniverl bench grpo``: one GRPO step (rollout + update) and the update alone, side by side in one process.

Same random weights (a model shape from its config, seeded), same prompts (``prompt_tokens`` random
ids per row), same sampling (temperature 1) and fixed completion lengths (no reachable EOS id), so
lengths cannot decide a ratio.

GRPO step paths (``prompts`` groups of ``samples`` completions of ``new_tokens`` tokens):

* ``miniverl_fast``: miniverl's step as training runs it: :func:`miniverl.rollout.generate_group`
  with the fast engine, seeded rewards, group advantages, :func:`~miniverl.training.algorithms.grpo.grpo_update`
  on the role runtime (LoRA r16, PEFT's default fp32 adapter), gradient clipping, AdamW;
* ``miniverl_fast_bf16``: the same with bf16 adapter tensors and fp32 master copies in the
  optimizer (:class:`~miniverl.training.update.Bf16MasterAdapter`; bf16 models only);
* ``miniverl_lean``: the step as training builds it: ``adapter_precision`` auto (bf16 + fp32 masters on
  a bf16 model) through :class:`~miniverl.training.algorithms.base.TrainedParameters`, and with
  ``--memory-budget-gib`` the memory plan's activation checkpointing, micro-batch and log-prob chunk
  (``--memory-budget-gib trl``: under TRL's peak reserved as measured in the same run, its cell first);
* ``miniverl_hf``: the same step with the transformers decode loop (``engine="hf"``);
* ``trl``: TRL's ``GRPOTrainer`` on the same model shape and lengths when ``trl`` is importable,
  else recorded ``not_run`` with the reason (never ``passed``);
* by name: ``miniverl_lean_fused`` / ``miniverl_lean_liger`` (the lean step with ``train.fused_kernels`` triton or
  liger), ``miniverl_lean_compiled`` (its decoder layers through ``torch.compile``, a probe), ``miniverl_lean_nf4``
  (the lean step over an NF4 student, rolled out by the HF loop over the NF4 model; Qwen3 shapes), ``trl_liger``
  (TRL with its liger-kernel switch).

Update paths (``update_shape`` = B rows of T tokens, the first ``min(32, T // 4)`` the prompt):

* ``naive_hf_peft``: HF + PEFT as a first implementation writes it: full logits, ``log_softmax``
  over the vocabulary in fp32, the policy-gradient loss, backward, AdamW (PEFT's fp32 adapter);
* ``miniverl_update``: :func:`grpo_update` on the role runtime (chunked log-probs of the selected
  positions only) + AdamW, PEFT's fp32 adapter;
* ``miniverl_update_bf16``: the same with :class:`Bf16MasterAdapter` (bf16 models only);
* by name: ``miniverl_update_bf16_fused`` / ``miniverl_update_bf16_liger``: with the fused training kernels;
  ``miniverl_update_bf16_compiled``: every decoder layer through ``torch.compile`` (a probe).

Per cell: ``warmup`` untimed steps (the first is ``first_call_seconds``: graph capture, cuDNN/SDPA
plans), then the median of ``repeats`` (default 5) CUDA-synchronized steps with their spread (range,
quartiles); peak reserved is ``torch.cuda.max_memory_reserved`` over the timed steps, each cell
starting from an emptied cache with its own model (the previous cell's runner and model dropped first).
Each miniverl cell also records ``estimated_peak_gib``, the memory plan's estimate for its settings.
Writes ``grpo.json``, ``grpo.md`` and ``grpo.svg``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from miniverl import progress
from miniverl.bench.common import package_version, save_partial, spread
from miniverl.bench.grpo_args import (
    FUSED_STEP_PATHS,
    FUSED_UPDATE_PATHS,
    GrpoBenchOptions,
    add_grpo_arguments,
    options_from_args,
    validate_options,
)
from miniverl.bench.grpo_lean import estimated_peak_gib
from miniverl.bench.grpo_models import RandomLoader, release, sync
from miniverl.bench.grpo_step import step_runner, trl_cell
from miniverl.bench.grpo_update import fused_kind, update_runner
from miniverl.canonical import atomic_write_json, atomic_write_text, sha256_file
from miniverl.errors import UsageError
from miniverl.models.loading import resolve_device
from miniverl.runtime.fused import fused_unavailable_reason

__all__ = ["FORMAT", "GrpoBenchOptions", "main", "measure", "options_from_args", "ratios", "run_grpo_bench"]

FORMAT = "miniverl-grpo-bench/v1"
GIB = float(1 << 30)


def measure(run: Callable[[int], dict[str, float]], *, warmup: int, repeats: int, device: torch.device
            ) -> dict[str, Any]:  # fmt: skip
    first = None
    step = 0
    for _ in range(warmup):
        sync(device)
        start = time.perf_counter()
        run(step)
        step += 1
        first = first if first is not None else time.perf_counter() - start
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    parts: list[dict[str, float]] = []
    for _ in range(repeats):
        parts.append(run(step))
        step += 1
    totals = [sum(p.values()) for p in parts]
    out: dict[str, Any] = {
        "status": "measured",
        "first_call_seconds": first,
        "step_seconds": totals,
        "median_step_seconds": statistics.median(totals),
        "spread_step_seconds": spread(totals),
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None,
    }
    for key in parts[0]:
        out[f"median_{key}"] = statistics.median(p[key] for p in parts)
    return out


def nf4_unavailable_reason(model: str) -> str | None:
    """Why an NF4 cell cannot run here (``None``: it can): the gate's NF4 loader builds Qwen3 shapes only."""
    import importlib.util

    if model == "smollm2-shape":
        return "the NF4 cell quantizes a Qwen3 shape (--model tiny or qwen3-0.6b-shape)"
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed (the cuda extra)"
    return None


def run_grpo_bench(opts: GrpoBenchOptions, out: str | Path) -> dict[str, Any]:
    """Measure every step and update cell; write ``grpo.json``, ``grpo.md`` and ``grpo.svg``."""
    from miniverl.bench.grpo_render import evaluate_grpo_goals, render_grpo_markdown, render_grpo_svg

    validate_options(opts)
    device = resolve_device(opts.device)
    dtype_name = opts.dtype if opts.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    started = time.perf_counter()
    loader = RandomLoader(opts.model, opts.seed)
    completion_tokens = opts.prompts * opts.samples * opts.new_tokens
    cells: list[dict[str, Any]] = []
    sections = [("update", p) for p in opts.update_paths] + [("step", p) for p in opts.paths]  # cheap ones first
    if opts.memory_budget_gib == "trl" and "trl" in opts.paths:  # TRL's peak is the lean path's budget
        sections.remove(("step", "trl"))
        sections.insert(0, ("step", "trl"))
    progress.task("bench grpo", len(sections), "cells")
    for section, path in sections:
        progress.advance(len(cells), f"bench grpo, measuring {section} {path}")
        cell: dict[str, Any] = {"section": section, "path": path}
        release(device)
        if device.type == "cuda":  # what an earlier cell left behind would count in this cell's peak
            cell["allocated_at_start_gib"] = torch.cuda.memory_allocated(device) / GIB
        fused = fused_kind(path)
        unfusable = fused_unavailable_reason(fused, device) if fused is not None else None
        if "_bf16" in path and dtype_name != "bfloat16":
            cell.update(status="not_run", reason="bf16 adapter with fp32 masters needs a bf16 model (--dtype)")
        elif unfusable is not None:
            cell.update(status="not_run", reason=unfusable)
        elif path.endswith("_nf4") and (why := nf4_unavailable_reason(opts.model)) is not None:
            cell.update(status="not_run", reason=why)
        elif path in ("trl", "trl_liger"):
            cell.update(trl_cell(loader, opts, device, dtype_name, liger=path == "trl_liger"))
        elif path.startswith("miniverl_lean") and opts.memory_budget_gib == "trl" and _trl_peak(cells) is None:
            cell.update(status="not_run", reason="--memory-budget-gib trl, and TRL's peak reserved was not measured")
        else:
            factory = step_runner if section == "step" else update_runner
            holder: Any = None
            run: Any = None
            cell_opts = opts
            if opts.memory_budget_gib == "trl":
                cell_opts = dataclasses.replace(opts, memory_budget_gib=_trl_peak(cells))
                cell["memory_budget_gib"], cell["memory_budget_from"] = cell_opts.memory_budget_gib, "trl"
            try:
                run, holder = factory(path, loader, cell_opts, device, dtype_name)
                cell.update(measure(run, warmup=opts.warmup, repeats=opts.repeats, device=device))
                cell["estimated_peak_gib"] = estimated_peak_gib(
                    section, path, holder, cell_opts, device, dtype_name, loader.config
                )
                plan = getattr(holder, "memory_plan", None)
                if plan is not None:
                    cell["memory_plan"] = plan.metrics()
                _say_estimate(cell)
            except (RuntimeError, ValueError) as exc:  # one broken path must not hide the others' figures
                cell.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
            finally:
                close = getattr(holder, "close", None)
                if callable(close):
                    close()
                # the runner's closure holds the model and optimizer too: drop both, so that the next
                # cell's release empties an allocator that holds nothing of this one
                del holder, run
        if cell.get("status") == "measured" and section == "step":
            cell["completion_tokens"] = completion_tokens
            cell["completion_tokens_per_second"] = completion_tokens / cell["median_step_seconds"]
        if cell.get("status") == "measured":
            cell["ms_per_step"] = cell["median_step_seconds"] * 1e3
        cells.append(cell)
        save_partial(Path(out) / "grpo.partial.json", FORMAT, cells)
    progress.advance(len(cells), "bench grpo")
    release(device)
    report: dict[str, Any] = {
        "format": FORMAT,
        "options": asdict(opts),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "peft": package_version("peft"),
        "trl": package_version("trl"),
        "threads": torch.get_num_threads(),
        "dtype": dtype_name,
        "completion_tokens_per_step": completion_tokens,
        "cells": cells,
        "seconds": time.perf_counter() - started,
    }
    report["ratios"] = ratios(cells)
    report["goals"] = evaluate_grpo_goals(report)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "grpo.md", render_grpo_markdown(report))
    atomic_write_text(out_dir / "grpo.svg", render_grpo_svg(report))
    report["artifacts"] = {name: sha256_file(out_dir / name) for name in ("grpo.md", "grpo.svg")}
    atomic_write_json(out_dir / "grpo.json", report, pretty=True)
    (out_dir / "grpo.partial.json").unlink(missing_ok=True)
    return report


def _trl_peak(cells: list[dict[str, Any]]) -> float | None:
    """TRL's measured peak reserved GiB among the cells run so far (``None``: not measured)."""
    for cell in cells:
        if cell["path"] == "trl" and cell.get("status") == "measured" and cell.get("peak_reserved_gib"):
            return float(cell["peak_reserved_gib"])
    return None


def _say_estimate(cell: dict[str, Any]) -> None:
    """One line per miniverl cell: the memory plan's estimate beside the measured peak (CUDA)."""
    estimated, measured = cell.get("estimated_peak_gib"), cell.get("peak_reserved_gib")
    if estimated is None:
        return
    seen = f"measured {measured:.2f} GiB" if measured is not None else "not measured (no CUDA)"
    progress.phase("memory", f"{cell['section']} {cell['path']}: estimated {estimated:.2f} GiB peak reserved, {seen}")


def ratios(cells: list[dict[str, Any]]) -> dict[str, float | None]:
    """Speed (time ratio, reference / ours) and memory (peak reserved, ours / reference) between paths."""
    by = {(c["section"], c["path"]): c for c in cells if c.get("status") == "measured"}

    def speed(section: str, ours: str, ref: str) -> float | None:
        a, b = by.get((section, ours)), by.get((section, ref))
        return None if a is None or b is None else b["median_step_seconds"] / a["median_step_seconds"]

    def memory(section: str, ours: str, ref: str) -> float | None:
        a, b = by.get((section, ours)), by.get((section, ref))
        if a is None or b is None or a["peak_reserved_gib"] is None or not b["peak_reserved_gib"]:
            return None
        return float(a["peak_reserved_gib"] / b["peak_reserved_gib"])

    out: dict[str, float | None] = {}
    for ours in ("miniverl_fast", "miniverl_fast_bf16", "miniverl_lean", *FUSED_STEP_PATHS):
        out[f"step_speed_{ours}_vs_miniverl_hf"] = speed("step", ours, "miniverl_hf")
        out[f"step_speed_{ours}_vs_trl"] = speed("step", ours, "trl")
        out[f"step_memory_{ours}_vs_trl"] = memory("step", ours, "trl")
    for ours in ("miniverl_update", "miniverl_update_bf16", *FUSED_UPDATE_PATHS):
        out[f"update_speed_{ours}_vs_naive_hf_peft"] = speed("update", ours, "naive_hf_peft")
        out[f"update_memory_{ours}_vs_naive_hf_peft"] = memory("update", ours, "naive_hf_peft")
    return out


def main(argv: list[str] | None = None) -> int:
    from miniverl.bench.grpo_render import render_grpo_markdown

    parser = argparse.ArgumentParser(prog="miniverl bench grpo", description=(__doc__ or "").splitlines()[0])
    add_grpo_arguments(parser)
    args = parser.parse_args(argv)
    try:
        report = run_grpo_bench(options_from_args(args), args.out)
    except UsageError as exc:
        sys.stderr.write(f"miniverl: error: {exc}\n")
        return 2
    sys.stdout.write(render_grpo_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

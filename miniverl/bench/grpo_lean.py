"""The ``miniverl_lean`` path of ``miniverl bench grpo``: the step as training builds it, with the memory plan
(``--memory-budget-gib``), and the memory plan's peak estimate beside every miniverl cell."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import torch

from miniverl import progress
from miniverl.bench.grpo_args import HF_ROLLOUT_PATHS, GrpoBenchOptions
from miniverl.bench.grpo_models import RandomLoader, role_runtime
from miniverl.gate.models import LORA_TARGETS
from miniverl.runtime.fused import FusedKernels


def lean_workload(opts: GrpoBenchOptions, device: torch.device, dtype_name: str, precision: str,
                   fast: bool = True, fused: bool = False, quantized: bool = False) -> Any:  # fmt: skip
    """The memory plan's view of the bench's GRPO step (no frozen models beside the student)."""
    from miniverl.runtime.memory_plan import Workload

    rows = opts.prompts * opts.samples
    return Workload(
        dtype=dtype_name,  # type: ignore[arg-type]
        adapter_precision=precision,  # type: ignore[arg-type]
        lora_rank=16,
        lora_targets=tuple(LORA_TARGETS),
        row_tokens=opts.prompt_tokens + opts.new_tokens,
        update_rows=rows,
        logprob_chunk=1024,
        rollout_rows=min(opts.rollout_batch, rows),
        rollout_capacity=opts.prompt_tokens + opts.new_tokens,
        fast_engine=fast and device.type == "cuda",
        fused_kernels=fused,
        quantized=quantized,
    )


def lean_precision(dtype_name: str) -> Literal["fp32", "bf16_master"]:
    """The lean path's adapter precision: bf16_master on a bf16 model (on CPU too, as a config may choose it;
    training's ``auto`` picks it on CUDA only), else PEFT's fp32 adapter."""
    return "bf16_master" if dtype_name == "bfloat16" else "fp32"


def lean_runtime(loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str,
                 fused: FusedKernels | None = None, nf4: bool = False) -> tuple[Any, Any]:  # fmt: skip
    """The runtime and optimizer as training builds them: ``adapter_precision: auto`` (bf16_master on a
    bf16 model; CPU included, as a config may choose it), :class:`TrainedParameters` (clip, AdamW over
    the masters), ``fused`` as ``train.fused_kernels`` (before the plan, which counts their smaller
    activations), ``nf4`` an NF4 student (bitsandbytes), and with ``--memory-budget-gib`` the memory plan
    (checkpointing and micro-batch ``auto``) applied to the runtime; without a budget, training's defaults (no
    checkpointing)."""
    from miniverl.runtime.memory_plan import DecoderDims, choose_plan
    from miniverl.training.algorithms.base import TrainedParameters

    rows = opts.prompts * opts.samples
    precision = lean_precision(dtype_name)
    runtime = role_runtime(
        loader, device, dtype_name, train_batch=rows, checkpointing=0, quantization="nf4" if nf4 else "none"
    )
    runtime.memory_plan = None
    if fused is not None:
        runtime.fuse_training_kernels(fused)
    if opts.memory_budget_gib is not None:
        assert isinstance(opts.memory_budget_gib, float), "run_grpo_bench resolves 'trl' first"
        plan = choose_plan(
            DecoderDims.from_hf_config(runtime.student_config()),
            lean_workload(opts, device, dtype_name, precision, fast=not nf4, fused=fused is not None, quantized=nf4),
            opts.memory_budget_gib,
            activation_checkpointing="auto",
            trajectory_batch_size="auto",
        )
        runtime.apply_memory_plan(
            activation_checkpointing=plan.activation_checkpointing,
            max_tokens=plan.max_tokens,
            release_rollout_engine=plan.release_rollout,
        )
        runtime.bench_config.train.trajectory_batch_size = "auto"
        runtime.bench_config.train.logprob_chunk_size = plan.logprob_chunk
        runtime.memory_plan = plan
        progress.phase("memory plan", plan.describe())
    trainer = TrainedParameters(
        list(runtime.named_trainable_parameters()), lr=opts.learning_rate, betas=(0.9, 0.999), eps=1e-8,
        weight_decay=0.0, max_grad_norm=1.0, bf16_master=precision == "bf16_master",
    )  # fmt: skip
    return runtime, trainer


def estimated_peak_gib(section: str, path: str, holder: Any, opts: GrpoBenchOptions, device: torch.device,
                       dtype_name: str, config: Any) -> float | None:  # fmt: skip
    """The memory plan's estimate for a miniverl cell, with the settings that cell ran (None: not miniverl's)."""

    from miniverl.runtime.memory_plan import GIB as PLAN_GIB
    from miniverl.runtime.memory_plan import DecoderDims, estimate

    if not path.startswith("miniverl"):
        return None
    plan = getattr(holder, "memory_plan", None)
    if plan is not None:
        return float(plan.estimate.peak / PLAN_GIB)
    dims = DecoderDims.from_hf_config(config)
    lean = path.startswith("miniverl_lean")
    bf16 = "_bf16" in path or (lean and lean_precision(dtype_name) == "bf16_master")
    fused = path.endswith(("_fused", "_liger"))
    every = opts.activation_checkpointing if not lean else 0
    checkpointed = -(-dims.layers // every) if every else 0
    if section == "update":
        batch, length = opts.update_shape
        work = dataclasses.replace(
            lean_workload(opts, device, dtype_name, "bf16_master" if bf16 else "fp32", fast=False),
            row_tokens=length, update_rows=batch, rollout_rows=1, rollout_capacity=1, fused_kernels=fused,
        )  # fmt: skip
        rows = batch
    else:
        precision = "bf16_master" if bf16 else "fp32"
        nf4 = path.endswith("_nf4")
        fast = path not in HF_ROLLOUT_PATHS
        work = lean_workload(opts, device, dtype_name, precision, fast=fast, fused=fused, quantized=nf4)
        rows = opts.prompts * opts.samples
    return float(estimate(dims, work, micro_rows=rows, checkpointed_layers=checkpointed).peak / PLAN_GIB)

"""The run's memory plan: the estimator's inputs taken from the config, the loaded runtime and the data.

With ``memory.max_peak_reserved_gib`` set, :func:`plan_memory` chooses what the config leaves
``auto`` (``train.activation_checkpointing``, ``train.trajectory_batch_size``) and the log-prob chunk
(at most ``train.logprob_chunk_size``) and whether the fast rollout engine is released after each
rollout from :func:`miniverl.runtime.memory_plan.choose_plan`, and applies them to the runtime and the
run's config. Without a budget it returns ``None`` and nothing changes
(``activation_checkpointing: auto`` is then off).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from miniverl.config.schema import OFFLINE_ALGORITHMS, MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import UsageError
from miniverl.runtime.base import RoleRuntime
from miniverl.runtime.memory_plan import DecoderDims, MemoryPlan, VllmMemory, Workload, choose_plan, vllm_memory
from miniverl.training.algorithms.base import AdapterPrecision


def longest_prompt_tokens(tokenizer: Any, rows: Sequence[PromptRow], *, use_chat_template: bool) -> int:
    """The longest prompt of the dataset in the student's tokens (the rollout's encoding)."""
    from miniverl.rollout.hf import encode_prompt

    return max((len(encode_prompt(tokenizer, r.prompt, use_chat_template=use_chat_template)) for r in rows), default=1)


def longest_oracle_tokens(config: MiniverlConfig, tokenizer: Any, rows: Sequence[PromptRow]) -> int:
    """The longest oracle trajectory (prompt + target + EOS) an offline algorithm will train on."""
    from miniverl.training.algorithms.sft import oracle_trajectories

    trajectories = oracle_trajectories(config, tokenizer, rows, policy_version=0)
    return max((len(t.prompt_token_ids) + len(t.response_token_ids) for t in trajectories), default=1)


def update_rows(config: MiniverlConfig) -> int:
    """Trajectories of one optimizer step: a cycle's, split by the algorithm's mini-batches."""
    per_cycle = config.trajectories_per_cycle
    name = config.algorithm.name
    minis = config.algorithm.grpo.mini_batches if name == "grpo" else 1
    if name == "ppo":
        minis = config.algorithm.ppo.mini_batches
    return max(1, per_cycle // max(1, minis))


def extra_models(config: MiniverlConfig, runtime: RoleRuntime) -> int:
    """Models loaded beside the student and resident on the device (``dual_model`` only)."""
    if config.models.runtime != "dual_model":
        return 0
    manifest = runtime.role_manifest()
    count = 0
    for role in ("teacher", "reference"):
        entry = manifest.get(role)
        own_load = isinstance(entry, dict) and entry.get("physical_model") == role
        if own_load and config.memory.placement == "resident":
            count += 1
    return count + (1 if runtime.has_role("critic") else 0)


def workload_of(
    config: MiniverlConfig, runtime: RoleRuntime, rows: Sequence[PromptRow], precision: AdapterPrecision
) -> Workload:
    r = config.rollout
    lora = config.models.student.lora
    assert lora is not None  # the schema fills the default
    offline = config.algorithm.name in OFFLINE_ALGORITHMS
    if offline:  # SFT / KD train on the dataset's own responses, whatever their length; nothing is sampled
        row_tokens = longest_oracle_tokens(config, runtime.tokenizer, rows)
        rollout_rows = 0
    else:
        prompt = longest_prompt_tokens(runtime.tokenizer, rows, use_chat_template=r.use_chat_template)
        row_tokens = prompt + r.max_new_tokens
        rollout_rows = min(r.batch_size, config.trajectories_per_cycle)
    fast = not offline and runtime.device.type == "cuda" and r.engine in ("auto", "fast") and r.backend == "hf"
    return Workload(
        dtype=config.models.dtype,
        adapter_precision=precision,
        lora_rank=lora.r,
        lora_targets=tuple(lora.target_modules),
        row_tokens=row_tokens,
        update_rows=update_rows(config),
        logprob_chunk=config.train.logprob_chunk_size,
        rollout_rows=rollout_rows,
        rollout_capacity=row_tokens,
        fast_engine=fast,
        vllm_engine=not offline and r.backend == "vllm",
        extra_models=extra_models(config, runtime),
        quantized=config.models.student.quantization != "none",
        fused_kernels=config.train.fused_kernels != "none",
    )


def plan_memory(
    config: MiniverlConfig, runtime: RoleRuntime, rows: Sequence[PromptRow], precision: AdapterPrecision
) -> MemoryPlan | None:
    """Choose and apply the memory plan (``None`` without ``memory.max_peak_reserved_gib``)."""
    budget = config.memory.max_peak_reserved_gib
    if budget is None:
        return None
    train = config.train
    plan = choose_plan(
        DecoderDims.from_hf_config(runtime.student_config()),
        workload_of(config, runtime, rows, precision),
        budget,
        activation_checkpointing=train.activation_checkpointing,
        trajectory_batch_size=train.trajectory_batch_size,
    )
    runtime.apply_memory_plan(
        activation_checkpointing=plan.activation_checkpointing if train.activation_checkpointing == "auto" else 0,
        max_tokens=plan.max_tokens if train.trajectory_batch_size == "auto" else None,
        release_rollout_engine=plan.release_rollout,
    )
    train.logprob_chunk_size = plan.logprob_chunk  # the configured chunk, or the half of it the plan chose
    return plan


def device_total_bytes(device: Any) -> float | None:
    """The CUDA device's memory in bytes (``None`` off CUDA)."""
    if device.type != "cuda":
        return None
    import torch

    return float(torch.cuda.get_device_properties(device).total_memory)


def plan_vllm(
    config: MiniverlConfig, runtime: RoleRuntime, rows: Sequence[PromptRow], precision: AdapterPrecision
) -> VllmMemory | None:
    """A colocated vLLM's share of the GPU and its limits, from the same workload as the memory plan (``None``
    unless ``rollout.backend`` is vllm on a CUDA device: vLLM runs nowhere else)."""
    total = device_total_bytes(runtime.device)
    if config.rollout.backend != "vllm" or total is None:
        return None
    try:
        return vllm_memory(
            DecoderDims.from_hf_config(runtime.student_config()),
            workload_of(config, runtime, rows, precision),
            device_bytes=total,
        )
    except ValueError as exc:
        raise UsageError(f"rollout.backend vllm: {exc}") from None

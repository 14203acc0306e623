"""The sections around the models and the algorithm: ``run``, ``data``, ``rollout``, ``train``, ``checkpoint`` and
``memory``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from miniverl.config.fields import MAX_NEW_TOKENS, Seed, Strict


class RunSection(Strict):
    name: str = "miniverl-run"
    seed: Seed = 0
    deterministic: bool = False


DatasetColumn = Literal["prompt_id", "prompt", "answer", "context", "task"]


class DataSection(Strict):
    path: str = Field(description="the training prompts: a .parquet, .jsonl or .csv file")
    shuffle: bool = True
    #: held-out prompts for ``algorithm.eval_every`` (greedy, the run's rewards; never trained on)
    eval_path: str | None = None
    columns: dict[DatasetColumn, Annotated[str, Field(min_length=1)]] = Field(
        default_factory=dict,
        description="which file column holds each dataset field, e.g. {prompt: question, answer: solution} "
        "(applies to data.path and data.eval_path; an unmapped field is read from the column of its own name)",
    )


class RolloutSection(Strict):
    backend: Literal["hf", "vllm"] = Field(
        default="hf",
        description="who samples: 'hf' (the training model, in process; its log-probs are the trainer's) or "
        "'vllm' (another engine, whose log-probs a policy-gradient update may use only after the trainer "
        "recomputes old_logp; refused where vllm is not installed)",
    )
    prompts_per_cycle: Annotated[int, Field(ge=1)] = 2
    samples_per_prompt: Annotated[int, Field(ge=1)] = 4
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] = 32
    temperature: Annotated[float, Field(ge=0)] = 1.0
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0
    batch_size: Annotated[int, Field(ge=1)] = 8
    use_chat_template: bool = True
    engine: Literal["auto", "fast", "hf"] = Field(
        default="auto",
        description="the rollout generator: 'fast' (folded bf16 policy copy, static KV cache, CUDA graphs on CUDA), "
        "'hf' (the transformers decode loop), 'auto' (fast when it supports the model, else hf)",
    )


class TrainSection(Strict):
    cycles: Annotated[int, Field(ge=1)] = 1
    gradient_accumulation_steps: Annotated[int, Field(ge=1)] | None = None
    trajectory_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = 1
    learning_rate: Annotated[float, Field(gt=0)] = 1e-4
    weight_decay: Annotated[float, Field(ge=0)] = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: Annotated[float, Field(gt=0)] = 1e-8
    max_grad_norm: Annotated[float, Field(gt=0)] | None = 1.0
    logprob_chunk_size: Annotated[int, Field(ge=1)] = 1024
    #: recompute every n-th student decoder layer in backward (0: off); ``auto``: chosen by the memory plan
    #: from ``memory.max_peak_reserved_gib`` (off without a budget)
    activation_checkpointing: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    #: ``fp32``: PEFT's fp32 adapter; ``bf16_master``: bf16 adapter tensors in the model, fp32 masters in
    #: the optimizer, checkpoints and export; ``auto``: bf16_master for a bfloat16 student on CUDA, else fp32
    adapter_precision: Literal["auto", "fp32", "bf16_master"] = "auto"


class CheckpointSection(Strict):
    every_updates: Annotated[int, Field(ge=1)] = 1
    keep_last: Annotated[int, Field(ge=1)] = 2


class MemorySection(Strict):
    """Where frozen models live, and a hard peak-memory limit.

    - ``placement: swap`` (``dual_model``, unquantized roles only): frozen teacher/reference models
      stay on the CPU and visit the device only inside their role's phase. The student and critic
      (trained, with optimizer state) are always resident; a shared backbone is one resident model.
    - ``max_peak_reserved_gib``: the run fails (before that cycle's checkpoint) when a cycle's CUDA
      peak reserved memory exceeds it. It is measured on CUDA only: a CPU run refuses it.
    """

    placement: Literal["resident", "swap"] = "resident"
    max_peak_reserved_gib: Annotated[float, Field(gt=0)] | None = None

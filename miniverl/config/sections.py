"""The sections around the models and the algorithm: ``run``, ``data``, ``rollout``, ``train``, ``checkpoint`` and
``memory``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from miniverl.config.fields import MAX_NEW_TOKENS, Seed, Strict


class RunSection(Strict):
    name: str = Field(
        default="miniverl-run",
        description="a label for the run: kept in the plan, and verl's trainer.experiment_name on handoff (the "
        "run directory is named by run --run-id)",
    )
    seed: Seed = Field(
        default=0,
        description="the run's one seed: prompt order, each sample's rollout stream, mini-batch orders, and the "
        "random, numpy and torch generators",
    )
    deterministic: bool = Field(
        default=False,
        description="torch.use_deterministic_algorithms(True) (with CUBLAS_WORKSPACE_CONFIG=:4096:8 unless set): "
        "an op without a deterministic implementation then fails instead of varying",
    )


DatasetColumn = Literal["prompt_id", "prompt", "answer", "context", "task"]


class DataSection(Strict):
    path: str = Field(description="the training prompts: a .parquet, .jsonl or .csv file")
    shuffle: bool = Field(
        default=True,
        description="take the prompts in an order shuffled once from run.seed (false: file order); a run that "
        "needs more prompts than the file holds wraps around",
    )
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
    prompts_per_cycle: Annotated[int, Field(ge=1)] = Field(
        default=2, description="prompts sampled per cycle (sft and kd: dataset rows per update)"
    )
    samples_per_prompt: Annotated[int, Field(ge=1)] = Field(
        default=4,
        description="responses sampled per prompt: GRPO's group size (grpo needs >= 2); sft and kd take one "
        "oracle trajectory per row instead",
    )
    max_new_tokens: Annotated[int, Field(ge=1, le=MAX_NEW_TOKENS)] = Field(
        default=32,
        description="the most tokens sampled per response; the plan also checks that every prompt plus this fits "
        "the student's context",
    )
    temperature: Annotated[float, Field(ge=0)] = Field(default=1.0, description="the sampling temperature (0: greedy)")
    top_p: Annotated[float, Field(gt=0, le=1)] = Field(
        default=1.0,
        description="nucleus sampling: keep the smallest set of most likely tokens whose probability sums to >= "
        "top_p (1: all)",
    )
    top_k: Annotated[int, Field(ge=0)] = Field(default=0, description="keep only the top_k most likely tokens (0: all)")
    batch_size: Annotated[int, Field(ge=1)] = Field(
        default=8,
        description="trajectories decoded together in one generation batch (memory and speed; each sample draws "
        "from its own seeded stream)",
    )
    use_chat_template: bool = Field(
        default=True,
        description="render each prompt as a user message through the tokenizer's chat template, with the "
        "generation prompt, when it has one; false: plain text with the tokenizer's special tokens",
    )
    engine: Literal["auto", "fast", "hf"] = Field(
        default="auto",
        description="the rollout generator: 'fast' (folded bf16 policy copy, static KV cache, CUDA graphs on CUDA), "
        "'hf' (the transformers decode loop), 'auto' (fast when it supports the model, else hf)",
    )


class TrainSection(Strict):
    cycles: Annotated[int, Field(ge=1)] = Field(
        default=1,
        description="training cycles, each one rollout (sft, kd: one batch of dataset rows) and its update: the "
        "run's update count",
    )
    gradient_accumulation_steps: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="trajectories per optimizer step, derived when unset: a cycle's for opd, sft and kd, one "
        "mini-batch's for grpo and ppo; any other value is refused",
    )
    trajectory_batch_size: Annotated[int, Field(ge=1)] | Literal["auto"] = Field(
        default=1,
        description="trajectories per padded forward and backward: a fixed k (length buckets of k rows) or "
        "'auto' (a cost-minimizing partition under a per-forward token budget, the memory plan's "
        "with memory.max_peak_reserved_gib); it changes speed and memory, not the update",
    )
    learning_rate: Annotated[float, Field(gt=0)] = Field(
        default=1e-4, description="the actor adapter's AdamW learning rate (constant: no schedule)"
    )
    weight_decay: Annotated[float, Field(ge=0)] = Field(
        default=0.0, description="AdamW's decoupled weight decay (actor and critic)"
    )
    adam_betas: tuple[float, float] = Field(
        default=(0.9, 0.999), description="AdamW's (beta1, beta2) (actor and critic)"
    )
    adam_eps: Annotated[float, Field(gt=0)] = Field(default=1e-8, description="AdamW's epsilon (actor and critic)")
    max_grad_norm: Annotated[float, Field(gt=0)] | None = Field(
        default=1.0, description="the actor's gradient-norm clip per optimizer step (null: no clipping)"
    )
    logprob_chunk_size: Annotated[int, Field(ge=1)] = Field(
        default=1024,
        description="the most token positions whose fp32 vocabulary logits are computed at once; the memory plan "
        "may halve it (down to 128) to fit memory.max_peak_reserved_gib",
    )
    #: recompute every n-th student decoder layer in backward (0: off); ``auto``: chosen by the memory plan
    #: from ``memory.max_peak_reserved_gib`` (off without a budget)
    activation_checkpointing: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    #: ``fp32``: PEFT's fp32 adapter; ``bf16_master``: bf16 adapter tensors in the model, fp32 masters in
    #: the optimizer, checkpoints and export; ``auto``: bf16_master for a bfloat16 student on CUDA, else fp32
    adapter_precision: Literal["auto", "fp32", "bf16_master"] = "auto"
    fused_kernels: Literal["none", "triton", "liger"] = Field(
        default="none",
        description="the student's RMSNorm and SwiGLU MLP forward and backward: 'none' (transformers' modules), "
        "'triton' (miniverl's own Triton kernels, HF's rounding order; CUDA, or CPU under TRITON_INTERPRET=1), "
        "'liger' (liger-kernel's, CUDA only); either also fuses PEFT's LoRA scale-and-add into the B GEMM; "
        "the same math, less activation memory",
    )


class CheckpointSection(Strict):
    every_updates: Annotated[int, Field(ge=1)] = Field(
        default=1, description="write a checkpoint every n updates, and always after the last"
    )
    keep_last: Annotated[int, Field(ge=1)] = Field(
        default=2, description="keep the newest n checkpoints; older ones are deleted"
    )


class MemorySection(Strict):
    """Where frozen models live, and a hard peak-memory limit.

    - ``placement: swap`` (``dual_model``, unquantized roles only): frozen teacher/reference models
      stay on the CPU and visit the device only inside their role's phase. The student and critic
      (trained, with optimizer state) are always resident; a shared backbone is one resident model.
    - ``max_peak_reserved_gib``: the run fails (before that cycle's checkpoint) when a cycle's CUDA
      peak reserved memory exceeds it. It is measured on CUDA only: a CPU run refuses it.
    """

    placement: Literal["resident", "swap"] = Field(
        default="resident",
        description="'resident': every model stays on the device; 'swap' (dual_model, unquantized roles): the "
        "frozen teacher and reference wait on the CPU outside their role's phase",
    )
    max_peak_reserved_gib: Annotated[float, Field(gt=0)] | None = Field(
        default=None,
        description="the most CUDA memory, in GiB, a cycle may reserve at its peak: the run fails when a cycle "
        "exceeds it, and the memory plan's auto choices fit it (refused on CPU)",
    )

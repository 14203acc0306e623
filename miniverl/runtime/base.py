"""The role-runtime interface the training controller talks to.

A runtime owns the physical models. The controller asks it for the *roles* it needs
(student, teacher, reference) and never touches model objects beyond this interface, so the
``dual_model`` and ``shared_backbone`` runtimes are interchangeable.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol

from miniverl.runtime.rows import BatchSize, PhysicalBatch, SequenceRows

if TYPE_CHECKING:
    import torch

RoleName = Literal["student", "teacher", "reference", "critic"]


class RoleHandle(Protocol):
    """One role, active for the duration of a ``RoleRuntime.use`` block."""

    name: RoleName

    @property
    def head_weight(self) -> torch.Tensor:
        """The output projection ``[V, H]`` (tied embeddings included)."""

    def selected_hidden(self, rows: SequenceRows, *, trajectory_batch_size: BatchSize) -> torch.Tensor:
        """Final-norm hidden states ``[sum(selected), H]`` in row order, then position order.

        Rows are grouped into padded physical batches per ``trajectory_batch_size``; padding never
        reaches the output, and each row keeps its own causal attention boundary. Gradients flow
        for the student role only.
        """

    def plan(self, rows: SequenceRows, trajectory_batch_size: BatchSize) -> list[list[int]]:
        """The physical batches (row indices) ``selected_hidden`` would run."""

    def iter_selected_hidden(self, rows: SequenceRows, *, trajectory_batch_size: BatchSize) -> Iterator[PhysicalBatch]:
        """Like ``selected_hidden`` but one padded forward per step, lazily, so that the caller can
        compute that batch's loss and ``backward()`` it before the next forward (peak activation
        memory is one physical batch, not the whole group). Each item holds its row indices, the
        rows' selected hidden states flattened in that order, per-row counts and padded tokens."""


class RoleRuntime(Protocol):
    runtime: Literal["dual_model", "shared_backbone"]

    @property
    def tokenizer(self) -> Any: ...

    @property
    def device(self) -> torch.device: ...

    def has_role(self, role: RoleName) -> bool: ...

    def use(self, role: RoleName) -> AbstractContextManager[RoleHandle]:
        """Activate ``role``; restore the previous role on exit, also after an exception."""

    def generation_model(self) -> AbstractContextManager[Any]:
        """The student policy as a HF causal LM ready for sampling (eval mode inside the block)."""

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """Student adapter parameters only: the optimizer sees nothing else."""

    def named_trainable_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]: ...

    def save_student_adapter(self, directory: str) -> None:
        """Write a standard PEFT adapter directory (adapter_config.json + adapter_model.safetensors)."""

    def student_config(self) -> Any:
        """The student's HF model config (the memory plan reads its shape)."""

    def apply_memory_plan(
        self, *, activation_checkpointing: int, max_tokens: int | None, release_rollout_engine: bool = False
    ) -> None:
        """Checkpoint every n-th student layer (0: as built); set the ``auto`` per-forward token budget;
        with ``release_rollout_engine``, every :meth:`generation_model` block gives the fast rollout
        engine's memory (folded copy, KV cache, graphs) back when it ends."""

    def fuse_training_kernels(self, kind: Literal["triton", "liger"]) -> dict[str, int]:
        """``train.fused_kernels``: the student's RMSNorm and SwiGLU MLP through fused kernels; how many of each."""

    @property
    def value_head(self) -> torch.nn.Linear:
        """PPO's scalar value head ``Linear(H, 1)`` (fp32); ``KeyError`` without a critic role."""

    def named_critic_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The critic's LoRA and value-head tensors (its own optimizer); empty without a critic."""

    def critic_parameters(self) -> list[torch.nn.Parameter]: ...

    def save_critic(self, directory: str) -> None:
        """Write the critic: a PEFT adapter directory plus ``value_head.safetensors``."""

    def role_manifest(self) -> Mapping[str, Any]:
        """Logical roles and immutable provenance (content digests, never local paths)."""

    def close(self) -> None:
        """Release every model and cached device memory (teardown)."""

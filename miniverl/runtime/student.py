"""What both role runtimes (``dual_model``, ``shared_backbone``) do the same way: load the student base with its
trainable LoRA, and answer for the student model and the role handles."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from miniverl.config.schema import ModelsSection
from miniverl.models.loading import disable_cpu_weight_repack
from miniverl.runtime.base import RoleName
from miniverl.runtime.batching import AutoPolicy
from miniverl.runtime.critic import CriticRole
from miniverl.runtime.handles import ModelRoleHandle, StudentMemoryPlan, save_peft_adapter
from miniverl.runtime.loading import (
    DTYPES,
    BaseLoader,
    LoadedBase,
    LoadSettings,
    attach_student_lora,
    default_loader,
    enable_activation_checkpointing,
    inner_causal_lm,
)

STUDENT_ADAPTER = "student"
FROZEN_ROLES: tuple[RoleName, ...] = ("teacher", "reference")


@dataclass(frozen=True)
class LoadedStudent:
    """The student's base as loaded, its model with the trainable LoRA, and how the other roles load."""

    base: LoadedBase
    model: Any
    load: BaseLoader
    settings: LoadSettings


class StudentRuntime(CriticRole, StudentMemoryPlan):
    """The members both runtimes share over ``_student_model`` and ``_handles``."""

    _device: torch.device
    _tokenizer: Any

    def _load_student(
        self,
        models: ModelsSection,
        *,
        device: torch.device,
        loader: BaseLoader | None,
        auto: AutoPolicy | None,
        activation_checkpointing: int,
    ) -> LoadedStudent:
        """Load the student base on ``device`` and attach its trainable LoRA (adapter ``student``); sets the
        runtime's device, batching policy and tokenizer."""
        load = loader or default_loader
        self._device = torch.device(device)
        dtype = DTYPES[models.dtype]
        self.auto = auto or AutoPolicy.for_device(self._device, dtype)
        settings = LoadSettings(device=self._device, dtype=dtype, attn_implementation=models.attn_implementation)
        base = load(models.student, settings)
        disable_cpu_weight_repack(base.model)
        assert models.student.lora is not None  # the schema fills the default
        model = attach_student_lora(base.model, models.student.lora, adapter_name=STUDENT_ADAPTER)
        if activation_checkpointing:
            enable_activation_checkpointing(model, activation_checkpointing)
        self._tokenizer = base.tokenizer
        return LoadedStudent(base=base, model=model, load=load, settings=settings)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    @property
    def device(self) -> torch.device:
        return self._device

    def has_role(self, role: RoleName) -> bool:
        return role in self._handles

    def _handle(self, role: RoleName) -> ModelRoleHandle:
        if role not in self._handles:
            raise KeyError(f"runtime has no {role!r} role (configured roles: {', '.join(self._handles)})")
        return self._handles[role]

    def named_trainable_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        raise NotImplementedError

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.named_trainable_parameters()]

    def student_config(self) -> Any:
        """The student's HF model config (the memory plan reads its shape)."""
        return inner_causal_lm(self._student_model()).config

    def save_student_adapter(self, directory: str) -> None:
        save_peft_adapter(self._student_model(), STUDENT_ADAPTER, directory)

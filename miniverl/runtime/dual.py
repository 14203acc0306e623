"""``models.runtime: dual_model``: every role owns its own physical model (the compatible default).

* student: the base plus one trainable LoRA (adapter name ``student``); the optimizer sees only it;
* teacher: a separate frozen model: any source, or ``source: student`` (a frozen copy of the
  student's base), optionally with a pinned frozen adapter. A ``privileged_context`` teacher is the
  frozen base: the controller builds its context-bearing rows, the runtime just scores them;
* reference: optional, frozen, same rules as the teacher;
* ``memory.placement: swap``: frozen (unquantized) teacher/reference models stay on the CPU and
  are moved to the device for the duration of ``use(role)`` only;
* critic (PPO): a separate model (``source: student`` = a copy of the student's base) with its own
  trainable LoRA (adapter name ``critic``) and a scalar value head; its own optimizer.

Teacher and reference built from the very same spec share one physical frozen model; they stay
two logical roles.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch

from miniverl.canonical import sha256_json
from miniverl.config.schema import ModelSpec, ModelsSection
from miniverl.errors import ConfigError
from miniverl.models.loading import disable_cpu_weight_repack
from miniverl.runtime.base import RoleName
from miniverl.runtime.batching import AutoPolicy
from miniverl.runtime.critic import CRITIC_ADAPTER, build_value_head
from miniverl.runtime.handles import (
    ModelRoleHandle,
    release_device_memory,
    rollout_memory_scope,
)
from miniverl.runtime.loading import (
    BaseLoader,
    LoadSettings,
    attach_student_lora,
    base_spec_for,
    load_frozen_adapter,
    resolve_adapter,
)
from miniverl.runtime.student import FROZEN_ROLES, STUDENT_ADAPTER, StudentRuntime


class DualModelRuntime(StudentRuntime):
    runtime: Literal["dual_model", "shared_backbone"] = "dual_model"

    def __init__(
        self,
        models: ModelsSection,
        *,
        device: torch.device,
        loader: BaseLoader | None = None,
        auto: AutoPolicy | None = None,
        activation_checkpointing: int = 0,
        critic_seed: int = 0,
        placement: str = "resident",
    ) -> None:
        student = self._load_student(
            models, device=device, loader=loader, auto=auto, activation_checkpointing=activation_checkpointing
        )
        load, settings = student.load, student.settings
        self._student = student.model
        self._student.train()
        assert models.student.lora is not None  # the schema fills the default
        self._manifest: dict[str, Any] = {
            "student": {
                "base": student.base.identity,
                "quantization": models.student.quantization,
                "lora": models.student.lora.model_dump(mode="json"),
                "adapter_name": STUDENT_ADAPTER,
            }
        }
        self._handles: dict[RoleName, ModelRoleHandle] = {
            "student": ModelRoleHandle("student", self._student, device=self._device, trainable=True, auto=self.auto)
        }
        physical: dict[str, Any] = {}
        for role in FROZEN_ROLES:
            spec: ModelSpec | None = getattr(models, role)
            if spec is None:
                continue
            key = sha256_json(
                {"base": base_spec_for(spec, models.student).model_dump(mode="json"), "adapter": _adapter_key(spec)}
            )
            entry = physical.get(key)
            if entry is None:
                model, info = self._load_frozen(role, spec, models.student, load, settings)
                entry = (model, info, role)
                physical[key] = entry
            model, info, owner = entry
            self._handles[role] = ModelRoleHandle(role, model, device=self._device, trainable=False, auto=self.auto)
            self._manifest[role] = {**info, "physical_model": owner}  # the role whose load it shares
        self._critic: Any = None
        self._value_head: torch.nn.Linear | None = None
        if models.critic is not None:
            self._load_critic(models, load, settings, critic_seed)
        self._active: list[RoleName] = []
        self._swap = placement == "swap"
        self.swap_transfers = 0
        if self._swap:
            for role in FROZEN_ROLES:
                if role in self._handles:
                    if getattr(models, role).quantization != "none":
                        raise ConfigError(f"memory.placement swap is refused for the quantized models.{role}")
                    self._handles[role].model.to("cpu")
            release_device_memory(self._device)

    def _load_critic(self, models: ModelsSection, load: BaseLoader, settings: LoadSettings, seed: int) -> None:
        spec = models.critic
        assert spec is not None and spec.lora is not None  # the schema fills the default
        loaded = load(base_spec_for(spec, models.student), settings)
        disable_cpu_weight_repack(loaded.model)
        self._critic = attach_student_lora(loaded.model, spec.lora, adapter_name=CRITIC_ADAPTER)
        self._critic.train()
        self._value_head = build_value_head(self._critic, seed=seed, device=self._device)
        self._handles["critic"] = ModelRoleHandle(
            "critic", self._critic, device=self._device, trainable=True, auto=self.auto
        )
        self._manifest["critic"] = {
            "base": loaded.identity,
            "base_is_student_base": spec.source == "student",
            "quantization": spec.quantization,
            "lora": spec.lora.model_dump(mode="json"),
            "adapter_name": CRITIC_ADAPTER,
            "value_head": {"hidden_size": int(self._value_head.in_features), "seed": seed, "dtype": "float32"},
            "physical_model": "critic",
        }

    @staticmethod
    def _load_frozen(
        role: RoleName, spec: ModelSpec, student: ModelSpec, load: BaseLoader, settings: LoadSettings
    ) -> tuple[Any, dict[str, Any]]:
        loaded = load(base_spec_for(spec, student), settings)
        disable_cpu_weight_repack(loaded.model)
        model = loaded.model.requires_grad_(False)
        info: dict[str, Any] = {
            "base": loaded.identity,
            "base_is_student_base": spec.source == "student",
            "quantization": spec.quantization,
            "adapter": None,
            "privileged_context": spec.privileged_context is not None,
        }
        if spec.adapter is not None:
            resolved = resolve_adapter(spec.adapter)
            model = load_frozen_adapter(model, resolved, adapter_name=role)
            info["adapter"] = resolved.provenance
        model.eval()
        return model, info

    # ------------------------------------------------------------------ RoleRuntime
    @property
    def active_role(self) -> RoleName | None:
        return self._active[-1] if self._active else None

    @contextmanager
    def use(self, role: RoleName) -> Iterator[ModelRoleHandle]:
        handle = self._handle(role)
        swap = self._swap and role in FROZEN_ROLES and role not in self._active
        if swap:
            handle.model.to(self._device)
            self.swap_transfers += 1
        self._active.append(role)
        try:
            yield handle
        finally:
            self._active.pop()
            if swap:
                handle.model.to("cpu")
                self.swap_transfers += 1
                if self._device.type == "cuda":
                    torch.cuda.empty_cache()

    @contextmanager
    def generation_model(self) -> Iterator[Any]:
        was_training = self._student.training
        with rollout_memory_scope(self._student, self._device, release=self.release_rollout_engine):
            self._student.eval()
            try:
                yield self._student
            finally:
                self._student.train(was_training)

    def named_trainable_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        for name, param in self._student.named_parameters():
            if param.requires_grad:
                yield name, param

    def _student_model(self) -> Any:
        return self._student

    # ------------------------------------------------------------------ critic (PPO)
    def _critic_model(self) -> Any:
        return self._critic

    def role_manifest(self) -> Mapping[str, Any]:
        return {"runtime": self.runtime, "roles": dict(self._manifest)}

    def close(self) -> None:
        self._handles.clear()
        self._student = None
        self._critic = None
        self._value_head = None
        release_device_memory(self._device)


def _adapter_key(spec: ModelSpec) -> Any:
    if spec.adapter is None:
        return None
    return spec.adapter.model_dump(mode="json")

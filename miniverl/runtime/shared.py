"""``models.runtime: shared_backbone``: one physical base, one adapter per role.

The base carries a trainable ``student`` LoRA, a frozen ``teacher`` adapter (required, pinned) and
an optional frozen ``reference`` (a pinned adapter, or ``source: student`` without one: the frozen
base, run with every adapter disabled), and for PPO a trainable ``critic`` adapter (with a
scalar value head outside the base, its own optimizer); teacher and reference are distinct adapters (and roles)
even when they load the same artifact. ``use(role)`` switches the active adapter:

* the switch walks a precomputed list of LoRA layers (no module-tree walk), so it is cheap;
* peft's ``set_adapter`` flips ``requires_grad`` (the active adapter becomes trainable, the others
  frozen); after every switch the student's adapter is made trainable again and every other
  adapter frozen, so the optimizer's parameter set never changes;
* the previous role is restored after the block, also after an exception; using the role that is
  already active is a no-op (no switch at all);
* the module mode follows the role: ``train()`` for the student, ``eval()`` for frozen roles.

A shared backbone is one resident model: ``placement: swap`` is refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

import torch

from miniverl.config.schema import ModelSpec, ModelsSection
from miniverl.errors import ConfigError
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
    load_frozen_adapter,
    resolve_adapter,
)
from miniverl.runtime.student import FROZEN_ROLES, StudentRuntime


def check_shared_models(models: ModelsSection, placement: str) -> None:
    """The runtime-side twin of the config check: refuse what one backbone cannot carry."""
    student = models.student
    for role in FROZEN_ROLES:
        spec: ModelSpec | None = getattr(models, role)
        if spec is None:
            continue
        if spec.adapter is None and not (role == "reference" and spec.source == "student"):
            raise ConfigError(f"runtime shared_backbone: models.{role} needs a pinned adapter")
        if spec.privileged_context is not None:
            raise ConfigError(f"runtime shared_backbone: models.{role} is an adapter role, not privileged_context")
        same_base = spec.source == "student" or (
            (spec.source, spec.model_id, spec.revision, spec.path)
            == (student.source, student.model_id, student.revision, student.path)
        )
        if not same_base:
            raise ConfigError(f"runtime shared_backbone: models.{role} must use the student's base model")
        if spec.quantization != student.quantization:
            raise ConfigError(f"runtime shared_backbone: models.{role} quantization must equal the student's")
    if placement == "swap" and student.quantization != "none":
        raise ConfigError(
            "memory.placement swap is refused for a quantized shared backbone: bitsandbytes parameters "
            "cannot be moved between devices safely; use placement resident"
        )
    if placement == "swap":
        raise ConfigError(
            "memory.placement swap is refused for a shared backbone: it is one resident model with nothing "
            "to swap; use placement resident (or runtime dual_model)"
        )


class SharedBackboneRuntime(StudentRuntime):
    runtime: Literal["dual_model", "shared_backbone"] = "shared_backbone"

    def __init__(
        self,
        models: ModelsSection,
        *,
        device: torch.device,
        loader: BaseLoader | None = None,
        auto: AutoPolicy | None = None,
        activation_checkpointing: int = 0,
        placement: str = "resident",
        critic_seed: int = 0,
    ) -> None:
        check_shared_models(models, placement)
        student = self._load_student(
            models, device=device, loader=loader, auto=auto, activation_checkpointing=activation_checkpointing
        )
        base = student.base
        self._model = student.model
        assert models.student.lora is not None  # the schema fills the default
        self._base_roles: set[RoleName] = set()
        self._manifest: dict[str, Any] = {
            "student": {
                "adapter_name": "student",
                "lora": models.student.lora.model_dump(mode="json"),
                "trainable": True,
            }
        }
        for role in FROZEN_ROLES:
            spec: ModelSpec | None = getattr(models, role)
            if spec is None:
                continue
            if spec.adapter is None:  # the reference is the frozen base: adapters disabled in its phase
                self._base_roles.add(role)
                self._manifest[role] = {"adapter_name": None, "adapter": None, "frozen_base": True, "trainable": False}
                continue
            resolved = resolve_adapter(spec.adapter)
            load_frozen_adapter(self._model, resolved, adapter_name=role)
            self._manifest[role] = {"adapter_name": role, "adapter": resolved.provenance, "trainable": False}
        self._value_head: torch.nn.Linear | None = None
        if models.critic is not None:
            self._add_critic(models, critic_seed)
        self._base_identity = {"base": base.identity, "quantization": models.student.quantization}
        self._layers = [m for m in self._model.modules() if hasattr(m, "set_adapter") and hasattr(m, "lora_A")]
        named = list(self._model.named_parameters())
        self._student_names = [n for n, _ in named if ".student." in n and "lora_" in n]
        self._student_params = [p for n, p in named if ".student." in n and "lora_" in n]
        self._critic_params = [p for n, p in named if f".{CRITIC_ADAPTER}." in n and "lora_" in n]
        trained = {id(p) for p in (*self._student_params, *self._critic_params)}
        self._frozen_params = [p for n, p in named if "lora_" in n and id(p) not in trained]
        trainable_roles = ("student", CRITIC_ADAPTER)
        self._handles: dict[RoleName, ModelRoleHandle] = {
            role: ModelRoleHandle(
                role, self._model, device=self._device, trainable=role in trainable_roles, auto=self.auto
            )
            for role in ("student", *FROZEN_ROLES, "critic")
            if role == "student" or role in self._manifest
        }
        self._modules = list(self._model.modules())
        self._fast_switch = True
        self._guard_grads()
        self._active: RoleName = "student"
        self.switch_count = 0
        self.switch_seconds = 0.0
        self._switch("student")
        if any(layer.active_adapters != ["student"] for layer in self._layers):
            self._fast_switch = False  # this peft does not read _active_adapter: use set_adapter
            self._switch("student")
        self.switch_count, self.switch_seconds = 0, 0.0

    def _add_critic(self, models: ModelsSection, seed: int) -> None:
        """A second trainable LoRA (``critic``) on the shared base, plus the value head."""
        from peft import LoraConfig as PeftLoraConfig
        from peft import TaskType

        spec = models.critic
        assert spec is not None and spec.lora is not None
        lora = spec.lora
        self._model.add_adapter(
            CRITIC_ADAPTER,
            PeftLoraConfig(
                r=lora.r,
                lora_alpha=int(lora.alpha) if float(lora.alpha).is_integer() else lora.alpha,  # type: ignore[arg-type]
                lora_dropout=lora.dropout,
                target_modules=list(lora.target_modules),
                bias="none",
                task_type=TaskType.CAUSAL_LM,
            ),
        )
        self._value_head = build_value_head(self._model, seed=seed, device=self._device)
        self._manifest["critic"] = {
            "adapter_name": CRITIC_ADAPTER,
            "lora": lora.model_dump(mode="json"),
            "trainable": True,
            "value_head": {"hidden_size": int(self._value_head.in_features), "seed": seed, "dtype": "float32"},
        }

    def _guard_grads(self) -> None:
        """Only the student (and critic) adapters are trainable, whatever peft did to ``requires_grad``."""
        for param in (*self._student_params, *self._critic_params):
            param.requires_grad_(True)
        for param in self._frozen_params:
            param.requires_grad_(False)

    def _switch(self, role: RoleName) -> None:
        """Activate ``role``'s adapter: O(LoRA layers + modules) attribute writes, no tree walks.

        The fast path writes each LoRA layer's active-adapter list directly, which leaves every
        ``requires_grad`` flag untouched; peft's ``set_adapter`` is the fallback when that attribute
        is missing (another peft layout). Either way the grad guard then restores student-only
        trainability, and module modes are set through a precomputed flat module list.
        """
        start = time.perf_counter()
        base_only = role in self._base_roles
        adapter = "student" if base_only else role  # a frozen-base role keeps any adapter, all disabled
        if self._fast_switch:
            for layer in self._layers:
                layer._active_adapter = [adapter]
                layer._disable_adapters = base_only
        else:
            for layer in self._layers:
                layer.set_adapter(adapter, inference_mode=True)
                layer._disable_adapters = base_only
            self._guard_grads()
        self._model.base_model.active_adapter = adapter
        training = role == "student"
        for module in self._modules:
            module.__dict__["training"] = training
        self._active = role
        self.switch_count += 1
        self.switch_seconds += time.perf_counter() - start

    # ------------------------------------------------------------------ RoleRuntime
    @property
    def active_role(self) -> RoleName:
        return self._active

    @contextmanager
    def use(self, role: RoleName) -> Iterator[ModelRoleHandle]:
        handle = self._handle(role)
        previous = self._active
        if role == previous:  # nested use of the active role: no switch
            yield handle
            return
        self._switch(role)
        try:
            yield handle
        finally:
            self._switch(previous)

    @contextmanager
    def generation_model(self) -> Iterator[Any]:
        with self.use("student"), rollout_memory_scope(self._model, self._device, release=self.release_rollout_engine):
            self._model.eval()
            try:
                yield self._model
            finally:
                self._model.train(self._active == "student")

    def named_trainable_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The student adapter only (the critic's adapter has its own optimizer)."""
        yield from zip(self._student_names, self._student_params, strict=True)

    def _student_model(self) -> Any:
        return self._model

    # ------------------------------------------------------------------ critic (PPO)
    def _critic_model(self) -> Any:
        return self._model

    def role_manifest(self) -> Mapping[str, Any]:
        return {"runtime": self.runtime, "backbone": dict(self._base_identity), "roles": dict(self._manifest)}

    def close(self) -> None:
        self._handles.clear()
        self._layers.clear()
        self._modules.clear()
        self._student_params.clear()
        self._student_names.clear()
        self._critic_params.clear()
        self._frozen_params.clear()
        self._value_head = None
        self._model = None
        release_device_memory(self._device)

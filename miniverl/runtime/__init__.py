"""Role runtimes: who owns the physical models, and how rows become selected hidden states.

``build_runtime(models, device=...)`` returns a :class:`~miniverl.runtime.base.RoleRuntime`:
``dual_model`` (one physical model per role) or ``shared_backbone`` (one base, one adapter per role).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from miniverl.runtime.base import BatchSize, RoleHandle, RoleName, RoleRuntime, SequenceRows
from miniverl.runtime.batching import AutoPolicy, padding_tokens, plan_physical_batches

if TYPE_CHECKING:
    import torch

    from miniverl.config.schema import ModelsSection
    from miniverl.runtime.loading import BaseLoader

__all__ = [
    "AutoPolicy",
    "BatchSize",
    "RoleHandle",
    "RoleName",
    "RoleRuntime",
    "SequenceRows",
    "build_runtime",
    "padding_tokens",
    "plan_physical_batches",
]


def build_runtime(
    models: ModelsSection,
    *,
    device: torch.device,
    loader: BaseLoader | None = None,
    auto: AutoPolicy | None = None,
    placement: str = "resident",
    activation_checkpointing: int = 0,
    critic_seed: int = 0,
) -> RoleRuntime:
    """Build the runtime ``models.runtime`` names. ``loader`` replaces model loading (tests, gate).

    ``auto`` is the cost model of ``trajectory_batch_size: auto`` (default: by device and dtype).
    ``placement`` is ``memory.placement``: ``swap`` keeps dual_model's frozen roles on the CPU between
    their phases; a shared backbone refuses it.
    ``activation_checkpointing`` > 0 recomputes every n-th student decoder layer in backward
    (peak activation memory of a physical batch drops from all layers to ~one layer).
    ``critic_seed`` seeds the PPO value head (``models.critic``).
    """
    if models.runtime == "shared_backbone":
        from miniverl.runtime.shared import SharedBackboneRuntime

        return SharedBackboneRuntime(
            models,
            device=device,
            loader=loader,
            auto=auto,
            placement=placement,
            activation_checkpointing=activation_checkpointing,
            critic_seed=critic_seed,
        )
    from miniverl.runtime.dual import DualModelRuntime

    return DualModelRuntime(
        models,
        placement=placement,
        device=device,
        loader=loader,
        auto=auto,
        activation_checkpointing=activation_checkpointing,
        critic_seed=critic_seed,
    )

"""The one algorithm interface: roles, targets/advantages and the update, per algorithm.

The controller sequences rollout -> score -> ``Algorithm.update`` -> checkpoint and knows nothing
else about an algorithm. An algorithm declares the runtime roles it needs, turns one cycle's scored
trajectories into its targets (advantages, teacher rows, returns ...) and runs its optimizer
step(s). State beyond the actor's adapter and optimizer (PPO's critic) goes into the checkpoint
through :meth:`Algorithm.state_tensors` / :meth:`Algorithm.load_state`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import torch

from miniverl.config.schema import MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import ConfigError
from miniverl.rewards import RewardScore
from miniverl.rollout.backends import LogprobSource
from miniverl.rollout.hf import Trajectory
from miniverl.rollout.records import TokenGae
from miniverl.runtime.base import RoleName, RoleRuntime
from miniverl.training.update import Bf16MasterAdapter, UpdateSequence


@dataclass
class CycleBatch:
    """One cycle's prompts, fresh trajectories (prompt-major order) and their reward scores.

    ``logprob_source``: who computed the trajectories' ``sampled_logprobs`` (the rollout backend's
    :attr:`~miniverl.rollout.backends.RolloutBackend.logprob_source`); a policy-gradient update
    must not take foreign ones as ``old_logp`` (:func:`~miniverl.rollout.backends.old_logp_origin`).
    """

    prompts: list[PromptRow]
    trajectories: list[Trajectory]
    scores: list[RewardScore]
    logprob_source: LogprobSource = "trainer"

    @property
    def rewards(self) -> list[float]:
        return [s.total for s in self.scores]

    def sequences(self, advantages: list[float] | None = None) -> list[UpdateSequence]:
        """The student's view of each trajectory (no teacher rows)."""
        return [
            UpdateSequence(
                student_ids=tuple(t.prompt_token_ids + t.response_token_ids),
                response_start=len(t.prompt_token_ids),
                teacher_ids=None,
                teacher_response_start=None,
                response_len=len(t.response_token_ids),
                advantage=advantages[i] if advantages is not None else 0.0,
            )
            for i, t in enumerate(self.trajectories)
        ]


@dataclass
class AlgorithmStep:
    """What one cycle's update did. ``advantages`` is one number per trajectory (for the records); ``gae`` (PPO)
    each trajectory's GAE inputs and outputs, kept on its trajectory record."""

    loss: float
    kl: float | None
    tokens: int
    grad_norm: float
    adapter_delta_norm: float
    advantages: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    gae: list[TokenGae] | None = None

    @property
    def nonzero_advantages(self) -> int | None:
        return None if self.advantages is None else sum(abs(a) > 0 for a in self.advantages)


AdapterPrecision = Literal["fp32", "bf16_master"]


def resolve_adapter_precision(config: MiniverlConfig, device: torch.device) -> AdapterPrecision:
    """``train.adapter_precision`` made concrete: ``auto`` is ``bf16_master`` for a bfloat16 student on
    CUDA, else ``fp32`` (PEFT's fp32 adapter); an explicit choice stands (the config refuses
    ``bf16_master`` on a non-bfloat16 student, so a CPU run can choose it with a bfloat16 student)."""
    choice = config.train.adapter_precision
    if choice != "auto":
        return choice
    return "bf16_master" if config.models.dtype == "bfloat16" and device.type == "cuda" else "fp32"


#: the parameter dtypes torch's fused CUDA AdamW is used for
FUSED_ADAMW_DTYPES = (torch.float32, torch.bfloat16)


def adamw_implementation(params: Sequence[torch.Tensor]) -> dict[str, bool]:
    """torch's fused AdamW where every parameter is a CUDA fp32/bf16 tensor, its foreach (multi-tensor) one
    otherwise: one kernel (or one per group) instead of a dozen per tensor. Same math as the per-tensor loop: on
    CPU foreach is bitwise the same; fused differs by float rounding. The state (``step`` included) keeps its
    keys and shapes, so the checkpoint's optimizer file does not change."""
    if params and all(p.device.type == "cuda" and p.dtype in FUSED_ADAMW_DTYPES for p in params):
        return {"fused": True}
    return {"foreach": True}


def _is_adapter_tensor(name: str) -> bool:
    """LoRA tensors go bf16 with fp32 masters; anything else (PPO's value head) stays its own fp32 master."""
    return "lora_" in name


class TrainedParameters:
    """One AdamW over one parameter set, with the step that reports grad norm and parameter change.

    ``bf16_master``: the model's LoRA tensors become bf16 and the optimizer steps fp32 masters
    (:class:`~miniverl.training.update.Bf16MasterAdapter`). :attr:`params` and :meth:`named` are then
    the masters: the clip, the step, the change norm, the checkpoint and the rollout's policy digest
    all see the fp32 masters, and :meth:`load` restores masters and re-derives the model's tensors.
    """

    def __init__(
        self,
        named: list[tuple[str, torch.nn.Parameter]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        max_grad_norm: float | None,
        bf16_master: bool = False,
    ) -> None:
        self.names = [n for n, _ in named]
        self.master: Bf16MasterAdapter | None = None
        self.params = [p for _, p in named]
        if bf16_master:
            self.master = Bf16MasterAdapter([p for n, p in named if _is_adapter_tensor(n)])
            master_of = {id(p): m for p, m in zip(self.master.params, self.master.masters, strict=True)}
            self.params = [master_of.get(id(p), p) for p in self.params]
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(
            self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **adamw_implementation(self.params)
        )
        self.steps_taken = 0  # optimizer steps so far (an algorithm reports its steps per update from it)
        self._update_steps: list[int] = []  # this update's optimizer steps, one entry per pass

    @property
    def precision(self) -> AdapterPrecision:
        return "fp32" if self.master is None else "bf16_master"

    def begin_update(self) -> None:
        """Start counting one cycle's update (its passes and optimizer steps, for the metrics line)."""
        self._update_steps = []

    def begin_pass(self) -> None:
        """One pass over the cycle's trajectories starts; the steps until the next pass are its mini-batches."""
        self._update_steps.append(0)

    def update_counts(self, prefix: str) -> dict[str, float]:
        """``{prefix}/updates`` (optimizer steps of this update), ``/passes`` and ``/mini_batches`` (steps per
        pass), as this wrapper counted them since :meth:`begin_update`."""
        per_pass = set(self._update_steps)
        if len(per_pass) > 1:
            raise RuntimeError(f"{prefix}: passes of one update took different step counts {self._update_steps}")
        return {
            f"{prefix}/updates": float(sum(self._update_steps)),
            f"{prefix}/passes": float(len(self._update_steps)),
            f"{prefix}/mini_batches": float(per_pass.pop() if per_pass else 0),
        }

    def named(self) -> dict[str, torch.nn.Parameter]:
        """Name -> the tensor the optimizer steps (the fp32 master under ``bf16_master``)."""
        return dict(zip(self.names, self.params, strict=True))

    def load(self, tensors: Mapping[str, torch.Tensor]) -> None:
        """Restore the stepped tensors (masters) from a checkpoint and re-derive the model's from them."""
        named = self.named()
        with torch.no_grad():
            for name, tensor in tensors.items():
                named[name].copy_(tensor.to(named[name].device, named[name].dtype))
        if self.master is not None:
            self.master.masters_to_model()

    def masters_in_model(self) -> AbstractContextManager[None]:
        """Inside the block the model holds the fp32 masters (a PEFT save writes them); a no-op in fp32."""
        return nullcontext() if self.master is None else self.master.masters_in_model()

    def step(self) -> tuple[float, float]:
        """Clip, step, zero the grads; return ``(grad norm before clipping, L2 norm of the change)``."""
        if self.master is not None:
            self.master.grads_to_masters()
        before = [p.detach().clone() for p in self.params]
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if self.master is not None:
            self.master.masters_to_model()
        self.steps_taken += 1
        if not self._update_steps:  # a single-step update that never called begin_pass is one pass
            self._update_steps.append(0)
        self._update_steps[-1] += 1
        delta = math.sqrt(sum(float((p.detach() - b).pow(2).sum()) for p, b in zip(self.params, before, strict=True)))
        return grad_norm, delta

    def release(self) -> None:
        self.optimizer.state.clear()
        self.optimizer.param_groups.clear()


def actor_parameters(config: MiniverlConfig, runtime: RoleRuntime) -> TrainedParameters:
    train = config.train
    return TrainedParameters(
        list(runtime.named_trainable_parameters()),
        lr=train.learning_rate,
        betas=train.adam_betas,
        eps=train.adam_eps,
        weight_decay=train.weight_decay,
        max_grad_norm=train.max_grad_norm,
        bf16_master=resolve_adapter_precision(config, runtime.device) == "bf16_master",
    )


class Algorithm(ABC):
    """One training algorithm. Subclasses set ``name`` and ``roles`` and implement ``update``."""

    name: ClassVar[str]
    #: runtime roles the algorithm always uses (``student`` is implied)
    roles: ClassVar[tuple[RoleName, ...]] = ()
    #: ``True``: the controller samples and scores trajectories; ``False`` (SFT, KD): the algorithm
    #: turns dataset rows into oracle trajectories itself (:meth:`oracle_trajectories`)
    on_policy: ClassVar[bool] = True

    def __init__(self, config: MiniverlConfig, runtime: RoleRuntime, actor: TrainedParameters) -> None:
        missing = [r for r in self.required_roles(config) if not runtime.has_role(r)]
        if missing:
            raise ConfigError(
                f"algorithm {self.name} needs runtime roles {', '.join(missing)}; configure them in models"
            )
        self.config = config
        self.runtime = runtime
        self.actor = actor

    def required_roles(self, config: MiniverlConfig) -> tuple[RoleName, ...]:
        """The roles this configuration needs (``roles`` plus conditional ones, e.g. a KL reference)."""
        return self.roles

    @abstractmethod
    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        """Targets/advantages from ``batch``, then the optimizer step(s). ``step``: updates done so far."""

    def prepare(self, rows: Sequence[PromptRow]) -> None:
        """Called once with the whole dataset before the first cycle (e.g. to reuse a teacher cache)."""
        return None

    def oracle_trajectories(self, prompts: Sequence[PromptRow], *, policy_version: int) -> list[Trajectory]:
        """Offline algorithms: the dataset's own trajectories for ``prompts`` (no sampling)."""
        raise NotImplementedError(f"algorithm {self.name} samples its trajectories (on_policy)")

    def state_tensors(self) -> dict[str, dict[str, torch.Tensor]]:
        """Checkpoint files (name -> tensors) beyond the actor's adapter and optimizer."""
        return {}

    def state_json(self) -> dict[str, Any]:
        return {}

    def load_state(self, tensors: Mapping[str, Mapping[str, torch.Tensor]], meta: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_tensors` / :meth:`state_json` wrote (nothing by default)."""
        return None

    def trained(self) -> list[TrainedParameters]:
        """Every parameter set this algorithm steps: the actor's, plus its own (PPO's critic)."""
        return [self.actor]

    def release(self) -> None:
        """Drop optimizer state beyond the actor's (teardown; nothing by default)."""
        return None

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
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from miniverl.config.schema import MiniverlConfig
from miniverl.data import PromptRow
from miniverl.errors import ConfigError
from miniverl.rewards import RewardScore
from miniverl.rollout.backends import LogprobSource
from miniverl.rollout.hf import Trajectory
from miniverl.runtime.base import RoleName, RoleRuntime
from miniverl.training.update import UpdateSequence


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
    """What one cycle's update did. ``advantages`` is one number per trajectory (for the records)."""

    loss: float
    kl: float | None
    tokens: int
    grad_norm: float
    adapter_delta_norm: float
    advantages: list[float] | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def nonzero_advantages(self) -> int | None:
        return None if self.advantages is None else sum(abs(a) > 0 for a in self.advantages)


class TrainedParameters:
    """One AdamW over one parameter set, with the step that reports grad norm and parameter change."""

    def __init__(
        self,
        named: list[tuple[str, torch.nn.Parameter]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        max_grad_norm: float | None,
    ) -> None:
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self.steps_taken = 0  # optimizer steps so far (an algorithm reports its steps per update from it)
        self._update_steps: list[int] = []  # this update's optimizer steps, one entry per pass

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
        return dict(zip(self.names, self.params, strict=True))

    def step(self) -> tuple[float, float]:
        """Clip, step, zero the grads; return ``(grad norm before clipping, L2 norm of the change)``."""
        before = [p.detach().clone() for p in self.params]
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.max_grad_norm is not None:
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        else:
            grad_norm = float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))) if grads else 0.0
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
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

    def release(self) -> None:
        """Drop optimizer state beyond the actor's (teardown; nothing by default)."""
        return None

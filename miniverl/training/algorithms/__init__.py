"""Training algorithms, one module each, behind one interface (:class:`Algorithm`).

========  =====================================================  ==========================
name      roles (beyond the student)                             updates per cycle
========  =====================================================  ==========================
``grpo``  reference (only with ``kl_coef > 0``)                  ppo_epochs x mini_batches
``opd``   teacher                                                1
``ppo``   critic; reference (only with ``kl_coef > 0``)          ppo_epochs x mini_batches
``sft``   none (oracle trajectories from a data column)          1
``kd``    teacher (online, or a reused teacher cache)            1
========  =====================================================  ==========================
"""

from __future__ import annotations

from miniverl.config.schema import MiniverlConfig
from miniverl.runtime.base import RoleRuntime
from miniverl.training.algorithms.base import (
    Algorithm,
    AlgorithmStep,
    CycleBatch,
    TrainedParameters,
    actor_parameters,
)
from miniverl.training.algorithms.grpo import Grpo
from miniverl.training.algorithms.kd import Kd
from miniverl.training.algorithms.opd import Opd
from miniverl.training.algorithms.ppo import Ppo
from miniverl.training.algorithms.sft import Sft

ALGORITHMS: dict[str, type[Algorithm]] = {cls.name: cls for cls in (Grpo, Opd, Ppo, Sft, Kd)}

__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "AlgorithmStep",
    "CycleBatch",
    "TrainedParameters",
    "actor_parameters",
    "build_algorithm",
]


def build_algorithm(config: MiniverlConfig, runtime: RoleRuntime) -> Algorithm:
    """The algorithm ``config.algorithm.name`` names, with the actor's optimizer."""
    cls = ALGORITHMS[config.algorithm.name]
    return cls(config, runtime, actor_parameters(config, runtime))

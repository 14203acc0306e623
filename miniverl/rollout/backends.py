"""Rollout backends and where their log-probs come from: the policy-gradient fail-closed boundary.

A rollout backend generates one cycle's trajectories and says where their ``sampled_logprobs`` come
from (:attr:`RolloutBackend.logprob_source`):

* ``"trainer"``: the training model itself computed them, in this process (``rollout.backend: hf``,
  with either engine: the transformers decode loop on the live weights, or the fast engine's copy
  folded from them);
* ``"foreign"``: another engine computed them (``rollout.backend: vllm``): other kernels, other
  numerics, possibly other weights if a refresh went wrong.

A policy-gradient update (GRPO, PPO) needs ``old_logp``, the log-probs of the sampled tokens under
the policy that sampled them. miniverl's algorithms recompute them with the training model
(:func:`old_logp_origin` returns ``"trainer"``); an algorithm that turns the recompute off may take
the rollout's own log-probs only when they come from the trainer and were sampled from the
unmodified distribution. Foreign log-probs without the recompute refuse the update with one
:class:`ForeignLogprobError` line: they never reach a loss.

``rollout.backend: vllm`` is in the config schema. ``plan`` (and ``run``, which re-checks the plan)
refuses it here with one line naming the reason: vllm is not installed, or it is installed but this
version has no vllm generation path yet. The harness records that as ``not_run``, never as passed.

The evidence a vllm generation path must write (issue #32; the harness's ``vllm_boundary`` judges nothing
else, ``harness/qualify/full/refresh.py`` ``VLLM_TRAJECTORY_FIELDS``): the plan keeps
``rollout.backend: vllm``; each metrics line sets ``rollout_backend`` to ``"vllm"``,
``actor/old_logp_recomputed`` to 1.0 and ``actor/old_logp_max_abs_diff`` to the cycle's maximum of
``|sampled_logprobs - old_logprobs|``; each trajectory record carries ``rollout_backend: "vllm"``,
``rollout_backend_version`` (``vllm.__version__``), ``sampled_logprobs`` (vLLM's, one per response token)
and ``old_logprobs`` (the trainer's recomputed ones, one per response token).

Torch-free at import (``plan`` imports this module); :meth:`InProcessBackend.generate` imports the
generator lazily.
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from miniverl.errors import DependencyError, MiniverlError

if TYPE_CHECKING:
    from miniverl.config.schema import MiniverlConfig, RolloutSection

LogprobSource = Literal["trainer", "foreign"]
OldLogpOrigin = Literal["trainer", "rollout"]

#: ``algorithm_metrics`` key a policy-gradient update sets: 1.0 when the trainer recomputed ``old_logp``,
#: 0.0 when it took the rollout's own log-probs (the harness requires 1.0 for a foreign backend)
OLD_LOGP_RECOMPUTED = "actor/old_logp_recomputed"


class ForeignLogprobError(MiniverlError):
    """A policy-gradient update was handed foreign log-probs without recomputing ``old_logp``."""


class RolloutBackend(ABC):
    """One way to sample a cycle's trajectories. ``generate`` returns them in prompt-major order."""

    name: ClassVar[str]
    logprob_source: ClassVar[LogprobSource]

    @abstractmethod
    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        """The trajectories for ``prompts`` (``miniverl.rollout.hf.generate_group``'s arguments)."""


class InProcessBackend(RolloutBackend):
    """``rollout.backend: hf``: the training model samples in this process (``rollout.engine`` picks how)."""

    name = "hf"
    logprob_source = "trainer"

    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        from miniverl.rollout.hf import generate_group

        return generate_group(model, tokenizer, prompts, **sampling)


def vllm_installed() -> bool:
    """Whether ``import vllm`` could find the package (nothing is imported)."""
    return importlib.util.find_spec("vllm") is not None


class VllmBackend(RolloutBackend):
    """``rollout.backend: vllm``: sampling in vLLM, whose log-probs are foreign to the trainer.

    Refused before any model loads (:func:`check_rollout_backend`): when vllm is not installed, and
    when it is, because this version has no vllm generation path yet.
    """

    name = "vllm"
    logprob_source = "foreign"

    def __init__(self) -> None:
        check_vllm()

    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        check_vllm()
        raise AssertionError("unreachable: check_vllm always refuses in this version")  # pragma: no cover


VLLM_NOT_INSTALLED = "rollout.backend vllm: vllm is not installed, so this run cannot sample with it"
VLLM_NOT_WIRED = (
    "rollout.backend vllm: vllm is installed, but this miniverl version has no vllm generation path; "
    "use rollout.backend hf"
)


def check_vllm() -> None:
    """Refuse ``rollout.backend: vllm`` with one line naming why (never a silent fallback to hf)."""
    if not vllm_installed():
        raise DependencyError(f"{VLLM_NOT_INSTALLED}; use rollout.backend hf")
    raise DependencyError(VLLM_NOT_WIRED)


BACKENDS: dict[str, type[RolloutBackend]] = {cls.name: cls for cls in (InProcessBackend, VllmBackend)}


def check_rollout_backend(config: MiniverlConfig) -> None:
    """``plan``'s check: the configured backend can run here (one line if not)."""
    if config.rollout.backend == "vllm":
        check_vllm()


def rollout_backend(rollout: RolloutSection) -> RolloutBackend:
    """The backend ``rollout.backend`` names (refusing one that cannot run here)."""
    return BACKENDS[rollout.backend]()


def old_logp_origin(source: LogprobSource, *, recompute: bool, algorithm: str, plain_sampling: bool) -> OldLogpOrigin:
    """Where a policy-gradient update takes ``old_logp`` from, or a refusal.

    ``recompute``: the algorithm recomputes ``old_logp`` with the training model (miniverl's default).
    Without it the rollout's ``sampled_logprobs`` are used, which is only sound when the trainer
    computed them (``source == "trainer"``) from the unmodified policy (``plain_sampling``:
    temperature 1, no top-k/top-p filtering).
    """
    if recompute:
        return "trainer"
    if source != "trainer":
        raise ForeignLogprobError(
            f"{algorithm}: refusing the update: the rollout's log-probs come from another engine ({source}) and "
            "old_logp recompute is off; a policy-gradient update needs old_logp recomputed by the training model"
        )
    if not plain_sampling:
        raise ForeignLogprobError(
            f"{algorithm}: refusing the update: old_logp recompute is off but the rollout sampled from a "
            "temperature-scaled or filtered distribution, so its log-probs are not the policy's"
        )
    return "rollout"


def plain_sampling(rollout: RolloutSection) -> bool:
    """Sampled log-probs equal the policy's own: temperature 1, no top-k, no top-p filtering."""
    return rollout.temperature == 1.0 and rollout.top_k == 0 and rollout.top_p == 1.0

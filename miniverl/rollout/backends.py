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

``rollout.backend: vllm`` samples with vLLM in this process (:mod:`miniverl.rollout.vllm_engine`). ``plan``
(and ``run``, which re-checks the plan) refuses it with one line where vllm is not installed (the harness records
that as ``not_run``, never as passed), and refuses by name a plan whose policy-gradient update would take vLLM's
log-probs as ``old_logp`` (``algorithm.old_logp: rollout``): that is the fail-closed boundary.

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
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from miniverl.errors import DependencyError, MiniverlError, UsageError

if TYPE_CHECKING:
    from miniverl.config.schema import MiniverlConfig, RolloutSection
    from miniverl.rollout.vllm_engine import VllmEngine
    from miniverl.runtime.memory_plan import VllmMemory

LogprobSource = Literal["trainer", "foreign"]
OldLogpOrigin = Literal["trainer", "rollout"]

#: ``algorithm_metrics`` key a policy-gradient update sets: 1.0 when the trainer recomputed ``old_logp``,
#: 0.0 when it took the rollout's own log-probs (the harness requires 1.0 for a foreign backend)
OLD_LOGP_RECOMPUTED = "actor/old_logp_recomputed"
#: the algorithms whose update is a policy gradient with an ``old_logp`` ratio
POLICY_GRADIENT = ("grpo", "ppo")


class ForeignLogprobError(MiniverlError):
    """A policy-gradient update was handed foreign log-probs without recomputing ``old_logp``."""


class RolloutBackend(ABC):
    """One way to sample a cycle's trajectories. ``generate`` returns them in prompt-major order."""

    name: ClassVar[str]
    logprob_source: ClassVar[LogprobSource]

    @abstractmethod
    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        """The trajectories for ``prompts`` (``miniverl.rollout.hf.generate_group``'s arguments)."""

    def switch_metrics(self) -> dict[str, float]:
        """What the last rollout's engine switches cost (seconds by metric key); none for in-process engines."""
        return {}

    def bind(self, save_adapter: Callable[[str], None], lora_rank: int | None) -> None:
        """What the run's student gives a backend outside the training model (nothing for in-process engines):
        how to write its adapter as a PEFT folder, and its LoRA rank."""
        del save_adapter, lora_rank


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
    """``rollout.backend: vllm``: sampling in a colocated vLLM, whose log-probs are foreign to the trainer.

    Refused before any model loads where vllm is not installed (:func:`check_rollout_backend`). The engine is
    built at the first rollout, from the student's base model as a transformers folder
    (:func:`miniverl.rollout.vllm_engine.vllm_model_dir`: the folder it was loaded from, or its weights written
    once as bf16 safetensors into the run's scratch folder) and its LoRA rank
    (:func:`miniverl.rollout.vllm_engine.load_llm`), or by ``engine_factory`` (tests: a named fake).
    """

    name = "vllm"
    logprob_source = "foreign"

    def __init__(self, engine_factory: Callable[[Any], VllmEngine] | None = None) -> None:
        if engine_factory is None:
            check_vllm()
        self._factory = engine_factory
        self.memory: VllmMemory | None = None  # the memory plan's share and limits (:meth:`configure`)
        self.engine: VllmEngine | None = None
        self.save_adapter: Callable[[str], None] | None = None
        self.lora_rank: int | None = None

    def bind(self, save_adapter: Callable[[str], None], lora_rank: int | None) -> None:
        self.save_adapter, self.lora_rank = save_adapter, lora_rank

    def configure(self, memory: VllmMemory | None) -> None:
        self.memory = memory

    def _engine(self, model: Any, tokenizer: Any, seed: int) -> VllmEngine:
        if self.engine is None:
            if self._factory is not None:
                self.engine = self._factory(model)
            else:
                import tempfile

                from miniverl.rollout.vllm_engine import load_llm, vllm_model_dir

                if self.memory is None:
                    raise UsageError(
                        "rollout.backend vllm: no memory plan for vLLM (it runs on a CUDA device, where the plan "
                        "sizes its share of the GPU)"
                    )
                scratch = Path(tempfile.mkdtemp(prefix="miniverl-vllm-"))
                self.engine = load_llm(
                    vllm_model_dir(model, tokenizer, scratch),
                    memory=self.memory,
                    max_lora_rank=self.lora_rank if self.lora_rank is not None else lora_rank(model),
                    seed=seed,
                    scratch=scratch,
                )
        return self.engine

    def _saver(self, model: Any) -> Callable[[Path], None]:
        bound = self.save_adapter
        if bound is not None:
            return lambda path: bound(str(path))
        return lambda path: model.save_pretrained(str(path))

    def switch_metrics(self) -> dict[str, float]:
        """The last rollout's wake and sleep seconds, and the share of the GPU the memory plan gave vLLM."""
        planned = self.memory.metrics() if self.memory is not None else {}
        return {**planned, **(self.engine.switch_seconds if self.engine is not None else {})}

    def generate(self, model: Any, tokenizer: Any, prompts: Any, **sampling: Any) -> list[Any]:
        from dataclasses import replace

        from miniverl.rollout.hf import Trajectory, derive_sample_seed, encode_prompt, group_id_for, resolve_eos_ids
        from miniverl.rollout.vllm_engine import SampledRow
        from miniverl.rollout.weights import policy_digest

        seed, version = int(sampling["seed"]), int(sampling["policy_version"])
        use_chat_template = bool(sampling.get("use_chat_template", True))
        engine = self._engine(model, tokenizer, seed)
        rows: list[tuple[Any, int, SampledRow]] = []
        for prompt in prompts:
            ids = encode_prompt(tokenizer, prompt.prompt, use_chat_template=use_chat_template)
            for index in range(int(sampling["samples_per_prompt"])):
                rows.append(
                    (prompt, index, SampledRow(ids, derive_sample_seed(seed, version, prompt.prompt_id, index)))
                )
        eos_ids = resolve_eos_ids(model, tokenizer)
        if not eos_ids:
            raise DependencyError("rollout.backend vllm: no EOS token id in the tokenizer or the model config")
        sampled = engine.sample(
            [row for _, _, row in rows],
            policy_version=version,
            save_adapter=self._saver(model),
            max_new_tokens=int(sampling["max_new_tokens"]),
            temperature=float(sampling.get("temperature", 1.0)),
            top_p=float(sampling.get("top_p", 1.0)),
            top_k=int(sampling.get("top_k", 0)),
            eos_ids=eos_ids,
        )
        report = sampling.get("report")
        if report is not None:
            report.backend = "vllm"
            tensors = sampling.get("policy_tensors")
            report.policy_digest = policy_digest(tensors) if tensors is not None else None
        out = []
        for (prompt, index, row), drawn in zip(rows, sampled, strict=True):
            trajectory = Trajectory(
                prompt_id=prompt.prompt_id,
                sample_index=index,
                group_id=group_id_for(prompt.prompt_id, version),
                policy_version=version,
                seed=row.seed,
                prompt_token_ids=tuple(row.prompt_ids),
                response_token_ids=tuple(drawn.token_ids),
                sampled_logprobs=tuple(drawn.logprobs),
                finish_reason="eos" if drawn.finish == "eos" else "length",
                prompt_text=prompt.prompt,
                response_text=tokenizer.decode(drawn.token_ids, skip_special_tokens=True),
            )
            out.append(replace(trajectory, rollout_backend="vllm", rollout_backend_version=engine.version))
        return out


def lora_rank(model: Any) -> int:
    """The student's LoRA rank (vLLM's ``max_lora_rank``)."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict) or not configs:
        raise DependencyError("rollout.backend vllm: the student has no LoRA adapter to hand to vLLM")
    return int(next(iter(configs.values())).r)


VLLM_NOT_INSTALLED = "rollout.backend vllm: vllm is not installed, so this run cannot sample with it"
#: the fail-closed boundary, refused by ``plan``: PG never takes vLLM's log-probs as old_logp
VLLM_LOGPROBS_AS_OLD_LOGP = (
    "rollout.backend vllm: algorithm.old_logp rollout would make the policy-gradient update take vLLM's "
    "log-probs as old_logp; the trainer must recompute them (algorithm.old_logp recompute)"
)


def check_vllm() -> None:
    """Refuse ``rollout.backend: vllm`` where vllm is absent, with one line (never a silent fallback to hf)."""
    if not vllm_installed():
        raise DependencyError(f"{VLLM_NOT_INSTALLED}; use rollout.backend hf")


BACKENDS: dict[str, type[RolloutBackend]] = {cls.name: cls for cls in (InProcessBackend, VllmBackend)}


def check_rollout_backend(config: MiniverlConfig) -> None:
    """``plan``'s check: the configured backend can run here, and a policy-gradient update never takes a
    foreign backend's log-probs as ``old_logp`` (one line if not)."""
    if config.rollout.backend != "vllm":
        return
    if config.algorithm.old_logp == "rollout" and config.algorithm.name in POLICY_GRADIENT:
        raise ForeignLogprobError(VLLM_LOGPROBS_AS_OLD_LOGP)
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

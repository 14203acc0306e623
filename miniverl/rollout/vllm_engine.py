"""``rollout.backend: vllm``: vLLM in this process, beside the trainer, on the same GPU (issue #32).

One :class:`VllmEngine` holds one ``vllm.LLM`` built with LoRA and sleep mode on, its GPU memory fraction
taken from the memory plan (:func:`load_llm`). Each policy version reaches vLLM as a new LoRA adapter
(:class:`AdapterVersions`: the trainer's adapter saved once per version, under a LoRA id never used before,
so vLLM cannot serve a cached older one). vLLM sleeps while the trainer updates and wakes for the next
rollout; both switches are timed into the metrics (:data:`WAKE_SECONDS`, :data:`SLEEP_SECONDS`).

vLLM's own log-prob of each sampled token (``logprobs_mode="processed_logprobs"``: of the distribution it
drew from, as ``sampled_logprobs`` means everywhere in miniverl) goes into the trajectory. They are foreign
to the trainer: a policy-gradient update always recomputes ``old_logp`` with the training model, and the
controller records both per token and the per-step mismatch (:func:`mismatch_metrics`).

Torch-free and vllm-free at import: ``vllm`` is imported only by :func:`load_llm` and
:func:`vllm_version`. Tests drive :class:`VllmEngine` with a named fake of the ``vllm.LLM`` surface it uses
(:class:`VllmLLM`); such a fake never writes harness evidence.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from miniverl.errors import MiniverlError, UsageError

#: the metrics keys of the rollout/trainer mismatch (per step, over every response token of the cycle)
OLD_LOGP_MAX_ABS_DIFF = "actor/old_logp_max_abs_diff"
MISMATCH_MEAN_ABS_DIFF = "rollout/mismatch_mean_abs_logp_diff"
MISMATCH_OUTSIDE_FRACTION = "rollout/mismatch_ratio_outside_frac"
MISMATCH_TOKENS = "rollout/mismatch_tokens"
#: the probability ratio trainer / sampler a token may have and still count as matched
MISMATCH_RATIO_BAND = (0.9, 1.1)
#: the switch times of one cycle, seconds
WAKE_SECONDS = "rollout/vllm_wake_seconds"
SLEEP_SECONDS = "rollout/vllm_sleep_seconds"
#: sleep level 1: weights to host memory, KV cache dropped (the trainer gets the GPU for its update)
SLEEP_LEVEL = 1


class VllmRolloutError(MiniverlError):
    """vLLM returned something a trajectory cannot be built from."""


def mismatch_metrics(sampled: Sequence[Sequence[float]], old: Sequence[Sequence[float]]) -> dict[str, float]:
    """The rollout/trainer mismatch of one step: per response token, ``delta = old - sampled`` (trainer minus
    sampler log-prob); the fraction of tokens whose ratio ``exp(delta)`` lies outside
    :data:`MISMATCH_RATIO_BAND`, the max and the mean of ``|delta|``."""
    if len(sampled) != len(old):
        raise ValueError(f"{len(sampled)} sampled trajectories, {len(old)} recomputed")
    deltas: list[float] = []
    for number, (s, o) in enumerate(zip(sampled, old, strict=True), start=1):
        if len(s) != len(o):
            raise ValueError(f"trajectory {number}: {len(s)} sampled log-probs, {len(o)} recomputed")
        deltas += [b - a for a, b in zip(s, o, strict=True)]
    if not deltas:
        raise ValueError("no response tokens: the mismatch is undefined")
    if not all(math.isfinite(d) for d in deltas):
        raise ValueError("a log-prob is not finite")
    low, high = MISMATCH_RATIO_BAND
    outside = sum(1 for d in deltas if not low <= math.exp(d) <= high)
    magnitudes = [abs(d) for d in deltas]
    return {
        OLD_LOGP_MAX_ABS_DIFF: max(magnitudes),
        MISMATCH_MEAN_ABS_DIFF: sum(magnitudes) / len(magnitudes),
        MISMATCH_OUTSIDE_FRACTION: outside / len(deltas),
        MISMATCH_TOKENS: float(len(deltas)),
    }


@dataclass(frozen=True)
class AdapterSlot:
    """The LoRA adapter vLLM samples one policy version with."""

    policy_version: int
    lora_id: int
    name: str
    path: Path


@dataclass
class AdapterVersions:
    """One LoRA adapter per policy version, each under a LoRA id never given before.

    vLLM caches adapters by id, so a refreshed policy under an old id would be sampled with the old weights;
    a version older than the newest is refused (the trainer only moves forward).
    """

    root: Path
    slots: list[AdapterSlot] = field(default_factory=list)

    def slot(self, policy_version: int, save: Callable[[Path], None]) -> AdapterSlot:
        """The adapter of ``policy_version``: the newest one again, or ``save`` called into a new folder."""
        if self.slots and self.slots[-1].policy_version == policy_version:
            return self.slots[-1]
        if self.slots and policy_version < self.slots[-1].policy_version:
            raise UsageError(
                f"vllm rollout: policy version {policy_version} after version {self.slots[-1].policy_version}; "
                "versions only move forward"
            )
        lora_id = len(self.slots) + 1
        path = self.root / f"policy-v{policy_version}"
        path.mkdir(parents=True, exist_ok=False)
        save(path)
        if not (path / "adapter_config.json").is_file():
            raise VllmRolloutError(f"vllm rollout: the adapter of policy version {policy_version} was not saved")
        made = AdapterSlot(policy_version, lora_id, f"policy-v{policy_version}", path)
        self.slots.append(made)
        return made


class VllmLLM(Protocol):
    """The part of ``vllm.LLM`` the engine uses."""

    def generate(self, prompts: Any, sampling_params: Any = ..., *, lora_request: Any = ...) -> list[Any]: ...

    def sleep(self, level: int = ...) -> None: ...

    def wake_up(self) -> None: ...


@dataclass(frozen=True)
class SampledRow:
    """One sample to draw: the prompt's ids and the sample's own seed."""

    prompt_ids: list[int]
    seed: int


@dataclass(frozen=True)
class Sampled:
    """What vLLM drew for one row."""

    token_ids: list[int]
    logprobs: list[float]
    finish: str  # "eos" | "length"


def _sampled_logprob(position: Any, token: int, where: str) -> float:
    """vLLM's log-prob of the sampled ``token`` at one position (a dict token id -> Logprob)."""
    entry = position.get(token) if isinstance(position, dict) else None
    value = getattr(entry, "logprob", entry)
    if not isinstance(value, int | float) or not math.isfinite(value) or value > 0.0:
        raise VllmRolloutError(f"vllm rollout: {where}: no finite log-prob <= 0 for the sampled token {token}")
    return float(value)


def read_completion(output: Any, eos_ids: Sequence[int], where: str) -> Sampled:
    """One ``RequestOutput``'s single completion as tokens, log-probs and how it ended."""
    completions = getattr(output, "outputs", None)
    if not completions or len(completions) != 1:
        raise VllmRolloutError(f"vllm rollout: {where}: expected one completion")
    completion = completions[0]
    tokens = [int(t) for t in completion.token_ids]
    positions = completion.logprobs
    if not tokens or positions is None or len(positions) != len(tokens):
        raise VllmRolloutError(f"vllm rollout: {where}: {len(tokens)} tokens but no log-prob for each")
    logprobs = [_sampled_logprob(p, t, where) for p, t in zip(positions, tokens, strict=True)]
    if completion.finish_reason == "length":
        finish = "length"
    elif completion.finish_reason == "stop" and tokens[-1] in eos_ids:
        finish = "eos"
    else:
        raise VllmRolloutError(
            f"vllm rollout: {where}: finished {completion.finish_reason!r} on token {tokens[-1]}, not an EOS"
        )
    return Sampled(tokens, logprobs, finish)


@dataclass
class VllmEngine:
    """The colocated vLLM: wakes for a rollout, samples with the policy version's adapter, sleeps after."""

    llm: VllmLLM
    version: str
    adapters: AdapterVersions
    #: ``vllm.SamplingParams`` and ``vllm.lora.request.LoRARequest`` (or the fake's)
    sampling_params: Callable[..., Any]
    lora_request: Callable[..., Any]
    asleep: bool = False
    switch_seconds: dict[str, float] = field(default_factory=dict)

    def sample(
        self,
        rows: Sequence[SampledRow],
        *,
        policy_version: int,
        save_adapter: Callable[[Path], None],
        max_new_tokens: int,
        temperature: float,
        top_p: float,
        top_k: int,
        eos_ids: Sequence[int],
    ) -> list[Sampled]:
        """Each row drawn once by vLLM with policy ``policy_version``'s adapter; vLLM sleeps again after."""
        slot = self.adapters.slot(policy_version, save_adapter)
        self.switch_seconds = {}
        if self.asleep:
            started = time.perf_counter()
            self.llm.wake_up()
            self.switch_seconds[WAKE_SECONDS] = time.perf_counter() - started
            self.asleep = False
        try:
            params = [
                self.sampling_params(
                    n=1,
                    temperature=temperature,
                    top_p=top_p,
                    top_k=top_k if top_k > 0 else -1,
                    max_tokens=max_new_tokens,
                    logprobs=0,  # the sampled token's own log-prob
                    seed=row.seed,
                    stop_token_ids=list(eos_ids),
                    skip_special_tokens=False,
                )
                for row in rows
            ]
            request = self.lora_request(slot.name, slot.lora_id, str(slot.path))
            prompts = [{"prompt_token_ids": list(row.prompt_ids)} for row in rows]
            outputs = self.llm.generate(prompts, params, lora_request=request)
        finally:
            started = time.perf_counter()
            self.llm.sleep(level=SLEEP_LEVEL)
            self.switch_seconds[SLEEP_SECONDS] = time.perf_counter() - started
            self.asleep = True
        if len(outputs) != len(rows):
            raise VllmRolloutError(f"vllm rollout: {len(outputs)} outputs for {len(rows)} prompts")
        return [read_completion(out, eos_ids, f"sample {i + 1}") for i, out in enumerate(outputs)]


def vllm_version() -> str:
    """``vllm.__version__`` of the installed engine."""
    import vllm

    return str(vllm.__version__)


def load_llm(model_dir: Path, *, gpu_memory_utilization: float, max_lora_rank: int, seed: int) -> VllmEngine:
    """The colocated engine over the student's base model (a transformers folder), asleep until its first
    rollout. ``gpu_memory_utilization`` is the memory plan's share of the GPU for vLLM."""
    import tempfile

    import vllm
    from vllm.lora.request import LoRARequest

    if not 0.0 < gpu_memory_utilization < 1.0:
        raise UsageError(f"vllm rollout: gpu_memory_utilization {gpu_memory_utilization} is not in (0, 1)")
    llm = vllm.LLM(
        model=str(model_dir),
        dtype="bfloat16",
        enable_lora=True,
        max_loras=1,
        max_lora_rank=max_lora_rank,
        enable_sleep_mode=True,
        gpu_memory_utilization=gpu_memory_utilization,
        seed=seed,
        logprobs_mode="processed_logprobs",
    )
    llm.sleep(level=SLEEP_LEVEL)
    root = Path(tempfile.mkdtemp(prefix="miniverl-vllm-adapters-"))
    return VllmEngine(
        llm=llm,
        version=str(vllm.__version__),
        adapters=AdapterVersions(root),
        sampling_params=vllm.SamplingParams,
        lora_request=LoRARequest,
        asleep=True,
    )

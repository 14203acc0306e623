"""``rollout.backend: vllm``: vLLM in this process, beside the trainer, on the same GPU (issue #32).

One :class:`VllmEngine` holds one ``vllm.LLM`` built with LoRA and sleep mode on, its GPU memory fraction
taken from the memory plan (:func:`load_llm`). Each policy version reaches vLLM as a new LoRA adapter
(:class:`AdapterVersions`: the trainer's adapter saved once per version, under a LoRA id never used before,
so vLLM cannot serve a cached older one). vLLM sleeps while the trainer updates and wakes for the next
rollout; both switches are timed into the metrics (:data:`WAKE_SECONDS`, :data:`SLEEP_SECONDS`).

vLLM's own log-prob of each sampled token (``logprobs_mode="processed_logprobs"``: of the distribution it
drew from, as ``sampled_logprobs`` means everywhere in miniverl) goes into the trajectory. They are foreign
to the trainer: a policy-gradient update always recomputes ``old_logp`` with the training model, and the
controller records both per token and the per-step mismatch
(:func:`miniverl.rollout.agreement.mismatch_metrics`).

Torch-free and vllm-free at import: ``vllm`` is imported only by :func:`load_llm` and
:func:`vllm_version`. Tests drive :class:`VllmEngine` with a named fake of the ``vllm.LLM`` surface it uses
(:class:`VllmLLM`); such a fake never writes harness evidence.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from miniverl.errors import DependencyError, MiniverlError, UsageError
from miniverl.runtime.memory_plan import VllmMemory

#: the switch times of one cycle, seconds
WAKE_SECONDS = "rollout/vllm_wake_seconds"
SLEEP_SECONDS = "rollout/vllm_sleep_seconds"
#: sleep level 1: weights to host memory, KV cache dropped (the trainer gets the GPU for its update)
SLEEP_LEVEL = 1
#: the folder under the run's vLLM scratch that holds the student's base written for vLLM (where it was not
#: loaded from a transformers folder: GGUF)
BASE_FOLDER = "base-bf16"
BASE_WEIGHTS = "model.safetensors"


class VllmRolloutError(MiniverlError):
    """vLLM returned something a trajectory cannot be built from."""


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


def _inner(model: Any) -> Any:
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _transformers_folder(where: str) -> Path | None:
    """``where`` as a transformers folder with safetensors weights, or None."""
    if not where:
        return None
    path = Path(where)
    if path.is_dir() and (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return path
    return None


def vllm_model_dir(model: Any, tokenizer: Any, scratch: Path) -> Path:
    """The transformers folder vLLM loads the student's base from: the one it was loaded from, or (a GGUF, a
    model built in memory, a quantized base) its base weights as the trainer computes with them, written once as
    bf16 safetensors into ``scratch`` (:func:`write_base_folder`). A quantized (NF4) student never samples from
    its folder: those weights are not the ones it trains on."""
    base = _inner(model)
    config = getattr(base, "config", None)
    found = _transformers_folder(str(getattr(config, "_name_or_path", "") or ""))
    quantized = getattr(config, "quantization_config", None) is not None
    return found if found is not None and not quantized else write_base_folder(model, tokenizer, scratch / BASE_FOLDER)


def _dequantized_weights(base: Any) -> dict[str, Any]:
    """Each 4-bit (bitsandbytes) layer's weight as the trainer's forward computes with it, by state-dict name."""
    out: dict[str, Any] = {}
    for name, module in base.named_modules():
        weight: Any = getattr(module, "weight", None)
        state = getattr(weight, "quant_state", None)
        if weight is not None and state is not None:
            from bitsandbytes.functional import dequantize_4bit

            out[f"{name}.weight"] = dequantize_4bit(weight.data, state)
    return out


def write_base_folder(model: Any, tokenizer: Any, target: Path) -> Path:
    """The student's base model (LoRA layers left out: each policy version reaches vLLM as its own adapter) as a
    bf16 safetensors transformers folder: config, weights, tokenizer. A 4-bit base is written dequantized (the
    numbers its forward uses), without its quantization config."""
    import torch
    from safetensors.torch import save_file

    base = _inner(model)
    config = getattr(base, "config", None)
    if config is None:
        raise DependencyError("rollout.backend vllm: the student has no model config to write for vLLM")
    dequantized = _dequantized_weights(base)
    tensors: dict[str, Any] = {}
    for name, tensor in base.state_dict().items():
        if ".lora_" in name or any(name.startswith(f"{q}.") for q in dequantized):  # a 4-bit weight's quant state
            continue
        if ".modules_to_save." in name or ".original_module." in name:
            raise DependencyError(f"rollout.backend vllm: the student trains {name} whole; vLLM takes only LoRA")
        tensor = dequantized.get(name, tensor)
        if not torch.is_floating_point(tensor):
            raise DependencyError(f"rollout.backend vllm: the student's base tensor {name} is {tensor.dtype}")
        # a clone per tensor: safetensors refuses tensors that share storage (tied embeddings)
        tensors[name.replace(".base_layer.", ".")] = tensor.detach().to("cpu", torch.bfloat16).contiguous().clone()
    if getattr(config, "tie_word_embeddings", False):
        tensors.pop("lm_head.weight", None)
    doc = config.to_diff_dict()
    doc.pop("_name_or_path", None)
    doc.pop("quantization_config", None)
    doc["dtype"] = "bfloat16"
    doc.pop("torch_dtype", None)
    if not doc.get("architectures"):
        doc["architectures"] = [type(base).__name__]
    partial = target.with_name(target.name + ".partial")
    partial.mkdir(parents=True, exist_ok=False)
    save_file(tensors, str(partial / BASE_WEIGHTS), metadata={"format": "pt"})
    (partial / "config.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(str(partial))
    partial.rename(target)
    return target


def load_llm(model_dir: Path, *, memory: VllmMemory, max_lora_rank: int, seed: int, scratch: Path) -> VllmEngine:
    """The colocated engine over the student's base model (a transformers folder), asleep until its first
    rollout. ``memory`` is the memory plan's share of the GPU for vLLM (``gpu_memory_utilization``), its KV cache
    in bytes and the longest row and batch it is built for; the adapters of each policy version go under ``scratch``.
    ``MINIVERL_VLLM_ENFORCE_EAGER=1`` (a device diagnosis switch) builds it without torch.compile and CUDA
    graphs."""
    if not 0.0 < memory.share < 1.0:
        raise UsageError(f"vllm rollout: gpu_memory_utilization {memory.share} is not in (0, 1)")
    # in this process, beside the trainer: vLLM's default engine-core subprocess would hold its own CUDA context
    # and the sleep/wake switches would cross a process boundary
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    import vllm
    from vllm.lora.request import LoRARequest

    llm = vllm.LLM(
        model=str(model_dir),
        dtype="bfloat16",
        enable_lora=True,
        max_loras=1,
        max_lora_rank=max_lora_rank,
        enable_sleep_mode=True,
        gpu_memory_utilization=memory.share,
        kv_cache_memory_bytes=memory.kv_cache_bytes,
        max_model_len=memory.max_model_len,
        max_num_seqs=memory.max_num_seqs,
        seed=seed,
        logprobs_mode="processed_logprobs",
        enforce_eager=os.environ.get("MINIVERL_VLLM_ENFORCE_EAGER") == "1",
    )
    llm.sleep(level=SLEEP_LEVEL)
    return VllmEngine(
        llm=llm,
        version=str(vllm.__version__),
        adapters=AdapterVersions(scratch / "adapters"),
        sampling_params=vllm.SamplingParams,
        lora_request=LoRARequest,
        asleep=True,
    )

"""The fast rollout engine: a folded bf16 policy copy, a static KV cache and CUDA-graph decode steps.

Per call (one policy version, a list of rows)::

    fold the policy (LoRA delta into base weights) unless this policy version is already folded
    for each chunk of ``batch_size`` rows (the last chunk is padded to the bucket with filler rows):
        prefill all prompts in one forward; sample column 0
        repeat: replay the captured decode step of the current attention span
                (forward + on-device sampling + state update, no host sync)
                every ``check_every`` steps read "all rows finished?" once and stop if so
        copy tokens and log-probs to the host once; cut each row after its first EOS

CUDA graphs: our own ``torch.cuda.CUDAGraph`` per (workspace, span), not
``torch.compile(mode="reduce-overhead")``. The step is a fixed sequence of aten ops on static
tensors, so plain capture removes the launch overhead without a compiler warm-up (tens of seconds
per shape under inductor), without recompiles when the batch bucket or span changes, and without
torch.compile's constraints on the policy copy, which is refilled in place (``copy_``) for every
policy version so the graphs stay valid. On CPU the same step runs eagerly.

Random streams: the token at response position ``n`` of a sample uses ``uniform(seed, n)``
(:mod:`miniverl.rollout.streams`), so a sample is the same whatever shares its batch.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from miniverl.errors import UsageError
from miniverl.rollout.decoder import DecodeWorkspace, SamplingSpec
from miniverl.rollout.kernels import KERNEL_CHOICES, triton_unavailable_reason
from miniverl.rollout.weights import RolloutWeights, fold_policy, policy_digest, unsupported_reason

FinishReason = Literal["eos", "length"]


@dataclass(frozen=True)
class EngineRow:
    prompt_ids: Sequence[int]
    seed: int


@dataclass
class EngineStats:
    folds: int = 0
    captures: int = 0
    decode_steps: int = 0
    host_syncs: int = 0


def _policy_state(model: Any) -> tuple[Any, ...]:
    """What the folded weights are a function of: every parameter's identity (name, storage, in-place
    version counter: an optimizer step or a ``copy_`` bumps it) and the LoRA layers' active/disabled/
    merged adapter state (a role switch or PEFT's ``disable_adapter()`` changes it without touching
    any parameter)."""
    tensors = tuple((name, p.data_ptr(), int(p._version)) for name, p in model.named_parameters())
    adapters = tuple(
        (name, tuple(m.active_adapters), bool(m.disable_adapters), bool(m.merged))
        for name, m in model.named_modules()
        if hasattr(m, "lora_A") and hasattr(m, "base_layer")
    )
    return tensors, adapters


class FastRolloutEngine:
    """Holds the folded policy copy and the decode workspace of one model (see the module docstring)."""

    def __init__(
        self,
        *,
        device: torch.device,
        dtype: torch.dtype,
        use_graphs: bool | None = None,
        compile_glue: bool = False,
        kernels: str = "torch",
    ) -> None:
        """``kernels``: ``"torch"`` (the decoder's torch maths) or ``"triton"`` (the decode step's triton
        kernels, :mod:`miniverl.rollout.kernels`; on CPU only under ``TRITON_INTERPRET=1``)."""
        self.device, self.dtype = _normalized(device), dtype
        self.use_graphs = self.device.type == "cuda" if use_graphs is None else use_graphs
        self.compile_glue = compile_glue
        self.kernels = _checked_kernels(kernels, self.device, compile_glue)
        self.weights: RolloutWeights | None = None
        self.workspace: DecodeWorkspace | None = None
        self._fold_key: tuple[Any, ...] | None = None
        self.fold_digest: str | None = None  # policy_digest of the adapter snapshot the current fold was made from
        self.stats = EngineStats()

    def sync_policy(
        self, model: Any, policy_version: int, tensors: Mapping[str, torch.Tensor] | None = None
    ) -> str | None:
        """Fold ``model`` into the rollout copy unless this (version, parameter state) is already there.

        ``tensors`` (the trainable adapter tensors, by name): their :func:`policy_digest` is taken at
        fold time, from the very tensors folded, and kept with the fold. Returns the digest of the
        snapshot the current fold was made from (a reused fold reports its own, older snapshot, so a
        stale fold shows up as a mismatch with the live policy); ``None`` without ``tensors``.
        """
        key = (policy_version, _policy_state(model))
        reuse = self.weights is not None and key == self._fold_key
        if reuse and (tensors is None or self.fold_digest is not None):
            return self.fold_digest if tensors is not None else None
        digest = policy_digest(tensors) if tensors is not None else None
        old = self.weights
        self.weights = fold_policy(model, device=self.device, dtype=self.dtype, into=old)
        same = old is not None and all(
            new.data_ptr() == was.data_ptr()
            for new, was in ((self.weights.embed, old.embed), (self.weights.lm_head, old.lm_head))
        )  # the embedding may be the model's own tensor, a new view of it on every fold
        if not same:
            self.workspace = None  # new tensors: captured graphs would read the old ones
        self._fold_key = key
        self.fold_digest = digest
        self.stats.folds += 1
        return digest

    def _workspace(self, batch: int, capacity: int, max_new_tokens: int) -> DecodeWorkspace:
        assert self.weights is not None
        ws = self.workspace
        if ws is None or ws.batch != batch or ws.capacity < capacity or ws.max_new_tokens != max_new_tokens:
            self.workspace = None
            ws = DecodeWorkspace(
                self.weights,
                batch=batch,
                capacity=capacity,
                max_new_tokens=max_new_tokens,
                device=self.device,
                compile_glue=self.compile_glue,
                kernels=self.kernels,
            )
            self.workspace = ws
        return ws

    @torch.no_grad()
    def generate(
        self,
        rows: Sequence[EngineRow],
        *,
        batch_size: int,
        max_new_tokens: int,
        spec: SamplingSpec,
        pad_id: int,
        check_every: int = 8,
    ) -> list[tuple[list[int], list[float], FinishReason]]:
        """Tokens, log-probs and finish reason per row, in order (call :meth:`sync_policy` first)."""
        if self.weights is None:
            raise RuntimeError("sync_policy must run before generate")
        bucket = min(batch_size, len(rows))
        longest = max(len(r.prompt_ids) for r in rows)
        ws = self._workspace(bucket, longest + max_new_tokens, max_new_tokens)
        out: list[tuple[list[int], list[float], FinishReason]] = []
        for start in range(0, len(rows), bucket):
            out.extend(self._chunk(ws, rows[start : start + bucket], spec, pad_id, max_new_tokens, check_every))
        return out

    def _chunk(
        self,
        ws: DecodeWorkspace,
        chunk: Sequence[EngineRow],
        spec: SamplingSpec,
        pad_id: int,
        max_new_tokens: int,
        check_every: int,
    ) -> list[tuple[list[int], list[float], FinishReason]]:
        width = max(len(r.prompt_ids) for r in chunk)
        if self.use_graphs:
            spans = sorted({ws.span_for(width + s) for s in range(1, max_new_tokens)})
            self.stats.captures += ws.capture(spec, spans)
        ws.prefill([r.prompt_ids for r in chunk], [r.seed for r in chunk], pad_id, spec)
        run = ws.runner(spec, use_graphs=self.use_graphs)
        steps = max_new_tokens
        for step in range(1, max_new_tokens):
            if step % check_every == 0:
                self.stats.host_syncs += 1
                if bool(ws.finished.all()):
                    steps = step
                    break
            # CPU: attend over exactly the used slots; CUDA: the captured span bucket.
            run(ws.span_for(width + step) if self.use_graphs else width + step)
            self.stats.decode_steps += 1
        tokens = ws.out_tokens[: len(chunk), :steps].tolist()
        logprobs = ws.out_logprobs[: len(chunk), :steps].tolist()
        self.stats.host_syncs += 1
        eos = set(spec.eos_ids)
        results: list[tuple[list[int], list[float], FinishReason]] = []
        for row_tokens, row_logprobs in zip(tokens, logprobs, strict=True):
            end = next((i + 1 for i, t in enumerate(row_tokens) if t in eos), None)
            if end is None:
                results.append((row_tokens, row_logprobs, "length"))
            else:
                results.append((row_tokens[:end], row_logprobs[:end], "eos"))
        return results


def _checked_kernels(kernels: str, device: torch.device, compile_glue: bool) -> str:
    if kernels not in KERNEL_CHOICES:
        raise UsageError(f"kernels {kernels!r} is not one of {', '.join(KERNEL_CHOICES)}")
    if kernels == "triton":
        if compile_glue:
            raise UsageError("compile_glue and kernels='triton' are two fusions of the same glue: choose one")
        reason = triton_unavailable_reason(device)
        if reason is not None:
            raise UsageError(f"kernels='triton' refused: {reason}")
    return kernels


def _normalized(device: torch.device) -> torch.device:
    """``cuda`` and ``cuda:<current>`` are one device (one cached engine)."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


_ENGINES: weakref.WeakKeyDictionary[Any, FastRolloutEngine] = weakref.WeakKeyDictionary()


def default_rollout_dtype(model: Any, device: torch.device) -> torch.dtype:
    """bf16 on CUDA (the rollout copy); on CPU the model's own compute dtype (fp32 stays exact)."""
    if device.type == "cuda":
        return torch.bfloat16
    from miniverl.rollout.weights import inner_model

    dtype: torch.dtype = inner_model(model).get_input_embeddings().weight.dtype
    return dtype


def default_kernels(device: torch.device, compile_glue: bool) -> str:
    """The decode step's kernels when the caller names none: the triton kernels on CUDA where triton can run
    them (1.75x the torch step at batch 16 and 1.54x at batch 64 on the H200, Qwen3-0.6B shape), else torch's.
    ``compile_glue`` is the other fusion of the same glue, so it keeps torch's kernels."""
    if device.type != "cuda" or compile_glue:
        return "torch"
    return "triton" if triton_unavailable_reason(device) is None else "torch"


def engine_for(
    model: Any,
    device: torch.device,
    dtype: torch.dtype | None = None,
    *,
    compile_glue: bool = False,
    kernels: str | None = None,
) -> FastRolloutEngine:
    """The engine cached for ``model`` (one per model object, kept while the model lives); ``kernels``
    ``None`` is :func:`default_kernels`."""
    device = _normalized(device)
    wanted = dtype or default_rollout_dtype(model, device)
    chosen = kernels or default_kernels(device, compile_glue)
    engine = _ENGINES.get(model)
    if engine is None or (engine.device, engine.dtype, engine.compile_glue, engine.kernels) != (
        device, wanted, compile_glue, chosen
    ):  # fmt: skip
        engine = FastRolloutEngine(device=device, dtype=wanted, compile_glue=compile_glue, kernels=chosen)
        _ENGINES[model] = engine
    return engine


def release_engine(model: Any) -> bool:
    """Drop ``model``'s cached engine (its folded copy, static KV cache and captured graphs) and give their
    device memory back, so that the update after a rollout has the room (the memory plan's
    ``release_rollout``); the next rollout folds and captures afresh. Returns whether there was one.

    On CUDA the graphs' private pool only leaves the caching allocator on ``empty_cache``, and cuBLAS's
    per-stream workspaces on clearing them, so both happen here; the workspaces only when no other engine
    is left on CUDA, since every engine's graphs were captured on the one warm-up stream and use its
    workspace."""
    engine = _ENGINES.pop(model, None)
    if engine is None:
        return False
    cuda = engine.device.type == "cuda"
    del engine
    if cuda:
        if not any(other.device.type == "cuda" for other in _ENGINES.values()):
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
    return True


def release_engines() -> None:
    """Drop every cached rollout copy and workspace (frees their device memory), and the cuBLAS
    workspaces their GEMMs kept per stream (returned to the caching allocator)."""
    _ENGINES.clear()
    if torch.cuda.is_initialized():
        torch._C._cuda_clearCublasWorkspaces()


__all__ = [
    "EngineRow",
    "FastRolloutEngine",
    "default_kernels",
    "engine_for",
    "release_engine",
    "release_engines",
    "unsupported_reason",
]

"""The memory plan: activation checkpointing and micro-batch chosen from a peak-memory budget.

A pure estimator (no torch, no device) of one training cycle's CUDA peak reserved memory, and the
choice it drives when ``memory.max_peak_reserved_gib`` is set: ``train.activation_checkpointing:
auto`` takes the least recomputation and ``train.trajectory_batch_size: auto`` the largest
micro-batch whose estimated peak fits the budget, and the log-prob chunk (``train.logprob_chunk_size``
is then the largest chunk the plan may use: it halves it, down to :data:`MIN_LOGPROB_CHUNK` rows, before
it recomputes more layers, since a smaller chunk costs a few more launches and recomputation a third
of the update). With the fast engine it also chooses whether the engine stays resident between
rollouts or is released after each one (``release_rollout``): released when that buys a larger
micro-batch, since a fold and a graph capture per rollout cost less than another forward and backward
through every layer. Without a budget nothing is chosen here.

Peak (bytes) = ``allocator_overhead`` x max(rollout phase, update phase), where both phases hold
the *resident* part: the base weights (student, plus each separately loaded frozen or critic
model), the adapter with its grads and AdamW state (fp32, or bf16 + fp32 masters), cuBLAS's
per-stream workspaces, and with the fast engine its folded rollout copy and static KV cache; then

* rollout phase (HF engine only; the fast engine's cache is resident): the KV cache and logits of one
  rollout batch; with ``release_rollout`` the fast engine's copy and cache are this phase's instead of
  resident;
* update phase: the kept activations ``tokens x [(L - c) x full + c x hidden x act_bytes]`` for
  ``c`` checkpointed layers of ``L``, ``tokens = rows x row_tokens`` of one micro-batch, plus the
  larger of two moments that never overlap: the log-prob chunks' backward (one chunk of fp32 logits
  and its copies, before any layer's backward starts) and a layer's backward (``tokens x full`` for
  the layer recomputed when ``c > 0``, plus ``backward_layers x tokens x full`` of its grads).

``full`` (bytes saved for backward per token per decoder layer) is stated by
:class:`MemoryConstants`: ``act_bytes x (hidden_copies x H + intermediate_copies x I +
qkv_copies x (q + 2 kv) dims)``, plus, with PEFT's fp32 adapter on a 16-bit model, the fp32 copy of
each LoRA target's input that PEFT's input cast saves. The constants are estimates for a
Llama-family decoder under SDPA (no ``[T, T]`` scores kept); ``miniverl bench grpo`` prints the
estimate beside the measured peak per path so they can be checked (and corrected) on the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from miniverl.runtime.memory_shapes import (
    DTYPE_BYTES,
    GIB,
    KV_SPAN_QUANTUM,
    DecoderDims,
    Workload,
    kv_cache_bytes,
)
from miniverl.runtime.vllm_memory import (
    VLLM_KV_MARGIN,
    VLLM_MAX_SHARE,
    VLLM_RUNTIME_BYTES,
    VllmMemory,
    vllm_kv_cache_bytes,
    vllm_memory,
    vllm_need_bytes,
)

__all__ = [
    "DTYPE_BYTES",
    "GIB",
    "KV_SPAN_QUANTUM",
    "MIN_LOGPROB_CHUNK",
    "VLLM_KV_MARGIN",
    "VLLM_MAX_SHARE",
    "VLLM_RUNTIME_BYTES",
    "DecoderDims",
    "MemoryConstants",
    "MemoryEstimate",
    "MemoryPlan",
    "VllmMemory",
    "Workload",
    "checkpoint_options",
    "choose_plan",
    "estimate",
    "kv_cache_bytes",
    "logprob_chunk_options",
    "per_token_layer_bytes",
    "vllm_kv_cache_bytes",
    "vllm_memory",
    "vllm_need_bytes",
]

MIN_LOGPROB_CHUNK = 128  # the plan halves the configured log-prob chunk no further than this


@dataclass(frozen=True)
class MemoryConstants:
    """The estimator's constants, fitted to five peaks measured on the H200 (2026-12-03, after the entropy fix):
    SmolLM2 GRPO steps (the fast path, fp32 adapter: 6.89 GiB reserved, estimate 7.64; the lean path,
    micro-batch 8, all layers checkpointed, chunk 128: 1.23, estimate 1.08) and Qwen3-0.6B updates, B = 8,
    T = 512, bf16 masters (no checkpointing 10.06, estimate 9.98; every 4th layer 8.50, estimate 8.60; every
    layer 3.81, estimate 4.45). ``bench grpo`` prints the estimate beside each measured peak.

    Per token and decoder layer, what autograd keeps, in hidden-size units (residual inputs, the norms'
    inputs and outputs, attention and o-proj outputs), intermediate-size units (gate, up and their
    products) and q/k/v-width units (before and after RoPE).
    """

    hidden_copies: float = 6.0
    intermediate_copies: float = 3.0
    #: the same with fused RMSNorm and SwiGLU kernels (they keep their inputs only: no float32 copies of the norm's
    #: input, no SiLU output): fitted to one H100 measurement (2026-12-06-h100-perf-fused: Qwen3-0.6B update, B = 8,
    #: T = 512, bf16 masters, no checkpointing: 8.31 GiB reserved with either kernel set, 10.04 without), with
    #: gate and up kept (2 intermediate units) and the rest put on the hidden units
    fused_hidden_copies: float = 2.4
    fused_intermediate_copies: float = 2.0
    qkv_copies: float = 2.0
    #: fp32 logits of one chunk, its log-softmax, exp and grad (SmolLM2 showed 4.8 from the difference between
    #: chunks of 1024 and 256 rows, Qwen3's checkpointed update about 3)
    logits_copies: float = 4.0
    #: backward of one decoder layer: the grads of its activations live beside them (one layer's worth)
    backward_layers: float = 1.0
    #: cuBLAS's workspace per stream that ran a GEMM (32 MiB on Hopper), on the allocator: the training
    #: stream, and with the fast engine the one stream its graphs are warmed up and captured on
    cublas_workspace: float = 32.0 * (1 << 20)
    #: CUDA caching allocator: reserved / allocated at peak (fragmentation, rounding to blocks): 1.15 on the
    #: H200's SmolLM2 GRPO step at 1.25 GiB allocated, 1.04-1.08 on Qwen3-0.6B updates of 3-10 GiB
    allocator_overhead: float = 1.15


@dataclass(frozen=True)
class MemoryEstimate:
    weights: float
    adapter_optimizer: float
    rollout_engine: float
    rollout_phase: float
    activations: float  # kept for backward through the whole update
    logits_chunk: float
    overhead: float
    layer_backward: float = 0.0  # one layer recomputed (if checkpointed) and its activation grads
    workspaces: float = 0.0  # cuBLAS's per-stream workspaces
    rollout_released: bool = False  # the fast engine is dropped after each rollout: not resident in the update

    @property
    def resident(self) -> float:
        engine = 0.0 if self.rollout_released else self.rollout_engine
        return self.weights + self.adapter_optimizer + engine + self.workspaces

    @property
    def peak(self) -> float:
        rollout = self.rollout_phase + (self.rollout_engine if self.rollout_released else 0.0)
        update = self.activations + max(self.logits_chunk, self.layer_backward)
        return self.overhead * (self.resident + max(rollout, update))


def per_token_layer_bytes(dims: DecoderDims, work: Workload, constants: MemoryConstants) -> float:
    """Bytes autograd keeps per token per decoder layer without checkpointing (see the module docstring)."""
    act = DTYPE_BYTES[work.dtype]
    hidden = constants.fused_hidden_copies if work.fused_kernels else constants.hidden_copies
    intermediate = constants.fused_intermediate_copies if work.fused_kernels else constants.intermediate_copies
    base = act * (
        hidden * dims.hidden + intermediate * dims.intermediate + constants.qkv_copies * (dims.q_dim + 2 * dims.kv_dim)
    )
    fp32_cast = work.adapter_precision == "fp32" and work.dtype != "float32"
    return base + (4.0 * dims.lora_input_elements(work.lora_targets) if fp32_cast else 0.0)


def estimate(
    dims: DecoderDims,
    work: Workload,
    *,
    micro_rows: int,
    checkpointed_layers: int,
    logprob_chunk: int | None = None,
    release_rollout: bool = False,
    constants: MemoryConstants = MemoryConstants(),
) -> MemoryEstimate:
    """The estimated peak of one cycle with ``micro_rows`` rows per forward and ``checkpointed_layers``
    (log-prob chunks of ``logprob_chunk`` rows; default the workload's); ``release_rollout``: the fast
    engine is released after each rollout."""
    if not 0 <= checkpointed_layers <= dims.layers or micro_rows < 1:
        raise ValueError("checkpointed_layers must be in [0, layers] and micro_rows >= 1")
    if release_rollout and not work.fast_engine:
        raise ValueError("release_rollout needs the fast engine: the HF engine keeps nothing between rollouts")
    element = DTYPE_BYTES[work.dtype]
    extra_models = dims.base_params() * element * work.extra_models
    weights = dims.base_weight_bytes(element, quantized=work.quantized) + extra_models
    lora = dims.lora_params(work.lora_rank, work.lora_targets)
    # fp32: param + grad + 2 Adam moments; bf16_master: bf16 param + bf16 grad + fp32 master, its grad, 2 moments
    adapter_optimizer = lora * (16.0 if work.adapter_precision == "fp32" else 20.0)
    rollout_kv = kv_cache_bytes(dims, work.rollout_rows, work.rollout_capacity, 2.0 if work.fast_engine else element)
    sampling_logits = work.rollout_rows * dims.vocab * 4.0 * 2
    if work.vllm_engine:  # asleep at level 1 through the update: its weights on the host, its cache dropped
        rollout_engine = 0.0
        rollout_phase = vllm_need_bytes(
            dims,
            rollout_rows=work.rollout_rows,
            capacity=work.rollout_capacity,
            lora_rank=work.lora_rank,
            targets=work.lora_targets,
        )
    elif work.fast_engine:
        capacity = -(-work.rollout_capacity // KV_SPAN_QUANTUM) * KV_SPAN_QUANTUM
        folded = dims.base_params() * 2.0  # bf16 rollout copy of the policy, LoRA folded in
        rollout_engine = folded + kv_cache_bytes(dims, work.rollout_rows, capacity, 2.0) + sampling_logits
        rollout_phase = 0.0
    else:
        rollout_engine = 0.0
        rollout_phase = rollout_kv + sampling_logits
    tokens = micro_rows * work.row_tokens
    full = per_token_layer_bytes(dims, work, constants)
    kept = (dims.layers - checkpointed_layers) * full + checkpointed_layers * dims.hidden * element
    recompute = full if checkpointed_layers else 0.0
    activations = tokens * kept
    layer_backward = tokens * (recompute + constants.backward_layers * full)
    chunk = min(logprob_chunk or work.logprob_chunk, tokens)
    logits_chunk = chunk * dims.vocab * 4.0 * constants.logits_copies
    return MemoryEstimate(
        weights=weights,
        adapter_optimizer=adapter_optimizer,
        rollout_engine=rollout_engine,
        rollout_phase=rollout_phase,
        activations=activations,
        logits_chunk=logits_chunk,
        overhead=constants.allocator_overhead,
        layer_backward=layer_backward,
        workspaces=constants.cublas_workspace * (2 if work.fast_engine else 1),
        rollout_released=release_rollout,
    )


def checkpoint_options(layers: int) -> list[tuple[int, int]]:
    """``(every_n_layers, checkpointed layers)`` in increasing recomputation: ``(0, 0)`` (off), then
    for each count ``c = ceil(L / n)`` the largest ``n`` that gives it (HF checkpoints the layers
    whose index is a multiple of ``n``)."""
    options: list[tuple[int, int]] = [(0, 0)]
    seen = set()
    for every in range(layers, 0, -1):
        count = -(-layers // every)
        if count not in seen:
            seen.add(count)
            options.append((every, count))
    return options


@dataclass(frozen=True)
class MemoryPlan:
    budget_bytes: float
    activation_checkpointing: int  # every n-th layer (0: off), for the runtime
    checkpointed_layers: int
    micro_rows: int
    row_tokens: int
    estimate: MemoryEstimate
    layers: int
    chosen: tuple[str, ...] = field(default=())  # which settings the plan chose (the rest were given)
    logprob_chunk: int = 1024  # rows of one log-prob chunk (the configured one, or a half of it the plan chose)
    release_rollout: bool = False  # the fast engine gives its memory back after every rollout

    @property
    def fits(self) -> bool:
        return self.estimate.peak <= self.budget_bytes

    @property
    def max_tokens(self) -> int:
        """The per-forward padded-token budget for ``trajectory_batch_size: auto``."""
        return self.micro_rows * self.row_tokens

    def describe(self) -> str:
        e = self.estimate
        ckpt = (
            f"checkpoint every {self.activation_checkpointing} layer(s) ({self.checkpointed_layers} of {self.layers})"
            if self.activation_checkpointing
            else "no activation checkpointing"
        )
        verdict = "fits" if self.fits else "DOES NOT FIT (the run's peak check still applies)"
        engine = "released after each rollout" if self.release_rollout else "resident"
        return (
            f"{ckpt}, micro-batch {self.micro_rows} row(s) x {self.row_tokens} tokens, log-prob chunk "
            f"{self.logprob_chunk} rows; estimated peak "
            f"{e.peak / GIB:.2f} GiB of budget {self.budget_bytes / GIB:.2f} GiB, {verdict} (weights "
            f"{e.weights / GIB:.2f}, adapter+optimizer {e.adapter_optimizer / GIB:.2f}, rollout engine "
            f"{e.rollout_engine / GIB:.2f} {engine}, cuBLAS workspaces {e.workspaces / GIB:.2f}, activations "
            f"{e.activations / GIB:.2f}, one layer's backward {e.layer_backward / GIB:.2f}, logits chunk "
            f"{e.logits_chunk / GIB:.2f}); chose {', '.join(self.chosen) or 'nothing (all given)'}"
        )

    def metrics(self) -> dict[str, float]:
        return {
            "memory_plan/activation_checkpointing": float(self.activation_checkpointing),
            "memory_plan/checkpointed_layers": float(self.checkpointed_layers),
            "memory_plan/micro_rows": float(self.micro_rows),
            "memory_plan/logprob_chunk": float(self.logprob_chunk),
            "memory_plan/release_rollout": float(self.release_rollout),
            "memory_plan/estimated_peak_gib": self.estimate.peak / GIB,
            "memory_plan/budget_gib": self.budget_bytes / GIB,
            "memory_plan/fits": float(self.fits),
        }


def logprob_chunk_options(configured: int) -> list[int]:
    """The configured chunk, then its halves down to :data:`MIN_LOGPROB_CHUNK` (largest first)."""
    options = [configured]
    while options[-1] // 2 >= MIN_LOGPROB_CHUNK:
        options.append(options[-1] // 2)
    return options


def choose_plan(
    dims: DecoderDims,
    work: Workload,
    budget_gib: float,
    *,
    activation_checkpointing: int | Literal["auto"],
    trajectory_batch_size: int | Literal["auto"],
    constants: MemoryConstants = MemoryConstants(),
) -> MemoryPlan:
    """The plan for ``budget_gib``: what is given stays; ``auto`` settings (and the chunk) are chosen.

    Among the checkpointing options (in increasing recomputation), each with the log-prob chunks of
    :func:`logprob_chunk_options` (largest first), and micro-batches of 1 .. ``update_rows`` rows: if
    some pair fits the whole step in one micro-batch, the first that does (least recomputation, then
    the largest chunk); else the pair that fits the largest micro-batch (ties: less recomputation,
    then a larger chunk). That search runs with the fast engine resident; if it falls short of one
    micro-batch, it runs again with the engine released after each rollout, which wins when it fits
    more rows. If nothing fits, the most frugal plan, marked as not fitting.
    """
    budget = budget_gib * GIB
    if activation_checkpointing == "auto":
        options = checkpoint_options(dims.layers)
    else:
        every = int(activation_checkpointing)
        options = [(every, -(-dims.layers // every) if every else 0)]
    if trajectory_batch_size == "auto":
        row_choices = list(range(1, max(1, work.update_rows) + 1))
    else:
        row_choices = [int(trajectory_batch_size)]
    chunks = logprob_chunk_options(work.logprob_chunk)

    def peak(option: tuple[int, int], rows: int, chunk: int, release: bool) -> MemoryEstimate:
        return estimate(
            dims,
            work,
            micro_rows=rows,
            checkpointed_layers=option[1],
            logprob_chunk=chunk,
            release_rollout=release,
            constants=constants,
        )

    def search(release: bool) -> tuple[int, tuple[int, int], int] | None:
        """(rows, option, chunk) of the best fitting plan, or None."""
        best: tuple[int, tuple[int, int], int] | None = None
        for option in options:
            for chunk in chunks:
                fitting = [r for r in row_choices if peak(option, r, chunk, release).peak <= budget]
                if not fitting:
                    continue
                rows = max(fitting)
                if best is None or rows > best[0]:
                    best = (rows, option, chunk)
                if rows == max(row_choices):
                    return best
        return best

    release = False
    best = search(release=False)
    if work.fast_engine and (best is None or best[0] < max(row_choices)):
        released = search(release=True)
        if released is not None and (best is None or released[0] > best[0]):
            best, release = released, True
    if best is None:  # nothing fits: the least memory the given/auto settings allow
        release = work.fast_engine
        best = (min(row_choices), max(options, key=lambda o: o[1]), chunks[-1])
    rows, (every, count), chunk = best
    chosen = (
        tuple(
            name
            for name, value in (
                ("activation_checkpointing", activation_checkpointing),
                ("micro-batch", trajectory_batch_size),
            )
            if value == "auto"
        )
        + (("log-prob chunk",) if chunk != work.logprob_chunk else ())
        + (("rollout release",) if release else ())
    )
    return MemoryPlan(
        budget_bytes=budget,
        activation_checkpointing=every,
        checkpointed_layers=count,
        micro_rows=rows,
        row_tokens=work.row_tokens,
        estimate=peak((every, count), rows, chunk, release),
        layers=dims.layers,
        chosen=chosen,
        logprob_chunk=chunk,
        release_rollout=release,
    )

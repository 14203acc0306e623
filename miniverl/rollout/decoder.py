"""A static-cache decoder over :class:`~miniverl.rollout.weights.RolloutWeights`, with on-device sampling.

One :class:`DecodeWorkspace` holds everything a batch bucket of ``batch`` rows needs for up to
``capacity`` cache slots, preallocated once: per layer K/V caches ``[batch, kv_heads, capacity,
head_dim]``, an additive attention bias ``[batch, capacity]`` (0 on visible slots, -inf elsewhere),
the RoPE table, and the step state (next input token, position id, cache slot, response column,
finished flags, output tokens and log-probs). All of it lives on the device, so a decode step
needs no host round trip and can be captured in a CUDA graph.

Layout (left padding): prompts occupy slots ``0 .. W-1`` (pads masked), the token fed at decode
step ``s >= 1`` is written to slot ``W + s - 1`` with position id ``prompt_len + s - 1``. Slot and
column advance inside the step. A step attends over the first ``span`` slots only (``span`` is a
multiple of ``SPAN_QUANTUM``), so graphs are captured per span and the cache read grows with the
sequence instead of costing ``capacity`` from the first step.

The maths is the transformers Llama/Qwen3 forward (RMSNorm with float32 statistics, RoPE table
cast to the compute dtype, attention softmax with float32 accumulation, ``head_dim ** -0.5``
scaling, SiLU MLP), arranged for few kernels: one fused ``rms_norm`` per norm, one norm and one
RoPE pass over q and k together, and the attention scale folded into the weights. With
``compile_glue`` the element-wise glue around the GEMMs of a decode step (norm, q/k norm, RoPE,
residuals, SiLU gate) is ``torch.compile``'d into a few fused kernels (compiled once per workspace
shape, then captured in the CUDA graph like any other kernel). With ``kernels="triton"`` a decode
step runs the triton kernels of :mod:`miniverl.rollout.kernels` instead (norm + RoPE + KV write in
one kernel, split-span decode attention, residual + norm fused, SiLU gate), its projections as split-K
GEMMs whose parts those kernels sum (the LM head stays ``F.linear``); the prefill stays on the torch path.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from miniverl.rollout.sampling import blocked_inverse_cdf_draw, sampling_logprobs
from miniverl.rollout.streams import counter_uniforms
from miniverl.rollout.weights import RolloutWeights

SPAN_QUANTUM = 64


def pre_attention(
    x: torch.Tensor,
    norm: torch.Tensor,
    qkv: torch.Tensor,
    qkv_bias: torch.Tensor | None,
    qk_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm, the stacked q/k/v projection, then :func:`qk_norm_rope`: ``q, k, v`` ``[B, h, S, d]``."""
    batch, seq, _ = x.shape
    h = F.rms_norm(x, (x.shape[-1],), norm, eps)
    mixed = F.linear(h, qkv, qkv_bias).view(batch, seq, heads + 2 * kv_heads, cos.shape[-1])
    return qk_norm_rope(mixed, qk_norm, cos, sin, eps, heads, kv_heads)


def qk_norm_rope(
    mixed: torch.Tensor,
    qk_norm: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float,
    heads: int,
    kv_heads: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-head q/k norm and RoPE of the projected ``mixed`` ``[B, S, h + 2 kv, d]``: ``q, k, v`` ``[B, h, S, d]``.

    RoPE as ``x * cos + roll(x, d/2) * sin_signed`` with ``sin_signed = (-sin, sin)`` halves, which
    equals ``x * cos + rotate_half(x) * sin``; ``cos``/``sin`` are ``[B, S, 1, d]``. q comes out
    pre-scaled by ``d ** -0.5`` (folded weights).
    """
    head_dim = mixed.shape[-1]
    qk, v = mixed.split([heads + kv_heads, kv_heads], dim=2)
    if qk_norm is not None:
        qk = F.rms_norm(qk, (head_dim,), None, eps) * qk_norm
    qk = qk * cos + qk.roll(head_dim // 2, dims=-1) * sin
    q, k = qk.transpose(1, 2).split([heads, kv_heads], dim=1)
    return q, k, v.transpose(1, 2)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Attention of ``q`` ``[B, h, S, d]`` over the first ``span`` cache slots: ``[B, S, h * d]``.

    ``bias`` ``[B, S, span]`` (0 / -inf) is added to the scores; ``k_cache``/``v_cache`` are
    ``[B, kv, capacity, d]`` and each KV head serves ``h / kv`` query heads (GQA).
    """
    batch, heads, seq, hd = q.shape
    kv, span = k_cache.shape[1], bias.shape[-1]
    group = heads // kv
    scores = torch.matmul(q.reshape(batch, kv, group * seq, hd), k_cache[:, :, :span].transpose(-1, -2))
    probs = torch.softmax(scores.view(batch, kv, group, seq, span) + bias.view(batch, 1, 1, seq, span), dim=-1)
    attn = torch.matmul(probs.view(batch, kv, group * seq, span), v_cache[:, :, :span])
    return attn.view(batch, heads, seq, hd).transpose(1, 2).reshape(batch, seq, heads * hd)


def add_rms_norm(
    residual: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The new residual ``residual + update`` and its RMSNorm."""
    x = residual + update
    return x, F.rms_norm(x, (x.shape[-1],), weight, eps)


def post_attention(
    x: torch.Tensor,
    attn: torch.Tensor,
    o: torch.Tensor,
    o_bias: torch.Tensor | None,
    norm: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    eps: float,
) -> torch.Tensor:
    """Output projection + residual, RMSNorm, SiLU-gated MLP + residual."""
    x, h = add_rms_norm(x, F.linear(attn, o, o_bias), norm, eps)
    gate, up = F.linear(h, gate_up).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, down)


_COMPILED: list[tuple[Callable[..., Any], Callable[..., Any]]] = []


def compiled_glue() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``torch.compile``'d :func:`pre_attention` / :func:`post_attention`, made once per process
    (static shapes: one compile per batch bucket, shared by every layer and workspace)."""
    if not _COMPILED:
        _COMPILED.append(
            (
                torch.compile(pre_attention, fullgraph=True, dynamic=False),
                torch.compile(post_attention, fullgraph=True, dynamic=False),
            )
        )
    return _COMPILED[0]


_WARMUP_STREAMS: dict[torch.device, torch.cuda.Stream] = {}
#: decode steps (by :meth:`DecodeWorkspace.step_key`) this process has run eagerly once, so that their triton
#: and inductor kernels are compiled and a capture of the same step launches no compiler
_WARMED_STEPS: set[tuple[Any, ...]] = set()


def warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every capture's warm-up step and capture run on, per device.

    cuBLAS keeps a workspace per (handle, stream) from the stream's first GEMM until the process
    clears them (32 MiB each on an H200): a fresh stream per captured span kept five of them, 0.16 GiB
    of a 1.4 GiB GRPO step on SmolLM2 (measured on the H200).
    """
    key = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    if key not in _WARMUP_STREAMS:
        _WARMUP_STREAMS[key] = torch.cuda.Stream(key)
    return _WARMUP_STREAMS[key]


class SamplingSpec:
    """Temperature / top-p / top-k and the EOS ids, fixed for a captured graph."""

    def __init__(self, temperature: float, top_p: float, top_k: int, eos_ids: Sequence[int]) -> None:
        self.temperature, self.top_p, self.top_k = float(temperature), float(top_p), int(top_k)
        self.eos_ids = tuple(sorted(set(int(i) for i in eos_ids)))

    def key(self) -> tuple[float, float, int, tuple[int, ...]]:
        return (self.temperature, self.top_p, self.top_k, self.eos_ids)


def sample_tokens(
    logits: torch.Tensor, seeds: torch.Tensor, counter: torch.Tensor, spec: SamplingSpec
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens and their log-probs under the sampling distribution, from counter-based uniforms."""
    if spec.temperature == 0.0:
        return torch.argmax(logits, dim=-1), torch.zeros(logits.shape[0], dtype=torch.float32, device=logits.device)
    logprobs = sampling_logprobs(logits, temperature=spec.temperature, top_p=spec.top_p, top_k=spec.top_k)
    chosen = blocked_inverse_cdf_draw(logprobs, counter_uniforms(seeds, counter))
    return chosen, logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1)


class DecodeWorkspace:
    def __init__(
        self,
        weights: RolloutWeights,
        *,
        batch: int,
        capacity: int,
        max_new_tokens: int,
        device: torch.device,
        compile_glue: bool = False,
        kernels: str = "torch",
    ) -> None:
        shape = weights.shape
        self.weights, self.batch, self.device = weights, batch, device
        self.capacity = -(-capacity // SPAN_QUANTUM) * SPAN_QUANTUM
        self.max_new_tokens = max_new_tokens
        dtype = weights.embed.dtype
        cache_shape = (batch, shape.kv_heads, self.capacity, shape.head_dim)
        self.k_cache = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(shape.layers)]
        self.v_cache = [torch.zeros(cache_shape, dtype=dtype, device=device) for _ in range(shape.layers)]
        positions = torch.arange(self.capacity, dtype=torch.float32, device=device)
        freqs = torch.outer(positions, weights.inv_freq.to(device))
        emb = torch.cat((freqs, freqs), dim=-1)
        self.cos = (emb.cos() * shape.attention_scaling).to(dtype)
        half = shape.head_dim // 2
        signed = torch.cat((-emb[:, :half], emb[:, half:]), dim=-1)  # rotate_half's sign, for the roll form
        self.sin = (signed.sin() * shape.attention_scaling).to(dtype)
        self.bias = torch.full((batch, self.capacity), float("-inf"), dtype=dtype, device=device)
        self.compile_glue = compile_glue
        self.kernels = kernels
        self.tokens = torch.zeros(batch, dtype=torch.long, device=device)
        self.positions = torch.zeros(batch, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.column = torch.zeros(1, dtype=torch.long, device=device)
        self.seeds = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.eos = torch.zeros(0, dtype=torch.long, device=device)
        self.out_tokens = torch.zeros((batch, max_new_tokens), dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros((batch, max_new_tokens), dtype=torch.float32, device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.graph_key: tuple[float, float, int, tuple[int, ...]] | None = None
        self._pool: Any = None

    # -- the model ----------------------------------------------------------------------------
    def forward(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        span: int,
        bias: torch.Tensor,
        *,
        compiled: bool = False,
    ) -> torch.Tensor:
        """Logits of the last input position ``[B, V]``; writes K/V of ``ids`` ``[B, S]`` at ``slots`` ``[S]``.

        ``bias`` ``[B, S, span]`` (compute dtype) is added to the attention scores over slots ``0 .. span-1``.
        ``compiled`` uses the torch.compile'd glue (decode steps only: one shape per workspace).
        """
        w, shape = self.weights, self.weights.shape
        batch, seq = ids.shape
        heads, kv = shape.heads, shape.kv_heads
        pre, post = self._compiled_glue() if compiled else (pre_attention, post_attention)
        cos = self.cos[positions].unsqueeze(2)  # [B, S, 1, D]
        sin = self.sin[positions].unsqueeze(2)
        bias = bias.view(batch, seq, span)
        x = F.embedding(ids, w.embed)
        for index, layer in enumerate(w.layers):
            q, k, v = pre(x, layer.input_norm, layer.qkv, layer.qkv_bias, layer.qk_norm, cos, sin, shape.eps, heads, kv)
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            k_cache.index_copy_(2, slots, k)
            v_cache.index_copy_(2, slots, v)
            attn = attend(q, k_cache, v_cache, bias)
            x = post(x, attn, layer.o, layer.o_bias, layer.post_norm, layer.gate_up, layer.down, shape.eps)
        last = F.rms_norm(x[:, -1], (shape.hidden,), w.final_norm, shape.eps)
        return F.linear(last, w.lm_head)

    def _compiled_glue(self) -> tuple[Callable[..., Any], Callable[..., Any]]:
        return compiled_glue()

    def decode_forward_triton(self, span: int) -> torch.Tensor:
        """The decode step's forward on the triton kernels: logits ``[B, V]`` of the workspace's next
        tokens at their positions, K/V written at the current slot, attention over slots ``0 .. span-1``.

        The four projections of a layer run as split-K GEMMs whose float32 parts the next kernel sums
        (q/k norm + RoPE, residual + norm, SiLU gate); a batch over the GEMM's row limit uses
        ``F.linear``, its output passed on as a single part. The LM head stays ``F.linear``.
        """
        from miniverl.rollout.kernels import load_triton_gemm, load_triton_ops
        from miniverl.rollout.kernels.triton_attention import decode_attention

        ops, gemm = load_triton_ops(), load_triton_gemm()
        w, shape = self.weights, self.weights.shape
        heads, kv, eps, batch = shape.heads, shape.kv_heads, shape.eps, self.batch
        use_split_k = batch <= gemm.MAX_ROWS

        def project(
            rows: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
        ) -> tuple[torch.Tensor, torch.Tensor | None]:
            """The projection's parts ``[S, B, N]`` and the bias its consumer still adds."""
            if use_split_k:
                return gemm.skinny_linear_partials(rows, weight), bias
            return F.linear(rows, weight, bias).unsqueeze(0), None

        x = F.embedding(self.tokens.unsqueeze(1), w.embed)  # [B, 1, hidden]
        _, h = ops.add_rms_norm(x, None, w.layers[0].input_norm, eps)
        for index, layer in enumerate(w.layers):
            mixed, qkv_bias = project(h.view(batch, shape.hidden), layer.qkv, layer.qkv_bias)
            k_cache, v_cache = self.k_cache[index], self.v_cache[index]
            rope = (self.cos, self.sin, self.positions)
            q = ops.qk_norm_rope_cache_write(
                mixed, layer.qk_norm, *rope, k_cache, v_cache, self.slot, eps, heads, kv, bias=qkv_bias
            )
            attn = decode_attention(q, k_cache, v_cache, self.bias, span)
            update, o_bias = project(attn.view(batch, -1), layer.o, layer.o_bias)
            x, h = ops.add_rms_norm(x, update, layer.post_norm, eps, bias=o_bias)
            gate_up, _ = project(h.view(batch, shape.hidden), layer.gate_up, None)
            update, _ = project(ops.silu_mul(gate_up, x.dtype), layer.down, None)
            following = w.layers[index + 1].input_norm if index + 1 < len(w.layers) else w.final_norm
            x, h = ops.add_rms_norm(x, update, following, eps)
        return F.linear(h[:, -1], w.lm_head)

    # -- one batch ----------------------------------------------------------------------------
    def prefill(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], pad_id: int, spec: SamplingSpec) -> None:
        """One forward over the left-padded prompts, then the first token of every row (column 0).

        Rows past ``len(prompts)`` (bucket filler) get a one-token prompt and start finished.
        """
        batch, device = self.batch, self.device
        real = len(prompts)
        rows = [list(p) for p in prompts] + [[pad_id]] * (batch - real)
        width = max(len(r) for r in rows)
        ids = torch.full((batch, width), pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.bool)
        for i, row in enumerate(rows):
            ids[i, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            mask[i, width - len(row) :] = True
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones((width, width), dtype=torch.bool, device=device).tril()
        visible = (causal.unsqueeze(0) & mask.unsqueeze(1)) | torch.eye(width, dtype=torch.bool, device=device)
        prefill_bias = torch.zeros((batch, width, width), dtype=self.bias.dtype, device=device)
        prefill_bias.masked_fill_(~visible, float("-inf"))
        logits = self.forward(ids, positions, torch.arange(width, device=device), width, prefill_bias)

        self.bias.fill_(float("-inf"))
        self.bias[:, :width].masked_fill_(mask, 0.0)
        self.seeds.copy_(torch.tensor(list(seeds) + [0] * (batch - real), dtype=torch.long))
        if tuple(self.eos.tolist()) != spec.eos_ids:  # a captured graph keeps reading the tensor it saw
            self.eos = torch.tensor(spec.eos_ids, dtype=torch.long, device=device)
        self.column.zero_()
        first, logprob = sample_tokens(logits, self.seeds, self.column, spec)
        self.out_tokens[:, 0] = first
        self.out_logprobs[:, 0] = logprob
        self.finished.copy_(self._is_eos(first))
        self.finished[real:] = True
        self.tokens.copy_(first)
        self.positions.copy_(mask.long().sum(-1))
        self.slot.fill_(width)
        self.column.fill_(1)

    def _is_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        return (tokens.unsqueeze(-1) == self.eos).any(-1)

    def step(self, span: int, spec: SamplingSpec) -> None:
        """One decode step on the workspace state (capturable: device tensors only, no host sync)."""
        self.bias.index_fill_(1, self.slot, 0.0)
        if self.kernels == "triton":
            logits = self.decode_forward_triton(span)
        else:
            bias = self.bias[:, :span].unsqueeze(1)
            logits = self.forward(
                self.tokens.unsqueeze(1), self.positions.unsqueeze(1), self.slot, span, bias, compiled=self.compile_glue
            )
        chosen, logprob = sample_tokens(logits, self.seeds, self.column, spec)
        self.out_tokens.index_copy_(1, self.column, chosen.unsqueeze(1))
        self.out_logprobs.index_copy_(1, self.column, logprob.unsqueeze(1))
        self.finished |= self._is_eos(chosen)
        self.tokens.copy_(chosen)
        self.positions += 1
        self.slot += 1
        self.column += 1

    @staticmethod
    def span_for(slots_used: int) -> int:
        return -(-slots_used // SPAN_QUANTUM) * SPAN_QUANTUM

    # -- CUDA graphs --------------------------------------------------------------------------
    def step_key(self, span: int, spec: SamplingSpec) -> tuple[Any, ...]:
        """What a decode step's kernels and shapes are a function of."""
        shape, dtype = self.weights.shape, self.weights.embed.dtype
        return (self.device, self.kernels, self.compile_glue, self.batch, self.capacity, span, dtype, shape, spec.key())

    def capture(self, spec: SamplingSpec, spans: Sequence[int]) -> int:
        """Capture one graph per span (same pool); state is junk afterwards until :meth:`prefill`.

        Before a capture the step runs once eagerly on the capture stream (outside the capture): the first
        span of every call, so that cuBLAS has its handle and workspace on that stream even after they
        were cleared, and any span whose step this process has not run yet (:data:`_WARMED_STEPS`: its
        kernels compile then). A released engine (the memory plan's ``release_rollout``) recaptures every
        rollout; skipping the other warm-ups took a quarter to a third off its five captures on the H200
        (``docs/measurements/2026-12-04-h200-release``).

        Returns how many graphs it captured (0 when every span's graph for ``spec`` is there already)."""
        if self.graph_key != spec.key():
            # Dropping every graph releases their pool to a use count of 0, and CUDA's caching allocator then
            # refuses to open that pool again for a capture (an internal assert): new graphs get a new pool.
            self.graphs.clear()
            self._pool = None
            self.graph_key = spec.key()
        if tuple(self.eos.tolist()) != spec.eos_ids:
            self.eos = torch.tensor(spec.eos_ids, dtype=torch.long, device=self.device)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        captured = 0
        for span in spans:
            if span in self.graphs:
                continue
            key = self.step_key(span, spec)
            side = warmup_stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            if captured == 0 or key not in _WARMED_STEPS:
                self._reset_counters()
                with torch.cuda.stream(side):
                    self.step(span, spec)
                torch.cuda.current_stream(self.device).wait_stream(side)
                _WARMED_STEPS.add(key)
            captured += 1
            self._reset_counters()
            self.graphs[span] = self._captured_step(span, spec, side)
        return captured

    def _captured_step(self, span: int, spec: SamplingSpec, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
        """One decode step captured on ``stream`` into the workspace's pool.

        ``capture_begin``/``capture_end`` rather than ``torch.cuda.graph``, whose ``empty_cache`` before
        every capture was 40 % of a released engine's five captures on the H200 (133 ms against 80 without;
        ``scripts/device/rollout_rebuild_timing.py``) and returns blocks the next allocation must take from
        the driver again."""
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):  # one stream for every capture: one cuBLAS workspace
            graph.capture_begin(pool=self._pool)
            try:
                self.step(span, spec)
            finally:
                graph.capture_end()
        return graph

    def _reset_counters(self) -> None:
        self.slot.zero_()
        self.column.zero_()
        self.positions.zero_()

    def runner(self, spec: SamplingSpec, *, use_graphs: bool) -> Callable[[int], None]:
        """A function ``run(span)`` that advances one step: a graph replay, or the eager step."""
        if not use_graphs:
            return lambda span: self.step(span, spec)
        return lambda span: self.graphs[span].replay()

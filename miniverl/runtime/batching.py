"""Physical batching of unpadded trajectories: the plan, and the mask-aware padded forward.

``train.trajectory_batch_size`` decides how many trajectories share one padded backbone forward:

* ``1``: one trajectory per forward (sequential; the compatible default);
* ``k``: deterministic length buckets of ``k`` rows: rows are sorted by ``(length, index)`` and cut
  into consecutive groups of ``k`` (the last one may be shorter);
* ``"auto"``: a cost-minimizing partition of the same sorted order (see :class:`AutoPolicy`).
  Padding the whole group into one forward can be slower than fixed buckets when lengths differ;
  ``auto`` instead picks the contiguous partition of the length-sorted rows that minimizes
  ``forwards * overhead_tokens + padded_tokens`` under a per-forward token budget. Every fixed
  ``k`` bucketing is one such partition, so under this cost model ``auto`` is never worse than the
  best fixed batch size that fits the budget. Unless the irregular optimum beats the best fixed
  bucketing by more than ``prefer_fixed_margin`` (model error is larger than that), ``auto`` uses
  that best fixed bucketing: regular shapes, and the model only has to rank the fixed sizes.

The padded forward right-pads each physical batch, passes the attention mask, runs the decoder
(never the LM head: no ``[B, T, V]`` logits), gathers the selected positions, and returns them
flattened in row order. Right padding keeps each row's own causal boundary and its positions
``0..L-1``; padded positions are never gathered, so padding never reaches an output or a loss.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from miniverl.runtime.rows import BatchSize, PhysicalBatch, SequenceRows

__all__ = [
    "AutoPolicy",
    "PhysicalBatch",
    "padded_selected_hidden",
    "padding_tokens",
    "plan_physical_batches",
    "run_physical_batch",
]


@dataclass(frozen=True)
class AutoPolicy:
    """Cost model for ``trajectory_batch_size: auto``.

    ``overhead_tokens``: the fixed cost of one extra forward+backward (kernel launches, weight
    dequantization, optimizer-independent per-call work) expressed in padded tokens.
    ``max_tokens``: the per-forward budget of padded tokens (``rows * longest``), which bounds the
    activation memory of one physical batch; a single row longer than the budget still runs alone.
    """

    overhead_tokens: int = 256
    max_tokens: int = 8192
    prefer_fixed_margin: float = 0.05

    def __post_init__(self) -> None:
        if self.overhead_tokens < 0 or self.max_tokens < 1 or not 0 <= self.prefer_fixed_margin < 1:
            raise ValueError("AutoPolicy needs overhead_tokens >= 0, max_tokens >= 1, 0 <= prefer_fixed_margin < 1")

    def cost(self, lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> int:
        """Modelled cost of a plan: ``forwards * overhead_tokens + sum(rows * longest)``."""
        return sum(self.overhead_tokens + len(b) * max(lengths[i] for i in b) for b in batches if b)

    def fits(self, lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> bool:
        return all(len(b) == 1 or len(b) * max(lengths[i] for i in b) <= self.max_tokens for b in batches)

    @classmethod
    def for_device(cls, device: torch.device | str, dtype: torch.dtype | None = None) -> AutoPolicy:
        """Defaults by device: a CPU forward has little fixed cost; a GPU forward has a lot.

        On CUDA, low-precision compute (bf16/fp16) moves the point where a forward stops being
        launch-bound to many more tokens than fp32 compute does.
        """
        kind = torch.device(device).type
        if kind == "cpu":
            return cls(overhead_tokens=16, max_tokens=4096)
        if dtype in (torch.bfloat16, torch.float16):
            return cls(overhead_tokens=2048, max_tokens=8192)
        return cls(overhead_tokens=512, max_tokens=4096)


def _sorted_order(lengths: Sequence[int]) -> list[int]:
    return sorted(range(len(lengths)), key=lambda i: (lengths[i], i))


def plan_physical_batches(
    lengths: Sequence[int], trajectory_batch_size: BatchSize, *, auto: AutoPolicy | None = None
) -> list[list[int]]:
    """Group row indices into physical batches (see module docstring). Deterministic.

    Returns a list of batches, each a list of row indices; every row appears exactly once.
    ``1`` keeps the original row order; buckets are in increasing length order.
    """
    n = len(lengths)
    if any(int(length) < 1 for length in lengths):
        raise ValueError("every row needs at least one token")
    if trajectory_batch_size == "auto":
        return _auto_partition([int(x) for x in lengths], auto or AutoPolicy())
    if isinstance(trajectory_batch_size, bool) or not isinstance(trajectory_batch_size, int):
        raise ValueError(f"trajectory_batch_size must be an integer >= 1 or 'auto', got {trajectory_batch_size!r}")
    if trajectory_batch_size < 1:
        raise ValueError(f"trajectory_batch_size must be >= 1, got {trajectory_batch_size}")
    if trajectory_batch_size == 1:
        return [[i] for i in range(n)]
    order = _sorted_order(lengths)
    k = trajectory_batch_size
    return [order[i : i + k] for i in range(0, n, k)]


def _auto_partition(lengths: list[int], policy: AutoPolicy) -> list[list[int]]:
    """Minimum-cost contiguous partition of the length-sorted rows (O(n^2) dynamic program).

    Cost of a batch of sorted rows ``i..j-1``: ``overhead_tokens + (j - i) * lengths[j-1]``. Ties
    prefer fewer forwards, then the earliest cut, so the plan is deterministic.
    """
    order = _sorted_order(lengths)
    srt = [lengths[i] for i in order]
    n = len(srt)
    inf = float("inf")
    best: list[tuple[float, int]] = [(0.0, 0)] + [(inf, 0)] * n  # (cost, forwards)
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j - 1, -1, -1):
            tokens = (j - i) * srt[j - 1]
            if tokens > policy.max_tokens and j - i > 1:
                break  # longer batches ending at j only grow
            cand = (best[i][0] + policy.overhead_tokens + tokens, best[i][1] + 1)
            if cand < best[j]:
                best[j] = cand
                cut[j] = i
    batches: list[list[int]] = []
    j = n
    while j > 0:
        batches.append(order[cut[j] : j])
        j = cut[j]
    best_plan = batches[::-1]
    fixed = [[order[i : i + k] for i in range(0, n, k)] for k in range(1, n + 1)]
    fixed = [plan for plan in fixed if policy.fits(lengths, plan)]
    if fixed:
        regular = min(fixed, key=lambda plan: (policy.cost(lengths, plan), len(plan)))
        if policy.cost(lengths, best_plan) >= (1.0 - policy.prefer_fixed_margin) * policy.cost(lengths, regular):
            return regular
    return best_plan


def padding_tokens(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> int:
    """Padded positions the plan adds: ``sum(len(b) * max_len(b) - sum_len(b))``."""
    return sum(len(b) * max(lengths[i] for i in b) - sum(lengths[i] for i in b) for b in batches if b)


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host -> device without a hidden sync: pinned + ``non_blocking`` on CUDA.

    A pageable copy blocks the host until the stream drains, so the CPU could not queue the next
    physical batch's kernels while the GPU still runs the previous backward.
    """
    if device.type == "cuda":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def run_physical_batch(
    decoder: Any, rows: SequenceRows, batch: Sequence[int], *, device: torch.device
) -> PhysicalBatch:
    """Right-pad ``batch``'s rows, run ``decoder`` with the attention mask, gather selected positions.

    ``decoder`` is the inner transformer (e.g. ``LlamaModel``) whose output ``last_hidden_state`` is
    already final-normed. The pad id is 0: padded positions are masked and never gathered, so their
    token value cannot matter.
    """
    lens = [len(rows.input_ids[i]) for i in batch]
    width = max(lens)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    flat: list[int] = []
    for b, i in enumerate(batch):
        ids[b, : lens[b]] = torch.tensor(rows.input_ids[i], dtype=torch.long)
        mask[b, : lens[b]] = 1
        flat.extend(b * width + p for p in rows.selected_positions[i])
    index = to_device(torch.tensor(flat, dtype=torch.long), device)
    ids, mask = to_device(ids, device), to_device(mask, device)
    out = decoder(input_ids=ids, attention_mask=mask, use_cache=False)
    hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
    selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
    return PhysicalBatch(
        rows=tuple(batch),
        hidden=selected,
        counts=tuple(len(rows.selected_positions[i]) for i in batch),
        padded_tokens=len(batch) * width - sum(lens),
    )


def iter_physical_batches(
    decoder: Any,
    rows: SequenceRows,
    trajectory_batch_size: BatchSize,
    *,
    device: torch.device,
    auto: AutoPolicy | None = None,
) -> Iterator[PhysicalBatch]:
    """Run the plan lazily, one padded forward per step (so a caller can backward per batch)."""
    lengths = [len(x) for x in rows.input_ids]
    for batch in plan_physical_batches(lengths, trajectory_batch_size, auto=auto):
        yield run_physical_batch(decoder, rows, batch, device=device)


def padded_selected_hidden(
    decoder: Any,
    rows: SequenceRows,
    trajectory_batch_size: BatchSize,
    *,
    device: torch.device,
    auto: AutoPolicy | None = None,
) -> torch.Tensor:
    """All rows' selected hidden states ``[sum(selected), H]`` in row order, then position order."""
    pieces: dict[int, torch.Tensor] = {}
    hidden_size: int | None = None
    ref: torch.Tensor | None = None
    for pb in iter_physical_batches(decoder, rows, trajectory_batch_size, device=device, auto=auto):
        ref, hidden_size = pb.hidden, pb.hidden.shape[-1]
        for row, part in zip(pb.rows, pb.hidden.split(list(pb.counts)), strict=True):
            pieces[row] = part
    if ref is None or hidden_size is None:
        raise ValueError("padded_selected_hidden needs at least one row")
    return torch.cat([pieces[i] for i in range(len(rows.input_ids))])

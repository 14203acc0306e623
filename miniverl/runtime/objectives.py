r"""Objectives on the shared batching contract: SFT, offline KD, strict OPD, GKD ``forward_kl_topk``.

Every objective is a per-token value :math:`\ell_{n,t}` at a row's selected positions, computed by
a pure function of ``miniverl.algorithms`` from the selected hidden states (``[N, H]``, projected
in ``[chunk, V]`` pieces, never ``[B, T, V]``). The group loss keeps each trajectory's own
normalization, whatever the physical batching:

.. math::
    L = \frac{1}{G} \sum_{n=1}^{G} \frac{\sum_t w_{n,t}\,\ell_{n,t}}{\sum_t w_{n,t}}

with ``G`` the number of trajectories in the optimizer group and ``w`` the token weights (a row
with zero total weight contributes 0). ``L`` is a sum over rows, so :func:`accumulate_objective`
backpropagates each physical batch's share right after its forward: peak activation memory is one
physical batch, and the accumulated gradient equals that of ``L``.

Where the teacher targets come from is orthogonal to the objective: strict OPD scores the
student's own samples with the online teacher (:func:`score_teacher`); offline KD reads them from a
teacher cache (``miniverl.runtime.teacher_cache``). ``exact`` targets are the teacher's selected
hidden states plus its head (full-vocabulary divergence); ``topk_tail`` targets are the teacher's
top-k ids and log-probs (k buckets + one tail bucket; also what ``forward_kl_topk`` needs).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from miniverl.algorithms.divergences import (
    DivergenceKind,
    chunked_divergence,
    chunked_topk_tail_divergence,
    forward_kl_topk,
    teacher_topk_targets,
)
from miniverl.algorithms.logprobs import sft_token_nll
from miniverl.runtime.base import BatchSize, RoleName, RoleRuntime, SequenceRows
from miniverl.runtime.batching import to_device

ObjectiveKind = Literal["sft", "divergence", "forward_kl_topk"]
TargetVariant = Literal["exact", "topk_tail"]


@dataclass(frozen=True)
class ObjectiveSpec:
    """``sft``: cross-entropy on the rows' next tokens. ``divergence``: ``variant`` exact/topk_tail with
    ``divergence`` forward_kl/reverse_kl/jsd (β weights the teacher) at ``temperature``.
    ``forward_kl_topk``: GKD's top-k forward KL (teacher top-k renormalized)."""

    kind: ObjectiveKind = "divergence"
    variant: TargetVariant = "exact"
    divergence: DivergenceKind = "reverse_kl"
    beta: float = 0.5
    temperature: float = 1.0
    top_k: int = 32
    chunk_size: int = 1024

    @property
    def target_kind(self) -> Literal["none", "hidden", "topk"]:
        if self.kind == "sft":
            return "none"
        if self.kind == "forward_kl_topk" or self.variant == "topk_tail":
            return "topk"
        return "hidden"


@dataclass
class TeacherTargets:
    """Teacher information for every selected position, flattened in row order then position order."""

    counts: tuple[int, ...]
    hidden: torch.Tensor | None = None  # [N, H]   (exact)
    head: torch.Tensor | None = None  # [V, H]     (exact)
    topk_ids: torch.Tensor | None = None  # [N, k] (top-k)
    topk_logprobs: torch.Tensor | None = None  # [N, k]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> Literal["hidden", "topk"]:
        return "hidden" if self.hidden is not None else "topk"

    def _offsets(self) -> list[int]:
        out = [0]
        for c in self.counts:
            out.append(out[-1] + c)
        return out

    def select_rows(self, rows: Sequence[int]) -> TeacherTargets:
        """The targets of ``rows`` (in that order), e.g. one physical batch."""
        off = self._offsets()
        index = torch.tensor([i for r in rows for i in range(off[r], off[r + 1])], dtype=torch.long)

        def take(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.index_select(0, to_device(index, t.device))

        return TeacherTargets(
            counts=tuple(self.counts[r] for r in rows),
            hidden=take(self.hidden),
            head=self.head,
            topk_ids=take(self.topk_ids),
            topk_logprobs=take(self.topk_logprobs),
            meta=self.meta,
        )

    def digest(self) -> str:
        """sha256 over the kind, counts and the exact bytes of every tensor (CPU, contiguous)."""
        h = hashlib.sha256(f"{self.kind}:{list(self.counts)}".encode())
        for name in ("hidden", "head", "topk_ids", "topk_logprobs"):
            t = getattr(self, name)
            if t is not None:
                c = t.detach().to("cpu").contiguous()
                h.update(f"|{name}:{c.dtype}:{list(c.shape)}|".encode())
                h.update(c.view(torch.uint8).numpy().tobytes() if c.numel() else b"")
        return h.hexdigest()


def rows_digest(rows: SequenceRows) -> str:
    """sha256 of the rows' token ids and selected positions (what a cache or a gate keys on)."""
    h = hashlib.sha256()
    for ids, pos in zip(rows.input_ids, rows.selected_positions, strict=True):
        h.update(f"{list(ids)}|{list(pos)};".encode())
    return h.hexdigest()


def next_token_targets(rows: SequenceRows) -> tuple[tuple[int, ...], ...]:
    """The token each selected position predicts (``input_ids[p + 1]``), e.g. SFT oracle tokens."""
    out = []
    for ids, pos in zip(rows.input_ids, rows.selected_positions, strict=True):
        if any(p + 1 >= len(ids) for p in pos):
            raise ValueError("a selected position is the last token of its row: it predicts nothing")
        out.append(tuple(ids[p + 1] for p in pos))
    return tuple(out)


@torch.no_grad()
def score_teacher(
    runtime: RoleRuntime,
    rows: SequenceRows,
    objective: ObjectiveSpec,
    *,
    trajectory_batch_size: BatchSize,
    role: RoleName = "teacher",
) -> TeacherTargets:
    """Online teacher targets for ``rows`` (one role switch, batched, under ``no_grad``)."""
    with runtime.use(role) as handle:
        hidden = handle.selected_hidden(rows, trajectory_batch_size=trajectory_batch_size).detach()
        head = handle.head_weight.detach()
    return targets_from_hidden(hidden, head, rows.selected_counts, objective)


@torch.no_grad()
def targets_from_hidden(
    hidden: torch.Tensor, head: torch.Tensor, counts: tuple[int, ...], objective: ObjectiveSpec
) -> TeacherTargets:
    if objective.target_kind == "topk":
        ids, lps = teacher_topk_targets(
            hidden, head, k=objective.top_k, temperature=objective.temperature, chunk_size=objective.chunk_size
        )
        return TeacherTargets(counts=counts, topk_ids=ids, topk_logprobs=lps)
    return TeacherTargets(counts=counts, hidden=hidden, head=head)


def token_values(
    hidden: torch.Tensor,
    head: torch.Tensor,
    objective: ObjectiveSpec,
    *,
    targets: TeacherTargets | None = None,
    token_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token objective values ``[N]`` for selected student hidden states ``[N, H]``."""
    common: dict[str, Any] = {"temperature": objective.temperature, "chunk_size": objective.chunk_size}
    if objective.kind == "sft":
        if token_ids is None:
            raise ValueError("objective sft needs the target token ids")
        return sft_token_nll(hidden, head, token_ids, **common)
    if targets is None:
        raise ValueError(f"objective {objective.kind} needs teacher targets")
    if objective.kind == "forward_kl_topk":
        assert targets.topk_ids is not None and targets.topk_logprobs is not None
        return forward_kl_topk(hidden, head, targets.topk_ids, targets.topk_logprobs, **common)
    div: dict[str, Any] = {"kind": objective.divergence, "beta": objective.beta, **common}
    if objective.variant == "topk_tail":
        if targets.topk_ids is None or targets.topk_logprobs is None:
            raise ValueError("a topk_tail objective needs top-k teacher targets, not hidden states")
        return chunked_topk_tail_divergence(hidden, head, targets.topk_ids, targets.topk_logprobs, **div)
    if targets.hidden is None or targets.head is None:
        raise ValueError("an exact objective needs the teacher's hidden states and head, not top-k targets")
    return chunked_divergence(hidden, head, targets.hidden.to(hidden.device), targets.head, **div)


def per_row_normalized_sum(values: torch.Tensor, weights: torch.Tensor, counts: Sequence[int]) -> torch.Tensor:
    r""":math:`\sum_n \sum_t w_{n,t} \ell_{n,t} / \sum_t w_{n,t}` over the rows of one physical batch.

    Rows are contiguous segments, so the per-row sums are plain reductions of slices: deterministic
    on every device (a scatter/``index_add`` would add in a nondeterministic order on CUDA).
    """
    if values.shape != weights.shape:
        raise ValueError(f"token weights {tuple(weights.shape)} must match the values {tuple(values.shape)}")
    w = weights.to(values.dtype)
    total = values.new_zeros(())
    for v, wr in zip(values.split(list(counts)), w.split(list(counts)), strict=True):
        den = wr.sum()
        if v.numel():
            total = total + torch.where(den > 0, (wr * v).sum() / torch.where(den > 0, den, 1.0), 0.0)
    return total


@dataclass(frozen=True)
class ObjectiveResult:
    loss: float
    plan: tuple[tuple[int, ...], ...]
    physical_forwards: int
    padding_tokens: int


def accumulate_objective(
    runtime: RoleRuntime,
    rows: SequenceRows,
    objective: ObjectiveSpec,
    *,
    trajectory_batch_size: BatchSize,
    targets: TeacherTargets | None = None,
    token_weights: Sequence[Sequence[float]] | None = None,
    group_size: int | None = None,
) -> ObjectiveResult:
    """Forward + backward the student per physical batch; gradients accumulate in ``.grad``.

    ``token_weights`` default to 1 per selected position; ``group_size`` (G) defaults to the rows.
    Returns the group loss ``L`` (a float; the graph is freed batch by batch).
    """
    weights = token_weights if token_weights is not None else [[1.0] * c for c in rows.selected_counts]
    if [len(w) for w in weights] != list(rows.selected_counts):
        raise ValueError("token_weights need one weight per selected position of each row")
    token_ids = next_token_targets(rows) if objective.kind == "sft" else None
    g = group_size if group_size is not None else len(rows.input_ids)
    total: torch.Tensor | None = None  # summed on the device: no host sync per physical batch
    plan: list[tuple[int, ...]] = []
    padding = 0
    with runtime.use("student") as handle:
        head = handle.head_weight
        for pb in handle.iter_selected_hidden(rows, trajectory_batch_size=trajectory_batch_size):
            device = pb.hidden.device
            ids = None
            if token_ids is not None:
                ids = to_device(torch.tensor([t for r in pb.rows for t in token_ids[r]], dtype=torch.long), device)
            sub = targets.select_rows(pb.rows) if targets is not None else None
            values = token_values(pb.hidden, head, objective, targets=sub, token_ids=ids)
            w = to_device(torch.tensor([x for r in pb.rows for x in weights[r]], dtype=values.dtype), device)
            loss = per_row_normalized_sum(values, w, pb.counts) / g
            if loss.requires_grad:
                loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
            plan.append(pb.rows)
            padding += pb.padded_tokens
    value = float(total) if total is not None else 0.0
    return ObjectiveResult(loss=value, plan=tuple(plan), physical_forwards=len(plan), padding_tokens=padding)

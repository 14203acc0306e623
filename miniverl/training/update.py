"""What every algorithm's update shares: the trajectory as the update sees it, physical batches, rows.

The math lives in :mod:`miniverl.algorithms` and each algorithm's update in
:mod:`miniverl.training.algorithms`. Each physical batch is backpropagated as soon as its loss is
known, with a weight that makes the sum over batches equal the objective over the whole optimizer
group (so batching never changes the math).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from miniverl.algorithms import chunked_token_logprobs
from miniverl.config.schema import MiniverlConfig
from miniverl.runtime.base import BatchSize, RoleRuntime, SequenceRows
from miniverl.runtime.batching import to_device


@dataclass(frozen=True)
class UpdateSequence:
    """One trajectory as the update sees it: the student's tokens and, if needed, the teacher's."""

    student_ids: tuple[int, ...]
    response_start: int
    teacher_ids: tuple[int, ...] | None
    teacher_response_start: int | None
    response_len: int
    advantage: float = 0.0

    def student_positions(self) -> tuple[int, ...]:
        return tuple(range(self.response_start - 1, self.response_start - 1 + self.response_len))

    def teacher_positions(self) -> tuple[int, ...]:
        assert self.teacher_response_start is not None
        start = self.teacher_response_start
        return tuple(range(start - 1, start - 1 + self.response_len))

    def response_ids(self) -> tuple[int, ...]:
        return self.student_ids[self.response_start : self.response_start + self.response_len]


@dataclass
class UpdateStats:
    loss: float
    kl: float | None
    tokens: int
    entropy: float | None = None  # token-mean policy entropy over the update's response tokens
    #: against given old log-probs (a later pass or mini-batch): the clipped token fraction and verl's k1 ppo_kl
    clip_fraction: float | None = None
    ppo_kl: float | None = None
    #: per sequence, the trainer's log-prob of each response token from the loss's own forward, where that forward
    #: ran on the rollout's weights (one step on fresh trajectories): the recomputed old_logp the agreement needs
    trainer_logp: list[tuple[float, ...]] | None = None


def host_logprobs(pieces: Sequence[torch.Tensor]) -> list[tuple[float, ...]]:
    """Per-sequence device log-probs as host floats, in one device read (not one per sequence)."""
    if not pieces:
        return []
    flat = torch.cat([p.detach().float() for p in pieces]).cpu().tolist()
    out: list[tuple[float, ...]] = []
    start = 0
    for piece in pieces:
        out.append(tuple(flat[start : start + piece.numel()]))
        start += piece.numel()
    return out


def physical_batches(
    runtime: RoleRuntime, sequences: Sequence[UpdateSequence], batch_size: BatchSize
) -> list[list[int]]:
    """The student's physical batches (the runtime's own length bucketing and ``auto`` policy)."""
    with runtime.use("student") as student:
        return student.plan(rows_of(sequences, teacher=False), batch_size)


def pass_order_seed(kind: str, run_seed: int, step: int, epoch: int) -> int:
    """The seed of one pass's mini-batch order: a function of (run seed, update, epoch) only, so a
    resumed run replays the same order (``kind`` keeps the algorithms' streams apart)."""
    digest = hashlib.sha256(f"{kind}-minibatch:{run_seed}:{step}:{epoch}".encode()).hexdigest()
    return int(digest[:15], 16)


def mini_batches(units: Sequence[Sequence[int]], count: int, seed: int, *, shuffle: bool) -> list[list[int]]:
    """``units`` (trajectory indices that stay together: one trajectory, or one prompt group) split
    into ``count`` mini-batches of equally many units, in an order permuted from ``seed`` when
    ``shuffle`` (verl's ``ppo_mini_batch_size`` splits its step the same way, in prompts)."""
    if count < 1 or len(units) % count:
        raise ValueError(f"{len(units)} units cannot make {count} equal mini-batches")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(units), generator=generator).tolist() if shuffle else list(range(len(units)))
    per_mini = len(units) // count
    return [[i for u in order[k : k + per_mini] for i in units[u]] for k in range(0, len(units), per_mini)]


def rows_of(sequences: Sequence[UpdateSequence], teacher: bool) -> SequenceRows:
    if teacher:
        return SequenceRows(
            input_ids=tuple(s.teacher_ids or () for s in sequences),
            selected_positions=tuple(s.teacher_positions() for s in sequences),
        )
    return SequenceRows(
        input_ids=tuple(s.student_ids for s in sequences),
        selected_positions=tuple(s.student_positions() for s in sequences),
    )


def targets_of(sequences: Sequence[UpdateSequence], device: torch.device) -> torch.Tensor:
    """The response token ids, on ``device`` without a host sync (pinned, non-blocking on CUDA)."""
    ids = [t for s in sequences for t in s.response_ids()]
    return to_device(torch.tensor(ids, dtype=torch.long), device)


class Bf16MasterAdapter:
    """bf16 trainable adapter tensors in the model, fp32 master copies in the optimizer.

    PEFT keeps LoRA weights in fp32 on a bf16 base (``autocast_adapter_dtype``), so every LoRA
    linear casts its input to fp32 and runs fp32 GEMMs, forward and backward, each step. Here the
    model's adapter tensors become bf16 (bf16 GEMMs, no per-layer casts) and the optimizer steps
    fp32 masters: :meth:`step` casts the grads into the masters once (one foreach copy), steps
    the optimizer over the masters, and copies the result back into the bf16 tensors (one foreach
    copy). The masters start as exact fp32 copies of the adapter (taken before the cast), so no
    update is lost to bf16 rounding between steps. Training uses it through
    :class:`~miniverl.training.algorithms.base.TrainedParameters` (``train.adapter_precision``).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], dtype: torch.dtype = torch.bfloat16) -> None:
        self.params = list(params)
        self.masters = [torch.nn.Parameter(p.detach().float().clone()) for p in self.params]
        for p in self.params:
            p.data = p.data.to(dtype)

    @torch.no_grad()
    def grads_to_masters(self) -> None:
        """The model's (bf16) grads into the masters' fp32 grads; a tensor without a grad leaves its master's alone."""
        pairs = [(m, p) for m, p in zip(self.masters, self.params, strict=True) if p.grad is not None]
        for m, _ in pairs:
            if m.grad is None:
                m.grad = torch.empty_like(m)
        if pairs:
            grads: list[torch.Tensor] = [p.grad for _, p in pairs if p.grad is not None]
            torch._foreach_copy_([m.grad for m, _ in pairs if m.grad is not None], grads)

    @torch.no_grad()
    def masters_to_model(self) -> None:
        """The masters, rounded, into the model's tensors; the model's grads dropped."""
        torch._foreach_copy_(list[torch.Tensor](self.params), list[torch.Tensor](self.masters))
        for p in self.params:
            p.grad = None

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Grads (bf16, in the model) -> fp32 masters; ``optimizer.step()`` over the masters; masters -> model."""
        self.grads_to_masters()
        with torch.no_grad():
            optimizer.step()
        self.masters_to_model()

    @contextmanager
    def masters_in_model(self) -> Iterator[None]:
        """Inside the block the model holds the fp32 masters themselves (a PEFT save writes the masters);
        on exit its own low-precision tensors are back, unchanged."""
        low = [p.data for p in self.params]
        try:
            for p, m in zip(self.params, self.masters, strict=True):
                p.data = m.data
            yield
        finally:
            for p, data in zip(self.params, low, strict=True):
                p.data = data


@torch.no_grad()
def rollout_token_logprobs(
    runtime: RoleRuntime, sequences: Sequence[UpdateSequence], config: MiniverlConfig, *, with_reference: bool
) -> tuple[list[torch.Tensor], list[torch.Tensor] | None]:
    """Per trajectory, the current student's response-token log-probs (and the reference's), before any step."""
    chunk = config.train.logprob_chunk_size
    old: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    ref: list[torch.Tensor] = [torch.empty(0)] * len(sequences)
    for index_list in physical_batches(runtime, sequences, config.train.trajectory_batch_size):
        part = [sequences[i] for i in index_list]
        rows, targets = rows_of(part, teacher=False), targets_of(part, runtime.device)
        sizes = [s.response_len for s in part]
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(part))
            logp, _ = chunked_token_logprobs(hidden, student.head_weight, targets, chunk_size=chunk)
        for i, piece in zip(index_list, logp.split(sizes), strict=True):
            old[i] = piece
        if with_reference:
            with runtime.use("reference") as reference:
                hidden = reference.selected_hidden(rows, trajectory_batch_size=len(part))
                ref_lp, _ = chunked_token_logprobs(hidden, reference.head_weight, targets, chunk_size=chunk)
            for i, piece in zip(index_list, ref_lp.split(sizes), strict=True):
                ref[i] = piece
    return old, ref if with_reference else None

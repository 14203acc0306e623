"""One optimizer update from one cycle's fresh trajectories: loss assembly over physical batches.

The math lives in :mod:`miniverl.algorithms`; this module only lines tensors up. Each physical
batch is backpropagated as soon as its loss is known, with a weight that makes the sum over
batches equal the objective over the whole optimizer group (so batching never changes the math).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from miniverl.algorithms import (
    chunked_divergence,
    chunked_token_logprobs,
    chunked_topk_tail_divergence,
    k3_kl,
    ppo_clip_token_losses,
    teacher_topk_targets,
)
from miniverl.config.schema import MiniverlConfig
from miniverl.runtime.base import BatchSize, RoleRuntime, SequenceRows


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


def physical_batches(
    runtime: RoleRuntime, sequences: Sequence[UpdateSequence], batch_size: BatchSize
) -> list[list[int]]:
    """The student's physical batches (the runtime's own length bucketing and ``auto`` policy)."""
    with runtime.use("student") as student:
        return student.plan(_rows(sequences, teacher=False), batch_size)


def _rows(sequences: Sequence[UpdateSequence], teacher: bool) -> SequenceRows:
    if teacher:
        return SequenceRows(
            input_ids=tuple(s.teacher_ids or () for s in sequences),
            selected_positions=tuple(s.teacher_positions() for s in sequences),
        )
    return SequenceRows(
        input_ids=tuple(s.student_ids for s in sequences),
        selected_positions=tuple(s.student_positions() for s in sequences),
    )


def _targets(sequences: Sequence[UpdateSequence], device: torch.device) -> torch.Tensor:
    ids = [t for s in sequences for t in s.response_ids()]
    return torch.tensor(ids, dtype=torch.long, device=device)


def grpo_update(runtime: RoleRuntime, sequences: Sequence[UpdateSequence], config: MiniverlConfig) -> UpdateStats:
    """GRPO: token-mean PPO-clip loss over the group (+ optional k3 KL to the reference), backpropagated.

    Strict on-policy: the group was sampled by the current weights and no optimizer step happens
    before this backward, so ``old_logp`` is the current log-prob detached (ratio exactly 1; the
    clip only matters for later epochs, which strict on-policy training never runs). This saves a
    second student forward per physical batch.
    """
    grpo = config.algorithm.grpo
    chunk = config.train.logprob_chunk_size
    batch_size = config.train.trajectory_batch_size
    total_tokens = sum(s.response_len for s in sequences)
    batches = physical_batches(runtime, sequences, batch_size)
    loss_sum = 0.0
    kl_sum = 0.0
    use_kl = grpo.kl_coef > 0
    for index_list in batches:
        part = [sequences[i] for i in index_list]
        rows = _rows(part, teacher=False)
        targets = _targets(part, runtime.device)
        ref_logp = None
        if use_kl:
            with runtime.use("reference") as ref, torch.no_grad():
                hidden = ref.selected_hidden(rows, trajectory_batch_size=len(part))
                ref_logp, _ = chunked_token_logprobs(hidden, ref.head_weight, targets, chunk_size=chunk)
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows, trajectory_batch_size=len(part))
            logp, _ = chunked_token_logprobs(hidden, student.head_weight, targets, chunk_size=chunk)
        old_logp = logp.detach()
        advantages = torch.tensor(
            [s.advantage for s in part for _ in range(s.response_len)], dtype=logp.dtype, device=logp.device
        )
        ones = torch.ones_like(logp, dtype=torch.bool)[None]
        token_losses = ppo_clip_token_losses(
            logp[None], old_logp[None], advantages[None], ones, clip_low=grpo.clip_low, clip_high=grpo.clip_high
        )[0]
        loss = token_losses.sum() / total_tokens
        if ref_logp is not None:
            kl_tokens = k3_kl(logp, ref_logp)
            loss = loss + grpo.kl_coef * kl_tokens.sum() / total_tokens
            kl_sum += float(kl_tokens.detach().sum())
        loss.backward()
        loss_sum += float(loss.detach())
    return UpdateStats(loss=loss_sum, kl=kl_sum / total_tokens if use_kl else None, tokens=total_tokens)


def opd_update(runtime: RoleRuntime, sequences: Sequence[UpdateSequence], config: MiniverlConfig) -> UpdateStats:
    """Strict on-policy distillation: per-trajectory mean of the token divergence, then the mean over trajectories.

    The default divergence is the exact reverse KL(student || teacher) over the whole vocabulary at
    every response position; ``distill.objective: topk_tail`` restricts it to the teacher's top-k plus a tail.
    """
    distill = config.algorithm.distill
    chunk = config.train.logprob_chunk_size
    batches = physical_batches(runtime, sequences, config.train.trajectory_batch_size)
    n = len(sequences)
    loss_sum = 0.0
    div_sum = 0.0
    tokens = 0
    for index_list in batches:
        part = [sequences[i] for i in index_list]
        with runtime.use("teacher") as teacher, torch.no_grad():
            teacher_hidden = teacher.selected_hidden(_rows(part, teacher=True), trajectory_batch_size=len(part))
            teacher_head = teacher.head_weight
            if distill.objective == "topk_tail":
                topk_ids, topk_logp = teacher_topk_targets(
                    teacher_hidden, teacher_head, k=distill.top_k, temperature=distill.temperature, chunk_size=chunk
                )
        with runtime.use("student") as student:
            hidden = student.selected_hidden(_rows(part, teacher=False), trajectory_batch_size=len(part))
            if distill.objective == "exact":
                per_token = chunked_divergence(
                    hidden,
                    student.head_weight,
                    teacher_hidden,
                    teacher_head,
                    kind=distill.divergence,
                    beta=distill.beta,
                    temperature=distill.temperature,
                    chunk_size=chunk,
                )
            else:
                per_token = chunked_topk_tail_divergence(
                    hidden,
                    student.head_weight,
                    topk_ids,
                    topk_logp,
                    kind=distill.divergence,
                    beta=distill.beta,
                    temperature=distill.temperature,
                    chunk_size=chunk,
                )
        per_traj = torch.stack([piece.mean() for piece in per_token.split([s.response_len for s in part])])
        loss = per_traj.sum() / n
        loss.backward()
        loss_sum += float(loss.detach())
        div_sum += float(per_token.detach().sum())
        tokens += per_token.numel()
    return UpdateStats(loss=loss_sum, kl=div_sum / max(tokens, 1), tokens=tokens)

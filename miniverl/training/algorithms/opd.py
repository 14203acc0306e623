"""Strict on-policy distillation (OPD): the student's own samples, the teacher's full distribution.

Roles: student, teacher (a separate frozen model, the base with a pinned adapter, or the frozen
base that sees ``privileged_context`` before the same response tokens). One update per cycle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from miniverl.algorithms import chunked_divergence, chunked_topk_tail_divergence, teacher_topk_targets
from miniverl.config.schema import MiniverlConfig
from miniverl.runtime.base import RoleRuntime
from miniverl.training.algorithms.base import Algorithm, AlgorithmStep, CycleBatch
from miniverl.training.update import UpdateSequence, UpdateStats, physical_batches, rows_of


class Opd(Algorithm):
    name = "opd"
    roles = ("teacher",)

    def update(self, batch: CycleBatch, *, step: int) -> AlgorithmStep:
        stats = opd_update(self.runtime, teacher_sequences(self.config, self.runtime.tokenizer, batch), self.config)
        grad_norm, delta = self.actor.step()
        return AlgorithmStep(
            loss=stats.loss, kl=stats.kl, tokens=stats.tokens, grad_norm=grad_norm, adapter_delta_norm=delta
        )


def teacher_sequences(config: MiniverlConfig, tokenizer: Any, batch: CycleBatch) -> list[UpdateSequence]:
    """Each trajectory with the teacher's rows: its own prompt (or the privileged one) + the same response."""
    from miniverl.rollout.hf import encode_prompt

    teacher = config.models.teacher
    context = teacher.privileged_context if teacher is not None else None
    by_id = {row.prompt_id: row for row in batch.prompts}
    teacher_prompts: dict[str, list[int]] = {}
    out = []
    for seq, traj in zip(batch.sequences(), batch.trajectories, strict=True):
        if context is not None:
            if traj.prompt_id not in teacher_prompts:
                row = by_id[traj.prompt_id]
                text = context.template.format(prompt=row.prompt, context=getattr(row, context.column))
                teacher_prompts[traj.prompt_id] = encode_prompt(
                    tokenizer, text, use_chat_template=config.rollout.use_chat_template
                )
            t_prompt = teacher_prompts[traj.prompt_id]
        else:
            t_prompt = list(traj.prompt_token_ids)
        out.append(
            UpdateSequence(
                student_ids=seq.student_ids,
                response_start=seq.response_start,
                teacher_ids=tuple(t_prompt + list(traj.response_token_ids)),
                teacher_response_start=len(t_prompt),
                response_len=seq.response_len,
            )
        )
    return out


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
            teacher_hidden = teacher.selected_hidden(rows_of(part, teacher=True), trajectory_batch_size=len(part))
            teacher_head = teacher.head_weight
            if distill.objective == "topk_tail":
                topk_ids, topk_logp = teacher_topk_targets(
                    teacher_hidden, teacher_head, k=distill.top_k, temperature=distill.temperature, chunk_size=chunk
                )
        with runtime.use("student") as student:
            hidden = student.selected_hidden(rows_of(part, teacher=False), trajectory_batch_size=len(part))
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

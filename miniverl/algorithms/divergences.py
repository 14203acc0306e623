r"""Token-level divergences between a student and a teacher distribution at the same positions.

Notation: at each selected position ``n`` the student distribution is :math:`p_s = \mathrm{softmax}
(h^s_n W_s^\top / \tau)` and the teacher's :math:`p_t = \mathrm{softmax}(h^t_n W_t^\top / \tau)`, the
same temperature :math:`\tau` on both sides. The teacher is always a constant: its inputs are
detached and its logits computed under ``no_grad``; gradients reach only the student's hidden
states and head. Student and teacher may have different hidden sizes but must share the vocabulary.

* ``forward_kl``  = :math:`\mathrm{KL}(p_t \| p_s) = \sum_v p_t (\log p_t - \log p_s)` (offline KD).
* ``reverse_kl``  = :math:`\mathrm{KL}(p_s \| p_t) = \sum_v p_s (\log p_s - \log p_t)` — strict
  on-policy distillation (student-sampled tokens, mode-seeking; Gu et al. 2024 "MiniLLM",
  Agarwal et al. 2024 "GKD").
* ``jsd`` (generalized JSD, GKD, Agarwal et al. 2024, eq. 1) with :math:`\beta \in (0, 1)`:
  :math:`\mathrm{JSD}_\beta = \beta\,\mathrm{KL}(p_t \| m) + (1-\beta)\,\mathrm{KL}(p_s \| m)`,
  :math:`m = \beta p_t + (1-\beta) p_s`. **β weights the teacher.** β = 0.5 is the symmetric JSD
  (bounded by log 2). At β = 0 or 1 the expression is identically 0 (only its *rescaled* limits
  tend to forward/reverse KL), so those values are refused: use ``forward_kl``/``reverse_kl``.

Top-k objectives (``teacher_topk_targets`` + ``chunked_topk_tail_divergence``, ``forward_kl_topk``)
only need the teacher's k best ids and log-probs per position, which can be stored offline.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from miniverl.algorithms._chunking import (
    check_chunk_size,
    check_projection,
    check_temperature,
    compute_dtype,
    log1mexp,
    log_floor,
    map_row_chunks,
    matmul_operands,
    tempered_logits,
)

DivergenceKind = Literal["forward_kl", "reverse_kl", "jsd"]
DIVERGENCE_KINDS: tuple[str, ...] = ("forward_kl", "reverse_kl", "jsd")

__all__ = [
    "DIVERGENCE_KINDS",
    "DivergenceKind",
    "chunked_divergence",
    "chunked_topk_tail_divergence",
    "forward_kl",
    "forward_kl_topk",
    "jsd",
    "reverse_kl",
    "teacher_topk_targets",
]


# --------------------------------------------------------------------------- on log-prob tensors
def forward_kl(student_logprobs: Tensor, teacher_logprobs: Tensor) -> Tensor:
    r""":math:`\mathrm{KL}(p_t \| p_s) = \sum p_t (\log p_t - \log p_s)` over the last dim."""
    return (teacher_logprobs.exp() * (teacher_logprobs - student_logprobs)).sum(dim=-1)


def reverse_kl(student_logprobs: Tensor, teacher_logprobs: Tensor) -> Tensor:
    r""":math:`\mathrm{KL}(p_s \| p_t) = \sum p_s (\log p_s - \log p_t)` over the last dim."""
    return (student_logprobs.exp() * (student_logprobs - teacher_logprobs)).sum(dim=-1)


def _check_beta(beta: float) -> None:
    if not (isinstance(beta, int | float) and 0.0 < beta < 1.0):
        raise ValueError(
            f"jsd needs 0 < beta < 1 (beta weights the teacher), got {beta!r}; "
            "JSD_beta is identically 0 at beta=0 and beta=1: use kind='forward_kl' or 'reverse_kl' instead"
        )


def jsd(student_logprobs: Tensor, teacher_logprobs: Tensor, beta: float = 0.5) -> Tensor:
    r""":math:`\beta\,\mathrm{KL}(p_t\|m) + (1-\beta)\,\mathrm{KL}(p_s\|m)` over the last dim.

    :math:`m = \beta p_t + (1-\beta) p_s`: GKD's generalized JSD (Agarwal et al. 2024); ``0 < beta < 1``.
    """
    _check_beta(beta)
    log_m = torch.logaddexp(teacher_logprobs + math.log(beta), student_logprobs + math.log1p(-beta))
    return beta * forward_kl(log_m, teacher_logprobs) + (1.0 - beta) * reverse_kl(student_logprobs, log_m)


def _divergence(student_logprobs: Tensor, teacher_logprobs: Tensor, kind: str, beta: float) -> Tensor:
    if kind == "forward_kl":
        return forward_kl(student_logprobs, teacher_logprobs)
    if kind == "reverse_kl":
        return reverse_kl(student_logprobs, teacher_logprobs)
    return jsd(student_logprobs, teacher_logprobs, beta)


def _check_kind(kind: str, beta: float) -> None:
    if kind not in DIVERGENCE_KINDS:
        raise ValueError(f"unknown divergence kind {kind!r}; valid kinds: {', '.join(DIVERGENCE_KINDS)}")
    if kind == "jsd":
        _check_beta(beta)


# --------------------------------------------------------------------------- exact, full vocabulary
def chunked_divergence(
    student_hidden: Tensor,
    student_head: Tensor,
    teacher_hidden: Tensor,
    teacher_head: Tensor,
    *,
    kind: DivergenceKind,
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    """Exact full-vocabulary divergence per row (see module docstring for ``kind``), ``[N]``.

    Both sides are projected in ``[chunk_size, V]`` pieces; the teacher piece is recomputed (under
    ``no_grad``) during the checkpointed backward instead of being kept. Float32 result (float64
    when a student input is float64).
    """
    check_projection("chunked_divergence (student)", student_hidden, student_head)
    check_projection("chunked_divergence (teacher)", teacher_hidden, teacher_head)
    check_temperature(temperature)
    check_chunk_size(chunk_size)
    _check_kind(kind, beta)
    if teacher_hidden.shape[0] != student_hidden.shape[0] or teacher_head.shape[0] != student_head.shape[0]:
        raise ValueError(
            "chunked_divergence: student and teacher must have the same rows N and vocabulary V, got "
            f"student {tuple(student_hidden.shape)}/{tuple(student_head.shape)}, "
            f"teacher {tuple(teacher_hidden.shape)}/{tuple(teacher_head.shape)}"
        )
    dtype = compute_dtype(student_hidden, student_head)
    sh, sw = matmul_operands(student_hidden, student_head)
    th, tw = matmul_operands(teacher_hidden.detach(), teacher_head.detach())

    def piece(shc: Tensor, thc: Tensor, swc: Tensor, twc: Tensor) -> Tensor:
        s_logp = torch.log_softmax(tempered_logits(shc, swc, temperature, dtype), dim=-1)
        with torch.no_grad():
            t_logp = torch.log_softmax(tempered_logits(thc, twc, temperature, dtype), dim=-1)
        return _divergence(s_logp, t_logp, kind, beta)

    (out,) = map_row_chunks(piece, (sh, th), (sw, tw), chunk_size=chunk_size, n_out=1, dtype=dtype)
    return out


# --------------------------------------------------------------------------- top-k (+ tail)
@torch.no_grad()
def teacher_topk_targets(
    teacher_hidden: Tensor,
    teacher_head: Tensor,
    *,
    k: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> tuple[Tensor, Tensor]:
    r"""The teacher's k most likely ids and their (full-softmax, tempered) log-probs, no grad.

    Returns ``(ids[N, k] int64, logprobs[N, k])``, sorted by decreasing probability; ``logprobs`` are
    :math:`\log p_t(v)` under the *full* vocabulary (not renormalized), float32 (float64 for float64
    inputs). Store these for offline KD; they are the only teacher input the top-k objectives need.
    """
    check_projection("teacher_topk_targets", teacher_hidden, teacher_head)
    check_temperature(temperature)
    check_chunk_size(chunk_size)
    vocab = teacher_head.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= vocab:
        raise ValueError(f"teacher_topk_targets: k must be an integer in [1, {vocab}] (the vocabulary), got {k!r}")
    dtype = compute_dtype(teacher_hidden, teacher_head)
    th, tw = matmul_operands(teacher_hidden, teacher_head)
    n = th.shape[0]
    ids = torch.empty(n, k, dtype=torch.long, device=th.device)  # preallocated: see map_row_chunks
    lps = torch.empty(n, k, dtype=dtype, device=th.device)
    for i in range(0, n, chunk_size):
        logp = torch.log_softmax(tempered_logits(th[i : i + chunk_size], tw, temperature, dtype), dim=-1)
        torch.topk(logp, k, dim=-1, largest=True, sorted=True, out=(lps[i : i + chunk_size], ids[i : i + chunk_size]))
    return ids, lps


def _check_topk_inputs(name: str, student_hidden: Tensor, student_head: Tensor, ids: Tensor, lps: Tensor) -> None:
    check_projection(name, student_hidden, student_head)
    n, vocab = student_hidden.shape[0], student_head.shape[0]
    if ids.dim() != 2 or ids.shape[0] != n or ids.shape != lps.shape or ids.shape[1] < 1:
        raise ValueError(
            f"{name}: topk_ids and teacher_topk_logprobs must both be [N, k] with N={n}, k >= 1, "
            f"got {tuple(ids.shape)} and {tuple(lps.shape)}"
        )
    if ids.is_floating_point() or ids.dtype == torch.bool or not lps.is_floating_point():
        raise ValueError(f"{name}: topk_ids must be integer and teacher_topk_logprobs floating point")
    if ids.numel():
        if int(ids.min()) < 0 or int(ids.max()) >= vocab:
            raise ValueError(f"{name}: topk_ids must lie in [0, {vocab}), the student's vocabulary")
        srt = ids.sort(dim=1).values
        if bool((srt[:, 1:] == srt[:, :-1]).any()):
            raise ValueError(f"{name}: topk_ids has a repeated id within a row; each row needs k distinct ids")


def chunked_topk_tail_divergence(
    student_hidden: Tensor,
    student_head: Tensor,
    topk_ids: Tensor,
    teacher_topk_logprobs: Tensor,
    *,
    kind: DivergenceKind,
    beta: float = 0.5,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    r"""Divergence over k+1 buckets: the teacher's k ids plus one tail bucket, per row ``[N]``.

    With :math:`K_n` the row's ``topk_ids`` and :math:`\ell^t_{n,i}` its ``teacher_topk_logprobs``
    (full-softmax teacher log-probs, as from :func:`teacher_topk_targets`):

    * teacher buckets: :math:`\ell^t_{n,i}` for :math:`i \in K_n`, tail
      :math:`\log(1 - \sum_i e^{\ell^t_{n,i}})` computed as ``log1mexp(logsumexp)``;
    * student buckets: the student's full log-softmax gathered at :math:`K_n`, tail
      :math:`\log \sum_{v \notin K_n} p_s(v)` computed exactly by a masked logsumexp (no cancellation);
    * both tails are clamped below at ``log(finfo.tiny)`` so an empty tail (k = V) contributes 0;
      then ``kind`` (``forward_kl``/``reverse_kl``/``jsd``) is applied over the k+1 buckets.

    With k = V this equals :func:`chunked_divergence`. Gradients reach only the student inputs.
    """
    name = "chunked_topk_tail_divergence"
    _check_topk_inputs(name, student_hidden, student_head, topk_ids, teacher_topk_logprobs)
    check_temperature(temperature)
    check_chunk_size(chunk_size)
    _check_kind(kind, beta)
    dtype = compute_dtype(student_hidden, student_head)
    sh, sw = matmul_operands(student_hidden, student_head)
    ids = topk_ids.long()
    t_lp = teacher_topk_logprobs.detach().to(dtype)
    floor = log_floor(dtype)

    def piece(shc: Tensor, idc: Tensor, tlc: Tensor, swc: Tensor) -> Tensor:
        logits = tempered_logits(shc, swc, temperature, dtype)
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        s_top = logits.gather(1, idc) - lse
        outside = logits.scatter(1, idc, torch.finfo(dtype).min)  # finite fill: no NaN grads when k=V
        s_tail = (torch.logsumexp(outside, dim=-1, keepdim=True) - lse).clamp_min(floor)
        t_tail = log1mexp(torch.logsumexp(tlc, dim=-1, keepdim=True)).clamp_min(floor)
        return _divergence(torch.cat([s_top, s_tail], dim=1), torch.cat([tlc, t_tail], dim=1), kind, beta)

    (out,) = map_row_chunks(piece, (sh, ids, t_lp), (sw,), chunk_size=chunk_size, n_out=1, dtype=dtype)
    return out


def forward_kl_topk(
    student_hidden: Tensor,
    student_head: Tensor,
    topk_ids: Tensor,
    teacher_topk_logprobs: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    r"""GKD-style forward KL restricted to the teacher's top-k, no tail bucket, per row ``[N]``.

    The teacher's top-k is renormalized, :math:`\hat p_t(i) = p_t(i) / \sum_{j \in K} p_t(j)`; the
    student keeps its *full-vocabulary* log-probs (not renormalized):

    .. math::
        L_n = \sum_{i \in K_n} \hat p_t(i) \,\bigl(\log \hat p_t(i) - \log p_s(i)\bigr)
            = \mathrm{KL}(\hat p_t \| \hat p_s) - \log \textstyle\sum_{i \in K_n} p_s(i) \;\ge 0,

    zero iff the student puts all its mass on :math:`K_n` in the teacher's proportions, so the loss
    also pulls mass leaking outside the top-k back in. With k = V it equals exact ``forward_kl``.
    """
    name = "forward_kl_topk"
    _check_topk_inputs(name, student_hidden, student_head, topk_ids, teacher_topk_logprobs)
    check_temperature(temperature)
    check_chunk_size(chunk_size)
    dtype = compute_dtype(student_hidden, student_head)
    sh, sw = matmul_operands(student_hidden, student_head)
    ids = topk_ids.long()
    t_lp = teacher_topk_logprobs.detach().to(dtype)
    t_hat = t_lp - torch.logsumexp(t_lp, dim=-1, keepdim=True)

    def piece(shc: Tensor, idc: Tensor, thc: Tensor, swc: Tensor) -> Tensor:
        s_logp = torch.log_softmax(tempered_logits(shc, swc, temperature, dtype), dim=-1)
        return forward_kl(s_logp.gather(1, idc), thc)

    (out,) = map_row_chunks(piece, (sh, ids, t_hat), (sw,), chunk_size=chunk_size, n_out=1, dtype=dtype)
    return out

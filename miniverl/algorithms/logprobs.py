"""Token log-probabilities and entropies from selected hidden states, by vocabulary chunks.

Never builds ``[B, T, V]`` logits: the caller gathers the hidden states at the positions it trains
on (``hidden[N, H]``, the state that *predicts* ``token_ids[N]``), and the projection through the
LM head happens here in ``[chunk_size, V]`` row pieces (see ``_chunking``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from miniverl.algorithms._chunking import (
    check_chunk_size,
    check_projection,
    check_temperature,
    compute_dtype,
    map_row_chunks,
    matmul_operands,
    tempered_logits,
)

__all__ = ["chunked_token_logprobs", "sft_token_nll"]


def _token_logprob_chunk(
    hidden: Tensor, head_weight: Tensor, token_ids: Tensor, *, temperature: float, dtype: torch.dtype
) -> Tensor:
    logp_all = torch.log_softmax(tempered_logits(hidden, head_weight, temperature, dtype), dim=-1)
    return logp_all.gather(1, token_ids.unsqueeze(1)).squeeze(1)


def _token_logprob_entropy_chunk(
    hidden: Tensor, head_weight: Tensor, token_ids: Tensor, *, temperature: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """The chunk's log-probs (with grad) and entropies (without: a metric, never a loss term).

    Under the caller's activation checkpoint a branch with grad would be recomputed in backward and
    its saved ``[chunk, V]`` tensors kept until the whole backward ends (no backward node of a
    metric ever consumes them): two float32 ``[N, V]`` tensors over all chunks, 4.3 GiB at
    Qwen3-0.6B's vocabulary and N = 4096 (measured on the H200). Without grad it saves nothing.
    """
    logp_all = torch.log_softmax(tempered_logits(hidden, head_weight, temperature, dtype), dim=-1)
    with torch.no_grad():
        entropy = -(logp_all.exp() * logp_all).sum(dim=-1)
    return logp_all.gather(1, token_ids.unsqueeze(1)).squeeze(1), entropy


def chunked_token_logprobs(
    hidden: Tensor,
    head_weight: Tensor,
    token_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    r"""Log-probability of each chosen token, and optionally the entropy, by ``[chunk, V]`` pieces.

    With :math:`z_n = h_n W^\top / \tau` (``hidden[n] @ head_weight.T / temperature``):

    .. math::
        \log p(y_n) = z_{n, y_n} - \log \textstyle\sum_v e^{z_{n,v}}, \qquad
        H_n = -\textstyle\sum_v p_{n,v} \log p_{n,v}

    Args:
        hidden: ``[N, H]`` hidden states at the trained positions.
        head_weight: ``[V, H]`` LM-head weight (``lm_head.weight``; no bias).
        token_ids: ``[N]`` integer ids of the tokens whose log-probabilities are wanted.
        temperature: :math:`\tau > 0`; must equal the sampling temperature for policy-gradient ratios.
        chunk_size: rows projected at once; peak extra memory is ``chunk_size * V`` values.
        with_entropy: also return the per-row entropy of the tempered distribution (a metric: no grad).

    Returns:
        ``(logprobs[N], entropy[N] | None)`` in float32, or float64 when an input is float64.
        Logits are computed in the operands' (promoted) dtype and upcast per chunk. Gradients flow
        to ``hidden`` and ``head_weight``; with autograd on, each chunk is activation-checkpointed.
    """
    check_projection("chunked_token_logprobs", hidden, head_weight)
    check_temperature(temperature)
    check_chunk_size(chunk_size)
    if token_ids.dim() != 1 or token_ids.shape[0] != hidden.shape[0]:
        raise ValueError(
            f"chunked_token_logprobs: token_ids must be [N] with N={hidden.shape[0]}, "
            f"got shape {tuple(token_ids.shape)}"
        )
    if token_ids.is_floating_point() or token_ids.dtype == torch.bool:
        raise ValueError("chunked_token_logprobs: token_ids must be an integer tensor")
    vocab = head_weight.shape[0]
    if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab):
        raise ValueError(f"chunked_token_logprobs: token_ids must lie in [0, {vocab}), the head's vocabulary")

    dtype = compute_dtype(hidden, head_weight)
    h, w = matmul_operands(hidden, head_weight)
    if with_entropy:

        def lp_ent(hc: Tensor, ic: Tensor, wc: Tensor) -> tuple[Tensor, Tensor]:
            return _token_logprob_entropy_chunk(hc, wc, ic, temperature=temperature, dtype=dtype)

        logp, entropy = map_row_chunks(lp_ent, (h, token_ids.long()), (w,), chunk_size=chunk_size, n_out=2, dtype=dtype)
        return logp, entropy

    def lp(hc: Tensor, ic: Tensor, wc: Tensor) -> Tensor:
        return _token_logprob_chunk(hc, wc, ic, temperature=temperature, dtype=dtype)

    (logp,) = map_row_chunks(lp, (h, token_ids.long()), (w,), chunk_size=chunk_size, n_out=1, dtype=dtype)
    return logp, None


def sft_token_nll(
    hidden: Tensor,
    head_weight: Tensor,
    token_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
) -> Tensor:
    r"""SFT cross-entropy on oracle tokens: :math:`\ell_n = -\log p(y_n)` per row, ``[N]``.

    Exactly ``-chunked_token_logprobs(...)[0]``; named so that ``"sft"`` is an objective like the others.
    """
    logp, _ = chunked_token_logprobs(hidden, head_weight, token_ids, temperature=temperature, chunk_size=chunk_size)
    return -logp

"""Token sampling as pure functions: the sampling distribution, per-sample seeds, inverse-CDF draws.

The sampling distribution for logits ``z`` (one row, float32)::

    z' = z / temperature
    keep the top_k largest z' (top_k = 0: all)
    keep the smallest set of most-likely tokens whose probability sums to >= top_p (always >= 1 token)
    p  = softmax(z' with every dropped token set to -inf)

A token is drawn by inverse CDF: with one uniform ``u ∈ [0, 1)`` from the row's own generator,
pick the first token ``i`` (in vocabulary order) whose cumulative probability ``Σ_{j<=i} p_j``
exceeds ``u``. The recorded log-prob is ``log p[token]``, the log-probability under exactly the
distribution the token was drawn from. ``temperature == 0`` is greedy (argmax, first index on
ties); the distribution is then a point mass and the recorded log-prob is ``0.0``.
"""

from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F

from miniverl.canonical import canonical_bytes


def derive_sample_seed(seed: int, policy_version: int, prompt_id: str, sample_index: int) -> int:
    """A 63-bit seed from ``sha256(canonical_json([seed, policy_version, prompt_id, sample_index]))``.

    Stable across processes and Python versions (unlike the salted built-in ``hash``), and
    independent of which other samples share a batch.
    """
    digest = hashlib.sha256(canonical_bytes([seed, policy_version, prompt_id, sample_index])).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def sampling_logprobs(logits: torch.Tensor, *, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """``log p`` of the sampling distribution for each row of ``logits`` ``[B, V]`` (float32 out).

    Dropped tokens get ``-inf``. Requires ``temperature > 0``, ``0 < top_p <= 1``, ``top_k >= 0``.
    """
    scaled = logits.float()
    if temperature != 1.0:
        scaled = scaled / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= top_p  # the top-1 token has mass_before == 0, so it is kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


def inverse_cdf_draw(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """For each row, the first token whose cumulative probability exceeds ``u`` (float64 cumsum).

    ``logprobs`` ``[B, V]``, ``uniforms`` ``[B]`` in ``[0, 1)``. The threshold is ``u`` times the
    row's total mass, so rounding in ``exp`` never pushes it past the end; a token of probability
    zero is never chosen.
    """
    probs = logprobs.double().exp()
    cdf = torch.cumsum(probs, dim=-1)
    threshold = uniforms.to(device=cdf.device, dtype=torch.float64).unsqueeze(-1) * cdf[..., -1:]
    index = torch.searchsorted(cdf, threshold, right=True).squeeze(-1)
    # u * total can round to total itself: fall back to the last token with positive probability.
    last_positive = probs.shape[-1] - 1 - torch.argmax((probs.flip(-1) > 0).to(torch.int8), dim=-1)
    return torch.minimum(index, last_positive)


def blocked_inverse_cdf_draw(logprobs: torch.Tensor, uniforms: torch.Tensor, block: int = 1024) -> torch.Tensor:
    """:func:`inverse_cdf_draw` in two levels, for wide vocabularies on the GPU.

    The same rule (first token whose float64 cumulative probability exceeds ``u`` times the
    total), found as: the block of ``block`` tokens whose cumulative block mass first exceeds the
    threshold, then the token inside that block. One sequential scan over 150k entries per row
    becomes a parallel reduction plus two short scans. Prefix sums are rounded in a different order,
    so a draw can differ from :func:`inverse_cdf_draw` only when ``u`` lies within float64 rounding
    of a token boundary. A token of probability zero is never chosen.
    """
    probs = logprobs.double().exp()
    rows, vocab = probs.shape
    blocks_n = -(-vocab // block)
    blocks = F.pad(probs, (0, blocks_n * block - vocab)).view(rows, blocks_n, block)
    mass = blocks.sum(-1)
    cum = torch.cumsum(mass, dim=-1)
    before = F.pad(cum[:, :-1], (1, 0))
    threshold = uniforms.to(device=cum.device, dtype=torch.float64).unsqueeze(-1) * cum[:, -1:]
    last_block = blocks_n - 1 - torch.argmax((mass.flip(-1) > 0).to(torch.int8), dim=-1)
    chosen_block = torch.minimum(torch.searchsorted(cum, threshold, right=True).squeeze(-1), last_block)
    inner = blocks.gather(1, chosen_block.view(rows, 1, 1).expand(rows, 1, block)).squeeze(1)
    local = torch.cumsum(inner, dim=-1) + before.gather(1, chosen_block.unsqueeze(-1))
    last_inner = block - 1 - torch.argmax((inner.flip(-1) > 0).to(torch.int8), dim=-1)
    within = torch.minimum(torch.searchsorted(local, threshold, right=True).squeeze(-1), last_inner)
    return chosen_block * block + within

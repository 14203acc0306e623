"""Counter-based random streams: one uniform per (sample seed, response position), computed on the device.

``uniform(seed, n)`` is the ``n``-th output (``n = 0, 1, ...``) of SplitMix64 started at ``seed``::

    x = seed + (n + 1) * 0x9E3779B97F4A7C15          (mod 2**64)
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB
    x =  x ^ (x >> 31)
    u = (x >> 11) * 2**-53                            in [0, 1)

It needs no state: the uniform of token ``n`` of a sample depends only on that sample's seed and
``n``, never on which rows share its batch, how many steps ran before, or the device. The torch
version works on int64 tensors (two's-complement wrap-around; right shifts are made logical by
masking), so it runs inside a captured CUDA graph with no host round trip.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


def _signed(value: int) -> int:
    """The int64 with the same 64 bits as the unsigned ``value``."""
    return value - (1 << 64) if value >= 1 << 63 else value


def uniform_reference(seed: int, n: int) -> float:
    """Pure-Python SplitMix64 uniform (the definition the tensor version is tested against)."""
    x = (seed + (n + 1) * _GOLDEN) & _MASK64
    x = ((x ^ (x >> 30)) * _MIX1) & _MASK64
    x = ((x ^ (x >> 27)) * _MIX2) & _MASK64
    x ^= x >> 31
    return (x >> 11) * 2.0**-53


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def counter_uniforms(seeds: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """float64 uniforms in ``[0, 1)``: ``uniform(seeds[i], counter)`` for each row ``i``.

    ``seeds`` int64 ``[B]`` (non-negative 63-bit seeds); ``counter`` an int64 scalar tensor or ``[B]``.
    """
    x = seeds + (counter + 1) * _signed(_GOLDEN)
    x = (x ^ _shr(x, 30)) * _signed(_MIX1)
    x = (x ^ _shr(x, 27)) * _signed(_MIX2)
    x = x ^ _shr(x, 31)
    return _shr(x, 11).to(torch.float64) * 2.0**-53

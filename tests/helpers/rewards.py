"""A plug-in reward for tests: varies with the response text even for a random tiny model."""

from __future__ import annotations

from typing import Any


def digit_fraction(prompt: str, response: str, **meta: Any) -> float:
    """Fraction of response characters that are digits."""
    return sum(ch.isdigit() for ch in response) / max(len(response), 1)

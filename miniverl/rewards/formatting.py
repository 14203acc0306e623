"""The target-length formatting reward and the short-answer ``formatting`` task.

The reward exists to give GRPO a real, cheap signal on CPU: samples of one prompt differ in
length, so their rewards differ, so group-normalized advantages are non-zero.
"""

from __future__ import annotations

import hashlib
from typing import Any

from miniverl.errors import UsageError
from miniverl.rewards.registry import register_reward

TERMINATORS = (".", "!", "?")


@register_reward("target_length")
def target_length(
    prompt: str,
    response: str,
    *,
    response_token_count: int,
    target_tokens: int = 24,
    tolerance: float | None = None,
    terminator_bonus: float = 0.1,
    **meta: Any,
) -> float:
    """Reward for answering in about ``target_tokens`` tokens and ending a sentence.

    With ``n = response_token_count`` (generated tokens, EOS excluded), ``T = target_tokens``,
    ``τ = tolerance`` (default ``T``) and ``w = terminator_bonus``::

        length = clip(1 - |n - T| / τ, 0, 1)
        end    = 1 if response.rstrip() ends with ".", "!" or "?" (a closing quote or bracket
                   after the terminator is allowed) else 0
        reward = (1 - w) * length + w * end            ∈ [0, 1]

    e.g. T = 24: n = 24 ending in "." gives 1.0; n = 12 with no terminator gives 0.45; n ≥ 48 ending
    in "." gives 0.1. Deterministic; it depends only on ``n`` and the text's last characters.
    """
    if target_tokens <= 0:
        raise UsageError(f"target_length: target_tokens must be > 0, got {target_tokens}")
    tol = float(target_tokens if tolerance is None else tolerance)
    if tol <= 0:
        raise UsageError(f"target_length: tolerance must be > 0, got {tolerance}")
    if not 0.0 <= terminator_bonus <= 1.0:
        raise UsageError(f"target_length: terminator_bonus must be in [0, 1], got {terminator_bonus}")
    if response_token_count < 0:
        raise UsageError(f"target_length: response_token_count must be >= 0, got {response_token_count}")
    length = min(1.0, max(0.0, 1.0 - abs(response_token_count - target_tokens) / tol))
    end = 1.0 if ends_with_terminator(response) else 0.0
    return (1.0 - terminator_bonus) * length + terminator_bonus * end


def ends_with_terminator(response: str) -> bool:
    """True when the text (trailing spaces, closing quotes and brackets stripped) ends in . ! or ?"""
    return response.rstrip().rstrip("\"')]}”’").endswith(TERMINATORS)


# --- the "formatting" prompt task ------------------------------------------------------------------

TASK = "formatting"
_SUBJECTS = (
    "the sea",
    "a rainy morning",
    "your favourite fruit",
    "a busy market",
    "the moon",
    "a quiet library",
    "a mountain path",
    "a cup of tea",
    "a city at night",
    "an old bicycle",
    "a summer garden",
    "a snowy street",
)
_ASKS = (
    "Describe {s} in one or two sentences.",
    "Write a short note about {s}.",
    "Tell me one interesting thing about {s}.",
    "In a few words, what do you think of {s}?",
)


def generate_formatting_prompts(rows: int, seed: int, *, target_tokens: int = 24) -> list[dict[str, str]]:
    """Short open prompts for the target-length reward; ``answer`` is empty, ``context`` is the format rule."""
    prompts = []
    for index in range(rows):
        digest = hashlib.sha256(f"fmt:{seed}:{index}".encode()).digest()
        subject = _SUBJECTS[int.from_bytes(digest[:8], "big") % len(_SUBJECTS)]
        ask = _ASKS[int.from_bytes(digest[8:16], "big") % len(_ASKS)]
        prompts.append(
            {
                "prompt_id": f"fmt-{seed}-{index}",
                "prompt": ask.format(s=subject),
                "answer": "",
                "context": (
                    f"Format rule: answer in about {target_tokens} tokens, "
                    "in plain sentences, and end with a full stop."
                ),
                "task": TASK,
            }
        )
    return prompts

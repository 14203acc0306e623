"""The calculator task: generated arithmetic word problems and their exact-answer verifier.

Problems use small integers and one or two of ``+``, ``-``, ``*``; every answer is a non-negative
integer. Each number is drawn from ``sha256("calc:<seed>:<index>:<field>")``, so row ``i`` depends
only on ``(seed, i)``: it is the same in every Python version and for every ``rows``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from miniverl.errors import DataError
from miniverl.rewards.registry import register_reward

TASK = "calculator"
INSTRUCTION = "Reply with the final number."

_NAMES = ("Mia", "Sam", "Ava", "Leo", "Zoe", "Max", "Ivy", "Ben", "Noah", "Lily", "Omar", "Rosa")
_ITEMS = ("apples", "pencils", "marbles", "cookies", "stickers", "books", "coins", "shells", "cards", "pears")


class _Draw:
    """Deterministic integers for one problem, keyed by field name (no shared RNG stream)."""

    def __init__(self, seed: int, index: int) -> None:
        self._prefix = f"calc:{seed}:{index}:"

    def int(self, field: str, low: int, high: int) -> int:
        """Uniform-ish integer in ``[low, high]`` (modulo bias is irrelevant at this size)."""
        digest = hashlib.sha256((self._prefix + field).encode()).digest()
        return low + int.from_bytes(digest[:8], "big") % (high - low + 1)

    def pick(self, field: str, options: tuple[str, ...]) -> str:
        return options[self.int(field, 0, len(options) - 1)]


# Each template: (draw) -> (problem text, worked steps, answer).
def _add(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a, b = d.int("a", 2, 20), d.int("b", 2, 20)
    text = f"{name} has {a} {item} and buys {b} more. How many {item} does {name} have now?"
    return text, f"{a} + {b} = {a + b}", a + b


def _sub(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a = d.int("a", 5, 20)
    b = d.int("b", 1, a)
    text = f"{name} has {a} {item} and gives {b} to a friend. How many {item} does {name} have left?"
    return text, f"{a} - {b} = {a - b}", a - b


def _mul(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a, b = d.int("a", 2, 9), d.int("b", 2, 9)
    text = f"{name} buys {a} bags with {b} {item} in each bag. How many {item} does {name} buy in total?"
    return text, f"{a} * {b} = {a * b}", a * b


def _add_sub(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a, b = d.int("a", 2, 20), d.int("b", 2, 20)
    c = d.int("c", 1, a + b)
    text = f"{name} has {a} {item}, finds {b} more and then loses {c}. How many {item} does {name} have now?"
    return text, f"{a} + {b} = {a + b}, {a + b} - {c} = {a + b - c}", a + b - c


def _mul_add(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a, b, c = d.int("a", 2, 9), d.int("b", 2, 9), d.int("c", 1, 12)
    text = f"{name} has {a} boxes of {b} {item} and {c} loose {item}. How many {item} does {name} have in all?"
    return text, f"{a} * {b} = {a * b}, {a * b} + {c} = {a * b + c}", a * b + c


def _mul_sub(d: _Draw, name: str, item: str) -> tuple[str, str, int]:
    a, b = d.int("a", 2, 9), d.int("b", 2, 9)
    c = d.int("c", 1, a * b)
    text = f"{name} packs {a} trays of {b} {item} and then sells {c} of them. How many {item} are left?"
    return text, f"{a} * {b} = {a * b}, {a * b} - {c} = {a * b - c}", a * b - c


_TEMPLATES: tuple[Callable[[_Draw, str, str], tuple[str, str, int]], ...] = (
    _add,
    _sub,
    _mul,
    _add_sub,
    _mul_add,
    _mul_sub,
)


def generate_calculator_problems(rows: int, seed: int) -> list[dict[str, str]]:
    """``rows`` word problems as prompt-dataset rows (``prompt_id``, ``prompt``, ``answer``, ``context``, ``task``).

    ``prompt_id`` is ``calc-<seed>-<index>``; ``answer`` is the exact integer as a string;
    ``context`` is the privileged hint a context-seeing teacher gets
    (``"Worked answer: 7 + 5 = 12. The answer is 12."``).
    """
    problems = []
    for index in range(rows):
        draw = _Draw(seed, index)
        template = _TEMPLATES[draw.int("template", 0, len(_TEMPLATES) - 1)]
        text, steps, answer = template(draw, draw.pick("name", _NAMES), draw.pick("item", _ITEMS))
        problems.append(
            {
                "prompt_id": f"calc-{seed}-{index}",
                "prompt": f"{text} {INSTRUCTION}",
                "answer": str(answer),
                "context": f"Worked answer: {steps}. The answer is {answer}.",
                "task": TASK,
            }
        )
    return problems


# A number: optional sign (not glued to a preceding word or digit, so "7-5" is 7 and 5), digits
# with optional thousands commas, optional decimal part.
_NUMBER = re.compile(r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|(?<=\w)(?:\d{1,3}(?:,\d{3})+|\d+)")
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_final_integer(response: str) -> int | None:
    """The integer a response ends on, or None.

    The content of the last ``\\boxed{...}`` wins when there is one; otherwise the last number in
    the text. Thousands commas are dropped (``1,234``), a leading ``-``/``−`` makes it negative,
    and ``12.0`` counts as 12 while ``12.5`` is no integer at all.
    """
    boxed = _BOXED.findall(response)
    text = boxed[-1] if boxed else response
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    token = numbers[-1].replace(",", "").replace("−", "-")
    whole, _, frac = token.partition(".")
    if frac and frac.strip("0"):
        return None
    return int(whole)


@register_reward("calculator_exact")
def calculator_exact(prompt: str, response: str, *, answer: str, **meta: Any) -> float:
    """1.0 when the final integer of ``response`` equals ``answer`` exactly, else 0.0."""
    try:
        expected = int(str(answer).strip().replace(",", ""))
    except ValueError:
        raise DataError(
            f"calculator answer {answer!r} (prompt {meta.get('prompt_id', '?')}) is not an integer"
        ) from None
    return 1.0 if extract_final_integer(response) == expected else 0.0

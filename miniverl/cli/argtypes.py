"""The argparse types of the ``miniverl`` command line: bounded counts, temperatures, seconds, column maps."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

#: Upper bounds on count arguments: far above any real use, low enough that a typo fails at once, not after hours.
MAX_SAMPLE_ROWS = 500_000  # a dataset miniverl can load (bounded.DATASET_MAX_ROWS)
MAX_EVAL_SAMPLES = 10_000
MAX_THREADS = 1024


def int_at_most(limit: int) -> Callable[[str], int]:
    """An argparse type: an integer no larger than ``limit`` (lower bounds stay with the command's own checks)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if value > limit:
            raise argparse.ArgumentTypeError(f"{value} exceeds the limit of {limit:,}")
        return value

    parse.__name__ = "int"
    return parse


def int_in_range(low: int, limit: int) -> Callable[[str], int]:
    """An argparse type: an integer in ``[low, limit]`` (checked at parse time, before any model loads)."""
    upper = int_at_most(limit)

    def parse(text: str) -> int:
        value = upper(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} must be at least {low}")
        return value

    parse.__name__ = "int"
    return parse


def _number(text: str, *, what: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid {what}: {text!r}") from None


def temperature(text: str) -> float:
    """An argparse type: a finite sampling temperature above 0 (at most 100)."""
    value = _number(text, what="number")
    if not math.isfinite(value) or not 0.0 < value <= 100.0:
        raise argparse.ArgumentTypeError(f"{text} is not a temperature; give a finite number above 0 (up to 100)")
    return value


temperature.__name__ = "float"


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, at least 0.1 and at most a day."""
    value = _number(text, what="number of seconds")
    if not 0.1 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"{text} seconds is outside 0.1 .. 86400")
    return value


def column_mapping(text: str) -> dict[str, str]:
    """An argparse type: ``field=column,...`` (the fields are checked where the file is read)."""
    mapping: dict[str, str] = {}
    for item in text.split(","):
        field, sep, column = (part.strip() for part in item.partition("="))
        if not sep or not field or not column:
            raise argparse.ArgumentTypeError(f"{item.strip()!r} is not FIELD=COLUMN (e.g. prompt=question)")
        if field in mapping:
            raise argparse.ArgumentTypeError(f"field {field!r} is mapped twice")
        mapping[field] = column
    return mapping

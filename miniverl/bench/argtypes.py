"""Torch-free ``argparse`` types for the benchmark and gate command lines: a bad number is one usage line,
before any model is built or any file is written."""

from __future__ import annotations

import argparse


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def positive_int_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers, at least one."""
    values = tuple(positive_int(part.strip()) for part in text.split(",") if part.strip())
    if not values:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least one integer")
    return values


def positive_int_pair(text: str) -> tuple[int, int]:
    values = positive_int_list(text)
    if len(values) != 2:
        raise argparse.ArgumentTypeError(f"give B,T (two integers), got {text!r}")
    return values[0], values[1]

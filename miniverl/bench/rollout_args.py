"""The torch-free command line of ``miniverl bench rollout`` (the CLI builds its parser without torch)."""

from __future__ import annotations

import argparse

PATHS = ("fast", "fast_compiled", "fast_eager", "hf_loop", "hf_generate", "trl")
ROLLOUT_MODELS = ("tiny", "qwen3-0.6b-shape")


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=ROLLOUT_MODELS, default="tiny")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16"], default="auto")
    parser.add_argument("--batches", type=_int_list, default=(16, 64), help="comma-separated, e.g. 16,64")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-repeats", type=int, default=1)
    parser.add_argument("--paths", type=lambda s: tuple(s.split(",")), default=PATHS)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--out", required=True, help="output directory")

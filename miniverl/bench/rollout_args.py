"""The torch-free command line of ``miniverl bench rollout`` (the CLI builds its parser without torch)."""

from __future__ import annotations

import argparse

from miniverl.bench.argtypes import non_negative_int, positive_int, positive_int_list

PATHS = (
    "fast",
    "fast_compiled",
    "fast_triton",
    "fast_eager",
    "hf_loop",
    "hf_generate",
    "hf_generate_static",
    "trl",
)
ROLLOUT_MODELS = ("tiny", "qwen3-0.6b-shape")


def add_rollout_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=ROLLOUT_MODELS, default="tiny", help="model shape (random weights)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to decode")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: bf16 on CUDA, fp32 on CPU"
    )
    parser.add_argument("--batches", type=positive_int_list, default=(16, 64), help="comma-separated, e.g. 16,64")
    parser.add_argument("--new-tokens", type=positive_int, default=256, help="fixed decode length per sample")
    parser.add_argument("--prompt-tokens", type=positive_int, default=32, help="prompt length per sample")
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed runs per cell (plans, graphs)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed runs per fast cell (median reported)")
    parser.add_argument("--slow-repeats", type=positive_int, default=1, help="timed runs per slow (HF) cell")
    parser.add_argument(
        "--paths", type=lambda s: tuple(s.split(",")), default=PATHS, help=f"comma-separated of {','.join(PATHS)}"
    )
    parser.add_argument(
        "--pair",
        type=lambda s: tuple(s.split(",")),
        default=("fast", "hf_generate"),
        help="A,B: two of --paths timed interleaved (ABAB...) for the ratio A/B; default fast,hf_generate",
    )
    parser.add_argument(
        "--pairs", type=non_negative_int, default=5, help="interleaved A,B pairs per batch (median ratio; 0: none)"
    )
    parser.add_argument(
        "--lora-rank", type=non_negative_int, default=16, help="the policy's LoRA rank (folded per fast call; 0: none)"
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the profiler summary")
    parser.add_argument("--out", required=True, help="output directory")

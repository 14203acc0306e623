"""The torch-free command line of ``miniverl bench grpo`` (the CLI builds its parser without torch)."""

from __future__ import annotations

import argparse

from miniverl.bench.argtypes import non_negative_int, positive_int, positive_int_pair

STEP_PATHS = ("miniverl_fast", "miniverl_fast_bf16", "miniverl_lean", "miniverl_hf", "trl")
UPDATE_PATHS = ("naive_hf_peft", "miniverl_update", "miniverl_update_bf16")
GRPO_MODELS = ("tiny", "smollm2-shape", "qwen3-0.6b-shape")


def _names(text: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in text.split(",") if s.strip())


def add_grpo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=GRPO_MODELS, default="tiny", help="model shape (random weights)")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto", help="where to run")
    parser.add_argument(
        "--dtype", choices=["auto", "float32", "bfloat16"], default="auto", help="auto: bf16 on CUDA, fp32 on CPU"
    )
    parser.add_argument("--prompts", type=positive_int, default=2, help="prompts per GRPO step (groups)")
    parser.add_argument("--samples", type=positive_int, default=8, help="samples per prompt (group size)")
    parser.add_argument("--new-tokens", type=positive_int, default=256, help="fixed completion length per sample")
    parser.add_argument("--prompt-tokens", type=positive_int, default=32, help="prompt length per sample")
    parser.add_argument(
        "--rollout-batch", type=positive_int, default=16, help="rollout batch size (rows decoded together)"
    )
    parser.add_argument("--warmup", type=non_negative_int, default=1, help="untimed steps per cell (plans, graphs)")
    parser.add_argument("--repeats", type=positive_int, default=5, help="timed steps per cell (median and spread)")
    parser.add_argument("--paths", type=_names, default=STEP_PATHS, help=f"GRPO step paths: {','.join(STEP_PATHS)}")
    parser.add_argument(
        "--update-paths", type=_names, default=UPDATE_PATHS, help=f"update paths: {','.join(UPDATE_PATHS)}"
    )
    parser.add_argument("--update-shape", type=positive_int_pair, default=(8, 512), help="update rows,tokens (B,T)")
    parser.add_argument(
        "--activation-checkpointing",
        type=non_negative_int,
        default=0,
        help="miniverl cells: recompute every n-th layer (0: off)",
    )
    parser.add_argument(
        "--memory-budget-gib",
        type=memory_budget,
        default=None,
        help="miniverl_lean: the memory plan's peak-reserved budget in GiB (checkpointing, micro-batch and log-prob "
        "chunk chosen to fit), or 'trl': TRL's peak reserved as measured in this run (its cell then runs first)",
    )
    parser.add_argument("--out", required=True, help="output directory")


def memory_budget(text: str) -> float | str:
    """``--memory-budget-gib``: a number of GiB > 0, or ``trl`` (TRL's measured peak)."""
    if text == "trl":
        return text
    try:
        return float(text)  # validate_options refuses one <= 0 (or nan), for every caller
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither a number of GiB nor 'trl'") from None

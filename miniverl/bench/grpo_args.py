"""The torch-free command line of ``miniverl bench grpo`` (the CLI builds its parser without torch): its arguments,
and the options they make, validated for every caller."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from miniverl.bench.argtypes import non_negative_int, positive_int, positive_int_pair
from miniverl.errors import UsageError

STEP_PATHS = ("miniverl_fast", "miniverl_fast_bf16", "miniverl_lean", "miniverl_hf", "trl")
#: the lean step with fused training kernels (``train.fused_kernels``): ours and liger-kernel's, and with every
#: decoder layer through torch.compile (a probe)
FUSED_STEP_PATHS = ("miniverl_lean_fused", "miniverl_lean_liger", "miniverl_lean_compiled")
#: ``miniverl_lean_nf4``: the lean step over an NF4 student (bitsandbytes; a Qwen3 shape);
#: TRL with its liger-kernel switch (``use_liger_loss``, or TRL 1.x's ``use_liger_kernel``), and the fused lean steps,
#: by name only (they need triton and liger-kernel, which run on CUDA only; ours also under triton's interpreter)
NAMED_STEP_PATHS = ("trl_liger", *FUSED_STEP_PATHS, "miniverl_lean_nf4")
#: the step paths that roll out through HF's decode loop: the NF4 lean step does, over the NF4 model itself, since
#: the fast engine's folded copy is bf16 (1.1 GiB for Qwen3-0.6B: more than the budget an NF4 student is for)
HF_ROLLOUT_PATHS = ("miniverl_hf", "miniverl_lean_nf4")
ALL_STEP_PATHS = (*STEP_PATHS, *NAMED_STEP_PATHS)
UPDATE_PATHS = ("naive_hf_peft", "miniverl_update", "miniverl_update_bf16")
#: the bf16 update with fused training kernels (miniverl.runtime.fused): ours, and liger-kernel's (CUDA only), and with
#: every decoder layer through torch.compile (a probe); asked for by name, since each needs triton (and liger-kernel)
#: where the defaults need neither
FUSED_UPDATE_PATHS = ("miniverl_update_bf16_fused", "miniverl_update_bf16_liger", "miniverl_update_bf16_compiled")
ALL_UPDATE_PATHS = (*UPDATE_PATHS, *FUSED_UPDATE_PATHS)
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
    parser.add_argument(
        "--paths",
        type=_names,
        default=STEP_PATHS,
        help=f"GRPO step paths: {','.join(STEP_PATHS)} (and by name: {','.join(NAMED_STEP_PATHS)})",
    )
    parser.add_argument(
        "--update-paths",
        type=_names,
        default=UPDATE_PATHS,
        help=f"update paths: {','.join(UPDATE_PATHS)} (and by name: {','.join(FUSED_UPDATE_PATHS)})",
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


@dataclass
class GrpoBenchOptions:
    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    prompts: int = 2
    samples: int = 8
    new_tokens: int = 256
    prompt_tokens: int = 32
    rollout_batch: int = 16
    warmup: int = 1
    repeats: int = 5
    paths: tuple[str, ...] = STEP_PATHS
    update_paths: tuple[str, ...] = UPDATE_PATHS
    update_shape: tuple[int, int] = (8, 512)
    learning_rate: float = 1e-5
    activation_checkpointing: int = 0  # miniverl cells: recompute every n-th decoder layer in backward (0: off)
    seed: int = 0
    #: miniverl_lean: the memory plan's budget in GiB, or "trl" (TRL's peak reserved measured in the same run);
    #: None: training's defaults
    memory_budget_gib: float | str | None = None


def validate_options(opts: GrpoBenchOptions) -> None:
    if opts.model not in GRPO_MODELS:
        raise UsageError(f"unknown model {opts.model!r}; choose one of {', '.join(GRPO_MODELS)}")
    unknown = [p for p in opts.paths if p not in ALL_STEP_PATHS]
    unknown += [p for p in opts.update_paths if p not in ALL_UPDATE_PATHS]
    if unknown:
        raise UsageError(
            f"unknown path(s) {', '.join(unknown)}; step paths: {', '.join(ALL_STEP_PATHS)}; "
            f"update paths: {', '.join(ALL_UPDATE_PATHS)}"
        )
    for name in ("prompts", "samples", "new_tokens", "prompt_tokens", "rollout_batch", "repeats"):
        if getattr(opts, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(opts, name)}")
    if opts.warmup < 0 or opts.activation_checkpointing < 0:
        raise UsageError("--warmup and --activation-checkpointing must be >= 0")
    budget = opts.memory_budget_gib
    if isinstance(budget, str) and budget != "trl":
        raise UsageError(f"--memory-budget-gib must be a number of GiB or 'trl', got {budget!r}")
    if isinstance(budget, str) and "trl" not in opts.paths:
        raise UsageError("--memory-budget-gib trl needs the trl path in --paths")
    if isinstance(budget, float | int) and not budget > 0:
        raise UsageError(f"--memory-budget-gib must be > 0, got {budget}")
    batch, length = opts.update_shape
    if batch < 1 or length < 4:
        raise UsageError(f"--update-shape {batch},{length}: give B >= 1 and T >= 4")


def options_from_args(args: argparse.Namespace) -> GrpoBenchOptions:
    """The options of a parsed command line (:func:`run_grpo_bench` validates them, for every caller)."""
    return GrpoBenchOptions(
        model=args.model, device=args.device, dtype=args.dtype, prompts=args.prompts, samples=args.samples,
        new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, rollout_batch=args.rollout_batch,
        warmup=args.warmup, repeats=args.repeats, paths=args.paths, update_paths=args.update_paths,
        update_shape=args.update_shape, activation_checkpointing=args.activation_checkpointing,
        memory_budget_gib=getattr(args, "memory_budget_gib", None),
    )  # fmt: skip

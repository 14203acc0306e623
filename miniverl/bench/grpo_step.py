"""The GRPO step benchmark of ``miniverl bench grpo``: rollout + update as training runs it (fast engine, bf16
masters, lean, the HF decode loop), and TRL's ``GRPOTrainer`` on the same shape when it is importable."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any, Literal

import torch

from miniverl.bench.common import random_prompt_ids
from miniverl.bench.grpo_args import HF_ROLLOUT_PATHS, GrpoBenchOptions
from miniverl.bench.grpo_lean import lean_runtime
from miniverl.bench.grpo_models import AdapterTrainer, IdTokenizer, RandomLoader, role_runtime, sync, update_sequences
from miniverl.bench.grpo_update import compile_decoder_layers, fused_kind


def step_runner(path: str, loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str
                 ) -> tuple[Callable[[int], dict[str, float]], Any]:  # fmt: skip
    """``run(step) -> {"rollout_seconds", "update_seconds"}`` for a miniverl GRPO step path."""
    from miniverl.algorithms import grpo_advantages
    from miniverl.rollout.hf import PromptInput, generate_group
    from miniverl.training.algorithms.grpo import grpo_update

    rows = opts.prompts * opts.samples
    trainer: Any
    if path.startswith("miniverl_lean"):
        nf4 = path == "miniverl_lean_nf4"
        runtime, trainer = lean_runtime(loader, opts, device, dtype_name, fused=fused_kind(path), nf4=nf4)
        if path.endswith("_compiled"):  # the update's layers only: the fast engine decodes from its own folded copy
            compile_decoder_layers(runtime._student_model())
    else:
        runtime = role_runtime(
            loader, device, dtype_name, train_batch=rows, checkpointing=opts.activation_checkpointing
        )
        trainer = AdapterTrainer(runtime, opts.learning_rate, bf16_master=path == "miniverl_fast_bf16")
    vocab = int(loader.config.vocab_size)
    prompts = [
        PromptInput(f"p{i}", " ".join(map(str, ids)))
        for i, ids in enumerate(random_prompt_ids(opts.prompts, opts.prompt_tokens, vocab, opts.seed))
    ]
    engine: Literal["fast", "hf"] = "hf" if path in HF_ROLLOUT_PATHS else "fast"
    tokenizer = IdTokenizer()

    def run(step: int) -> dict[str, float]:
        sync(device)
        start = time.perf_counter()
        with runtime.generation_model() as model:
            trajectories = generate_group(
                model, tokenizer, prompts, samples_per_prompt=opts.samples, max_new_tokens=opts.new_tokens,
                temperature=1.0, seed=opts.seed, policy_version=step, batch_size=opts.rollout_batch,
                eos_token_ids=[vocab], engine=engine,
            )  # fmt: skip
        sync(device)
        rolled = time.perf_counter()
        lengths = {len(t.response_token_ids) for t in trajectories}
        if lengths != {opts.new_tokens} or len(trajectories) != rows:
            raise RuntimeError(f"fixed lengths broken: {len(trajectories)} rows of lengths {sorted(lengths)}")
        rng = random.Random(opts.seed * 7919 + step)
        scores = torch.tensor([rng.random() for _ in trajectories], dtype=torch.float64)
        advantages = [float(a) for a in grpo_advantages(scores, [t.group_id for t in trajectories])]
        sequences = update_sequences(
            [(list(t.prompt_token_ids), list(t.response_token_ids)) for t in trajectories], advantages
        )
        grpo_update(runtime, sequences, runtime.bench_config)
        trainer.step()
        sync(device)
        done = time.perf_counter()
        return {"rollout_seconds": rolled - start, "update_seconds": done - rolled}

    return run, runtime


def trl_cell(
    loader: RandomLoader, opts: GrpoBenchOptions, device: torch.device, dtype_name: str, *, liger: bool = False
) -> dict[str, Any]:
    """TRL's GRPOTrainer, its defaults (with ``liger``: its liger-kernel switch,
    :func:`miniverl.bench.grpo_trl.trl_liger_options`), or ``not_run`` with the reason."""
    try:
        import trl
    except ImportError as exc:
        return {"status": "not_run", "reason": f"trl is not importable in this environment ({exc})"}
    if liger:
        from miniverl.runtime.fused import fused_unavailable_reason

        why = fused_unavailable_reason("liger", device)
        if why is not None:
            return {"status": "not_run", "reason": f"TRL's liger switch: {why}"}
    from miniverl.bench.grpo_trl import run_trl_cell

    try:
        return {"trl_version": trl.__version__, **run_trl_cell(loader, opts, device, dtype_name, liger=liger)}
    except Exception as exc:  # a TRL failure is recorded, never hidden behind miniverl's figures
        return {"status": "failed", "trl_version": trl.__version__, "reason": f"{type(exc).__name__}: {exc}"[:500]}

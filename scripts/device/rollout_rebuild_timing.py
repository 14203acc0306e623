"""What a released rollout engine costs to rebuild, per part (H200, 2026-12-04, issue 21).

SmolLM2-135M shape (random weights, LoRA r16 on all 7 targets, bf16), one rollout of 16 rows x 32 prompt tokens
x 256 new tokens, as the lean GRPO path runs it with ``release_rollout``. Median (range) of 5 repeats of each:

* ``fold``: :func:`fold_policy` into new tensors;
* ``workspace``: a new :class:`DecodeWorkspace` (KV cache, tables, state);
* ``capture_first_warmup``: capturing the 5 spans' graphs with a warm-up step before the first span only (every
  step already ran once in this process), ``capture_all_warmups`` with one before every span (as before), and
  ``capture_first_warmup_no_empty_cache`` with ``torch.cuda.empty_cache`` patched out for that timing only (what
  ``torch.cuda.graph``'s ``empty_cache`` before every capture cost while the engine captured through it; since
  the engine calls ``capture_begin``/``capture_end`` itself, the two timings measure the same capture);
* ``rollout_kept`` / ``rollout_released``: ``generate_group`` on an engine kept resident, and on one released
  after every rollout (fold, workspace, capture and decode included).

Usage: ``python3 scripts/device/rollout_rebuild_timing.py [--json OUT]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from miniverl.bench.common import random_prompt_ids
from miniverl.bench.grpo_models import IdTokenizer, RandomLoader, role_runtime
from miniverl.rollout import decoder as decoder_module
from miniverl.rollout.decoder import DecodeWorkspace, SamplingSpec
from miniverl.rollout.engine import engine_for, release_engine, release_engines
from miniverl.rollout.hf import PromptInput, generate_group
from miniverl.rollout.weights import fold_policy

ROWS, PROMPT, NEW, REPEATS = 16, 32, 256, 5
CUDA = torch.device("cuda", 0)


def timed(run: Callable[[], Any]) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    run()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def summary(seconds: list[float]) -> dict[str, float]:
    ms = [s * 1e3 for s in seconds]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "max_ms": max(ms), "repeats": len(ms)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    loader = RandomLoader("smollm2-shape", seed=0)
    vocab = int(loader.config.vocab_size)
    runtime = role_runtime(loader, CUDA, "bfloat16", train_batch=ROWS)
    prompts = [
        PromptInput(f"p{i}", " ".join(map(str, ids))) for i, ids in enumerate(random_prompt_ids(2, PROMPT, vocab, 0))
    ]
    spec = SamplingSpec(1.0, 1.0, 0, [vocab])
    spans = sorted({DecodeWorkspace.span_for(PROMPT + s) for s in range(1, NEW)})

    def rollout(version: int) -> None:
        with runtime.generation_model() as model:
            out = generate_group(
                model, IdTokenizer(), prompts, samples_per_prompt=8, max_new_tokens=NEW, temperature=1.0, seed=0,
                policy_version=version, batch_size=ROWS, eos_token_ids=[vocab], engine="fast",
            )  # fmt: skip
        assert len(out) == ROWS and {len(t.response_token_ids) for t in out} == {NEW}

    results: dict[str, Any] = {"spans": spans}
    with runtime.generation_model() as model:
        engine = engine_for(model, CUDA)
        kernels = engine.kernels
        weights = fold_policy(model, device=CUDA, dtype=torch.bfloat16)
        results["fold"] = summary(
            [timed(lambda: fold_policy(model, device=CUDA, dtype=torch.bfloat16)) for _ in range(REPEATS)]
        )

        def workspace() -> DecodeWorkspace:
            return DecodeWorkspace(
                weights, batch=ROWS, capacity=PROMPT + NEW, max_new_tokens=NEW, device=CUDA, kernels=kernels
            )

        results["workspace"] = summary([timed(workspace) for _ in range(REPEATS)])
        workspace().capture(spec, spans)  # every step has run once in this process
        results["capture_first_warmup"] = summary(
            [timed(lambda: workspace().capture(spec, spans)) for _ in range(REPEATS)]
        )
        all_warmups = []
        for _ in range(REPEATS):
            ws = workspace()
            decoder_module._WARMED_STEPS.clear()
            all_warmups.append(timed(lambda ws=ws: ws.capture(spec, spans)))
        results["capture_all_warmups"] = summary(all_warmups)
        # what torch.cuda.graph's empty_cache before every capture costs (a probe: patched out for this timing)
        emptied = torch.cuda.empty_cache
        torch.cuda.empty_cache = lambda: None  # type: ignore[assignment]
        try:
            results["capture_first_warmup_no_empty_cache"] = summary(
                [timed(lambda: workspace().capture(spec, spans)) for _ in range(REPEATS)]
            )
        finally:
            torch.cuda.empty_cache = emptied  # type: ignore[assignment]
    release_engines()
    rollout(0)
    results["rollout_kept"] = summary([timed(lambda v=v: rollout(v)) for v in range(1, REPEATS + 1)])
    runtime.apply_memory_plan(activation_checkpointing=0, max_tokens=None, release_rollout_engine=True)
    results["rollout_released"] = summary([timed(lambda v=v: rollout(v)) for v in range(1, REPEATS + 1)])
    with runtime.generation_model() as model:
        release_engine(model)
    results["kernels"] = kernels
    for name, value in results.items():
        print(name, value)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()

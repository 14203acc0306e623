"""``miniverl bench rollout``: decode throughput of the rollout paths, side by side in one process.

Same weights, same prompts (``prompt_tokens`` random ids per row, no padding), same sampling
(temperature 1, no top-k/top-p) and fixed output lengths (EOS can never end a row: the fast engine
and the HF loop get no reachable EOS id, ``generate`` gets ``min_new_tokens = max_new_tokens``),
so the lengths cannot decide a ratio. Paths:

* ``fast``: :class:`miniverl.rollout.engine.FastRolloutEngine` (folded bf16 copy, static KV cache,
  CUDA-graph decode steps on CUDA, on-device sampling);
* ``fast_compiled``: the same with the element-wise glue of the decode step ``torch.compile``'d
  (fused kernels, still captured in our own CUDA graphs; the compile time is in ``first_call_seconds``);
* ``fast_triton``: the same with the decode step on the triton kernels of :mod:`miniverl.rollout.kernels`
  (``kernels="triton"``: norm + RoPE + KV write, split-span decode attention, residual + norm; CUDA only);
* ``fast_eager``: the same engine with CUDA graphs off (what the graphs buy);
* ``hf_loop``: miniverl's previous path (transformers forward with a dynamic cache, per-sample
  CPU generators, a host sync per step);
* ``hf_generate``: transformers ``model.generate`` (sdpa attention, dynamic cache);
* ``hf_generate_static``: ``model.generate`` with a static KV cache, which transformers ``torch.compile``s on CUDA
  (the stronger baseline; on CPU it runs uncompiled, recorded in the cell's ``compiled``);
* ``trl``: recorded ``not_run`` unless trl is importable (it is not part of any known-good stack).

The model carries a LoRA adapter (``lora_rank``, on the training targets, B seeded non-zero) as a policy does in
training: the HF paths run it unmerged through PEFT, and each ``fast`` call folds it first (a new policy version
per call, the fold once per rollout as in a training cycle), so the fold is inside the fast path's time.

Per (path, batch): ``warmup`` untimed calls (at least one; the first is reported as
``first_call_seconds``; it includes the fast engine's graph capture and cuDNN/SDPA plan building),
then the median of ``repeats`` timed samples (CUDA-synchronized wall time), each of
``calls_per_sample`` back-to-back calls, enough to last 0.2 s (a call of a few milliseconds timed
alone is mostly scheduler noise), reported per call. ``ms_per_decode_step`` is wall time over
``new_tokens`` (the prefill of the short prompts is included). The bandwidth bound of a step is the
bytes a decode step must read, the rollout copy's distinct weights plus the KV cache of every row at its
mean context over the decode (``prompt_tokens + (new_tokens - 1) / 2``), over the measured device-to-device
copy bandwidth (read + write bytes over time); ``pct_of_bandwidth_bound`` is bound / measured (the
weight-only bound and its percentage are kept beside it).
Peak reserved is ``torch.cuda.max_memory_reserved`` over the timed calls; each cell starts from an
emptied cache with only the model resident and builds its own engine (fold, workspace, graphs).

Then, per batch, the two paths of ``pair`` (both among ``paths``) are timed interleaved, ``pairs`` times
A then B on the same prompts (:mod:`miniverl.bench.pairs`): ``comparisons`` holds every pair's two
timings, its ratio, and the median, quartiles and range of those ratios, the speed figure that load on a
shared machine cannot flip.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from miniverl import progress
from miniverl.bench.common import package_version, random_prompt_ids, save_partial
from miniverl.bench.pairs import measure_pairs
from miniverl.bench.rollout_args import PATHS, ROLLOUT_MODELS, add_rollout_arguments
from miniverl.bench.rollout_render import evaluate_rollout_goals, render_rollout_markdown, render_rollout_svg
from miniverl.canonical import atomic_write_json, atomic_write_text, sha256_file, sha256_json
from miniverl.errors import UsageError
from miniverl.models.loading import resolve_device

FORMAT = "miniverl-rollout-bench/v1"
GIB = float(1 << 30)
MIN_SAMPLE_SECONDS = 0.2
MAX_CALLS_PER_SAMPLE = 100
TRITON_ON_CPU = "the triton kernels are measured on CUDA only (on CPU they run under the interpreter, for tests)"


@dataclass
class RolloutBenchOptions:
    model: str = "tiny"
    device: str = "auto"
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    batches: tuple[int, ...] = (16, 64)
    new_tokens: int = 256
    prompt_tokens: int = 32
    warmup: int = 1
    repeats: int = 5
    slow_repeats: int = 1  # the HF paths and fast_eager take seconds per call
    paths: tuple[str, ...] = PATHS
    pair: tuple[str, str] = ("fast", "hf_generate")  # timed interleaved, A then B, `pairs` times per batch
    pairs: int = 5  # 0: no interleaved comparison
    check_every: int = 8
    seed: int = 0
    profile: bool = True
    lora_rank: int = 16  # 0: a bare model (no adapter, no fold in the fast path's time)
    extra: dict[str, Any] = field(default_factory=dict)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build_model(name: str, device: torch.device, dtype: torch.dtype, seed: int, lora_rank: int = 0) -> Any:
    """A random-weight Qwen3 of the named shape, built directly on ``device`` (sdpa attention), with a LoRA
    adapter of ``lora_rank`` on the training targets whose B matrices are seeded non-zero (0: no adapter)."""
    from transformers import Qwen3ForCausalLM

    from miniverl.gate.models import LORA_TARGETS, qwen3_config

    config = qwen3_config(name)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    with torch.device(device):
        model: Any = Qwen3ForCausalLM(config)
    model = model.to(dtype).eval()
    if lora_rank == 0:
        return model
    import peft

    lora = peft.LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, lora_dropout=0.0, target_modules=LORA_TARGETS)
    model = peft.get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name_, param in model.named_parameters():
            if "lora_B" in name_:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.01)
    return model.to(dtype).eval()


def kv_read_bytes_per_step(config: Any, batch: int, prompt_tokens: int, new_tokens: int, element_bytes: int) -> float:
    """Mean bytes of K and V cache a decode step reads: every layer's keys and values of every row, at the mean
    context over the decode (the step that makes token i attends to ``prompt_tokens + i`` positions)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_position = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element_bytes
    mean_context = prompt_tokens + (new_tokens - 1) / 2
    return float(batch * per_position * mean_context)


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, trials: int = 10) -> float:
    """Bytes per second of a device-to-device copy, counting bytes read plus bytes written."""
    if device.type != "cuda":
        nbytes = min(nbytes, 1 << 27)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    _sync(device)
    start = time.perf_counter()
    for _ in range(trials):
        dst.copy_(src)
    _sync(device)
    seconds = time.perf_counter() - start
    del src, dst
    return 2.0 * nbytes * trials / seconds


def _runners(
    path: str, model: Any, prompts: list[list[int]], opts: RolloutBenchOptions, device: torch.device, engines: Any
) -> Callable[[], int]:
    """A zero-argument call that generates ``new_tokens`` for every prompt; returns tokens generated."""
    n, vocab = opts.new_tokens, int(model.config.vocab_size)
    batch = len(prompts)
    if path in ("fast", "fast_compiled", "fast_triton", "fast_eager"):
        from miniverl.rollout.decoder import SamplingSpec
        from miniverl.rollout.engine import EngineRow

        engine = engines[path]
        rows = [EngineRow(p, 1000 + i) for i, p in enumerate(prompts)]
        spec = SamplingSpec(1.0, 1.0, 0, ())
        versions = iter(range(1, 1 << 62))

        def fast() -> int:
            if opts.lora_rank:  # a new policy version per rollout: the fold is part of the path's time
                engine.sync_policy(model, next(versions))
            out = engine.generate(
                rows, batch_size=batch, max_new_tokens=n, spec=spec, pad_id=0, check_every=opts.check_every
            )
            return sum(len(t) for t, _, _ in out)

        return fast
    if path == "hf_loop":
        from miniverl.rollout.hf import _decode_batch, _Row

        loop_rows = [_Row(f"p{i}", "", 0, 1000 + i, p) for i, p in enumerate(prompts)]

        def loop() -> int:
            with torch.no_grad():
                out = _decode_batch(model, loop_rows, [vocab], 0, device, n, 1.0, 1.0, 0)
            return sum(len(t) for t, _, _ in out)

        return loop
    if path in ("hf_generate", "hf_generate_static"):
        ids = torch.tensor(prompts, dtype=torch.long, device=device)
        mask = torch.ones_like(ids)
        cache = {"cache_implementation": "static"} if path == "hf_generate_static" else {}

        def hf_generate() -> int:
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                    max_new_tokens=n, min_new_tokens=n, pad_token_id=0, **cache,
                )  # fmt: skip
            return int(out[:, ids.shape[1] :].numel())

        return hf_generate
    raise ValueError(f"unknown path {path!r}")


def measure(
    run: Callable[[], int], *, warmup: int, repeats: int, device: torch.device, expected_tokens: int
) -> dict[str, Any]:
    """``warmup`` untimed calls, then ``repeats`` timed samples of ``calls_per_sample`` back-to-back calls each
    (enough calls that a sample lasts MIN_SAMPLE_SECONDS, from the last warm-up call's time): a call of a few
    milliseconds timed alone is mostly scheduler noise. ``seconds`` are per call, one per sample."""
    first = last = None
    for _ in range(max(warmup, 1)):
        _sync(device)
        start = time.perf_counter()
        run()
        _sync(device)
        last = time.perf_counter() - start
        first = first if first is not None else last
    calls = min(MAX_CALLS_PER_SAMPLE, max(1, math.ceil(MIN_SAMPLE_SECONDS / max(last or 0.0, 1e-9))))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    seconds: list[float] = []
    tokens: list[int] = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        tokens.extend(run() for _ in range(calls))
        _sync(device)
        seconds.append((time.perf_counter() - start) / calls)
    if any(t != expected_tokens for t in tokens):
        raise RuntimeError(f"fixed lengths broken: generated {sorted(set(tokens))}, want {expected_tokens} per call")
    return {
        "status": "measured",
        "first_call_seconds": first,
        "calls_per_sample": calls,
        "seconds": seconds,
        "median_seconds": statistics.median(seconds),
        "generated_tokens": expected_tokens,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GIB if device.type == "cuda" else None,
    }


def _unmeasurable(path: str, opts: RolloutBenchOptions, device: torch.device) -> str | None:
    if path not in opts.paths:
        return f"{path} is not among the measured paths"
    if path == "trl":
        return "trl's rollout is not measured"
    if path == "fast_compiled" and device.type != "cuda":
        return "compiled glue is measured on CUDA only"
    if path == "fast_triton" and device.type != "cuda":
        return TRITON_ON_CPU
    return None


def _compare(
    model: Any,
    prompts: list[list[int]],
    opts: RolloutBenchOptions,
    device: torch.device,
    dtype: torch.dtype,
    engine_kwargs: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """``opts.pair`` timed interleaved on ``prompts`` (:func:`miniverl.bench.pairs.measure_pairs`), fresh engines."""
    from miniverl.rollout.engine import FastRolloutEngine

    a, b = opts.pair
    entry: dict[str, Any] = {"a": a, "b": b, "batch": len(prompts), "new_tokens": opts.new_tokens}
    why = _unmeasurable(a, opts, device) or _unmeasurable(b, opts, device)
    if why is not None:
        return {**entry, "status": "not_run", "reason": why}
    _release(device)
    engines: dict[str, FastRolloutEngine] = {}
    for path in (a, b):
        if path in engine_kwargs:
            engines[path] = FastRolloutEngine(device=device, dtype=dtype, **engine_kwargs[path])
            engines[path].sync_policy(model, 0)
    run_a, run_b = (_runners(path, model, prompts, opts, device, engines) for path in (a, b))
    try:
        entry.update(
            measure_pairs(
                run_a, run_b, pairs=opts.pairs, warmup=opts.warmup, expected_tokens=len(prompts) * opts.new_tokens,
                sync=lambda: _sync(device),
            )
        )  # fmt: skip
    except (RuntimeError, ValueError) as exc:
        entry.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
    return entry


def _profile_fast(run: Callable[[], int], device: torch.device) -> dict[str, Any]:
    from miniverl.bench.runtime import profile_update

    summary = profile_update(None, run, device)  # type: ignore[arg-type]
    summary.pop("sha256", None)
    summary["sha256"] = sha256_json(summary)
    return summary


def run_rollout_bench(opts: RolloutBenchOptions, out: str | Path) -> dict[str, Any]:
    """Measure every (path, batch) cell and write ``rollout.json``, ``rollout.md`` and ``rollout.svg``."""
    from miniverl.rollout.engine import FastRolloutEngine

    if opts.model not in ROLLOUT_MODELS:
        raise ValueError(f"unknown model {opts.model!r}; choose one of {', '.join(ROLLOUT_MODELS)}")
    device = resolve_device(opts.device)
    dtype_name = opts.dtype if opts.dtype != "auto" else ("bfloat16" if device.type == "cuda" else "float32")
    dtype = getattr(torch, dtype_name)
    started = time.perf_counter()
    model = build_model(opts.model, device, dtype, opts.seed, opts.lora_rank)
    vocab = int(model.config.vocab_size)
    bandwidth = copy_bandwidth(device)
    fold_start = time.perf_counter()
    probe = FastRolloutEngine(device=device, dtype=dtype)
    probe.sync_policy(model, 0)
    _sync(device)
    fold_seconds = time.perf_counter() - fold_start
    assert probe.weights is not None
    weight_bytes = probe.weights.nbytes()
    del probe
    bound_ms = weight_bytes / bandwidth * 1e3
    engine_kwargs: dict[str, dict[str, Any]] = {
        "fast": {},
        "fast_eager": {"use_graphs": False},
        "fast_compiled": {"compile_glue": True},
        "fast_triton": {"kernels": "triton"},
    }
    cells: list[dict[str, Any]] = []
    comparisons: list[dict[str, Any]] = []
    profiler = None
    progress.task("bench rollout", len(opts.batches) * len(opts.paths), "cells")
    for batch in opts.batches:
        prompts = random_prompt_ids(batch, opts.prompt_tokens, vocab, opts.seed + batch)
        for path in opts.paths:
            progress.advance(len(cells), f"bench rollout, measuring {path} x batch {batch}")
            cell: dict[str, Any] = {"path": path, "batch": batch, "new_tokens": opts.new_tokens}
            if path == "fast_compiled" and device.type != "cuda":
                cell.update(status="not_run", reason="compiled glue is measured on CUDA only")
                cells.append(cell)
                continue
            if path == "fast_triton" and device.type != "cuda":
                cell.update(status="not_run", reason=TRITON_ON_CPU)
                cells.append(cell)
                continue
            if path == "trl":
                try:
                    import trl  # noqa: F401
                except ImportError:
                    cell.update(status="not_run", reason="trl is not importable in this environment")
                else:
                    cell.update(status="not_run", reason="trl is importable but its rollout is not wired in")
                cells.append(cell)
                continue
            _release(device)  # each cell starts from an empty cache: peak reserved is its own
            engines: dict[str, FastRolloutEngine] = {}
            if path in engine_kwargs:  # a fresh engine per cell: its fold, workspace and graphs only
                engines[path] = FastRolloutEngine(device=device, dtype=dtype, **engine_kwargs[path])
                engines[path].sync_policy(model, 0)
            run = _runners(path, model, prompts, opts, device, engines)
            repeats = opts.repeats if path in ("fast", "fast_triton") else opts.slow_repeats
            try:
                cell.update(measure(run, warmup=opts.warmup, repeats=repeats, device=device,
                                    expected_tokens=batch * opts.new_tokens))  # fmt: skip
            except (RuntimeError, ValueError) as exc:  # one broken path must not hide the others' figures
                cell.update(status="failed", reason=f"{type(exc).__name__}: {exc}"[:500])
                cells.append(cell)
                continue
            ms = cell["median_seconds"] / opts.new_tokens * 1e3
            kv_bytes = kv_read_bytes_per_step(model.config, batch, opts.prompt_tokens, opts.new_tokens,
                                              torch.finfo(dtype).bits // 8)  # fmt: skip
            cell["tokens_per_second"] = batch * opts.new_tokens / cell["median_seconds"]
            cell["ms_per_decode_step"] = ms
            cell["pct_of_weight_bandwidth_bound"] = 100.0 * bound_ms / ms
            cell["kv_read_bytes_per_step"] = kv_bytes
            cell["bandwidth_bound_ms_per_step"] = (weight_bytes + kv_bytes) / bandwidth * 1e3
            cell["pct_of_bandwidth_bound"] = 100.0 * cell["bandwidth_bound_ms_per_step"] / ms
            if path in engines:
                cell["engine_stats"] = asdict(engines[path].stats)
            if path == "hf_generate_static":
                cell["compiled"] = device.type == "cuda"  # transformers compiles a static-cache generate on CUDA
            cells.append(cell)
            save_partial(Path(out) / "rollout.partial.json", FORMAT, cells)
            if opts.profile and path == "fast" and batch == max(opts.batches):
                profiler = _profile_fast(run, device)
            del run, engines
        if opts.pairs:
            progress.phase("pairs", f"{opts.pairs} interleaved pairs at batch {batch}")
            comparisons.append(_compare(model, prompts, opts, device, dtype, engine_kwargs))
    progress.advance(len(cells), "bench rollout")
    report: dict[str, Any] = {
        "format": FORMAT,
        "options": asdict(opts),
        "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "threads": torch.get_num_threads(),
        "dtype": dtype_name,
        "cuda_graphs": "torch.cuda.CUDAGraph per (batch bucket, attention span)" if device.type == "cuda" else "off",
        "copy_bandwidth_bytes_per_second": bandwidth,
        "rollout_weight_bytes": weight_bytes,
        "weight_bandwidth_bound_ms_per_step": bound_ms,
        "fold_seconds": fold_seconds,
        "cells": cells,
        "comparisons": comparisons,
        "seconds": time.perf_counter() - started,
    }
    report["goals"] = evaluate_rollout_goals(report)
    return _write(report, profiler, Path(out))


def _release(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _write(report: dict[str, Any], profiler: dict[str, Any] | None, out_dir: Path) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    artifacts: dict[str, str] = {}
    if profiler is not None:
        atomic_write_json(out_dir / "rollout-profiler.json", profiler, pretty=True)
        artifacts["rollout-profiler.json"] = sha256_file(out_dir / "rollout-profiler.json")
        report["profiler_summary_sha256"] = profiler["sha256"]
    atomic_write_text(out_dir / "rollout.md", render_rollout_markdown(report))
    atomic_write_text(out_dir / "rollout.svg", render_rollout_svg(report))
    for name in ("rollout.md", "rollout.svg"):
        artifacts[name] = sha256_file(out_dir / name)
    report["artifacts"] = artifacts
    atomic_write_json(out_dir / "rollout.json", report, pretty=True)
    (out_dir / "rollout.partial.json").unlink(missing_ok=True)
    return report


def options_from_args(args: argparse.Namespace) -> RolloutBenchOptions:
    unknown = [p for p in args.paths if p not in PATHS]
    if unknown:
        raise UsageError(f"unknown path(s) {', '.join(unknown)}; choose from {', '.join(PATHS)}")
    pair = tuple(args.pair)
    if len(pair) != 2 or len(set(pair)) != 2 or not set(pair) <= set(PATHS) - {"trl"}:
        raise UsageError(f"--pair {','.join(pair)}: give two different paths A,B of {', '.join(PATHS[:-1])}")
    return RolloutBenchOptions(
        model=args.model, device=args.device, dtype=args.dtype, batches=args.batches, new_tokens=args.new_tokens,
        prompt_tokens=args.prompt_tokens, warmup=args.warmup, repeats=args.repeats, slow_repeats=args.slow_repeats,
        paths=args.paths, pair=(pair[0], pair[1]), pairs=args.pairs, profile=not args.no_profile,
        lora_rank=args.lora_rank,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="miniverl bench rollout", description=(__doc__ or "").splitlines()[0])
    add_rollout_arguments(parser)
    args = parser.parse_args(argv)
    report = run_rollout_bench(options_from_args(args), args.out)
    sys.stdout.write(render_rollout_markdown(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

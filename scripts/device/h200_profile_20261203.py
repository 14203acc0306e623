"""H200 profile for issue 21 (2026-12-03): where a decode step's time goes, and where the update's memory goes.

Sections (``python3 scripts/device/h200_profile_20261203.py SECTION [SECTION ...] --out DIR``):

* ``decode``: Qwen3-0.6B shape + LoRA r16 folded, batch 16 and 64, span 192, torch and triton kernels: the
  per-kernel device time of 5 eager steps (torch.profiler), and ms per step by CUDA-graph replay (median of 5).
* ``update``: Qwen3-0.6B shape, B = 8, T = 512, ``miniverl_update_bf16`` with and without checkpointing: median
  time of 3, peak allocated / reserved, the top device ops of one update, and what is live at the allocation peak
  (``torch.cuda.memory`` history), grouped by the innermost miniverl / transformers / peft frame.
* ``grpo``: SmolLM2 shape, 16 x 256, the lean step under several micro-batch / checkpointing / chunk settings: the
  same figures.

Random weights built from each config; nothing downloaded. Every figure is printed and written to DIR as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

GIB = float(1 << 30)
DEVICE = torch.device("cuda")
# the shapes measured; --cpu-check swaps in tiny ones to run every code path on CPU first
SHAPES: dict[str, Any] = {
    "decode": "qwen3-0.6b-shape",
    "update": "qwen3-0.6b-shape",
    "update_shape": (8, 512),
    "grpo": "smollm2-shape",
    "new_tokens": 256,
}
INTERESTING = ("/miniverl/", "/transformers/", "/peft/", "torch/utils/checkpoint")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def top_device_ops(prof: Any, top: int = 25) -> list[dict[str, Any]]:
    rows = []
    for e in prof.key_averages():
        t = float(getattr(e, "self_device_time_total", 0.0) or 0.0)
        if t > 0:
            rows.append({"name": e.key[:90], "calls": int(e.count), "self_device_us": round(t, 1)})
    rows.sort(key=lambda r: -r["self_device_us"])
    total = sum(r["self_device_us"] for r in rows) or 1.0
    for r in rows:
        r["share"] = round(r["self_device_us"] / total, 4)
    return [{"total_device_us": round(total, 1), "kernels": sum(r["calls"] for r in rows)}, *rows[:top]]


def _frame_key(frames: list[dict[str, Any]]) -> str:
    picked = [f for f in frames if any(k in str(f.get("filename", "")) for k in INTERESTING)]
    if not picked:
        return "(no python frame)"
    inner = picked[0]
    ours = next((f for f in picked if "/miniverl/" in str(f.get("filename", ""))), None)
    label = f"{Path(str(inner['filename'])).name}:{inner.get('line')}:{inner.get('name')}"
    if ours is not None and ours is not inner:
        label += f" <- {Path(str(ours['filename'])).name}:{ours.get('line')}:{ours.get('name')}"
    return label


def peak_breakdown(snapshot: dict[str, Any], baseline: int, top: int = 20) -> dict[str, Any]:
    """Replay the allocation trace; at the peak of live bytes, group the live blocks by their allocating frame."""
    trace = snapshot["device_traces"][DEVICE.index or 0]
    live: dict[int, tuple[int, int]] = {}
    total = peak = peak_at = 0
    for i, ev in enumerate(trace):
        action = ev.get("action")
        if action == "alloc":
            live[ev["addr"]] = (ev["size"], i)
            total += ev["size"]
            if total > peak:
                peak, peak_at = total, i
        elif action == "free_completed" and ev["addr"] in live:
            total -= live.pop(ev["addr"])[0]
    rows = _live_by_frame(trace, upto=peak_at, top=top)
    at = trace[peak_at]
    return {
        "baseline_allocated_gib": round(baseline / GIB, 3),
        "trace_peak_gib": round(peak / GIB, 3),
        "peak_total_gib": round((baseline + peak) / GIB, 3),
        "peak_event": _frame_key(at.get("frames", [])),
        "live_at_peak": rows,
    }


def record_one(run: Any, label: str) -> dict[str, Any]:
    if DEVICE.type != "cuda":  # --cpu-check: the code path runs, nothing is measured
        run()
        return {}
    _sync()
    baseline = torch.cuda.memory_allocated(DEVICE)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=400_000)
    try:
        run()
        _sync()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    out = peak_breakdown(snapshot, baseline)
    peak, base = out["peak_total_gib"], out["baseline_allocated_gib"]
    print(f"[{label}] memory peak {peak} GiB (baseline {base}); live at peak:")
    for row in out["live_at_peak"][:14]:
        print(f"    {row['gib']:8.4f} GiB  {row['blocks']:5d}  {row['where']}")
    return out


def profile_one(run: Any, label: str) -> list[dict[str, Any]]:
    from torch.profiler import ProfilerActivity, profile

    if DEVICE.type != "cuda":
        run()
        return []
    _sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        _sync()
    ops = top_device_ops(prof)
    print(f"[{label}] device total {ops[0]['total_device_us']} us over {ops[0]['kernels']} kernels; top ops:")
    for row in ops[1:16]:
        print(f"    {row['self_device_us']:10.1f} us {row['share']:6.1%} x{row['calls']:<5d} {row['name']}")
    return ops


def timed(run: Any, repeats: int) -> dict[str, Any]:
    if DEVICE.type != "cuda":
        run()
        return {}
    torch.cuda.empty_cache()
    run()  # the allocator refills its cache here, outside the timed steps
    torch.cuda.reset_peak_memory_stats(DEVICE)
    times = []
    for _ in range(repeats):
        _sync()
        t0 = time.perf_counter()
        run()
        _sync()
        times.append(time.perf_counter() - t0)
    return {
        "median_s": statistics.median(times),
        "times_s": [round(t, 4) for t in times],
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated(DEVICE) / GIB, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved(DEVICE) / GIB, 3),
    }


def release() -> None:
    import gc

    from miniverl.rollout.engine import release_engines

    release_engines()
    gc.collect()
    if DEVICE.type != "cuda":
        return
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(DEVICE)


# -- decode ----------------------------------------------------------------------------------------------------
def section_decode() -> dict[str, Any]:
    from miniverl.bench.rollout import build_model
    from miniverl.rollout.decoder import SamplingSpec
    from miniverl.rollout.engine import FastRolloutEngine

    model = build_model(SHAPES["decode"], DEVICE, torch.bfloat16, seed=0, lora_rank=16)
    vocab = int(model.get_base_model().config.vocab_size)
    spec = SamplingSpec(1.0, 1.0, 0, [vocab])
    out: dict[str, Any] = {}
    for kernels in ("torch", "triton"):
        engine = FastRolloutEngine(device=DEVICE, dtype=torch.bfloat16, kernels=kernels)
        engine.sync_policy(model, 0)
        for batch in (16, 64):
            key = f"{kernels}_b{batch}"
            ws = engine._workspace(batch, 32 + 256, 256)  # span 192 stays inside the cache
            gen = torch.Generator().manual_seed(batch)
            prompts = [torch.randint(0, vocab, (32,), generator=gen).tolist() for _ in range(batch)]
            span = 192 if DEVICE.type == "cuda" else 48
            if DEVICE.type == "cuda":
                ws.capture(spec, [span])
            ws.prefill(prompts, list(range(batch)), 0, spec)
            for _ in range(3):
                ws.step(span, spec)

            def eager(ws: Any = ws, span: int = span) -> None:
                for _ in range(5):
                    ws.step(span, spec)

            ops = profile_one(eager, f"decode {key} (5 eager steps)")
            if DEVICE.type != "cuda":
                continue
            graph = ws.graphs[span]
            replays = []
            for _ in range(7):
                ws.prefill(prompts, list(range(batch)), 0, spec)  # 50 steps from slot 32: inside the cache
                _sync()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(50):
                    graph.replay()
                end.record()
                _sync()
                replays.append(start.elapsed_time(end) / 50)
            ms = statistics.median(replays[2:])
            low, high = min(replays[2:]), max(replays[2:])
            print(f"[decode {key}] graph replay at span {span}: {ms:.3f} ms/step (range {low:.3f}-{high:.3f})")
            out[key] = {"graph_ms_per_step": ms, "replays_ms": replays, "eager_profile_5_steps": ops}
        engine.workspace = None
        del engine
        release()
    return out


# -- update / grpo ---------------------------------------------------------------------------------------------
def _bench_opts(**kw: Any) -> Any:
    from miniverl.bench.grpo import GrpoBenchOptions

    return GrpoBenchOptions(device=DEVICE.type, dtype="bfloat16", **kw)


def _stepper(run: Any, parts: list[dict[str, float]]) -> Any:
    """A no-argument call of the bench runner ``run(step)`` with its step counting up; results into ``parts``."""
    counter = iter(range(1_000_000))
    return lambda: parts.append(run(next(counter)))


def section_update() -> dict[str, Any]:
    from miniverl.bench.grpo import RandomLoader, _update_runner

    loader = RandomLoader(SHAPES["update"], 0)
    out: dict[str, Any] = {}
    cells = (
        ("naive_hf_peft", 0),
        ("miniverl_update_bf16", 0),
        ("miniverl_update_bf16", 4),
        ("miniverl_update_bf16", 1),
    )
    for path, ckpt in cells:
        opts = _bench_opts(model=SHAPES["update"], update_shape=SHAPES["update_shape"], activation_checkpointing=ckpt)
        run, holder = _update_runner(path, loader, opts, DEVICE, "bfloat16")
        step = _stepper(run, [])
        step()
        key = f"{path}_ckpt{ckpt}"
        cell = timed(step, 5)
        print(f"[update {key}] {cell}")
        if path != "naive_hf_peft" and ckpt == 0:
            cell["memory"] = record_one(step, f"update {key}")
        out[key] = cell
        close = getattr(holder, "close", None)
        if callable(close):
            close()
        del run, holder, step
        release()
    return out


def section_grpo() -> dict[str, Any]:
    from miniverl.bench.grpo import RandomLoader, _step_runner

    loader = RandomLoader(SHAPES["grpo"], 0)
    out: dict[str, Any] = {}

    def build(micro: int, every: int, chunk: int) -> tuple[Any, Any]:
        opts = _bench_opts(
            model=SHAPES["grpo"], prompts=2, samples=8, new_tokens=SHAPES["new_tokens"], rollout_batch=16,
            memory_budget_gib=1.2,
        )  # fmt: skip
        run, runtime = _step_runner("miniverl_lean", loader, opts, DEVICE, "bfloat16")
        if every:
            runtime.apply_memory_plan(activation_checkpointing=every, max_tokens=None)
        runtime.bench_config.train.trajectory_batch_size = micro
        runtime.bench_config.train.logprob_chunk_size = chunk
        return run, runtime

    # (label, trajectory batch, checkpoint every n-th layer (0: none), logprob chunk)
    variants = (
        ("mb16_ckpt1_chunk256", 16, 1, 256),
        ("mb16_ckpt1_chunk1024", 16, 1, 1024),
        ("mb16_ckpt2_chunk256", 16, 2, 256),
        ("mb16_ckpt0_chunk1024", 16, 0, 1024),
    )
    for label, micro, every, chunk in variants:
        run, runtime = build(micro, every, chunk)
        parts: list[dict[str, float]] = []
        step = _stepper(run, parts)
        step()
        cell = timed(step, 5)
        cell["update_s"] = [round(p["update_seconds"], 4) for p in parts[1:]]
        cell["rollout_s"] = [round(p["rollout_seconds"], 4) for p in parts[1:]]
        print(f"[grpo {label}] {cell}")
        out[label] = cell
        runtime.close()
        del run, runtime, step
        release()
    out["lifecycle_mb16_ckpt1_chunk256"] = lifecycle(lambda: build(16, 1, 256), "grpo lifecycle mb16_ckpt1_chunk256")
    return out


def _live_by_frame(trace: list[dict[str, Any]], upto: int | None = None, top: int = 25) -> list[dict[str, Any]]:
    """The blocks live after event ``upto`` (default: the end), summed by their allocating frame, largest first."""
    live: dict[int, tuple[int, int]] = {}
    for i, ev in enumerate(trace if upto is None else trace[: upto + 1]):
        if ev.get("action") == "alloc":
            live[ev["addr"]] = (ev["size"], i)
        elif ev.get("action") == "free_completed":
            live.pop(ev["addr"], None)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, index in live.values():
        key = _frame_key(trace[index].get("frames", []))
        groups[key][0] += size
        groups[key][1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return [{"where": k, "gib": round(v[0] / GIB, 4), "blocks": v[1]} for k, v in rows[:top]]


def lifecycle(build: Any, label: str) -> dict[str, Any]:
    """Record every allocation from before the runtime is built: two steps, then close + release. What is
    live at the peak (all of it itemized, the resident part included), and what is still live at the end."""
    if DEVICE.type != "cuda":
        run, runtime = build()
        run(0)
        runtime.close()
        return {}
    release()
    before = torch.cuda.memory_allocated(DEVICE)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=2_000_000)
    try:
        run, runtime = build()
        run(0)
        run(1)
        _sync()
        peak_reserved = torch.cuda.max_memory_reserved(DEVICE)
        runtime.close()
        del run, runtime
        release()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    trace = snapshot["device_traces"][DEVICE.index or 0]
    out = peak_breakdown(snapshot, before, top=25)
    out["peak_reserved_gib"] = round(peak_reserved / GIB, 3)
    out["left_after_release"] = _live_by_frame(trace)
    out["left_after_release_gib"] = round((torch.cuda.memory_allocated(DEVICE) - before) / GIB, 4)
    print(f"[{label}] allocated before {before / GIB:.3f} GiB; peak {out['peak_total_gib']} GiB; live at peak:")
    for row in out["live_at_peak"]:
        print(f"    {row['gib']:8.4f} GiB  {row['blocks']:5d}  {row['where']}")
    print(f"[{label}] left after close + release: {out['left_after_release_gib']} GiB")
    for row in out["left_after_release"][:10]:
        print(f"    {row['gib']:8.4f} GiB  {row['blocks']:5d}  {row['where']}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("sections", nargs="+", choices=("decode", "update", "grpo"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--cpu-check", action="store_true", help="tiny shapes on CPU: every code path, no figures")
    args = parser.parse_args()
    if args.cpu_check:
        global DEVICE
        DEVICE = torch.device("cpu")
        SHAPES.update(decode="tiny", update="tiny", update_shape=(2, 64), grpo="tiny", new_tokens=16)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in args.sections:
        t0 = time.perf_counter()
        try:
            result = {"decode": section_decode, "update": section_update, "grpo": section_grpo}[name]()
        except Exception as exc:  # one section's failure must not hide the others' figures
            import traceback

            traceback.print_exc()
            result = {"failed": f"{type(exc).__name__}: {exc}"}
        result["seconds"] = time.perf_counter() - t0
        (out_dir / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
        print(f"== {name}: {result['seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Render grpo.md and grpo.svg from the grpo.partial.json of a run stopped by its timeout (the script's options)."""

import json
import sys
from dataclasses import asdict
from pathlib import Path

from miniverl.bench.grpo import GrpoBenchOptions, ratios
from miniverl.bench.grpo_render import evaluate_grpo_goals, render_grpo_markdown, render_grpo_svg

root = Path(sys.argv[1])
runs = {
    "qwen3": dict(
        model="qwen3-0.6b-shape",
        device="cuda",
        prompts=2,
        samples=8,
        new_tokens=256,
        rollout_batch=16,
        warmup=1,
        repeats=2,
        update_shape=(8, 512),
    ),
    "smollm2": dict(
        model="smollm2-shape",
        device="cuda",
        prompts=2,
        samples=8,
        new_tokens=256,
        rollout_batch=16,
        warmup=1,
        repeats=2,
        paths=("miniverl_fast", "miniverl_fast_bf16", "trl"),
        update_paths=(),
    ),
}
for name, kw in runs.items():
    d = root / name
    cells = json.loads((d / "grpo.partial.json").read_text())["cells"]
    report = {
        "options": asdict(GrpoBenchOptions(**kw)),
        "device": "cuda",
        "device_name": "NVIDIA H200",
        "dtype": "bfloat16",
        "torch": "2.11.0+cu130",
        "transformers": "5.17.0",
        "peft": "0.21.0",
        "trl": "1.16.0",
        "threads": 16,
        "cells": cells,
    }
    report["ratios"] = ratios(cells)
    report["goals"] = evaluate_grpo_goals(report)
    note = (
        "\n> Rendered after the call from `grpo.partial.json` (`python scripts/device/h200_bench_grpo_render.py "
        "docs/measurements/2026-12-01-h200-grpo-bench`): the run was stopped by its timeout during the `trl` "
        "cell (the last one), so `trl` has no row here; TRL was measured in a second call, `../smollm2-trl/`.\n"
    )
    (d / "grpo.md").write_text(render_grpo_markdown(report) + note)
    (d / "grpo.svg").write_text(render_grpo_svg(report))

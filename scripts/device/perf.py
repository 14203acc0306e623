"""Issue #33's benchmarks on the lent GPU, side by side in one process per run, from the product's own
``miniverl bench grpo`` (the README's performance table is rendered from what this writes).

What travels (one carry call beside the tracked tree): TRL 1.16.0 and the part of its closure the image lacks
(datasets, dill, multiprocess), liger-kernel 0.8.5, pydantic's four wheels (miniverl's config) and bitsandbytes
0.50.2, each pinned by the sha256 recorded when it was staged.

Subcommands:

- ``stage`` (here): ``pip download`` of :data:`PINS` (cp312 manylinux wheels) into ``.carry/perf/1/wheels`` and
  their sha256 into ``.carry/perf/1/SHA256SUMS``; prints the bytes the call will send;
- ``measure --out DIR [--what update,grpo,decode] [--runs 3]`` (device, carrying ``.carry/perf/1``): checks every
  wheel against ``SHA256SUMS``, installs them into a site of their own (``pip --no-index --no-deps --target``), then
  * ``update``: the Qwen3-0.6B-shape update, 8 x 512: naive HF+PEFT, miniverl bf16 + fp32 masters, the same with
    miniverl's fused kernels and with liger-kernel's, each without and with every layer checkpointed;
  * ``grpo``: the SmolLM2-shape GRPO step, 16 x 256, ``--runs`` separate processes (TRL's step moved from 10 s to
    15 s between runs on one machine): TRL's defaults, TRL with its liger switch, miniverl's fast path and its
    lean path under TRL's measured peak, with HF's modules, miniverl's fused kernels and liger-kernel's;
  * ``decode``: ``decode_kernel_timing.py`` (CUDA-graph replay, batch 16 and 64);
  each into ``DIR/<what>[-run-K]/`` (``grpo.json``, ``grpo.md``), with ``perf.log``/``perf.json`` (every command,
  its exit code and seconds) written after every step, so a call cut off at its limit still brings back what ran.

Each command's timeout keeps the call inside its ``--deadline-s`` (default 570 s of the 600 a call may run).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from steps import Steps, checkout_facts, sha256  # a sibling script, not a package

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / ".carry" / "perf" / "1"
SITE = Path(os.environ.get("PERF_SITE", "/tmp/perf-site"))
PINS = (
    "trl==1.16.0",
    "liger-kernel==0.8.5",
    "datasets==5.2.0",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "bitsandbytes==0.50.2",
)
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux_2_24_x86_64")
UPDATE_PATHS = ",".join(
    ("naive_hf_peft", "miniverl_update_bf16", "miniverl_update_bf16_fused", "miniverl_update_bf16_liger",
     "miniverl_update_bf16_compiled")
)  # fmt: skip
GRPO_PATHS = "trl,trl_liger,miniverl_fast,miniverl_lean,miniverl_lean_fused,miniverl_lean_liger,miniverl_lean_compiled"
CALL_BYTES = 64 * 2**20


def stage() -> int:
    wheels = STAGE / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    for old in wheels.iterdir():
        old.unlink()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", *platforms, "-d", str(wheels), *PINS],
        check=True,
    )  # fmt: skip
    files = sorted(wheels.glob("*.whl"))
    if len(files) != len(PINS):
        print(f"perf stage: {len(files)} wheels for {len(PINS)} pins", file=sys.stderr)
        return 1
    (STAGE / "SHA256SUMS").write_text("".join(f"{sha256(w)}  wheels/{w.name}\n" for w in files))
    tree = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    tree_bytes = sum(
        (REPO / n.decode()).stat().st_size for n in tree.split(b"\0") if n and (REPO / n.decode()).is_file()
    )
    total = tree_bytes + sum(w.stat().st_size for w in files)
    print(f"staged {len(files)} wheels; the call sends {total} bytes (limit {CALL_BYTES})")
    return 0 if total < CALL_BYTES else 1


def install(steps: Steps) -> bool:
    for line in (STAGE / "SHA256SUMS").read_text().splitlines():
        digest, name = line.split("  ", 1)
        if sha256(STAGE / name) != digest:
            steps.say(f"perf FAILED: {name} is not the staged wheel (sha256 differs)")
            return False
    wheels = [str(p) for p in sorted((STAGE / "wheels").glob("*.whl"))]
    argv = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(SITE), *wheels]
    return steps.step("install", argv, dict(os.environ), cap_s=120)


def bench(steps: Steps, name: str, out: Path, env: dict[str, str], *args: str) -> None:
    argv = [sys.executable, "-m", "miniverl", "bench", "grpo", "--device", "cuda", "--out", str(out / name), *args]
    steps.step(name, argv, env, cap_s=540)


def measure(out: Path, what: list[str], runs: int, deadline_s: float) -> int:
    out.mkdir(parents=True, exist_ok=True)
    checkout = checkout_facts(REPO)
    steps = Steps(
        REPO, out, time.monotonic() + deadline_s, "perf", commit=checkout["git_head"],
        tree_matches_commit=checkout["tree_matches_head"], what=what, runs=runs,
    )  # fmt: skip
    if not SITE.is_dir() and not install(steps):
        return 1
    env = {**os.environ, "PYTHONPATH": f"{SITE}:{REPO}"}
    for item in what:
        if item == "update":
            for ckpt in ("0", "1"):
                bench(steps, f"update-ckpt{ckpt}", out, env, "--model", "qwen3-0.6b-shape", "--paths", "",
                      "--update-paths", UPDATE_PATHS, "--update-shape", "8,512", "--activation-checkpointing", ckpt,
                      "--repeats", "5")  # fmt: skip
        elif item == "grpo":
            for run in range(1, runs + 1):
                bench(steps, f"grpo-run-{run}", out, env, "--model", "smollm2-shape", "--prompts", "2", "--samples",
                      "8", "--new-tokens", "256", "--paths", GRPO_PATHS, "--update-paths", "",
                      "--memory-budget-gib", "trl", "--repeats", "5")  # fmt: skip
        elif item == "decode":
            script = str(REPO / "scripts" / "device" / "decode_kernel_timing.py")
            steps.step("decode", [sys.executable, script], env, cap_s=300)
    steps.save()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("stage")
    run = sub.add_parser("measure")
    run.add_argument("--out", type=Path, required=True)
    run.add_argument("--what", default="update,grpo,decode", help="comma-separated: update, grpo, decode")
    run.add_argument("--runs", type=int, default=3, help="separate GRPO processes (>= 3: TRL's step is noisy)")
    run.add_argument("--deadline-s", type=float, default=570.0)
    args = parser.parse_args()
    if args.command == "stage":
        return stage()
    what = [w for w in args.what.split(",") if w]
    unknown = sorted(set(what) - {"update", "grpo", "decode"})
    if unknown:
        print(f"perf: unknown --what {', '.join(unknown)} (update, grpo, decode)", file=sys.stderr)
        return 2
    return measure(args.out, what, args.runs, args.deadline_s)


if __name__ == "__main__":
    sys.exit(main())

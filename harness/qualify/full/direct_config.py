"""v0.15 direct-config (issue 19): native verl 0.9 GRPO and PPO YAMLs with repeated passes, imported without an
edit (compiler v4), trained, extended, replayed tensor-exactly, handed off and diagnosed by verl 0.9.1, through
the installed CLI.

The two native files are ``harness/workloads/verl-native-grpo-2x2.yaml`` and ``harness/workloads/verl-native-ppo.yaml``
(byte-identical to the examples of the same names): the actor makes ``ppo_epochs`` 2 x (``train_batch_size`` 2 /
``ppo_mini_batch_size`` 1) = 4 optimizer steps per training step in both; the PPO critic ``critic.ppo_epochs`` 1 x
(2 / ``critic.ppo_mini_batch_size`` 1) = 2. For each file (cwd a fresh work dir): copy and hash it; ``plan
--verl-config`` it with runtime bindings only (the native file fixes the sizes: 2 prompts x 4 samples x 32 new
tokens, 2 steps); run its 2 cycles; ``inspect``; ``run --resume --extend 1``; ``inspect``. The replay: the same
native file with ``total_training_steps: 1``, run 1 cycle, then ``--resume --extend 1``: its step-2 adapter,
optimizer, RNG (and for PPO critic and critic optimizer) state must be byte-identical to the straight run's by the
harness's own sha256. ``handoff`` of the extended run, ``diagnose`` of the bundle in verl's own venv
(``ctx.verl_python``; none given: the launch check fails, never passes). The native file is hashed again at the end.

Counts: verl performs ``actor.ppo_epochs`` x ``train_batch_size / actor.ppo_mini_batch_size`` actor optimizer
steps per training step, and ``critic.ppo_epochs`` x ``train_batch_size / critic.ppo_mini_batch_size`` critic
steps (both batch sizes in prompts; verl multiplies each by ``rollout.n``). The judge reads those values from
the bundle's native diff (each equal to the native file's), requires them to give what this workload declares
(2 x 2 actor steps, 1 x 2 critic steps: harness code, never the evidence), the plan to hold them, and the optimizer
state to have made them: at each kept checkpoint of step k (the straight run's 1, 2 and 3, the replay's 2) every
parameter slot's AdamW ``step`` counter in ``optimizer.safetensors`` is k x 4 and in ``critic_optimizer.safetensors``
k x 2 (a GRPO checkpoint holds no critic state). The harness reads those counters itself from the bytes it hashed
(``statehash.optimizer_steps``), while the work dir exists, into ``state-hashes.json`` beside that sha256: the
optimizer files (megabytes each) are not kept, and each kept ``checkpoint-<k>.json`` must be the one the harness
read and list the same sha256. The runtime's own counters on every metrics line (``actor/updates``,
``actor/passes``, ``actor/mini_batches``; ``critic/...``) must agree.
"""

from __future__ import annotations

import hashlib
import shutil
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness.qualify.full import runs, statehash
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Context, Workload
from harness.qualify.full.direct_config_judge import judge
from harness.qualify.full.direct_config_layout import (
    CONFIGS,
    CYCLES,
    EVIDENCE,
    EXTEND,
    INPUTS,
    MODEL,
    NAME,
    PER_CONFIG,
    REPLAY_FIRST,
    REPLAY_LINE,
    TRAJECTORY_BATCH,
    Config,
    one_line_changed,
)


def bindings(ctx: Context) -> list[str]:
    """``--set`` runtime bindings (the only keys ``plan --verl-config`` accepts; the sizes are the native file's)."""
    values = (f"model={MODEL}", f"device={ctx.profile.device}", f"trajectory_batch_size={TRAJECTORY_BATCH}")
    return [arg for value in values for arg in ("--set", value)]


def run(ctx: Context) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def keep(role: str, path: Path | None) -> None:
        if path is not None:
            out[role] = path

    shutil.copyfile(ctx.work / ctx.data, ctx.work / "prompts.parquet")  # the native data.train_files
    keep("diagnose_environment", wt.write_evidence(ctx, "diagnose-environment.json", wt.diagnose_environment(ctx)))
    taken: dict[str, statehash.Taken | None] = {}
    # Each config drives its own CLI driver (distinct files in the work dir); the transcript keeps CONFIGS' order.
    forks = [replace(ctx, cli=ctx.cli.fork()) for _ in CONFIGS]
    if ctx.scale.side_by_side:
        with ThreadPoolExecutor(max_workers=len(CONFIGS), thread_name_prefix="direct-config") as pool:
            list(pool.map(lambda fork, config: _run_config(fork, config, keep, taken), forks, CONFIGS))
    else:
        for fork, config in zip(forks, CONFIGS, strict=True):
            _run_config(fork, config, keep, taken)
    for fork in forks:
        ctx.cli.results.extend(fork.cli.results)
    keep("state_hashes", statehash.write_taken(wt.evidence_dir(ctx) / "state-hashes.json", taken))
    return out


def _run_config(
    ctx: Context, c: Config, keep: Callable[[str, Path | None], None], taken: dict[str, statehash.Taken | None]
) -> None:
    cli, work = ctx.cli, ctx.work
    native = work / c.native
    shutil.copyfile(INPUTS / c.native, native)
    before = hashlib.sha256(native.read_bytes()).hexdigest()
    (work / c.replay).write_bytes(one_line_changed(native.read_bytes(), *REPLAY_LINE, c.native))
    sets = bindings(ctx)

    def member(role: str) -> str:
        return f"{c.key}/{PER_CONFIG[role]}"

    def keep_checkpoint(run_dir: Path, step: int, role: str) -> None:
        """Keep the run's step-``step`` checkpoint.json and take the harness's hashes and optimizer step counters
        of the files it lists, now (a later resume prunes old checkpoints)."""
        directory = wt.checkpoint_dir(run_dir, step)
        keep(c.role(role), wt.keep_file(ctx, directory / "checkpoint.json", member(role)))
        taken[c.role(role)] = statehash.take(directory, steps=True)

    def plan(step: str, source: str, dest: str) -> Any:
        argv = ["plan", "--verl-config", source, *sets, "--out", dest, "--json"]
        return cli(c.step(step), argv, timeout=runs.PLAN_TIMEOUT)

    def train(step: str, plan_file: str, run_id: str, *extra: str) -> Any:
        argv = ["run", "--plan", plan_file, "--output", "runs", "--run-id", run_id, *extra, "--json"]
        return cli(c.step(step), argv, timeout=runs.RUN_TIMEOUT)

    plan_file = f"plan-{c.key}.json"
    planned = plan("plan", c.native, plan_file)
    keep(c.role("plan_output"), wt.keep_json(ctx, planned, member("plan_output")))
    keep(c.role("plan"), wt.keep_file(ctx, work / plan_file, member("plan")) if planned.ok else None)
    run_dir, replay_dir = work / "runs" / c.run_id, work / "runs" / c.replay_id
    if planned.ok:
        keep(c.role("run_output"), wt.keep_json(ctx, train("run", plan_file, c.run_id), member("run_output")))
        for step in range(1, CYCLES + 1):  # before the resume goes on from them (and prunes the first)
            keep_checkpoint(run_dir, step, f"checkpoint_{step}")
        inspect = ["inspect", f"runs/{c.run_id}", "--json"]
        keep(c.role("inspect_2"), wt.keep_json(ctx, cli(c.step("inspect_2"), inspect), member("inspect_2")))
        resumed = train("resume_extend", plan_file, c.run_id, "--resume", "--extend", str(EXTEND))
        keep(c.role("resume_output"), wt.keep_json(ctx, resumed, member("resume_output")))
        keep_checkpoint(run_dir, CYCLES + EXTEND, f"checkpoint_{CYCLES + EXTEND}")
        keep(c.role("inspect_3"), wt.keep_json(ctx, cli(c.step("inspect_3"), inspect), member("inspect_3")))
    keep(c.role("summary"), wt.keep_file(ctx, run_dir / "summary.json", member("summary")))
    keep(c.role("metrics"), wt.keep_file(ctx, run_dir / "metrics.jsonl", member("metrics")))
    replay_plan = f"plan-{c.key}-replay.json"
    if plan("plan_replay", c.replay, replay_plan).ok:
        first = train("run_replay", replay_plan, c.replay_id)
        keep(c.role("replay_first_output"), wt.keep_json(ctx, first, member("replay_first_output")))
        if first.ok:
            train("resume_replay", replay_plan, c.replay_id, "--resume", "--extend", str(CYCLES - REPLAY_FIRST))
    keep(c.role("replay_summary"), wt.keep_file(ctx, replay_dir / "summary.json", member("replay_summary")))
    keep(c.role("replay_metrics"), wt.keep_file(ctx, replay_dir / "metrics.jsonl", member("replay_metrics")))
    keep_checkpoint(replay_dir, CYCLES, "replay_checkpoint_2")
    bundle_dir = f"bundle-{c.key}"
    handoff = cli(c.step("handoff"), ["handoff", f"runs/{c.run_id}", "--out", bundle_dir, "--json"], timeout=1800)
    keep(c.role("handoff"), wt.keep_json(ctx, handoff, member("handoff")))
    bundle = work / bundle_dir
    keep(c.role("bundle_manifest"), wt.keep_file(ctx, bundle / "manifest.json", member("bundle_manifest")))
    keep(c.role("native_diff"), wt.keep_file(ctx, bundle / "native-diff.json", member("native_diff")))
    keep(c.role("bundle_native"), wt.keep_file(ctx, bundle / "native" / c.native, member("bundle_native")))
    if ctx.verl_python is not None and handoff.ok:
        argv = ["diagnose", bundle_dir, "--json"]
        result = wt.run_module(ctx, c.step("diagnose"), Path(ctx.verl_python), argv)
        report = result.json()  # kept with a blocker too (exit 1): the judge names it
        keep(c.role("diagnose"), wt.write_evidence(ctx, member("diagnose"), report) if report is not None else None)
    after = hashlib.sha256(native.read_bytes()).hexdigest()
    record = {"file": c.native, "sha256_before": before, "sha256_after": after}
    keep(c.role("native_sha256"), wt.write_evidence(ctx, member("native_sha256"), record))


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

"""v0.13 PPO/RM/handoff (issue 11): PPO with a critic and a reward-model role, through the installed CLI, on the models
the profile's scale declares (the seed's Qwen3-0.6B and DistilBERT SST-2 classifier at their pinned hub revisions on
the release card; SmolLM2 and the tiny seeded classifier standing in elsewhere, which the record says: ``actor_updates``
and ``reward_model`` require the plan to have used exactly the declared student and reward model); GAE re-derived
from the evidence; a real interruption inside the second update's actor pass and a tensor-exact resume of actor,
critic and optimizers (by the harness's own sha256 of the checkpoint files, taken before the work dir goes); a verl
0.9 handoff bundle diagnosed locally. On a CPU profile the reward model's offload after each scoring phase measures
nothing: ``reward_model_offloaded`` is not applicable there.

Steps: plan (2 cycles) of ``harness/workloads/ppo-rm-handoff.yaml`` at the scale's sizes; run it straight
(``ppo-two``); run it again (``ppo-resumed``) as a child whose stderr the harness reads, and send it SIGTERM as soon
as it prints ``cycle 2/2 actor_pass`` (the product announces each pass); record what the stop left (the
checkpoints, the harness's hashes of the one kept, no temp files, the exit code, the stderr); ``run --resume`` it
to the end; ``handoff`` of the straight run; ``diagnose`` of the bundle with ``ctx.verl_python -m miniverl``
(verl's own venv; none given: the handoff check fails, never passes). The PPO config runs without NF4 on every
profile: verl cannot express NF4, and the handoff compiler refuses what verl cannot express.

Checks: ``gae_nontrivial`` recomputes each update's advantages, returns and whitened advantages from the GAE rows
the trajectory records keep (``harness/qualify/full/gae.py``, gamma and lambda from the plan);
``resume_tensor_exact`` judges the interruption (``harness/qualify/full/interruption.py``), the checkpoint it left
(byte-identical to the straight run's step 1) and the resumed run's final actor, critic and optimizer tensors
(byte-identical to the straight run's).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from harness.core.jsonio import sha256_file
from harness.core.records import SHA256_HEX, Profile
from harness.qualify.full import gae, interruption, runs, statehash
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.reading import count, file_sha256, finite, read_json, read_jsonl

NAME = "ppo-rm-handoff"
YAML = "ppo-rm-handoff.yaml"
FOLDER = "v013/ppo-rm-handoff"
CYCLES = 2
RUN_TWO, RUN_RESUMED = "ppo-two", "ppo-resumed"
RUN_ARGS = ["run", "--plan", "plan.json", "--output", "runs", "--run-id"]
INTERRUPTED_STEP = "run_interrupted"
# The roles whose model the profile's scale declares: the seed's Qwen3-0.6B and DistilBERT reward model on the release
# card (fetched at their pinned revisions), SmolLM2 and the tiny seeded classifier standing in elsewhere.
MODEL_ROLES = ("student", "reward")
OFFLOAD_NOT_MEASURED = (
    "cpu profile: the reward model never leaves a GPU it was never on, so offloaded_after_phase measures nothing"
)
ACTOR_FILES = ("adapter/adapter_model.safetensors", "student_params.safetensors")
CRITIC_FILES = ("critic_params.safetensors", "critic/adapter_model.safetensors")

# role -> its name under the workload's evidence folder (and its archive member under FOLDER)
MEMBERS = {
    "transcript": "transcript.json",
    "plan": "plan.json",
    "summary": "run/summary.json",
    "metrics": "run/metrics.jsonl",
    "checkpoint_1": "run/checkpoint-1.json",
    "checkpoint_2": "run/checkpoint-2.json",
    "trajectories_1": "run/cycle-000001.jsonl",
    "trajectories_2": "run/cycle-000002.jsonl",
    "resumed_summary": "resumed/summary.json",
    "resumed_metrics": "resumed/metrics.jsonl",
    "resumed_checkpoint_2": "resumed/checkpoint-2.json",
    "interrupt": "resumed/interrupt.json",
    "interrupted_stderr": "resumed/interrupted-stderr.txt",
    "interrupted_checkpoint_1": "resumed/checkpoint-1-after-interrupt.json",
    "resumed_trajectories_1": "resumed/cycle-000001.jsonl",
    "resumed_trajectories_2": "resumed/cycle-000002.jsonl",
    "handoff": "handoff.json",
    "bundle_manifest": "bundle-manifest.json",
    "diagnose_environment": "diagnose-environment.json",
    "diagnose": "diagnose.json",
    "state_hashes": "state-hashes.json",
}
EVIDENCE = {role: f"{FOLDER}/{member}" for role, member in MEMBERS.items()}
LOCK_NAME = ".lock"  # the product's run-directory lock, held for the process's life: not a half-written file


def run(ctx: Context) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def keep(role: str, path: Path | None) -> None:
        if path is not None:
            out[role] = path

    shutil.copyfile(wt.WORKLOADS / YAML, ctx.work / YAML)
    models = [arg for value in runs.model_sets(ctx.scale, MODEL_ROLES) for arg in ("--set", value)]
    sets = [*wt.scale_sets(ctx.scale), "--set", f"data.path={ctx.data}", *models]
    cli = ctx.cli
    plan = cli("plan", ["plan", YAML, *sets, "--out", "plan.json", "--json"], timeout=600)
    keep("plan", wt.keep_file(ctx, ctx.work / "plan.json", "plan.json") if plan.ok else None)
    cli("run", [*RUN_ARGS, RUN_TWO, "--json"], timeout=3600)
    resumed = ctx.work / "runs" / RUN_RESUMED
    # no --json: the progress lines on stderr are the events the harness waits for
    stopped = cli.interrupt(
        INTERRUPTED_STEP, [*RUN_ARGS, RUN_RESUMED], wait_for_line=interruption.event_marker(CYCLES, CYCLES),
        # a GPU's actor pass of one mini-batch can take tens of milliseconds: look for the line every millisecond
        timeout=3600, poll_seconds=0.001,
    )  # fmt: skip
    left_checkpoint = wt.checkpoint_dir(resumed, CYCLES - 1)
    taken_after_interrupt = statehash.take(left_checkpoint)
    left_listing = wt.keep_file(ctx, left_checkpoint / "checkpoint.json", MEMBERS["interrupted_checkpoint_1"])
    keep("interrupted_checkpoint_1", left_listing)
    keep("interrupt", wt.write_evidence(ctx, MEMBERS["interrupt"], {
        "signal": stopped.signal, "signalled": stopped.signalled, "wait_for": stopped.wait_for,
        "event": stopped.event, "exit_code": stopped.result.invocation.exit_code, **_left_behind(resumed),
    }))  # fmt: skip
    stderr = wt.evidence_dir(ctx) / MEMBERS["interrupted_stderr"]
    stderr.parent.mkdir(parents=True, exist_ok=True)
    stderr.write_text(cli.redact.text(stopped.result.stderr.decode("utf-8", "replace")), encoding="utf-8")
    keep("interrupted_stderr", stderr)
    cli("resume", [*RUN_ARGS, RUN_RESUMED, "--resume", "--json"], timeout=3600)
    for prefix, run_id in (("", RUN_TWO), ("resumed_", RUN_RESUMED)):
        run_dir = ctx.work / "runs" / run_id
        folder = "resumed" if prefix else "run"
        keep(f"{prefix}summary", wt.keep_file(ctx, run_dir / "summary.json", f"{folder}/summary.json"))
        keep(f"{prefix}metrics", wt.keep_file(ctx, run_dir / "metrics.jsonl", f"{folder}/metrics.jsonl"))
        for step in range(1, CYCLES + 1):
            name = f"cycle-{step:06d}.jsonl"
            keep(f"{prefix}trajectories_{step}", wt.keep_file(ctx, run_dir / "trajectories" / name, f"{folder}/{name}"))
            if prefix and step < CYCLES:
                continue
            source = wt.checkpoint_dir(run_dir, step) / "checkpoint.json"
            keep(f"{prefix}checkpoint_{step}", wt.keep_file(ctx, source, f"{folder}/checkpoint-{step}.json"))
    straight = ctx.work / "runs" / RUN_TWO
    taken = {
        "checkpoint_1": statehash.take(wt.checkpoint_dir(straight, 1)),
        "checkpoint_2": statehash.take(wt.checkpoint_dir(straight, CYCLES)),
        "resumed_checkpoint_2": statehash.take(wt.checkpoint_dir(resumed, CYCLES)),
        "interrupted_checkpoint_1": taken_after_interrupt,
    }
    keep("state_hashes", statehash.write_taken(wt.evidence_dir(ctx) / "state-hashes.json", taken))
    handoff = cli("handoff", ["handoff", f"runs/{RUN_TWO}", "--out", "bundle", "--json"], timeout=1800)
    keep("handoff", wt.keep_json(ctx, handoff, "handoff.json"))
    keep("bundle_manifest", wt.keep_file(ctx, ctx.work / "bundle" / "manifest.json", "bundle-manifest.json"))
    keep("diagnose_environment", wt.write_evidence(ctx, "diagnose-environment.json", wt.diagnose_environment(ctx)))
    if ctx.verl_python is not None and handoff.ok:
        result = wt.run_module(ctx, "diagnose", Path(ctx.verl_python), ["diagnose", "bundle", "--json"])
        report = result.json()  # kept with a blocker too (exit 1): the judge names it
        keep("diagnose", wt.write_evidence(ctx, "diagnose.json", report) if report is not None else None)
    return out


def _left_behind(run_dir: Path) -> dict[str, Any]:
    """What a stopped run left in its directory, as the harness finds it: the checkpoints and trajectory files, any
    temp file or directory (a write the stop cut short), the metrics lines and whether a summary was written."""
    checkpoints = run_dir / "checkpoints"
    trajectories = run_dir / "trajectories"
    temp = sorted(
        p.relative_to(run_dir).as_posix()
        for p in run_dir.rglob("*")
        if p.name != LOCK_NAME and (p.name.startswith(".") or ".tmp" in p.name)
    )
    metrics = run_dir / "metrics.jsonl"
    return {
        "checkpoints_after": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else [],
        "trajectories_after": sorted(p.name for p in trajectories.iterdir()) if trajectories.is_dir() else [],
        "temp_entries_after": temp,
        "metrics_lines_after": metrics.read_bytes().count(b"\n") if metrics.is_file() else 0,
        "summary_written": (run_dir / "summary.json").exists(),
    }


# ----------------------------------------------------------------------------------------------- judge


def _lines(evidence: dict[str, Path], role: str) -> list[dict[str, Any]] | None:
    rows = wt.metrics(evidence.get(role), "ppo")
    return rows if rows is not None and wt.steps_of(rows) == list(range(1, CYCLES + 1)) else None


def _positive(value: float | None) -> bool:
    return value is not None and value > 0


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    inv = wt.transcript_invocations(evidence.get("transcript"))
    lines = _lines(evidence, "metrics")
    summary = read_json(evidence.get("summary"))
    plan = read_json(evidence.get("plan"))
    ran, ran_why = wt.step_ok(inv, "run")
    completed = (
        summary is not None
        and plan is not None
        and isinstance(plan.get("plan_digest"), str)
        and summary.get("plan_digest") == plan["plan_digest"]
        and summary.get("status") == "completed"
        and summary.get("algorithm") == "ppo"
        and count(summary.get("updates")) == CYCLES
    )
    sized, sized_why = runs.planned_as_declared(plan, runs.declared_sizes(scale), profile)
    base = (
        f"{ran_why}; summary of plan {'plan.json' if completed else 'not plan.json or missing'}, "
        f"status {summary.get('status') if summary else None!r}, "
        f"updates {summary.get('updates') if summary else None}; {sized_why}; "
        + ("metrics steps 1..2" if lines is not None else "metrics.jsonl missing, unreadable or not steps 1..2")
    )
    ok_base = ran and completed and sized and lines is not None
    students, students_why = runs.models_as_declared(j, plan, scale, ("student",))
    rewards, rewards_why = runs.models_as_declared(j, plan, scale, ("reward",))
    rows = lines or []

    actor_deltas = [finite(line.get("adapter_delta_norm")) for line in rows]
    actor_steps = [wt.algo_metric(line, "actor/updates") for line in rows]
    moved, moved_why = wt.changed(evidence, "checkpoint_1", "checkpoint_2", ACTOR_FILES)
    j.check(
        "actor_updates",
        ok_base
        and students
        and all(_positive(d) for d in actor_deltas)
        and all(_positive(s) for s in actor_steps)
        and moved,
        f"{base}; {students_why}; adapter_delta_norm {actor_deltas}, actor optimizer steps per update {actor_steps}; "
        f"actor checkpoint step 1 -> 2: {moved_why}",
    )

    critic_deltas = [wt.algo_metric(line, "critic/delta_norm") for line in rows]
    critic_steps = [wt.algo_metric(line, "critic/updates") for line in rows]
    c_moved, c_why = wt.changed(evidence, "checkpoint_1", "checkpoint_2", CRITIC_FILES)
    j.check(
        "critic_updates",
        ok_base and all(_positive(d) for d in critic_deltas) and all(_positive(s) for s in critic_steps) and c_moved,
        f"{base}; critic/delta_norm {critic_deltas}, critic optimizer steps per update {critic_steps}; "
        f"critic checkpoint step 1 -> 2: {c_why}",
    )

    updates = [gae.judge_update(evidence.get(f"trajectories_{step}"), step, plan) for step in range(1, CYCLES + 1)]
    committed = [
        _committed(evidence, "checkpoint_2", evidence.get(f"trajectories_{s}"), s) for s in range(1, CYCLES + 1)
    ]
    j.check(
        "gae_nontrivial",
        ok_base and all(ok for ok, _ in updates) and all(committed),
        f"{base}; "
        + "; ".join(
            f"update {step}: {why}, trajectories {'committed by checkpoint 2' if bound else 'NOT checkpointed'}"
            for step, ((_, why), bound) in enumerate(zip(updates, committed, strict=True), start=1)
        ),
    )

    resumed = _lines(evidence, "resumed_metrics")
    resumed_summary = read_json(evidence.get("resumed_summary"))
    stopped, stopped_why = interruption.judge(evidence, inv, INTERRUPTED_STEP, CYCLES, CYCLES)
    kept, kept_why = wt.replay_exact(evidence, "checkpoint_1", "interrupted_checkpoint_1", "ppo")
    resume_ok, resume_why = wt.step_ok(inv, "resume")
    exact, exact_why = wt.replay_exact(evidence, "checkpoint_2", "resumed_checkpoint_2", "ppo")
    resumed_done = (
        resumed_summary is not None
        and resumed_summary.get("status") == "completed"
        and count(resumed_summary.get("updates")) == CYCLES
        and resumed_summary.get("resumed_from_step") == CYCLES - 1
        and plan is not None
        and resumed_summary.get("plan_digest") == plan.get("plan_digest")
    )
    finished = resumed is not None and resumed_done
    j.check(
        "resume_tensor_exact",
        ran and stopped and kept and resume_ok and finished and exact,
        f"{stopped_why}; the checkpoint it left vs the straight run's step 1: {kept_why}; {resume_why}, resumed run "
        + ("completed from step 1 with metrics steps 1..2" if finished else "incomplete or not resumed from step 1")
        + f"; straight 2-cycle run vs interrupted + --resume: {exact_why}",
    )

    rm_ok, rm_why = _reward_model(evidence, rows, resumed or [])
    j.check("reward_model", ok_base and resumed is not None and rm_ok and rewards, f"{rewards_why}; {rm_why}")
    if profile.device == "cuda":
        off_ok, off_why = _offloaded(rows, resumed or [])
        j.check("reward_model_offloaded", ok_base and resumed is not None and off_ok, off_why)
    else:
        j.not_applicable("reward_model_offloaded", OFFLOAD_NOT_MEASURED)

    h_ok, h_why = _handoff(evidence, inv)
    j.check("handoff", h_ok, h_why)

    diagnosed = read_json(evidence.get("diagnose")) or {}
    j.metrics.update(
        reward_source=str(runs.section(plan, "models", "reward").get("source"))[:20] if plan else None,
        launch_status=str(diagnosed.get("launch_status"))[:40] if diagnosed else None,
        verl_version=str(diagnosed.get("verl_version"))[:20] if diagnosed else None,
        updates=count(summary.get("updates")) if summary else None,
        reward_mean=finite(summary.get("reward_mean")) if summary else None,
        wall_seconds_run=finite(summary.get("wall_seconds")) if summary else None,
        actor_delta_norm_last=actor_deltas[-1] if actor_deltas else None,
        critic_delta_norm_last=critic_deltas[-1] if critic_deltas else None,
    )
    return j


def _rm_scores(path: Path | None) -> list[float] | None:
    rows = read_jsonl(path)
    if not rows:
        return None
    scores: list[float] = []
    for row in rows:
        comps = row.get("reward_components")
        value = finite(comps.get("reward_model")) if isinstance(comps, dict) else None
        if value is None:
            return None
        scores.append(value)
    return scores


def _reward_model(
    evidence: dict[str, Path], rows: list[dict[str, Any]], resumed: list[dict[str, Any]]
) -> tuple[bool, str]:
    """Scores nonconstant within each cycle, identical in two independent processes (the 2-cycle run and the
    resumed run score the same trajectories), and the trajectories files are the ones the checkpoints commit
    (the harness's sha256 of each kept file is the digest the checkpoint.json names, and that checkpoint.json
    states the harness's own digests of its files)."""
    why: list[str] = []
    ok = True
    for step in range(1, CYCLES + 1):
        a_path, b_path = evidence.get(f"trajectories_{step}"), evidence.get(f"resumed_trajectories_{step}")
        a, b = _rm_scores(a_path), _rm_scores(b_path)
        committed = _committed(evidence, "checkpoint_2", a_path, step) and _committed(
            evidence, "resumed_checkpoint_2", b_path, step
        )
        distinct = len(set(a)) if a else 0
        same = a is not None and a == b
        ok = ok and committed and same and distinct >= 2
        why.append(
            f"cycle {step}: {len(a) if a else 0} reward-model scores, {distinct} distinct, "
            f"{'identical' if same else 'NOT identical'} in the resumed run, trajectories "
            f"{'committed by the checkpoints' if committed else 'not the checkpointed files'}"
        )
    for label, lines in (("run", rows), ("resumed", resumed)):
        std = [wt.algo_metric(line, "reward_model/std") for line in lines]
        ok = ok and len(lines) == CYCLES and all(_positive(s) for s in std)
        why.append(f"{label}: reward_model/std {std}")
    return ok, "; ".join(why)


def _offloaded(rows: list[dict[str, Any]], resumed: list[dict[str, Any]]) -> tuple[bool, str]:
    """The reward model left the GPU after each scoring phase, in both runs (CUDA only: on the CPU it never
    was on a GPU, so the figure measures nothing there)."""
    ok, why = True, []
    for label, lines in (("run", rows), ("resumed", resumed)):
        off = [wt.algo_metric(line, "reward_model/offloaded_after_phase") for line in lines]
        ok = ok and len(lines) == CYCLES and all(o == 1.0 for o in off)
        why.append(f"{label}: reward_model/offloaded_after_phase {off}")
    return ok, "; ".join(why)


def _committed(evidence: dict[str, Path], checkpoint: str, trajectories: Path | None, step: int) -> bool:
    doc = read_json(evidence.get(checkpoint))
    listed = doc.get("trajectories") if doc is not None else None
    if not isinstance(listed, dict) or trajectories is None or read_jsonl(trajectories) is None:
        return False
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    told, _ = statehash.product_agrees(hashes, checkpoint, evidence.get(checkpoint))
    return told and listed.get(f"cycle-{step:06d}.jsonl") == file_sha256(trajectories)


def _handoff(evidence: dict[str, Path], inv: list[dict[str, Any]] | None) -> tuple[bool, str]:
    env = read_json(evidence.get("diagnose_environment"))
    if env is not None and env.get("verl_python") is None:
        return False, f"not diagnosed: {str(env.get('reason'))[:200]}"
    h_ok, h_why = wt.step_ok(inv, "handoff")
    d_ok, d_why = wt.step_ok(inv, "diagnose")
    handoff = read_json(evidence.get("handoff"))
    manifest = read_json(evidence.get("bundle_manifest"))
    diagnose = read_json(evidence.get("diagnose"))
    if handoff is None or manifest is None or diagnose is None or env is None:
        missing = [
            n
            for n, v in (("handoff", handoff), ("manifest", manifest), ("diagnose", diagnose), ("environment", env))
            if v is None
        ]
        return False, f"{h_why}; {d_why}; missing or unreadable: {missing}"
    digests = [handoff.get(k) for k in ("ir_digest", "rules_digest")]
    hex_ok = all(isinstance(d, str) and SHA256_HEX.match(d) for d in digests)
    agree = all(
        doc.get(k) == handoff.get(k) for doc in (manifest, diagnose) for k in ("ir_digest", "rules_digest", "compiler")
    )
    manifest_ok = (
        isinstance(manifest.get("files"), dict)
        and bool(manifest["files"])
        and handoff.get("manifest_sha256") == sha256_file(evidence["bundle_manifest"])
    )
    status = diagnose.get("launch_status")
    ok = (
        h_ok
        and d_ok
        and handoff.get("compiler") == wt.VERL_COMPILER_PPO
        and hex_ok
        and agree
        and manifest_ok
        and status == "ready"
        and diagnose.get("verl_version") == wt.VERL_VERSION
    )
    return ok, (
        f"{h_why}; {d_why} in {env.get('verl_python')} ({env.get('reason')}), verl "
        f"{str(diagnose.get('verl_version'))[:20]} (want {wt.VERL_VERSION}); compiler {handoff.get('compiler')!r} "
        f"(want {wt.VERL_COMPILER_PPO!r}); IR/rules digests {'64-hex' if hex_ok else 'malformed'} and "
        f"{'equal' if agree else 'NOT equal'} in handoff, manifest and diagnose; manifest "
        f"{'lists its files and matches the handoff sha256' if manifest_ok else 'does not match'}; "
        f"launch_status {str(status)[:60]!r}"
    )


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

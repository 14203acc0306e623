"""``smollm2``: the embedded SmolLM2 canonical resume workload (principal record qualification-smollm2.json).

Run A: the 2-cycle plan, uninterrupted. Run B: the same plan, started as a child process and sent SIGTERM as soon
as its first checkpoint committed (``checkpoints/step-000001/checkpoint.json`` exists); it must stop with the
documented interrupted exit (130), and ``miniverl run --resume`` must finish it. The final checkpoints of A and B
must hold the same adapter, optimizer and RNG state (the harness's own sha256 of the files, taken before the
work dir goes; each checkpoint.json must state exactly those digests), and B's metrics lines must equal
A's in everything but time and memory figures.
"""

from __future__ import annotations

from pathlib import Path

from harness.core.records import Profile
from harness.qualify.full import runs
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.cuda_memory import judge_cuda
from harness.qualify.full.reading import count, read_json

NAME = "smollm2"
YAML = "smollm2-resume.yaml"
CYCLES = 2
INTERRUPT_AFTER = 1  # the checkpoint step whose commit triggers SIGTERM
INTERRUPTED_EXIT = 130  # docs: SIGTERM stops a run as Ctrl-C does
FOLDER = "v011/smollm2"
RUN_ARGS = ["--output", "runs", "--json"]

EVIDENCE = {
    "transcript": f"{FOLDER}/transcript.json",
    "plan_output": f"{FOLDER}/plan-output.json",
    "plan": f"{FOLDER}/plan.json",
    "a_summary": f"{FOLDER}/run-a/summary.json",
    "a_metrics": f"{FOLDER}/run-a/metrics.jsonl",
    "a_checkpoint": f"{FOLDER}/run-a/checkpoint.json",
    "interrupt": f"{FOLDER}/run-b/interrupt.json",
    "b_resume_output": f"{FOLDER}/run-b/resume-output.json",
    "b_summary": f"{FOLDER}/run-b/summary.json",
    "b_metrics": f"{FOLDER}/run-b/metrics.jsonl",
    "b_checkpoint": f"{FOLDER}/run-b/checkpoint.json",
    "state_hashes": f"{FOLDER}/state-hashes.json",
}
STEPS = {"plan": 0, "run_a": 0, "run_b_resume": 0}  # the interrupted step is judged by resume_tensor_exact


def run(ctx: Context) -> dict[str, Path]:
    planned, plan_output = runs.plan(
        ctx, "plan", YAML, "plan.json", [f"train.cycles={CYCLES}"], min_new_tokens=runs.GRPO_MIN_NEW_TOKENS
    )
    files: dict[str, Path] = {"plan_output": plan_output, "plan": ctx.work / "plan.json"}
    if planned.ok:
        runs.run(ctx, "run_a", "plan.json", "a")
        b = runs.run_dir(ctx, "b")
        stopped = ctx.cli.interrupt(
            "run_b_interrupted",
            ["run", "--plan", "plan.json", "--run-id", "b", *RUN_ARGS],
            wait_for=runs.checkpoint_json(b, INTERRUPT_AFTER).relative_to(ctx.work),
            timeout=runs.RUN_TIMEOUT,
        )
        files["interrupt"] = runs.save_json(
            ctx,
            "interrupt.json",
            {
                "signal": stopped.signal,
                "signalled": stopped.signalled,
                "wait_for": stopped.wait_for,
                "appeared_after_seconds": stopped.appeared_after_seconds,
                "exit_code": stopped.result.invocation.exit_code,
                "summary_written": (b / "summary.json").exists(),
                "metrics_lines_after_interrupt": _lines(b / "metrics.jsonl"),
            },
        )
        _, files["b_resume_output"] = runs.run(ctx, "run_b_resume", "plan.json", "b", "--resume")
    for label in ("a", "b"):
        d = runs.run_dir(ctx, label)
        files[f"{label}_summary"] = d / "summary.json"
        files[f"{label}_metrics"] = d / "metrics.jsonl"
        files[f"{label}_checkpoint"] = runs.checkpoint_json(d, CYCLES)
    files["state_hashes"] = runs.state_hashes(
        ctx, {f"{label}_checkpoint": runs.checkpoint_json(runs.run_dir(ctx, label), CYCLES).parent for label in "ab"}
    )
    return runs.existing(files)


def _lines(path: Path) -> int | None:
    try:
        return path.read_bytes().count(b"\n")
    except OSError:
        return None


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    a = runs.Run(evidence, "a_summary", "a_metrics", "grpo")
    b = runs.Run(evidence, "b_summary", "b_metrics", "grpo")
    steps_ok, steps_why = runs.steps_ok(evidence, STEPS)
    a_ok, a_why = a.completed(CYCLES)
    b_ok, b_why = b.completed(CYCLES)
    planned = (read_json(evidence.get("plan_output")) or {}).get("plan_digest")
    ran = [(r.summary or {}).get("plan_digest") for r in (a, b)]
    plan = read_json(evidence.get("plan"))
    same_plan = isinstance(planned, str) and ran == [planned, planned] and (plan or {}).get("plan_digest") == planned
    sizes = runs.declared_sizes(scale, min_new_tokens=runs.GRPO_MIN_NEW_TOKENS)
    sized, sized_why = runs.planned_as_declared(plan, sizes, profile)
    j.check(
        "run_completed",
        steps_ok and a_ok and b_ok and same_plan and sized,
        f"{steps_why}; run A: {a_why}; run B: {b_why}; both ran the planned plan_digest {same_plan}; {sized_why}",
    )

    stop = read_json(evidence.get("interrupt")) or {}
    exit_code = count(stop.get("exit_code"))
    interrupted = (
        stop.get("signal") == "SIGTERM"
        and stop.get("signalled") is True
        and exit_code == INTERRUPTED_EXIT
        and runs.exits(evidence).get("run_b_interrupted") == [INTERRUPTED_EXIT]
        and stop.get("summary_written") is False
        and count(stop.get("metrics_lines_after_interrupt")) == INTERRUPT_AFTER
    )
    resumed_from = (b.summary or {}).get("resumed_from_step")
    resume_out = read_json(evidence.get("b_resume_output")) or {}
    resumed = resume_out.get("status") == "completed" and "resumed" not in resume_out
    state_ok, state_why = runs.same_state(evidence, "a_checkpoint", "b_checkpoint", CYCLES)
    lines_ok, lines_why = runs.same_metrics(a, b)
    # Every update moved the adapter: the optimizer state the resume restores is not trivially zero.
    moved, deltas = runs.positive_each(a, "adapter_delta_norm")
    j.check(
        "resume_tensor_exact",
        interrupted and resumed and resumed_from == INTERRUPT_AFTER and state_ok and lines_ok and moved,
        f"run B: signal {runs.short(stop.get('signal'))!r} sent {stop.get('signalled') is True} after "
        f"{runs.short(stop.get('wait_for'))!r} appeared, exit {exit_code} (want {INTERRUPTED_EXIT}), summary "
        f"written {runs.short(stop.get('summary_written'))}, {runs.short(stop.get('metrics_lines_after_interrupt'))} "
        f"metrics lines left (want {INTERRUPT_AFTER}); `run --resume` {'trained on' if resumed else 'did not train'}"
        f", from step {runs.short(resumed_from)} "
        f"(want {INTERRUPT_AFTER}); {state_why}; {lines_why}; run A adapter delta norm per update {deltas}",
    )
    judge_cuda(j, profile, {"a": a.summary, "b": b.summary}, teardown=True, peak=False)
    runs.summary_metrics(j, "a", a)
    runs.summary_metrics(j, "b", b)
    j.metrics["interrupt_after_seconds"] = (
        stop.get("appeared_after_seconds") if isinstance(stop.get("appeared_after_seconds"), int | float) else None
    )
    return j


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

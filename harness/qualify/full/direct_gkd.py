"""``direct-gkd``: GKD run directly from its config through the installed CLI (qualification-direct-gkd.json).

On-policy distillation with the forward-KL top-k objective (``distill.objective: topk_tail``, ``divergence:
forward_kl``) on the embedded SmolLM2, the teacher being the same frozen base with privileged context. Run A: two
cycles. Run B: one cycle, then ``run --resume --extend 1``. The final checkpoints must hold the same adapter,
optimizer and RNG state (by the harness's own sha256) and the metrics lines must agree; then ``miniverl export``
of run B must reload with PEFT within the harness's logit tolerance for the run's dtype.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.jsonio import sha256_file
from harness.core.records import Profile
from harness.qualify.full import runs
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.cuda_memory import judge_cuda
from harness.qualify.full.reading import finite, read_json
from harness.qualify.smoke_judge import RELOAD_TOLERANCE_MAX

NAME = "direct-gkd"
YAML = "direct-gkd.yaml"
CYCLES = 2
FIRST = 1  # run B's cycles before `--resume --extend`
FOLDER = "v011/direct-gkd"
EVIDENCE = {
    "transcript": f"{FOLDER}/transcript.json",
    "a_plan": f"{FOLDER}/run-a/plan.json",
    "a_summary": f"{FOLDER}/run-a/summary.json",
    "a_metrics": f"{FOLDER}/run-a/metrics.jsonl",
    "a_checkpoint": f"{FOLDER}/run-a/checkpoint.json",
    "b_first_output": f"{FOLDER}/run-b/first-output.json",
    "b_summary": f"{FOLDER}/run-b/summary.json",
    "b_metrics": f"{FOLDER}/run-b/metrics.jsonl",
    "b_checkpoint": f"{FOLDER}/run-b/checkpoint.json",
    "state_hashes": f"{FOLDER}/state-hashes.json",
    "export_output": f"{FOLDER}/export/export-output.json",
    "export_manifest": f"{FOLDER}/export/miniverl-manifest.json",
}
STEPS = {"plan": 0, "plan_first": 0, "run_a": 0, "run_b": 0, "run_b_extend": 0, "export": 0}


def run(ctx: Context) -> dict[str, Path]:
    files: dict[str, Path] = {}
    planned, _ = runs.plan(ctx, "plan", YAML, "plan.json", [f"train.cycles={CYCLES}"])
    first, _ = runs.plan(ctx, "plan_first", YAML, "plan-first.json", [f"train.cycles={FIRST}"])
    if planned.ok:
        runs.run(ctx, "run_a", "plan.json", "a")
    if first.ok:
        b_first, files["b_first_output"] = runs.run(ctx, "run_b", "plan-first.json", "b")
        if b_first.ok:
            runs.run(ctx, "run_b_extend", "plan-first.json", "b", "--resume", "--extend", str(CYCLES - FIRST))
            exported = ctx.cli("export", ["export", "runs/b", "--out", "export", "--json"], timeout=1800)
            files["export_output"] = runs.save_output(ctx, "export.json", exported)
            files["export_manifest"] = ctx.work / "export" / "miniverl-manifest.json"
    a, b = runs.run_dir(ctx, "a"), runs.run_dir(ctx, "b")
    files.update(
        a_plan=a / "plan.json",
        a_summary=a / "summary.json",
        a_metrics=a / "metrics.jsonl",
        a_checkpoint=runs.checkpoint_json(a, CYCLES),
        b_summary=b / "summary.json",
        b_metrics=b / "metrics.jsonl",
        b_checkpoint=runs.checkpoint_json(b, CYCLES),
    )
    files["state_hashes"] = runs.state_hashes(
        ctx, {"a_checkpoint": files["a_checkpoint"].parent, "b_checkpoint": files["b_checkpoint"].parent}
    )
    return runs.existing(files)


def gkd_config(plan: dict[str, Any] | None) -> tuple[bool, str]:
    """The plan that ran is OPD with the forward-KL top-k objective and a privileged-context teacher."""
    algorithm = runs.section(plan, "config", "algorithm")
    distill = runs.section(plan, "config", "algorithm", "distill")
    context = bool(runs.section(plan, "config", "models", "teacher", "privileged_context"))
    ok = (
        algorithm.get("name") == "opd"
        and distill.get("objective") == "topk_tail"
        and distill.get("divergence") == "forward_kl"
        and context
    )
    return ok, (
        f"plan: algorithm {runs.short(algorithm.get('name'))!r}, objective {runs.short(distill.get('objective'))!r}, "
        f"divergence {runs.short(distill.get('divergence'))!r}, privileged-context teacher {context}"
    )


def export_reload(evidence: dict[str, Path], dtype: Any) -> tuple[bool, str, float | None]:
    """Export's reload passed, its max |logit diff| <= its tolerance <= the harness ceiling for the dtype, and
    the manifest it wrote is the one it reported."""
    out = read_json(evidence.get("export_output"))
    reload = runs.section(out, "reload")
    diff, tol = finite(reload.get("max_abs_logit_diff")), finite(reload.get("tolerance"))
    ceiling = RELOAD_TOLERANCE_MAX.get(dtype) if isinstance(dtype, str) else None
    within = diff is not None and tol is not None and ceiling is not None and 0 <= diff <= tol <= ceiling
    manifest = evidence.get("export_manifest")
    reported = out.get("manifest_sha256") if out is not None else None
    try:
        manifest_ok = manifest is not None and manifest.is_file() and sha256_file(manifest) == reported
    except OSError:
        manifest_ok = False
    ok = reload.get("passed") is True and within and manifest_ok
    return (
        ok,
        f"PEFT reload passed {reload.get('passed') is True}, max |logit diff| {diff} (tolerance {tol}, at most "
        f"{ceiling} for {runs.short(dtype)}), manifest sha256 {'matches' if manifest_ok else 'differs or missing'}",
        diff,
    )


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    a = runs.Run(evidence, "a_summary", "a_metrics", "opd")
    b = runs.Run(evidence, "b_summary", "b_metrics", "opd")
    steps_ok, steps_why = runs.steps_ok(evidence, STEPS)
    a_ok, a_why = a.completed(CYCLES)
    b_ok, b_why = b.completed(CYCLES)
    plan = read_json(evidence.get("a_plan"))
    config_ok, config_why = gkd_config(plan)
    sized, sized_why = runs.planned_as_declared(plan, runs.declared_sizes(scale), profile)
    scored = a.why is None and all((finite(v) or 0.0) > 0 for v in a.column("kl")) and bool(a.lines)
    j.check(
        "run_completed",
        steps_ok and a_ok and b_ok and config_ok and sized and scored,
        f"{steps_why}; run A: {a_why}; run B: {b_why}; {config_why}; {sized_why}; forward KL per update "
        f"{[runs.short(v) for v in a.column('kl')][:8]} (want finite > 0)",
    )
    first = runs.section(read_json(evidence.get("b_first_output")), "summary")
    first_ok = first.get("status") == "completed" and first.get("updates") == FIRST
    resumed_from = (b.summary or {}).get("resumed_from_step")
    state_ok, state_why = runs.same_state(evidence, "a_checkpoint", "b_checkpoint", CYCLES)
    lines_ok, lines_why = runs.same_metrics(a, b)
    j.check(
        "resume_tensor_exact",
        first_ok and resumed_from == FIRST and state_ok and lines_ok,
        f"run B first ran {runs.short(first.get('updates'))} update(s) ({runs.short(first.get('status'))!r}), then "
        f"resumed from step {runs.short(resumed_from)} (want {FIRST}); {state_why}; {lines_why}",
    )
    ok, detail, diff = export_reload(evidence, (b.summary or {}).get("dtype"))
    j.check("export_reload", ok, detail)
    j.metrics["export_max_abs_logit_diff"] = diff
    judge_cuda(j, profile, {"a": a.summary, "b": b.summary}, teardown=False, peak=True)
    runs.summary_metrics(j, "a", a)
    runs.summary_metrics(j, "b", b)
    return j


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

"""``pg-k1``: policy gradient with the k1 KL estimator (principal record qualification-pg-k1.json).

GRPO on the embedded SmolLM2 with ``algorithm.grpo.kl_coef > 0`` and ``kl_estimator: k1`` (a KL loss term to the
frozen base as reference), two cycles. The judge checks the plan that ran really is that configuration, that
rewards vary within a group and advantages are nonzero, that every update changed the adapter, and that the KL
was measured: present and finite in every metrics line, and nonzero once the first update moved the student
away from the reference (before it the LoRA delta is zero, so the student equals the reference).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.core.records import Profile
from harness.qualify.full import runs
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.learning_signal import nonzero_advantages, reward_varies
from harness.qualify.full.reading import finite, read_json

NAME = "pg-k1"
YAML = "pg-k1.yaml"
CYCLES = 2
FOLDER = "v011/pg-k1"
EVIDENCE = {
    "transcript": f"{FOLDER}/transcript.json",
    "plan": f"{FOLDER}/plan.json",
    "summary": f"{FOLDER}/summary.json",
    "metrics": f"{FOLDER}/metrics.jsonl",
    "checkpoint_1": f"{FOLDER}/checkpoint-1.json",
    "checkpoint_2": f"{FOLDER}/checkpoint-2.json",
    "trajectories_1": f"{FOLDER}/cycle-000001.jsonl",
    "trajectories_2": f"{FOLDER}/cycle-000002.jsonl",
    "state_hashes": f"{FOLDER}/state-hashes.json",
}
STEPS = {"plan": 0, "run": 0}


def run(ctx: Context) -> dict[str, Path]:
    planned, _ = runs.plan(
        ctx,
        "plan",
        YAML,
        "plan.json",
        [f"train.cycles={CYCLES}", runs.KEEP_BOTH_CHECKPOINTS],
        min_new_tokens=runs.GRPO_MIN_NEW_TOKENS,
    )
    if planned.ok:
        runs.run(ctx, "run", "plan.json", "pg")
    return runs.existing(runs.cycle_evidence(ctx, runs.run_dir(ctx, "pg"), CYCLES))


def kl_config(plan: dict[str, Any] | None) -> tuple[bool, str]:
    """The plan that ran is GRPO with kl_coef > 0, the k1 estimator and a reference model."""
    algorithm = runs.section(plan, "config", "algorithm")
    grpo = runs.section(plan, "config", "algorithm", "grpo")
    reference = bool(runs.section(plan, "config", "models", "reference"))
    coef = finite(grpo.get("kl_coef"))
    ok = (
        algorithm.get("name") == "grpo"
        and coef is not None
        and coef > 0
        and grpo.get("kl_estimator") == "k1"
        and reference
    )
    return ok, (
        f"plan: algorithm {runs.short(algorithm.get('name'))!r}, kl_coef {coef}, "
        f"kl_estimator {runs.short(grpo.get('kl_estimator'))!r}, reference {reference}"
    )


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    r = runs.Run(evidence, "summary", "metrics", "grpo")
    steps_ok, steps_why = runs.steps_ok(evidence, STEPS)
    done, done_why = r.completed(CYCLES)
    plan = read_json(evidence.get("plan"))
    config_ok, config_why = kl_config(plan)
    sizes = runs.declared_sizes(scale, min_new_tokens=runs.GRPO_MIN_NEW_TOKENS)
    sized, sized_why = runs.planned_as_declared(plan, sizes, profile)
    j.check(
        "run_completed",
        steps_ok and done and config_ok and sized,
        f"{steps_why}; {done_why}; {config_why}; {sized_why}",
    )
    trajectories, kept_why = runs.kept_trajectories(evidence, CYCLES)
    reward_varies(j, r, trajectories, kept=kept_why)
    nonzero_advantages(j, r, trajectories, kept=kept_why)
    changed, changed_why = runs.adapter_changed_each_update(evidence, CYCLES)
    # secondary: what the run itself reports agrees with the harness's digests
    moved, deltas = runs.positive_each(r, "adapter_delta_norm")
    each = (r.summary or {}).get("adapter_changed_each_update")
    j.check(
        "adapter_changed",
        changed and moved and len(deltas) == CYCLES and each is True,
        f"harness digests: {changed_why}; run reports adapter delta norm per update {deltas}, "
        f"adapter_changed_each_update {each is True}",
    )
    kls = [finite(v) for v in r.column("kl")]
    later = kls[1:]
    measured = (
        r.why is None
        and len(kls) == CYCLES
        and all(v is not None for v in kls)
        and bool(later)
        and all(v is not None and v != 0 for v in later)
    )
    j.check(
        "kl_measured",
        measured,
        f"k1 KL per update {[runs.short(v) for v in r.column('kl')][:8]}: finite in every line, nonzero after the "
        "first update",
    )
    j.metrics["kl_last"] = kls[-1] if kls else None
    runs.summary_metrics(j, "run", r)
    return j


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

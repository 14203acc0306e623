"""``grpo-cycles`` (v0.12, subordinate record v012/grpo-cycles.json): two LoRA GRPO cycles on the profile's model.

The deterministic target-length formatting reward (plus the calculator's exact answer) on the student the profile's
scale declares (the seed's Qwen3-0.6B at its pinned revision on the release card; the embedded SmolLM2 standing in
elsewhere: ``two_updates_changed`` requires the plan to have used exactly that model), NF4 base weights where the
scale declares ``quantization: nf4``. Both updates must change the adapter
(the harness's own per-tensor digests of the adapter after each update) after rewards varied within a group and
advantages were nonzero (re-derived from the kept trajectories the checkpoint commits); on CUDA the peak reserved
memory stays under the profile's threshold. Then ``miniverl handoff RUN --out bundle --json`` must compile the run
into the verl plan ``verl-rl-v0.9-single-gpu-v1``, and say that the quantization it trained at is handed off as
none (NF4 is not carried over: verl 0.9 receives the full-precision base).
"""

from __future__ import annotations

from pathlib import Path

from harness.core.records import SHA256_HEX, Profile
from harness.qualify.full import runs
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.cuda_memory import judge_cuda
from harness.qualify.full.learning_signal import nonzero_advantages, reward_varies
from harness.qualify.full.reading import read_json

NAME = "grpo-cycles"
YAML = "grpo-cycles.yaml"
CYCLES = 2
COMPILER = "verl-rl-v0.9-single-gpu-v1"
FOLDER = "v012/grpo-cycles"
EVIDENCE = {
    "transcript": f"{FOLDER}/transcript.json",
    "plan": f"{FOLDER}/plan.json",
    "summary": f"{FOLDER}/summary.json",
    "metrics": f"{FOLDER}/metrics.jsonl",
    "handoff_output": f"{FOLDER}/handoff-output.json",
    "checkpoint_1": f"{FOLDER}/checkpoint-1.json",
    "checkpoint_2": f"{FOLDER}/checkpoint-2.json",
    "trajectories_1": f"{FOLDER}/cycle-000001.jsonl",
    "trajectories_2": f"{FOLDER}/cycle-000002.jsonl",
    "state_hashes": f"{FOLDER}/state-hashes.json",
}
MODEL_ROLES = ("student",)  # the rewards are rules: no reward model here


def run(ctx: Context) -> dict[str, Path]:
    files: dict[str, Path] = {}
    planned, _ = runs.plan(
        ctx,
        "plan",
        YAML,
        "plan.json",
        [f"train.cycles={CYCLES}", runs.KEEP_BOTH_CHECKPOINTS, *runs.model_sets(ctx.scale, MODEL_ROLES)],
        min_new_tokens=runs.GRPO_MIN_NEW_TOKENS,
        quantize=True,
    )
    if planned.ok:
        done, _ = runs.run(ctx, "run", "plan.json", "g")
        if done.ok:
            handed = ctx.cli("handoff", ["handoff", "runs/g", "--out", "bundle", "--json"], timeout=600)
            files["handoff_output"] = runs.save_output(ctx, "handoff.json", handed)
    files.update(runs.cycle_evidence(ctx, runs.run_dir(ctx, "g"), CYCLES))
    return runs.existing(files)


def handed_off(trained: str) -> dict[str, object]:
    """What ``handoff --json`` must say of the quantization of a run trained at ``trained``: verl receives the
    unquantized base, so NF4 is never carried over (rule ``nf4_not_carried_over``)."""
    return {"trained": trained, "handed_off": "none", "carried_over": trained == "none"}


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    r = runs.Run(evidence, "summary", "metrics", "grpo")
    trajectories, kept_why = runs.kept_trajectories(evidence, CYCLES)
    reward_varies(j, r, trajectories, kept=kept_why)
    nonzero_advantages(j, r, trajectories, kept=kept_why)
    done, done_why = r.completed(CYCLES)
    changed, changed_why = runs.adapter_changed_each_update(evidence, CYCLES)
    moved, deltas = runs.positive_each(r, "adapter_delta_norm")  # secondary: what the run reports agrees
    want_quant = scale.quantization or "none"
    plan = read_json(evidence.get("plan"))
    planned_quant = runs.section(plan, "config", "models", "student").get("quantization")
    ran_quant = (r.summary or {}).get("quantization")
    quant_ok = planned_quant == want_quant and ran_quant == want_quant
    sizes = runs.declared_sizes(scale, min_new_tokens=runs.GRPO_MIN_NEW_TOKENS)
    sized, sized_why = runs.planned_as_declared(plan, sizes, profile)
    exits = runs.exits(evidence).get("run")
    modelled, modelled_why = runs.models_as_declared(j, plan, scale, MODEL_ROLES)
    j.check(
        "two_updates_changed",
        done and changed and moved and len(deltas) == CYCLES and quant_ok and sized and modelled and exits == [0],
        f"run exit {exits}; {done_why}; harness digests: {changed_why}; run reports adapter delta norm per update "
        f"{deltas}; quantization planned "
        f"{runs.short(planned_quant)!r}, run {runs.short(ran_quant)!r} (the scale declares {want_quant!r}); "
        f"{sized_why}; {modelled_why}",
    )
    judge_cuda(j, profile, {"run": r.summary}, teardown=False, peak=True)
    out = read_json(evidence.get("handoff_output")) or {}
    compiler = out.get("compiler")
    handoff_exit = runs.exits(evidence).get("handoff")
    quantization = out.get("quantization")
    want_handoff = handed_off(want_quant)
    j.check(
        "verl_plan_compiled",
        handoff_exit == [0] and compiler == COMPILER and quantization == want_handoff,
        f"`miniverl handoff` exit {handoff_exit}, compiler {runs.short(compiler)!r} (want {COMPILER!r}), "
        f"quantization {quantization if isinstance(quantization, dict) and len(str(quantization)) < 200 else '?'} "
        f"(want {want_handoff}: verl 0.9 has no NF4 base, so an NF4 run is handed off on the full-precision base)",
    )
    carried = quantization.get("carried_over") if isinstance(quantization, dict) else None
    j.metrics["handoff_quantization_carried_over"] = carried if isinstance(carried, bool) else None
    for key in ("ir_digest", "rules_digest"):
        value = out.get(key)
        j.metrics[f"handoff_{key}"] = value if isinstance(value, str) and SHA256_HEX.match(value) else None
    runs.summary_metrics(j, "run", r)
    return j


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

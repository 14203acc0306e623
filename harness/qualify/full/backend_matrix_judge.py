"""The backend-matrix workload's judge: the 24 preregistered cells completed and conformant, re-judged from the
observed values in the gate's report (the gate's own verdict must agree, but it is not trusted alone); the speed
figure, the median of the per-pair ratios recomputed from every pair's recorded timings; CUDA teardown; and the refresh
checks of :mod:`harness.qualify.full.refresh`. See :mod:`harness.qualify.full.backend_matrix`."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

from harness.core import policy
from harness.core.proc import REPO_ROOT
from harness.core.records import Profile
from harness.qualify.full.backend_matrix_layout import (
    BENCH_STEP,
    COMPARISONS,
    GATE_MODEL,
    GATE_STEP,
    NAME,
    PREREGISTRATION,
    BackendMatrixPreregistration,
    SpeedBench,
    load_preregistration,
    refresh_module,
)
from harness.qualify.full.base import Judgement, Scale
from harness.qualify.full.reading import count, finite, read_json, transcript_steps


def _cells(doc: dict[str, Any] | None) -> list[dict[str, Any]] | None:
    cells = doc.get("cells") if doc is not None else None
    if not isinstance(cells, list) or not all(isinstance(c, dict) for c in cells):
        return None
    return cells


def _key(cell: dict[str, Any]) -> tuple[Any, Any, Any]:
    return (cell.get("objective"), cell.get("runtime"), cell.get("trajectory_batch_size"))


def _value_problems(cell: dict[str, Any]) -> list[str]:
    """The values conformance compares: finite loss, maxima and observations, and a physical plan."""
    obs = cell.get("observations")
    obs = obs if isinstance(obs, dict) else {}
    pair = obs.get("vs_other_runtime")
    pair = pair if isinstance(pair, dict) else {}
    numbers = {
        "loss": cell.get("loss"),
        "grad_abs_max": cell.get("grad_abs_max"),
        "logit_abs_max": cell.get("logit_abs_max"),
        "reference_grad_abs_max": obs.get("reference_grad_abs_max"),
        "reference_logit_abs_max": obs.get("reference_logit_abs_max"),
        **{name: obs.get(name) for name in COMPARISONS},
        **{f"vs_other_runtime.{name}": pair.get(name) for name in COMPARISONS if "rel" not in name},
    }
    problems = [f"{name} {str(v)[:20]}" for name, v in numbers.items() if finite(v) is None]
    if not isinstance(cell.get("plan"), list):
        problems.append("no physical plan")
    return problems


def _completion_problems(cell: dict[str, Any]) -> list[str]:
    """A completed cell also ran its update (wall seconds > 0) through counted physical forwards."""
    problems = _value_problems(cell)
    if (finite(cell.get("wall_seconds")) or 0.0) <= 0:
        problems.append(f"wall_seconds {str(cell.get('wall_seconds'))[:20]}")
    forwards, plan = count(cell.get("physical_forwards")), cell.get("plan")
    if not forwards or not isinstance(plan, list) or forwards != len(plan):
        problems.append(f"physical_forwards {str(cell.get('physical_forwards'))[:20]} for its plan")
    return problems


def _preregistered_cells(
    doc: dict[str, Any] | None, prereg: BackendMatrixPreregistration
) -> tuple[dict[tuple[Any, Any, Any], dict[str, Any]], list[str]]:
    """The report's cells by (objective, runtime, batch), and what differs from the preregistered list."""
    cells = _cells(doc)
    if cells is None:
        return {}, ["the gate report is missing, not one JSON object, or its cells are not objects"]
    want = [(c.objective, c.runtime, c.trajectory_batch_size) for c in prereg.cells]
    keys = [_key(c) for c in cells]
    by_key = {_key(c): c for c in cells}
    problems = []
    if len(set(keys)) != len(keys):
        problems.append(f"{len(keys) - len(set(keys))} duplicated cells")
    missing = [k for k in want if k not in by_key]
    extra = [k for k in keys if k not in set(want)]
    if missing:
        problems.append(f"missing cells {missing[:4]}")
    if extra:
        problems.append(f"cells not preregistered {[str(k)[:60] for k in extra[:4]]}")
    return by_key, problems


def _judge_cells(
    judgement: Judgement,
    doc: dict[str, Any] | None,
    prereg: BackendMatrixPreregistration,
    profile: Profile,
    scale: Scale,
    gate_codes: list[int] | None,
) -> None:
    by_key, problems = _preregistered_cells(doc, prereg)
    bad = {f"{k[0]}/{k[1]}/{k[2]}": _completion_problems(c) for k, c in by_key.items()}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        first = next(iter(bad))
        problems.append(f"{len(bad)} cells lack finite observations ({first}: {', '.join(bad[first][:3])})")
    model, device = GATE_MODEL.get(scale.matrix_model), profile.device
    if doc is not None and (doc.get("model") != model or doc.get("device") != device):
        problems.append(
            f"ran on {str(doc.get('model'))[:40]!r}/{str(doc.get('device'))[:10]!r}, declared {model!r}/{device!r}"
        )
    if doc is not None and doc.get("objectives") != list(prereg.objectives):
        problems.append(f"objectives {str(doc.get('objectives'))[:60]}, preregistered {list(prereg.objectives)}")
    if gate_codes is None or len(gate_codes) != 1 or gate_codes[0] not in (0, 1):
        problems.append(f"gate exit codes {gate_codes} (0: passed, 1: a comparison failed; else it did not finish)")
    if not problems:
        judgement.metrics["cells"] = len(by_key)
        judgement.metrics["gate_seconds"] = finite(doc.get("seconds")) if doc is not None else None
    judgement.check(
        "all_cells_completed",
        not problems,
        "; ".join(problems)
        or f"{len(by_key)} distinct preregistered cells on {model}/{device}, each with finite "
        "loss, maxima, wall seconds and observations",
    )


def _rejudge(
    by_key: dict[tuple[Any, Any, Any], dict[str, Any]], prereg: BackendMatrixPreregistration, metrics: dict[str, Any]
) -> list[str]:
    """Every preregistered comparison, recomputed from the cells' observed values: the failures."""
    failures: list[str] = []
    for objective in prereg.objectives:
        tol = prereg.tolerances[objective].model_dump()
        cells = [by_key[(objective, r, b)] for b in prereg.batches for r in prereg.runtimes]
        ref = by_key[(objective, "dual_model", 1)]
        ref_obs = ref["observations"]
        ref_grad, ref_logit = ref["grad_abs_max"], ref["logit_abs_max"]
        if ref_obs["reference_grad_abs_max"] != ref_grad or ref_obs["reference_logit_abs_max"] != ref_logit:
            failures.append(f"{objective}: the reference maxima are not the reference cell's")
        if ref_grad <= 0 or ref_logit <= 0:
            failures.append(f"{objective}: the reference gradient or logits are all zero")
            continue
        observed: dict[str, float] = dict.fromkeys(COMPARISONS, 0.0)
        for cell in cells:
            obs = cell["observations"]
            if obs["reference_grad_abs_max"] != ref_grad or obs["reference_logit_abs_max"] != ref_logit:
                failures.append(f"{objective}/{cell['runtime']}/{cell['trajectory_batch_size']}: another reference")
            values = {
                "loss_abs_diff": max(abs(cell["loss"] - ref["loss"]), obs["loss_abs_diff"]),
                "grad_max_abs_diff": obs["grad_max_abs_diff"],
                "grad_max_rel_to_reference_max": obs["grad_max_abs_diff"] / ref_grad,
                "updated_logit_max_abs_diff": obs["updated_logit_max_abs_diff"],
                "updated_logit_max_rel_to_reference_max": obs["updated_logit_max_abs_diff"] / ref_logit,
            }
            for name, value in values.items():
                observed[name] = max(observed[name], value)
        for name, value in observed.items():
            metrics[f"{objective}_{name}"] = value
            if not value <= tol[name]:
                failures.append(f"{objective} {name} {value:.3g} > {tol[name]:.3g}")
        for batch in prereg.batches:
            dual, shared = by_key[(objective, "dual_model", batch)], by_key[(objective, "shared_backbone", batch)]
            pairs = [dual["observations"]["vs_other_runtime"], shared["observations"]["vs_other_runtime"]]
            diffs = [abs(dual["loss"] - shared["loss"])]
            diffs += [p[n] for p in pairs for n in ("loss_abs_diff", "grad_max_abs_diff", "updated_logit_max_abs_diff")]
            same_plan = dual["plan"] == shared["plan"] and all(p.get("same_physical_plan") is True for p in pairs)
            if max(diffs) != prereg.conformance.max_abs_diff or not same_plan:
                failures.append(
                    f"{objective} batch {batch}: dual != shared (max diff {max(diffs):.3g}, same plan {same_plan})"
                )
        for digest in prereg.conformance.identical_across_cells:
            distinct = {str(c.get(digest)) for c in cells}
            if len(distinct) != 1:
                failures.append(f"{objective}: {len(distinct)} distinct {digest}")
        targets = {c.get("target_digest") for c in cells}
        if (objective == "sft") != (targets == {None}):
            failures.append(f"{objective}: teacher targets {'present' if objective == 'sft' else 'absent'}")
    return failures


def _judge_conformance(
    judgement: Judgement,
    doc: dict[str, Any] | None,
    prereg: BackendMatrixPreregistration,
    gate_codes: list[int] | None,
) -> None:
    by_key, problems = _preregistered_cells(doc, prereg)
    bad = sorted(f"{k[0]}/{k[1]}/{k[2]}" for k, c in by_key.items() if _value_problems(c))
    if problems or bad or doc is None:
        judgement.check("conformance", False, "; ".join(problems) or f"cells without the values to compare: {bad[:4]}")
        return
    failures = _rejudge(by_key, prereg, judgement.metrics)
    gate_says = doc.get("status")
    if gate_says != "passed" or gate_codes != [0]:
        failures.append(f"the gate itself reports {str(gate_says)[:20]!r} (exit {gate_codes})")
    judgement.check(
        "conformance",
        not failures,
        "; ".join(failures[:4])
        or f"{len(prereg.objectives)} objectives: every comparison within the preregistered "
        "tolerances, recomputed from the observed values; dual == shared exactly at every batch; digests identical",
    )


def _pairs(doc: dict[str, Any], b: SpeedBench) -> tuple[list[tuple[float, float, float]], list[str]]:
    """Every recorded (fast seconds, baseline seconds, ratio) of the one fast/baseline comparison at the declared
    batch, the ratio recomputed from the two timings here; and what keeps them from being the declared measurement."""
    raw = doc.get("comparisons")
    found = [
        c
        for c in (raw if isinstance(raw, list) else [])
        if isinstance(c, dict) and (c.get("a"), c.get("b"), c.get("batch")) == (b.fast_path, b.baseline_path, b.batch)
    ]
    if len(found) != 1:
        return [], [f"{len(found)} interleaved {b.fast_path}/{b.baseline_path} comparisons at batch {b.batch}, want 1"]
    entry = found[0]
    if entry.get("status") != "measured" or entry.get("order") != "ABAB":
        why = str(entry.get("reason"))[:120]
        return [], [f"the interleaved comparison is {str(entry.get('status'))[:20]!r}, not measured ABAB ({why})"]
    recorded = entry.get("pairs")
    if not isinstance(recorded, list) or len(recorded) != b.pairs:
        n = len(recorded) if isinstance(recorded, list) else None
        return [], [f"{n} interleaved pairs recorded, the preregistration declares {b.pairs}"]
    pairs: list[tuple[float, float, float]] = []
    for number, pair in enumerate(recorded, start=1):
        fast, base = (finite(pair.get(k)) if isinstance(pair, dict) else None for k in ("a_seconds", "b_seconds"))
        if fast is None or base is None or fast <= 0 or base <= 0:
            return [], [f"pair {number}: its timings are not two positive seconds"]
        ratio = base / fast  # same tokens per call: fast's tokens/s over the baseline's
        said = finite(pair.get("ratio"))
        if said is None or not math.isclose(said, ratio, rel_tol=1e-9):
            return [], [f"pair {number} reports ratio {str(pair.get('ratio'))[:20]}, its timings give {ratio:.6g}"]
        pairs.append((fast, base, ratio))
    said = finite(entry.get("median_ratio"))
    median = statistics.median(r for _, _, r in pairs)
    if said is None or not math.isclose(said, median, rel_tol=1e-9):
        return [], [f"the bench reports median {str(entry.get('median_ratio'))[:20]}, its pairs give {median:.6g}"]
    return pairs, []


def _judge_speed(
    judgement: Judgement,
    evidence: dict[str, Path],
    prereg: BackendMatrixPreregistration,
    profile: Profile,
    codes: list[int] | None,
) -> None:
    """The median of the recorded pairs' ratios: a threshold where the policy requires ``speed_thresholds``,
    elsewhere recorded and not applicable. A measurement that is not the declared one fails on every profile."""
    doc = read_json(evidence.get("rollout_bench"))
    b = prereg.speed.bench
    if doc is None:
        judgement.check("speed_thresholds", False, f"no rollout bench JSON (exit codes {codes})")
        return
    raw = doc.get("options")
    options: dict[str, Any] = raw if isinstance(raw, dict) else {}
    declared = {
        "model": b.model,
        "batches": [b.batch],
        "new_tokens": b.new_tokens,
        "prompt_tokens": b.prompt_tokens,
        "repeats": b.repeats,
        "slow_repeats": b.slow_repeats,
        "warmup": b.warmup,
        "pair": [b.fast_path, b.baseline_path],
        "pairs": b.pairs,
    }
    problems = []
    if codes != [0]:
        problems.append(f"bench exit codes {codes}")
    differs = sorted(k for k, v in declared.items() if options.get(k) != v)
    if differs:
        problems.append(f"bench options {differs} differ from the preregistered size")
    if doc.get("device") != profile.device:
        problems.append(f"bench ran on {str(doc.get('device'))[:10]!r}, the profile is {profile.device!r}")
    pairs, unusable = _pairs(doc, b)
    problems += unusable
    if problems:
        judgement.check("speed_thresholds", False, "; ".join(problems))
        return
    ratios = sorted(r for _, _, r in pairs)
    median = statistics.median(ratios)
    judgement.metrics.update(speed_pairs=len(pairs), speed_ratio=median, speed_min_ratio=ratios[0])
    judgement.metrics.update(speed_max_ratio=ratios[-1])
    for number, (fast, base, ratio) in enumerate(pairs, start=1):
        judgement.metrics[f"speed_pair_{number:02d}_fast_seconds"] = fast
        judgement.metrics[f"speed_pair_{number:02d}_baseline_seconds"] = base
        judgement.metrics[f"speed_pair_{number:02d}_ratio"] = ratio
    figure = (
        f"median {b.fast_path}/{b.baseline_path} tokens/s over {len(pairs)} interleaved pairs at batch {b.batch}: "
        f"{median:.3g} (pairs {ratios[0]:.3g}..{ratios[-1]:.3g})"
    )
    if "speed_thresholds" not in policy.required_checks(profile, NAME):
        judgement.not_applicable(
            "speed_thresholds",
            f"not a threshold on {profile.name}: the machine is not dedicated (shared cores), so the speed figure "
            f"is recorded and shown, never judged; {figure}",
        )
        return
    threshold = next((t.minimum_ratio for t in prereg.speed.thresholds if t.device == profile.device), None)
    if threshold is None:
        judgement.check("speed_thresholds", False, f"no preregistered threshold for {profile.device}; {figure}")
        return
    judgement.metrics["speed_minimum_ratio"] = threshold
    judgement.check(
        "speed_thresholds",
        median >= threshold,
        f"{figure} {'>=' if median >= threshold else '<'} preregistered {threshold:g} ({profile.name})",
    )


def _judge_teardown(judgement: Judgement, doc: dict[str, Any] | None, profile: Profile) -> None:
    cuda = doc.get("cuda") if doc is not None else None
    if not isinstance(cuda, dict):
        judgement.check("teardown", False, "the gate report has no cuda section on a CUDA profile")
        return
    base, final = count(cuda.get("baseline_allocated_bytes")), count(cuda.get("final_allocated_bytes"))
    if base is None or final is None:
        judgement.check("teardown", False, "the cuda section lacks integer baseline/final allocated bytes")
        return
    t = profile.thresholds
    tolerance = max(t.teardown_tolerance_bytes_min, int(t.teardown_tolerance_fraction * base))
    judgement.metrics.update(cuda_baseline_allocated_bytes=base, cuda_final_allocated_bytes=final)
    judgement.check(
        "teardown",
        final - base <= tolerance,
        f"allocated {final} B after all 24 cells vs baseline {base} B (tolerance {tolerance} B)",
    )


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    judgement = Judgement()
    prereg, digest = load_preregistration()
    judgement.metrics.update(
        preregistration=PREREGISTRATION.relative_to(REPO_ROOT).as_posix(), preregistration_sha256=digest
    )
    steps = transcript_steps(evidence.get("transcript"))
    gate_codes = steps.get(GATE_STEP) if steps is not None else None
    doc = read_json(evidence.get("gate_report"))
    _judge_cells(judgement, doc, prereg, profile, scale, gate_codes)
    _judge_conformance(judgement, doc, prereg, gate_codes)
    _judge_speed(judgement, evidence, prereg, profile, steps.get(BENCH_STEP) if steps is not None else None)
    if profile.device == "cuda":
        _judge_teardown(judgement, doc, profile)
    module = refresh_module()
    if module is not None:
        module.judge_refreshes(evidence, judgement, profile, scale)
    return judgement

"""The direct-config workload's judge (what each check proves: :mod:`harness.qualify.full.direct_config`), over the
evidence files alone."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.records import SHA256_HEX, Profile
from harness.qualify.full import runs, statehash
from harness.qualify.full import walkthrough as wt
from harness.qualify.full.base import Judgement, Scale
from harness.qualify.full.direct_config_layout import (
    ACTOR_EPOCHS,
    ACTOR_KEYS,
    ACTOR_MINI_BATCHES,
    ACTOR_OPTIMIZER,
    COMPILER_V4,
    CONFIGS,
    COUNTED,
    CRITIC_EPOCHS,
    CRITIC_KEYS,
    CRITIC_MINI_BATCHES,
    CRITIC_OPTIMIZER,
    CRITIC_STATE,
    CYCLES,
    EXTEND,
    INPUTS,
    NATIVE_SIZES,
    REPLAY_FIRST,
    Config,
)
from harness.qualify.full.reading import count, file_sha256, finite, read_json

Check = tuple[bool, str]


def _each(judge_one: Callable[[Config], Check]) -> Check:
    """One check over both native files: passed when it passes for each, the detail naming each."""
    results = [(c, *judge_one(c)) for c in CONFIGS]
    return all(ok for _, ok, _ in results), " | ".join(f"{c.key}: {why}" for c, _, why in results)


def _hex(value: Any) -> bool:
    return isinstance(value, str) and SHA256_HEX.match(value) is not None


def _steps(inv: list[dict[str, Any]] | None, c: Config, names: tuple[str, ...]) -> Check:
    results = [wt.step_ok(inv, c.step(name)) for name in names]
    return all(ok for ok, _ in results), "; ".join(why for _, why in results)


def _completed(output: dict[str, Any] | None, updates: int, resumed_from: int | None) -> bool:
    summary = runs.section(output, "summary")
    return (
        output is not None
        and output.get("status") == "completed"
        and summary.get("status") == "completed"
        and count(summary.get("updates")) == updates
        and summary.get("resumed_from_step") == resumed_from
    )


def _run_completed(
    evidence: dict[str, Path], inv: list[dict[str, Any]] | None, c: Config, final: runs.Run, profile: Profile
) -> Check:
    steps_ok, steps_why = _steps(inv, c, ("plan", "run", "inspect_2", "resume_extend", "inspect_3"))
    plan = read_json(evidence.get(c.role("plan")))
    direct = runs.section(plan, "direct_config")
    algorithm = runs.section(plan, "config", "algorithm").get("name")
    plan_ok = direct.get("compiler") == COMPILER_V4 and algorithm == c.algorithm and plan is not None
    plan_ok = plan_ok and count((plan or {}).get("cycles")) == CYCLES
    sized, sized_why = runs.planned_as_declared(plan, NATIVE_SIZES, profile)
    first = _completed(read_json(evidence.get(c.role("run_output"))), CYCLES, None)
    resumed = _completed(read_json(evidence.get(c.role("resume_output"))), CYCLES + EXTEND, CYCLES)
    done, done_why = final.completed(CYCLES + EXTEND)
    inspected = [read_json(evidence.get(c.role(role))) for role in ("inspect_2", "inspect_3")]
    steps_seen = [(doc or {}).get("last_complete_step") for doc in inspected]
    statuses = [(doc or {}).get("status") for doc in inspected]
    inspect_ok = steps_seen == [CYCLES, CYCLES + EXTEND] and statuses == ["completed", "completed"]
    ok = steps_ok and plan_ok and sized and first and resumed and done and inspect_ok
    return ok, (
        f"{steps_why}; plan: compiler {runs.short(direct.get('compiler'))!r} (want {COMPILER_V4!r}), algorithm "
        f"{runs.short(algorithm)!r} (want {c.algorithm!r}), cycles {runs.short((plan or {}).get('cycles'))} (want "
        f"{CYCLES}), {sized_why}; first run {'completed' if first else 'NOT completed'} with {CYCLES} updates; "
        f"--resume --extend {EXTEND} {'completed' if resumed else 'NOT completed'} with {CYCLES + EXTEND} updates "
        f"from step {CYCLES}; final run: {done_why}; inspect last complete steps "
        f"{[runs.short(s) for s in steps_seen]}, statuses {[runs.short(s) for s in statuses]}"
    )


def _native_unchanged(evidence: dict[str, Path], c: Config) -> Check:
    record = read_json(evidence.get(c.role("native_sha256"))) or {}
    before, after = record.get("sha256_before"), record.get("sha256_after")
    expected = file_sha256(INPUTS / c.native)  # the harness input at this commit: harness code, not evidence
    plan = read_json(evidence.get(c.role("plan")))
    native = runs.section(plan, "direct_config", "native")
    text = native.get("text")
    plan_bytes = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() if isinstance(text, str) else None
    handoff = read_json(evidence.get(c.role("handoff")))
    manifest = read_json(evidence.get(c.role("bundle_manifest")))
    recorded = {
        "plan --json": (read_json(evidence.get(c.role("plan_output"))) or {}).get("native_sha256"),
        "plan direct_config": native.get("sha256"),
        "plan native bytes": plan_bytes,
        "inspect (2)": runs.section(read_json(evidence.get(c.role("inspect_2"))), "direct_config").get("native_sha256"),
        "inspect (3)": runs.section(read_json(evidence.get(c.role("inspect_3"))), "direct_config").get("native_sha256"),
        "handoff --json": runs.section(handoff, "direct_config").get("native_sha256"),
        "bundle manifest": runs.section(manifest, "direct_config").get("native_sha256"),
        "native diff": (read_json(evidence.get(c.role("native_diff"))) or {}).get("native_sha256"),
        "bundle native file": file_sha256(evidence.get(c.role("bundle_native"))),
    }
    verified = [
        runs.section(read_json(evidence.get(c.role(role))), "direct_config").get("native_sha256_verified") is True
        for role in ("inspect_2", "inspect_3")
    ]
    differ = sorted(label for label, sha in recorded.items() if sha != before)
    named = record.get("file") == c.native
    ok = _hex(before) and before == expected and before == after and not differ and all(verified) and named
    return ok, (
        f"native {runs.short(record.get('file'))!r} sha256 before {runs.short(before)!r} "
        f"({'the harness input' if before == expected else 'NOT the harness input ' + str(expected)[:16]}), after "
        f"{'the same' if before == after else runs.short(after)!r}; records holding another sha256: {differ}; "
        f"inspect native_sha256_verified {verified}"
    )


def _native_values(diff: dict[str, Any] | None, keys: tuple[str, ...]) -> dict[str, tuple[int | None, str]]:
    """Native key -> (its native value as a count, its native-diff status), for ``keys``."""
    entries = diff.get("entries") if diff is not None else None
    found: dict[str, tuple[int | None, str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("key") in keys:
            found[str(entry["key"])] = (count(entry.get("native")), str(entry.get("status"))[:20])
    return found


def _verl_count(diff: dict[str, Any] | None, keys: tuple[str, ...]) -> tuple[int | None, int | None, int, str]:
    """verl's (passes, mini-batches) from the native ``(epochs, train_batch_size, mini_batch_size)`` keys, the
    number of those keys the bundle holds at the native value, and a phrase saying so."""
    values = _native_values(diff, keys)
    epochs, batch, mini = (values.get(key, (None, "absent"))[0] for key in keys)
    same = sum(1 for key in keys if values.get(key, (None, ""))[1] == "same")
    minis = batch // mini if epochs and batch and mini and batch % mini == 0 else None
    phrase = (
        f"{keys[0].rsplit('.', 1)[-1]} {epochs} x (train_batch_size {batch} / ppo_mini_batch_size {mini}) = "
        f"{epochs * minis if epochs and minis else None} (bundle = native for {same}/{len(keys)} keys)"
    )
    return (epochs if minis else None), minis, same, phrase


def _planned(plan: dict[str, Any] | None, section: str, epochs_key: str, minis_key: str) -> tuple[Any, Any]:
    """The plan's (passes, mini-batches) in ``config.algorithm.<section>``; a critic's None is the actor's."""
    algo = runs.section(plan, "config", "algorithm", section)
    epochs, minis = algo.get(epochs_key), algo.get(minis_key)
    if epochs_key.startswith("critic_"):
        epochs = algo.get("ppo_epochs") if epochs is None else epochs
        minis = algo.get("mini_batches") if minis is None else minis
    return count(epochs), count(minis)


def _recorded(final: runs.Run, prefix: str) -> list[tuple[float | None, ...]]:
    return [tuple(wt.algo_metric(line, f"{prefix}/{k}") for k in ("updates", "passes", "mini_batches"))
            for line in final.lines]  # fmt: skip


def _optimizer_steps(evidence: dict[str, Path], c: Config, name: str, per_update: int | None) -> Check:
    """At each kept checkpoint of step k (the straight run's 1, 2, 3), every parameter slot of the optimizer file
    ``name`` holds AdamW step k x ``per_update``, as the harness read it from the bytes it hashed; the kept
    checkpoint.json is the one hashed and lists that file at the harness's sha256."""
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    found: list[str] = []
    ok = per_update is not None
    for role, step in COUNTED:
        label = c.role(role)
        bound, bound_why = statehash.listed_as_hashed(hashes, label, evidence.get(label), name)
        held, _ = statehash.checkpoint(hashes, label)
        value, why = statehash.optimizer_step_count(hashes, label, name)
        want = step * per_update if per_update is not None else None
        good = bound and held is not None and held.step == step and value is not None and value == want
        ok = ok and good
        found.append(
            f"{role} (step {held.step if held else None}): {why} (want {want})" if bound else f"{role}: {bound_why}"
        )
    return ok, f"optimizer state {'; '.join(found)}"


def _no_critic_state(evidence: dict[str, Path], c: Config) -> Check:
    """No kept checkpoint holds a critic's files, by the harness's hashes."""
    hashes = statehash.read_state_hashes(evidence.get("state_hashes"))
    held = [statehash.checkpoint(hashes, c.role(role))[0] for role, _ in COUNTED]
    critic = sorted({n for h in held if h is not None for n in h.files if n in CRITIC_STATE})
    ok = all(h is not None for h in held) and not critic
    return ok, f"critic state files in the kept checkpoints {critic} (want none; all hashed: {None not in held})"


@dataclass(frozen=True)
class _Model:
    """The model whose optimizer steps a check counts: its metrics prefix, the native keys that give verl's count,
    what this workload declares, its optimizer file and where its plan holds passes and mini-batches."""

    prefix: str  # actor | critic
    keys: tuple[str, ...]
    declared: tuple[int, int]  # (passes, mini-batches)
    optimizer: str
    # where the plan holds passes and mini-batches: (section, None for the algorithm's own; passes key; mini-batches)
    planned_in: tuple[str | None, str, str]
    planned_label: str


ACTOR = _Model("actor", ACTOR_KEYS, (ACTOR_EPOCHS, ACTOR_MINI_BATCHES), ACTOR_OPTIMIZER,
               (None, "ppo_epochs", "mini_batches"), "passes")  # fmt: skip
CRITIC = _Model("critic", CRITIC_KEYS, (CRITIC_EPOCHS, CRITIC_MINI_BATCHES), CRITIC_OPTIMIZER,
                ("ppo", "critic_ppo_epochs", "critic_mini_batches"), "critic passes")  # fmt: skip


def _steps_counted(evidence: dict[str, Path], c: Config, final: runs.Run, model: _Model) -> Check:
    """verl's optimizer steps per training step for ``model``, from the bundle's native values: what this workload
    declares, held by the plan, made by the optimizer state, and recorded on every metrics line."""
    epochs, minis, same, phrase = _verl_count(read_json(evidence.get(c.role("native_diff"))), model.keys)
    steps = epochs * minis if epochs and minis else None
    counted, counted_why = _optimizer_steps(evidence, c, model.optimizer, steps)
    section, epochs_key, minis_key = model.planned_in
    planned = _planned(read_json(evidence.get(c.role("plan"))), section or c.algorithm, epochs_key, minis_key)
    recorded = _recorded(final, model.prefix)
    lines_ok = (
        final.why is None
        and len(final.lines) == CYCLES + EXTEND
        and steps is not None
        and recorded == [(steps, epochs, minis)] * len(final.lines)
    )
    declared = (epochs, minis) == model.declared
    ok = declared and same == len(model.keys) and planned == (epochs, minis) and lines_ok and counted
    want = " x ".join(str(n) for n in model.declared)
    return ok, (
        f"verl {model.prefix} steps per training step: {phrase} (want {want}); {model.prefix} {counted_why}; planned "
        f"{model.planned_label} x mini-batches {planned}; (updates, passes, mini_batches) recorded per line "
        f"{recorded[:4]} (want ({steps}, {epochs}, {minis}) on each of {CYCLES + EXTEND})"
    )


def _actor_passes(evidence: dict[str, Path], c: Config, final: runs.Run) -> Check:
    counted, counted_why = _steps_counted(evidence, c, final, ACTOR)
    norms = [finite(v) for v in final.column("grad_norm")]
    deltas = [finite(v) for v in final.column("adapter_delta_norm")]
    each = (final.summary or {}).get("adapter_changed_each_update") is True
    # a cycle whose groups all scored alike has no gradient (norm 0), yet AdamW's momentum still moves it
    moved = (
        all(v is not None for v in norms)
        and any(v is not None and v > 0 for v in norms)
        and all(v is not None and v > 0 for v in deltas)
        and each
    )
    return counted and moved, (
        f"{counted_why}; grad norm {_rounded(norms)} (finite, one > 0), adapter delta {_rounded(deltas)} (each > 0), "
        f"changed each update {each}"
    )


def _critic_counts(evidence: dict[str, Path], c: Config, final: runs.Run) -> Check:
    if not c.critic:
        # a GRPO file has no critic (critic.enable false): no line may claim critic steps, no checkpoint hold its state
        recorded = _recorded(final, "critic")
        no_state, no_state_why = _no_critic_state(evidence, c)
        absent = final.why is None and len(final.lines) == CYCLES + EXTEND and no_state
        absent = absent and all(r == (None, None, None) for r in recorded)
        return absent, (
            f"no critic; critic (updates, passes, mini_batches) per line {recorded[:4]} (want none); {no_state_why}"
        )
    counted, counted_why = _steps_counted(evidence, c, final, CRITIC)
    moved = [finite(wt.algo_metric(line, "critic/delta_norm")) for line in final.lines]
    ok = counted and all(v is not None and v > 0 for v in moved)
    return ok, f"{counted_why}; critic delta norm {_rounded(moved)}"


def _rounded(values: list[float | None]) -> list[float | None]:
    return [round(v, 4) if v is not None else None for v in values][:4]


def _resume_exact(evidence: dict[str, Path], inv: list[dict[str, Any]] | None, c: Config, final: runs.Run) -> Check:
    steps_ok, steps_why = _steps(inv, c, ("plan_replay", "run_replay", "resume_replay"))
    first = _completed(read_json(evidence.get(c.role("replay_first_output"))), REPLAY_FIRST, None)
    replay = runs.Run(evidence, c.role("replay_summary"), c.role("replay_metrics"), c.algorithm)
    done, done_why = replay.completed(CYCLES)
    resumed_from = (replay.summary or {}).get("resumed_from_step")
    names = runs.STATE_FILES + (CRITIC_STATE if c.critic else ())
    straight_label, replay_label = c.role("checkpoint_2"), c.role("replay_checkpoint_2")
    state_ok, state_why = runs.same_state(evidence, straight_label, replay_label, CYCLES, names)
    exact, exact_why = wt.replay_exact(evidence, straight_label, replay_label, c.algorithm)
    straight = runs.stable_lines(final.lines[:CYCLES])
    lines_ok = final.why is None and replay.why is None and len(straight) == CYCLES
    lines_ok = lines_ok and straight == runs.stable_lines(replay.lines)
    ok = steps_ok and first and done and resumed_from == REPLAY_FIRST and state_ok and exact and lines_ok
    return ok, (
        f"{steps_why}; replay: {REPLAY_FIRST} update {'completed' if first else 'NOT completed'}, resumed from step "
        f"{runs.short(resumed_from)} (want {REPLAY_FIRST}), {done_why}; metrics lines 1..{CYCLES} (time/memory "
        f"aside) {'equal' if lines_ok else 'DIFFER or missing'}; step {CYCLES} straight vs replay: {state_why}; "
        f"{exact_why}"
    )


def _handoff_digests(evidence: dict[str, Path], inv: list[dict[str, Any]] | None, c: Config) -> Check:
    step_ok, step_why = wt.step_ok(inv, c.step("handoff"))
    planned = runs.section(read_json(evidence.get(c.role("plan_output"))), "handoff")
    handoff = read_json(evidence.get(c.role("handoff")))
    manifest = read_json(evidence.get(c.role("bundle_manifest")))
    diagnose = read_json(evidence.get(c.role("diagnose")))
    missing = [n for n, d in (("handoff", handoff), ("manifest", manifest), ("diagnose", diagnose)) if d is None]
    if handoff is None or manifest is None or diagnose is None:
        return False, f"{step_why}; missing or unreadable: {missing}"
    plan_ok = (
        planned.get("status") == "compiles"
        and planned.get("compiler") == c.compiler
        and planned.get("imported_by") == COMPILER_V4
        and _hex(planned.get("ir_digest"))
        and _hex(planned.get("rules_digest"))
    )
    keys = ("compiler", "ir_digest", "rules_digest")
    agree = all(_hex(handoff.get(k)) for k in keys[1:]) and all(
        doc.get(k) == handoff.get(k) for doc in (manifest, diagnose) for k in keys
    )
    same_compiler = handoff.get("compiler") == planned.get("compiler") == c.compiler
    same_rules = handoff.get("rules_digest") == planned.get("rules_digest")
    manifest_ok = handoff.get("manifest_sha256") == file_sha256(evidence.get(c.role("bundle_manifest")))
    imports = [
        runs.section(read_json(evidence.get(c.role("plan"))), "direct_config"),
        runs.section(read_json(evidence.get(c.role("inspect_3"))), "direct_config"),
        runs.section(manifest, "direct_config"),
        runs.section(handoff, "direct_config"),
    ]
    import_digests = {str(d.get("rules_digest"))[:16] for d in imports}
    import_ok = all(d.get("compiler") == COMPILER_V4 for d in imports) and len(import_digests) == 1
    import_ok = import_ok and _hex(imports[0].get("rules_digest"))
    diff = read_json(evidence.get(c.role("native_diff"))) or {}
    counts = runs.section(diff, "counts")
    diff_ok = (
        diff.get("semantically_equal") is True
        and diff.get("added_cycles") == EXTEND
        and counts.get("extended") == 1
        and all(counts.get(s) == 0 for s in ("changed", "native_only", "bundle_only"))
    )
    ok = step_ok and plan_ok and agree and same_compiler and same_rules and manifest_ok and import_ok and diff_ok
    return ok, (
        f"{step_why}; plan handoff {runs.short(planned.get('status'))!r} {runs.short(planned.get('compiler'))!r} "
        f"imported by {runs.short(planned.get('imported_by'))!r} ({'ok' if plan_ok else f'NOT {c.compiler} by v4'}); "
        f"compiler/ir/rules digests {'equal' if agree else 'NOT equal'} in handoff, manifest, diagnose, compiler and "
        f"rules {'=' if same_compiler and same_rules else '!='} the plan's; manifest sha256 "
        f"{'matches' if manifest_ok else 'differs'}; v4 import rules {sorted(import_digests)[:3]} in plan, inspect, "
        f"manifest, handoff; native diff equal {diff.get('semantically_equal') is True}, "
        f"{ {k: counts.get(k) for k in ('extended', 'changed', 'native_only', 'bundle_only')} } (want 1, 0, 0, 0)"
    )


def _launch_status(evidence: dict[str, Path], inv: list[dict[str, Any]] | None, c: Config) -> Check:
    env = read_json(evidence.get("diagnose_environment"))
    if env is None:
        return False, "diagnose-environment.json missing or unreadable"
    if env.get("verl_python") is None:
        return False, f"not diagnosed: {str(env.get('reason'))[:200]}"
    step_ok, step_why = wt.step_ok(inv, c.step("diagnose"))
    diagnose = read_json(evidence.get(c.role("diagnose"))) or {}
    blockers = diagnose.get("blockers")
    status, version = diagnose.get("launch_status"), diagnose.get("verl_version")
    ok = step_ok and status == "ready" and blockers == [] and version == wt.VERL_VERSION
    return ok, (
        f"{step_why} in {runs.short(env.get('verl_python'))} ({runs.short(env.get('reason'))}); launch_status "
        f"{runs.short(status)!r}, blockers {blockers if isinstance(blockers, list) else runs.short(blockers)}"[:400]
        + f", verl {runs.short(version)!r} (want {wt.VERL_VERSION})"
    )


def judge(evidence: dict[str, Path], profile: Profile, scale: Scale) -> Judgement:
    j = Judgement()
    inv = wt.transcript_invocations(evidence.get("transcript"))
    finals = {c.key: runs.Run(evidence, c.role("summary"), c.role("metrics"), c.algorithm) for c in CONFIGS}
    j.check("run_completed", *_each(lambda c: _run_completed(evidence, inv, c, finals[c.key], profile)))
    j.check("native_bytes_unchanged", *_each(lambda c: _native_unchanged(evidence, c)))
    j.check("actor_passes", *_each(lambda c: _actor_passes(evidence, c, finals[c.key])))
    j.check("critic_counts", *_each(lambda c: _critic_counts(evidence, c, finals[c.key])))
    j.check("resume_tensor_exact", *_each(lambda c: _resume_exact(evidence, inv, c, finals[c.key])))
    j.check("handoff_digests", *_each(lambda c: _handoff_digests(evidence, inv, c)))
    j.check("launch_status", *_each(lambda c: _launch_status(evidence, inv, c)))
    for c in CONFIGS:
        diagnose = read_json(evidence.get(c.role("diagnose"))) or {}
        native = (read_json(evidence.get(c.role("native_sha256"))) or {}).get("sha256_before")
        j.metrics[f"{c.key}_native_sha256"] = runs.short(native)
        j.metrics[f"{c.key}_launch_status"] = runs.short(diagnose.get("launch_status"))
        j.metrics[f"{c.key}_verl_version"] = runs.short(diagnose.get("verl_version"))
        j.metrics[f"{c.key}_ir_digest"] = runs.short(
            (read_json(evidence.get(c.role("handoff"))) or {}).get("ir_digest")
        )
        runs.summary_metrics(j, f"{c.key}_run", finals[c.key])
        # the clip at work (shown, never judged): each line's mean clip fraction and ppo_kl over its mini-batches
        for number, line in enumerate(finals[c.key].lines[: CYCLES + EXTEND], start=1):
            for key in ("pg_clipfrac", "ppo_kl"):
                j.metrics[f"{c.key}_line{number}_{key}"] = wt.algo_metric(line, f"actor/{key}")
    return j

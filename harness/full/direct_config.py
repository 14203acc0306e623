"""v0.15 direct-config (issue 11): a native verl 0.9 GRPO YAML, imported without an edit (compiler v4), trained,
extended, replayed tensor-exactly, handed off and diagnosed by verl 0.9.1, through the installed CLI.

Steps (cwd a fresh work dir): copy ``harness/workloads/verl-native-grpo.yaml`` (byte-identical to
``examples/verl-native-grpo.yaml``) and hash it; ``plan --verl-config`` it with runtime bindings only (the
native file fixes the sizes: 2 prompts x 4 samples x 32 new tokens, 2 steps); run its 2 cycles; ``inspect``;
``run --resume --extend 1``; ``inspect``. The replay: the same native file with ``total_training_steps: 1``,
run 1 cycle, then ``--resume --extend 1``: its step-2 adapter, optimizer and RNG state must be byte-identical
to the straight run's. ``handoff`` of the extended run, ``diagnose`` of the bundle in verl's own venv
(``ctx.verl_python``; none given: the launch check fails, never passes). The native file is hashed again at
the end. The boundaries are planned too and must be refused by name (exit 2): a native PPO YAML
(``harness/workloads/verl-native-ppo.yaml``: ``critic_lora_value_head``), and the native GRPO file with more
than one actor pass per step (``ppo_epochs: 2``: ``grpo_ppo_epochs``; two mini-batches: ``grpo_mini_batches``).

Actor passes: verl performs ``ppo_epochs`` x ``train_batch_size / ppo_mini_batch_size`` optimizer steps per
training step (from the native values the bundle's native diff carries). Each GRPO metrics line records the
optimizer steps its update took (``algorithm_metrics["actor/updates"]``); the judge requires them to equal
verl's count on every line, and the configs that would need more passes per step to be refused by name.
There is no critic in a GRPO file: the critic side of v0.15 is the named refusal of a native PPO file.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

from harness.full import runs, statehash
from harness.full import walkthrough as wt
from harness.full.base import Context, Judgement, Scale, Workload, WorkloadFailure
from harness.full.reading import count, file_sha256, finite, read_json
from harness.records import Profile

NAME = "direct-config"
FOLDER = "v015/direct-config"
NATIVE = "verl-native-grpo.yaml"  # harness input, byte-identical to examples/verl-native-grpo.yaml
NATIVE_PPO = "verl-native-ppo.yaml"
MODEL = "smollm2-135m-instruct"  # the runtime binding of actor_rollout_ref.model.path (the embedded SmolLM2)
TRAJECTORY_BATCH = 8  # micro-batching only (runtime binding); 8 = one micro-batch of the native 2 x 4 step
# The native file's data.train_batch_size, rollout.n and data.max_response_length, which the import maps.
NATIVE_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 32}
CYCLES = 2  # the native trainer.total_training_steps
EXTEND = 1
REPLAY_FIRST = 1  # the replay's cycles before `--resume --extend`
RUN_ID, REPLAY_ID = "native", "replay"
COMPILER_V4 = "verl-rl-v0.9-single-gpu-v4"
ACTOR_KEYS = (
    "actor_rollout_ref.actor.ppo_epochs",
    "data.train_batch_size",
    "actor_rollout_ref.actor.ppo_mini_batch_size",
)


# One line of the native file changed (never the file itself: these are new files in the work dir).
class Variant:
    def __init__(self, name: str, line: str, replacement: str) -> None:
        self.name, self.line, self.replacement = name, line, replacement

    @property
    def file(self) -> str:
        return f"verl-native-grpo-{self.name}.yaml"

    def write(self, native: bytes, dest: Path) -> None:
        old, new = self.line.encode(), self.replacement.encode()
        if native.count(old) != 1:
            raise WorkloadFailure(f"{NATIVE} does not hold {self.line.strip()!r} exactly once: variant {self.name}")
        dest.write_bytes(native.replace(old, new))


REPLAY = Variant("one-step", "  total_training_steps: 2\n", "  total_training_steps: 1\n")
PPO_EPOCHS_2 = Variant("ppo-epochs-2", "    ppo_epochs: 1\n", "    ppo_epochs: 2\n")
MINI_BATCHES_2 = Variant("mini-batches-2", "    ppo_mini_batch_size: 2\n", "    ppo_mini_batch_size: 1\n")
# Plans that must be refused: step -> (native file, refusal code in the one error line).
REFUSALS = {
    "plan_native_ppo": (NATIVE_PPO, "critic_lora_value_head"),
    "plan_ppo_epochs_2": (PPO_EPOCHS_2.file, "grpo_ppo_epochs"),
    "plan_mini_batches_2": (MINI_BATCHES_2.file, "grpo_mini_batches"),
}
REFUSAL_EXIT = 2

EVIDENCE = {
    role: f"{FOLDER}/{member}"
    for role, member in {
        "transcript": "transcript.json",
        "native_sha256": "native-sha256.json",
        "plan_output": "plan-output.json",
        "plan": "plan.json",
        "run_output": "run-output.json",
        "inspect_2": "inspect-2.json",
        "resume_output": "resume-output.json",
        "inspect_3": "inspect-3.json",
        "summary": "run/summary.json",
        "metrics": "run/metrics.jsonl",
        "checkpoint_2": "run/checkpoint-2.json",
        "replay_first_output": "replay/first-output.json",
        "replay_summary": "replay/summary.json",
        "replay_metrics": "replay/metrics.jsonl",
        "replay_checkpoint_2": "replay/checkpoint-2.json",
        "state_hashes": "state-hashes.json",
        "handoff": "handoff.json",
        "bundle_manifest": "bundle/manifest.json",
        "bundle_native": "bundle/native.yaml",
        "native_diff": "bundle/native-diff.json",
        "diagnose_environment": "diagnose-environment.json",
        "diagnose": "diagnose.json",
    }.items()
}


# ----------------------------------------------------------------------------------------------- run


def bindings(ctx: Context) -> list[str]:
    """``--set`` runtime bindings (the only keys ``plan --verl-config`` accepts; the sizes are the native file's)."""
    values = (f"model={MODEL}", f"device={ctx.profile.device}", f"trajectory_batch_size={TRAJECTORY_BATCH}")
    return [arg for value in values for arg in ("--set", value)]


def run(ctx: Context) -> dict[str, Path]:
    out: dict[str, Path] = {}

    def keep(role: str, path: Path | None) -> None:
        if path is not None:
            out[role] = path

    cli, work = ctx.cli, ctx.work
    native = work / NATIVE
    shutil.copyfile(wt.WORKLOADS / NATIVE, native)
    shutil.copyfile(wt.WORKLOADS / NATIVE_PPO, work / NATIVE_PPO)
    shutil.copyfile(work / ctx.data, work / "prompts.parquet")  # the native data.train_files
    before = hashlib.sha256(native.read_bytes()).hexdigest()
    for variant in (REPLAY, PPO_EPOCHS_2, MINI_BATCHES_2):
        variant.write(native.read_bytes(), work / variant.file)
    sets = bindings(ctx)

    def plan(step: str, source: str, dest: str) -> Any:
        return cli(step, ["plan", "--verl-config", source, *sets, "--out", dest, "--json"], timeout=runs.PLAN_TIMEOUT)

    def train(step: str, plan_file: str, run_id: str, *extra: str) -> Any:
        argv = ["run", "--plan", plan_file, "--output", "runs", "--run-id", run_id, *extra, "--json"]
        return cli(step, argv, timeout=runs.RUN_TIMEOUT)

    planned = plan("plan", NATIVE, "plan.json")
    keep("plan_output", wt.keep_json(ctx, planned, "plan-output.json"))
    keep("plan", wt.keep_file(ctx, work / "plan.json", "plan.json") if planned.ok else None)
    for step, (source, _) in REFUSALS.items():
        plan(step, source, f"{step}.json")
    run_dir, replay_dir = work / "runs" / RUN_ID, work / "runs" / REPLAY_ID
    taken: dict[str, statehash.Taken | None] = {}
    if planned.ok:
        keep("run_output", wt.keep_json(ctx, train("run", "plan.json", RUN_ID), "run-output.json"))
        checkpoint = wt.checkpoint_dir(run_dir, CYCLES) / "checkpoint.json"
        keep("checkpoint_2", wt.keep_file(ctx, checkpoint, "run/checkpoint-2.json"))
        taken["checkpoint_2"] = statehash.take(checkpoint.parent)  # before the resume goes on from it
        inspect = ["inspect", f"runs/{RUN_ID}", "--json"]
        keep("inspect_2", wt.keep_json(ctx, cli("inspect_2", inspect), "inspect-2.json"))
        resumed = train("resume_extend", "plan.json", RUN_ID, "--resume", "--extend", str(EXTEND))
        keep("resume_output", wt.keep_json(ctx, resumed, "resume-output.json"))
        keep("inspect_3", wt.keep_json(ctx, cli("inspect_3", inspect), "inspect-3.json"))
    keep("summary", wt.keep_file(ctx, run_dir / "summary.json", "run/summary.json"))
    keep("metrics", wt.keep_file(ctx, run_dir / "metrics.jsonl", "run/metrics.jsonl"))
    if plan("plan_replay", REPLAY.file, "plan-replay.json").ok:
        first = train("run_replay", "plan-replay.json", REPLAY_ID)
        keep("replay_first_output", wt.keep_json(ctx, first, "replay/first-output.json"))
        if first.ok:
            train("resume_replay", "plan-replay.json", REPLAY_ID, "--resume", "--extend", str(CYCLES - REPLAY_FIRST))
    keep("replay_summary", wt.keep_file(ctx, replay_dir / "summary.json", "replay/summary.json"))
    keep("replay_metrics", wt.keep_file(ctx, replay_dir / "metrics.jsonl", "replay/metrics.jsonl"))
    replay_checkpoint = wt.checkpoint_dir(replay_dir, CYCLES) / "checkpoint.json"
    keep("replay_checkpoint_2", wt.keep_file(ctx, replay_checkpoint, "replay/checkpoint-2.json"))
    taken["replay_checkpoint_2"] = statehash.take(replay_checkpoint.parent)
    keep("state_hashes", statehash.write_taken(wt.evidence_dir(ctx) / "state-hashes.json", taken))
    handoff = cli("handoff", ["handoff", f"runs/{RUN_ID}", "--out", "bundle", "--json"], timeout=1800)
    keep("handoff", wt.keep_json(ctx, handoff, "handoff.json"))
    bundle = work / "bundle"
    keep("bundle_manifest", wt.keep_file(ctx, bundle / "manifest.json", "bundle/manifest.json"))
    keep("native_diff", wt.keep_file(ctx, bundle / "native-diff.json", "bundle/native-diff.json"))
    keep("bundle_native", wt.keep_file(ctx, bundle / "native" / NATIVE, "bundle/native.yaml"))
    keep("diagnose_environment", wt.write_evidence(ctx, "diagnose-environment.json", wt.diagnose_environment(ctx)))
    if ctx.verl_python is not None and handoff.ok:
        result = wt.run_module(ctx, "diagnose", Path(ctx.verl_python), ["diagnose", "bundle", "--json"])
        report = result.json()  # kept with a blocker too (exit 1): the judge names it
        keep("diagnose", wt.write_evidence(ctx, "diagnose.json", report) if report is not None else None)
    after = hashlib.sha256(native.read_bytes()).hexdigest()
    record = {"file": NATIVE, "sha256_before": before, "sha256_after": after}
    keep("native_sha256", wt.write_evidence(ctx, "native-sha256.json", record))
    return out


# ----------------------------------------------------------------------------------------------- judge


def _hex(value: Any) -> bool:
    return isinstance(value, str) and wt.SHA256.match(value) is not None


def _steps(inv: list[dict[str, Any]] | None, names: tuple[str, ...]) -> tuple[bool, str]:
    results = [wt.step_ok(inv, name) for name in names]
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
    evidence: dict[str, Path], inv: list[dict[str, Any]] | None, final: runs.Run, profile: Profile
) -> tuple[bool, str]:
    steps_ok, steps_why = _steps(inv, ("plan", "run", "inspect_2", "resume_extend", "inspect_3"))
    plan = read_json(evidence.get("plan"))
    direct = runs.section(plan, "direct_config")
    algorithm = runs.section(plan, "config", "algorithm").get("name")
    plan_ok = direct.get("compiler") == COMPILER_V4 and algorithm == "grpo" and plan is not None
    plan_ok = plan_ok and count((plan or {}).get("cycles")) == CYCLES
    sized, sized_why = runs.planned_as_declared(plan, NATIVE_SIZES, profile)
    first = _completed(read_json(evidence.get("run_output")), CYCLES, None)
    resumed = _completed(read_json(evidence.get("resume_output")), CYCLES + EXTEND, CYCLES)
    done, done_why = final.completed(CYCLES + EXTEND)
    inspected = [read_json(evidence.get(role)) for role in ("inspect_2", "inspect_3")]
    steps_seen = [(doc or {}).get("last_complete_step") for doc in inspected]
    statuses = [(doc or {}).get("status") for doc in inspected]
    inspect_ok = steps_seen == [CYCLES, CYCLES + EXTEND] and statuses == ["completed", "completed"]
    ok = steps_ok and plan_ok and sized and first and resumed and done and inspect_ok
    return ok, (
        f"{steps_why}; plan: compiler {runs.short(direct.get('compiler'))!r} (want {COMPILER_V4!r}), algorithm "
        f"{runs.short(algorithm)!r}, cycles {runs.short((plan or {}).get('cycles'))} (want {CYCLES}), {sized_why}; "
        "first run "
        f"{'completed' if first else 'NOT completed'} with {CYCLES} updates; --resume --extend {EXTEND} "
        f"{'completed' if resumed else 'NOT completed'} with {CYCLES + EXTEND} updates from step {CYCLES}; final run: "
        f"{done_why}; inspect last complete steps {[runs.short(s) for s in steps_seen]}, statuses "
        f"{[runs.short(s) for s in statuses]}"
    )


def _native_unchanged(evidence: dict[str, Path]) -> tuple[bool, str]:
    record = read_json(evidence.get("native_sha256")) or {}
    before, after = record.get("sha256_before"), record.get("sha256_after")
    plan = read_json(evidence.get("plan"))
    native = runs.section(plan, "direct_config", "native")
    text = native.get("text")
    plan_bytes = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest() if isinstance(text, str) else None
    handoff, manifest = read_json(evidence.get("handoff")), read_json(evidence.get("bundle_manifest"))
    recorded = {
        "plan --json": (read_json(evidence.get("plan_output")) or {}).get("native_sha256"),
        "plan direct_config": native.get("sha256"),
        "plan native bytes": plan_bytes,
        "inspect (2)": runs.section(read_json(evidence.get("inspect_2")), "direct_config").get("native_sha256"),
        "inspect (3)": runs.section(read_json(evidence.get("inspect_3")), "direct_config").get("native_sha256"),
        "handoff --json": runs.section(handoff, "direct_config").get("native_sha256"),
        "bundle manifest": runs.section(manifest, "direct_config").get("native_sha256"),
        "native diff": (read_json(evidence.get("native_diff")) or {}).get("native_sha256"),
        "bundle native file": file_sha256(evidence.get("bundle_native")),
    }
    verified = [
        runs.section(read_json(evidence.get(role)), "direct_config").get("native_sha256_verified") is True
        for role in ("inspect_2", "inspect_3")
    ]
    differ = sorted(label for label, sha in recorded.items() if sha != before)
    ok = _hex(before) and before == after and not differ and all(verified)
    return ok, (
        f"native {record.get('file')!r} sha256 before {runs.short(before)!r}, after "
        f"{'the same' if before == after else runs.short(after)!r}; records holding another sha256: {differ}; "
        f"inspect native_sha256_verified {verified}"
    )


def _native_values(diff: dict[str, Any] | None) -> dict[str, tuple[int | None, str]]:
    """Native key -> (its native value as a count, its native-diff status), for the actor-pass keys."""
    entries = diff.get("entries") if diff is not None else None
    found: dict[str, tuple[int | None, str]] = {}
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and entry.get("key") in ACTOR_KEYS:
            found[str(entry["key"])] = (count(entry.get("native")), str(entry.get("status"))[:20])
    return found


def _refused(inv: list[dict[str, Any]] | None, step: str, quote: int = 110) -> tuple[bool, str]:
    """``step`` planned its native file once and exited 2 with the named refusal in its one error line."""
    source, code = REFUSALS[step]
    found = [i for i in inv or [] if i["step"] == step]
    if len(found) != 1:
        return False, f"{step} ran {len(found)} times (want once)"
    line = str(found[0].get("stderr_last_line", ""))
    argv = found[0].get("argv")
    planned = isinstance(argv, list) and "--verl-config" in argv and source in argv
    ok = found[0]["exit_code"] == REFUSAL_EXIT and planned and f"handoff refused ({code})" in line
    said = f": {line[:quote]!r}" if quote else (f", {code} named" if f"({code})" in line else f", {code} NOT named")
    return ok, f"{step} exit {found[0]['exit_code']} (want {REFUSAL_EXIT}){said}"


def _actor_passes(evidence: dict[str, Path], inv: list[dict[str, Any]] | None, final: runs.Run) -> tuple[bool, str]:
    values = _native_values(read_json(evidence.get("native_diff")))
    epochs, batch, mini = (values.get(key, (None, "absent"))[0] for key in ACTOR_KEYS)
    same = [key for key in ACTOR_KEYS if values.get(key, (None, ""))[1] == "same"]
    passes = epochs * (batch // mini) if epochs and batch and mini and batch % mini == 0 else None
    plan = read_json(evidence.get("plan")) or {}
    cycles, updates = count(plan.get("cycles")), count(plan.get("updates"))
    planned = updates // cycles if cycles and updates is not None and updates % cycles == 0 else None
    steps = [wt.algo_metric(line, "actor/updates") for line in final.lines]
    norms = [finite(v) for v in final.column("grad_norm")]
    deltas = [finite(v) for v in final.column("adapter_delta_norm")]
    each = (final.summary or {}).get("adapter_changed_each_update") is True
    lines_ok = (
        final.why is None
        and len(final.lines) == CYCLES + EXTEND
        and passes is not None
        and steps == [passes] * len(final.lines)
        and all(v is not None and v > 0 for v in norms + deltas)
        and each
    )
    refusals = [_refused(inv, step, quote=0) for step in ("plan_ppo_epochs_2", "plan_mini_batches_2")]
    ok = passes == 1 and planned == passes and len(same) == len(ACTOR_KEYS) and lines_ok
    ok = ok and all(r for r, _ in refusals)
    return ok, (
        f"verl passes per step: native ppo_epochs {epochs} x (train_batch_size {batch} / ppo_mini_batch_size "
        f"{mini}) = {passes} (want 1; bundle = native for {len(same)}/{len(ACTOR_KEYS)} keys), planned updates per "
        f"cycle {planned}; optimizer steps per update recorded {steps[:4]} (want {passes} each; grad norm "
        f"{_rounded(norms)}, adapter delta {_rounded(deltas)}, changed each update {each}); refused: "
        + "; ".join(why for _, why in refusals)
    )


def _rounded(values: list[float | None]) -> list[float | None]:
    return [round(v, 4) if v is not None else None for v in values][:4]


def _resume_exact(evidence: dict[str, Path], inv: list[dict[str, Any]] | None, final: runs.Run) -> tuple[bool, str]:
    steps_ok, steps_why = _steps(inv, ("plan_replay", "run_replay", "resume_replay"))
    first = _completed(read_json(evidence.get("replay_first_output")), REPLAY_FIRST, None)
    replay = runs.Run(evidence, "replay_summary", "replay_metrics", "grpo")
    done, done_why = replay.completed(CYCLES)
    resumed_from = (replay.summary or {}).get("resumed_from_step")
    state_ok, state_why = runs.same_state(evidence, "checkpoint_2", "replay_checkpoint_2", CYCLES)
    exact, exact_why = wt.replay_exact(evidence, "checkpoint_2", "replay_checkpoint_2", "grpo")
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


def _handoff_digests(evidence: dict[str, Path], inv: list[dict[str, Any]] | None) -> tuple[bool, str]:
    step_ok, step_why = wt.step_ok(inv, "handoff")
    planned = runs.section(read_json(evidence.get("plan_output")), "handoff")
    handoff, manifest = read_json(evidence.get("handoff")), read_json(evidence.get("bundle_manifest"))
    diagnose = read_json(evidence.get("diagnose"))
    missing = [n for n, d in (("handoff", handoff), ("manifest", manifest), ("diagnose", diagnose)) if d is None]
    if handoff is None or manifest is None or diagnose is None:
        return False, f"{step_why}; missing or unreadable: {missing}"
    plan_ok = (
        planned.get("status") == "compiles"
        and planned.get("compiler") == wt.VERL_COMPILER_GRPO
        and planned.get("imported_by") == COMPILER_V4
        and _hex(planned.get("ir_digest"))
        and _hex(planned.get("rules_digest"))
    )
    keys = ("compiler", "ir_digest", "rules_digest")
    agree = all(_hex(handoff.get(k)) for k in keys[1:]) and all(
        doc.get(k) == handoff.get(k) for doc in (manifest, diagnose) for k in keys
    )
    same_compiler = handoff.get("compiler") == planned.get("compiler") == wt.VERL_COMPILER_GRPO
    same_rules = handoff.get("rules_digest") == planned.get("rules_digest")
    manifest_ok = handoff.get("manifest_sha256") == file_sha256(evidence.get("bundle_manifest"))
    imports = [
        runs.section(read_json(evidence.get("plan")), "direct_config"),
        runs.section(read_json(evidence.get("inspect_3")), "direct_config"),
        runs.section(manifest, "direct_config"),
        runs.section(handoff, "direct_config"),
    ]
    import_digests = {str(d.get("rules_digest"))[:16] for d in imports}
    import_ok = all(d.get("compiler") == COMPILER_V4 for d in imports) and len(import_digests) == 1
    import_ok = import_ok and _hex(imports[0].get("rules_digest"))
    diff = read_json(evidence.get("native_diff")) or {}
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
        f"imported by {runs.short(planned.get('imported_by'))!r} ({'ok' if plan_ok else 'NOT v1 by v4, 64-hex'}); "
        f"compiler/ir/rules digests {'equal' if agree else 'NOT equal'} in handoff, manifest, diagnose, compiler and "
        f"rules {'=' if same_compiler and same_rules else '!='} the plan's; manifest sha256 "
        f"{'matches' if manifest_ok else 'differs'}; v4 import rules {sorted(import_digests)[:3]} in plan, inspect, "
        f"manifest, handoff; native diff equal {diff.get('semantically_equal') is True}, "
        f"{ {k: counts.get(k) for k in ('extended', 'changed', 'native_only', 'bundle_only')} } (want 1, 0, 0, 0)"
    )


def _launch_status(evidence: dict[str, Path], inv: list[dict[str, Any]] | None) -> tuple[bool, str]:
    env = read_json(evidence.get("diagnose_environment"))
    if env is None:
        return False, "diagnose-environment.json missing or unreadable"
    if env.get("verl_python") is None:
        return False, f"not diagnosed: {str(env.get('reason'))[:200]}"
    step_ok, step_why = wt.step_ok(inv, "diagnose")
    diagnose = read_json(evidence.get("diagnose")) or {}
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
    final = runs.Run(evidence, "summary", "metrics", "grpo")
    j.check("run_completed", *_run_completed(evidence, inv, final, profile))
    j.check("native_bytes_unchanged", *_native_unchanged(evidence))
    j.check("actor_passes", *_actor_passes(evidence, inv, final))
    j.check("resume_tensor_exact", *_resume_exact(evidence, inv, final))
    j.check("handoff_digests", *_handoff_digests(evidence, inv))
    j.check("launch_status", *_launch_status(evidence, inv))
    j.check("native_ppo_refused", *_refused(inv, "plan_native_ppo"))
    diagnose = read_json(evidence.get("diagnose")) or {}
    j.metrics.update(
        native_sha256=runs.short((read_json(evidence.get("native_sha256")) or {}).get("sha256_before")),
        launch_status=runs.short(diagnose.get("launch_status")),
        verl_version=runs.short(diagnose.get("verl_version")),
        ir_digest=runs.short((read_json(evidence.get("handoff")) or {}).get("ir_digest")),
    )
    runs.summary_metrics(j, "run", final)
    return j


WORKLOAD = Workload(name=NAME, evidence=EVIDENCE, run=run, judge=judge)

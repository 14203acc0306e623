"""Policy refreshes, grouped trajectory identity and the vLLM fail-closed boundary (issue #11, v0.11).

Part of the backend-matrix workload (:mod:`harness.qualify.full.backend_matrix` calls :func:`run_refreshes` from its
``run`` and :func:`judge_refreshes` from its ``judge``, and merges :data:`REFRESH_EVIDENCE` into its evidence).

``run_refreshes`` drives the installed CLI: for each in-process rollout engine (``rollout.engine: fast`` and
``hf``) one GRPO run of ``scale.policy_refreshes`` cycles at the fixed :data:`REFRESH_SIZES` (the refresh proves
that rollout and trained weights agree after every update, which the batch size does not change; a small fixed
size keeps it cheap on every profile), with the scale's device and quantization, keeping its plan, summary,
metrics and per-cycle trajectories; then ``miniverl plan`` with ``rollout.backend=vllm``, whose result (exit code,
last stderr line, whether a plan was written) it saves. ``judge_refreshes`` decides, from those files only:

* ``policy_refreshes``: per engine, one metrics line per update with ``rollout_backend`` the engine asked for and,
  for every update k, ``policy_digest_rollout[k] == policy_digest_before[k]`` (the rollout used the weights being
  trained), ``policy_digest_before[k] == policy_digest_after[k-1]`` (nothing changed them between updates) and
  ``policy_digest_after[k] != policy_digest_before[k]`` (the update changed them);
* ``grouped_trajectory_identity``: per engine and cycle, ``prompts_per_cycle`` groups of ``samples_per_prompt``
  trajectories; a group's trajectories share ``group_id``, ``prompt_id``, prompt tokens and ``policy_version``
  (the updates before the cycle, as its metrics line says); sample indices 0..n-1 once each; group ids distinct
  across every group of the run;
* ``vllm_boundary``: where the plan was accepted, the vllm run's metrics must show ``old_logp`` recomputed by the
  trainer on every update. Where vllm is absent, ``plan`` must refuse ``rollout.backend: vllm`` with exactly one
  stderr line naming that vllm is not installed, and write no plan; that refusal is kept as evidence, but it measures
  nothing about vLLM's policy-gradient boundary, so the check is ``not_applicable`` with the reason (never
  "passed"; the policy fails the level where it requires the check). Any other outcome (a traceback, a timeout,
  a plan written, another reason) fails it: a crash is not a boundary.

Torch-free and miniverl-free, like all of the harness.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from harness.core.proc import HARNESS_DIR
from harness.core.records import Profile
from harness.qualify.full.base import Context, Judgement, Scale, WorkloadFailure
from harness.qualify.full.reading import count, finite, read_json, read_jsonl
from harness.qualify.transcript import CliDriver, CliResult

WORKLOADS = HARNESS_DIR / "workloads"
YAML = "refresh-grpo.yaml"
ENGINES = ("fast", "hf")
#: the most refreshes an evidence layout declares (every scale asks for 8)
MAX_REFRESHES = 8
ROOT = "v011/backend-matrix/refresh"
RUN_OUTPUT = "refresh-runs"

#: the one line ``miniverl plan`` must refuse ``rollout.backend: vllm`` with where vllm is absent
VLLM_REFUSAL_PREFIX = "miniverl: error: rollout.backend vllm: "
VLLM_ABSENT_REASON = "vllm is not installed"
#: the algorithm_metrics key a policy-gradient update sets to 1.0 when the trainer recomputed old_logp
OLD_LOGP_RECOMPUTED = "actor/old_logp_recomputed"

_DIGEST = re.compile(r"[0-9a-f]{64}")


def _trajectory_role(engine: str, cycle: int) -> str:
    return f"refresh_{engine}_trajectories_{cycle}"


def _evidence() -> dict[str, str]:
    members: dict[str, str] = {}
    for engine in ENGINES:
        members[f"refresh_{engine}_plan"] = f"{ROOT}/{engine}/plan.json"
        members[f"refresh_{engine}_summary"] = f"{ROOT}/{engine}/summary.json"
        members[f"refresh_{engine}_metrics"] = f"{ROOT}/{engine}/metrics.jsonl"
        for cycle in range(1, MAX_REFRESHES + 1):
            members[_trajectory_role(engine, cycle)] = f"{ROOT}/{engine}/trajectories/cycle-{cycle:06d}.jsonl"
    members["refresh_vllm_plan"] = f"{ROOT}/vllm/plan-result.json"
    members["refresh_vllm_metrics"] = f"{ROOT}/vllm/metrics.jsonl"
    return members


#: role -> archive member of every file :func:`run_refreshes` may return
REFRESH_EVIDENCE: dict[str, str] = _evidence()


# The rollout sizes of every refresh run, on every profile (declared here, recorded in the plan, judged).
REFRESH_SIZES = {"prompts_per_cycle": 2, "samples_per_prompt": 4, "max_new_tokens": 16}


# ---------------------------------------------------------------------------------------------------- run
def _sizes(scale: Scale, cycles: int) -> list[str]:
    values = [f"train.cycles={cycles}", *(f"rollout.{key}={value}" for key, value in REFRESH_SIZES.items())]
    if scale.quantization is not None:
        values.append(f"models.student.quantization={scale.quantization}")
    return [arg for value in values for arg in ("--set", value)]


def _plan(ctx: Context, step: str, out: str, extra: list[str], cycles: int) -> CliResult:
    args = ["plan", YAML, *ctx.scale.overrides(), *_sizes(ctx.scale, cycles), *extra, "--out", out, "--json"]
    return ctx.cli(step, args, timeout=600)


def _run(ctx: Context, step: str, plan: str, run_id: str) -> Path:
    ctx.cli(step, ["run", "--plan", plan, "--output", RUN_OUTPUT, "--run-id", run_id, "--json"], timeout=3600)
    return ctx.work / RUN_OUTPUT / run_id


def _redact(value: Any, cli: CliDriver) -> Any:
    if isinstance(value, str):
        return cli.redact.text(value)
    if isinstance(value, dict):
        return {str(k): _redact(v, cli) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact(v, cli) for v in value]
    return value


def _keep(found: dict[str, Path], role: str, path: Path) -> None:
    if path.is_file():
        found[role] = path


def run_refreshes(ctx: Context) -> dict[str, Path]:
    """The refresh runs per engine and the vllm plan probe; returns the evidence files they produced."""
    cycles = ctx.scale.policy_refreshes
    if not 1 <= cycles <= MAX_REFRESHES:
        raise WorkloadFailure(f"scale {ctx.scale.name} asks for {cycles} policy refreshes; the layout holds 1..8")
    shutil.copyfile(WORKLOADS / YAML, ctx.work / YAML)
    found: dict[str, Path] = {}
    for engine in ENGINES:
        plan = f"plan-refresh-{engine}.json"
        if not _plan(ctx, f"refresh_{engine}_plan", plan, ["--set", f"rollout.engine={engine}"], cycles).ok:
            continue
        _keep(found, f"refresh_{engine}_plan", ctx.work / plan)
        run_dir = _run(ctx, f"refresh_{engine}_run", plan, f"refresh-{engine}")
        _keep(found, f"refresh_{engine}_summary", run_dir / "summary.json")
        _keep(found, f"refresh_{engine}_metrics", run_dir / "metrics.jsonl")
        for cycle in range(1, cycles + 1):
            _keep(found, _trajectory_role(engine, cycle), run_dir / "trajectories" / f"cycle-{cycle:06d}.jsonl")
    # the vLLM boundary: the plan must refuse where vllm is absent (and is run where it was accepted)
    plan = "plan-refresh-vllm.json"
    result = _plan(ctx, "refresh_vllm_plan", plan, ["--set", "rollout.backend=vllm"], 1)
    inv = result.invocation
    stderr = result.stderr.decode("utf-8", errors="replace")
    probe = {
        "step": inv.step,
        "argv": inv.argv,
        "exit_code": inv.exit_code,
        "timed_out": inv.timed_out,
        "stderr_last_line": inv.stderr_last_line,
        "stderr_lines": sum(1 for line in stderr.splitlines() if line.strip()),
        "stdout_json": _redact(result.json(), ctx.cli),
        "plan_written": (ctx.work / plan).exists(),
    }
    probe_path = ctx.work / "refresh-vllm-plan-result.json"
    probe_path.write_text(json.dumps(probe, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    found["refresh_vllm_plan"] = probe_path
    if result.ok:
        run_dir = _run(ctx, "refresh_vllm_run", plan, "refresh-vllm")
        _keep(found, "refresh_vllm_metrics", run_dir / "metrics.jsonl")
    return found


# ---------------------------------------------------------------------------------------------------- judge
def _digest(line: dict[str, Any], key: str) -> str | None:
    value = line.get(key)
    return value if isinstance(value, str) and _DIGEST.fullmatch(value) else None


def _refreshes_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    """One engine's refresh chain: (passed, detail naming the engine and the first bad step)."""
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    summary = read_json(evidence.get(f"refresh_{engine}_summary"))
    if summary is None:
        return False, f"{where}: no readable summary.json (the run failed or did not run)"
    if summary.get("status") != "completed" or summary.get("algorithm") != "grpo":
        return False, f"{where}: run status {summary.get('status')!r}, algorithm {summary.get('algorithm')!r}"
    if count(summary.get("updates")) != cycles:
        return False, f"{where}: {summary.get('updates')!r} updates, the scale asks for {cycles}"
    plan = read_json(evidence.get(f"refresh_{engine}_plan"))
    config = plan.get("config") if plan is not None else None
    rollout = config.get("rollout") if isinstance(config, dict) else None
    if not isinstance(rollout, dict) or rollout.get("engine") != engine or rollout.get("backend") != "hf":
        return False, f"{where}: the plan does not ask for rollout.backend hf with rollout.engine {engine}"
    other = [f"{k} {rollout.get(k)!r} (declared {v})" for k, v in REFRESH_SIZES.items() if count(rollout.get(k)) != v]
    if other:
        return False, f"{where}: the plan's rollout sizes are not the declared refresh sizes: {', '.join(other)}"
    models = config.get("models") if isinstance(config, dict) else None
    student = models.get("student") if isinstance(models, dict) else None
    quantization = student.get("quantization") if isinstance(student, dict) else None
    if quantization != (scale.quantization or "none"):
        return False, f"{where}: the plan's student quantization {quantization!r} is not the scale's"
    lines = read_jsonl(evidence.get(f"refresh_{engine}_metrics"))
    if lines is None:
        return False, f"{where}: metrics.jsonl missing or not strict JSON lines"
    if len(lines) != cycles:
        return False, f"{where}: {len(lines)} metrics lines for {cycles} updates"
    previous_after: str | None = None
    for k, line in enumerate(lines, start=1):
        at = f"{where} step {k}"
        if count(line.get("step")) != k or count(line.get("policy_version")) != k - 1:
            return False, f"{at}: line says step {line.get('step')!r}, policy_version {line.get('policy_version')!r}"
        if line.get("rollout_backend") != engine:
            return False, f"{at}: rollout_backend {line.get('rollout_backend')!r}, asked for {engine!r}"
        rollout_d, before, after = (_digest(line, f"policy_digest_{s}") for s in ("rollout", "before", "after"))
        if rollout_d is None or before is None or after is None:
            return False, f"{at}: a policy digest is missing or not sha256 hex"
        if rollout_d != before:
            return False, f"{at}: policy_digest_rollout {rollout_d[:12]} != policy_digest_before {before[:12]}"
        if previous_after is not None and before != previous_after:
            return False, f"{at}: policy_digest_before {before[:12]} != step {k - 1}'s after {previous_after[:12]}"
        if after == before:
            return False, f"{at}: policy_digest_after == policy_digest_before (the update did not change the weights)"
        previous_after = after
    return True, f"{where}: {cycles} updates, every rollout used the trained weights and every update changed them"


def _trajectory_fields(record: dict[str, Any]) -> tuple[str, str, int, int, tuple[int, ...]] | None:
    group, prompt = record.get("group_id"), record.get("prompt_id")
    index, version = count(record.get("sample_index")), count(record.get("policy_version"))
    tokens = record.get("prompt_token_ids")
    if not isinstance(group, str) or not group or not isinstance(prompt, str) or not prompt:
        return None
    if index is None or version is None or not isinstance(tokens, list) or not tokens:
        return None
    if any(count(t) is None for t in tokens):
        return None
    return group, prompt, index, version, tuple(tokens)


def _groups_of(engine: str, evidence: dict[str, Path], scale: Scale) -> tuple[bool, str]:
    where = f"engine {engine}"
    cycles = scale.policy_refreshes
    per_group, groups_per_cycle = REFRESH_SIZES["samples_per_prompt"], REFRESH_SIZES["prompts_per_cycle"]
    seen_groups: set[str] = set()
    lines = read_jsonl(evidence.get(f"refresh_{engine}_metrics")) or []
    for cycle in range(1, cycles + 1):
        at = f"{where} cycle {cycle}"
        records = read_jsonl(evidence.get(_trajectory_role(engine, cycle)))
        if records is None:
            return False, f"{at}: trajectories file missing or not strict JSON lines"
        if len(records) != groups_per_cycle * per_group:
            return False, f"{at}: {len(records)} trajectories, expected {groups_per_cycle} x {per_group}"
        version = cycle - 1
        if len(lines) >= cycle and count(lines[cycle - 1].get("policy_version")) != version:
            return False, f"{at}: the metrics line's policy_version is not {version}"
        groups: dict[str, list[tuple[str, str, int, int, tuple[int, ...]]]] = {}
        for number, record in enumerate(records, start=1):
            fields = _trajectory_fields(record)
            if fields is None:
                return False, f"{at} line {number}: group_id, prompt_id, sample_index, policy_version or prompt missing"
            groups.setdefault(fields[0], []).append(fields)
        if len(groups) != groups_per_cycle:
            return False, f"{at}: {len(groups)} groups, expected {groups_per_cycle}"
        for group_id, members in sorted(groups.items()):
            if group_id in seen_groups:
                return False, f"{at}: group_id {group_id!r} also names a group of an earlier cycle"
            seen_groups.add(group_id)
            if len({(m[1], m[4]) for m in members}) != 1:
                return False, f"{at}: group {group_id!r} mixes prompts"
            versions = {m[3] for m in members}
            if versions != {version}:
                return False, f"{at}: group {group_id!r} has policy_version {sorted(versions)}, expected {version}"
            indices = sorted(m[2] for m in members)
            if indices != list(range(per_group)):
                return False, f"{at}: group {group_id!r} sample indices {indices} (duplicated or missing trajectories)"
    return True, (
        f"{where}: {cycles} cycles x {groups_per_cycle} groups x {per_group} trajectories, each group one prompt and "
        "one policy version, indices complete, group ids distinct"
    )


def _vllm(evidence: dict[str, Path], judgement: Judgement) -> None:
    probe = read_json(evidence.get("refresh_vllm_plan"))
    if probe is None:
        judgement.metrics["vllm_backend"] = "failed"
        judgement.check("vllm_boundary", False, "no readable result of `miniverl plan` with rollout.backend=vllm")
        return
    code, line = probe.get("exit_code"), probe.get("stderr_last_line")
    line = line if isinstance(line, str) else ""
    if count(code) == 0 and probe.get("timed_out") is False:
        # vllm was importable and the plan accepted it: the run must show old_logp recomputed by the trainer
        lines = read_jsonl(evidence.get("refresh_vllm_metrics"))
        recomputed = bool(lines) and all(
            isinstance(m := ln.get("algorithm_metrics"), dict) and finite(m.get(OLD_LOGP_RECOMPUTED)) == 1.0
            for ln in lines or []
        )
        judgement.metrics["vllm_backend"] = "passed" if recomputed else "failed"
        judgement.check(
            "vllm_boundary",
            recomputed,
            f"vllm accepted: {len(lines or [])} metrics lines, "
            + ("old_logp recomputed by the trainer on every update" if recomputed else f"no {OLD_LOGP_RECOMPUTED}=1"),
        )
        return
    refused = (
        count(code) is not None
        and code != 0
        and probe.get("timed_out") is False
        and probe.get("plan_written") is False
        and count(probe.get("stderr_lines")) == 1
        and line.startswith(VLLM_REFUSAL_PREFIX)
        and VLLM_ABSENT_REASON in line
    )
    reason = line[len("miniverl: error: ") :] if line.startswith("miniverl: error: ") else line
    judgement.metrics["vllm_backend"] = "not_run" if refused else "failed"
    judgement.metrics["vllm_backend_reason"] = reason[:300]
    if refused:
        judgement.not_applicable(
            "vllm_boundary",
            f"{VLLM_ABSENT_REASON}: plan refused rollout.backend=vllm (exit {code}) in one line ({reason[:200]}); "
            "nothing about vLLM's policy-gradient boundary was measured",
        )
        return
    judgement.check(
        "vllm_boundary",
        False,
        f"plan with rollout.backend=vllm: exit {code!r}, timed out {probe.get('timed_out')!r}, plan written "
        f"{probe.get('plan_written')!r}, {probe.get('stderr_lines')!r} stderr lines, last {line[:200]!r} (expected "
        f"a one-line refusal naming that {VLLM_ABSENT_REASON}, or the plan accepted where vllm is installed)",
    )


def judge_refreshes(evidence: dict[str, Path], judgement: Judgement, profile: Profile, scale: Scale) -> None:
    """Decide ``policy_refreshes``, ``grouped_trajectory_identity`` and ``vllm_boundary`` from the files only (the
    last may be ``not_applicable``: whether that fails the level is the policy's, per profile)."""
    del profile  # the same judgement on every profile
    cycles = scale.policy_refreshes
    judgement.metrics["refresh_cycles_per_engine"] = cycles
    if not 1 <= cycles <= MAX_REFRESHES:
        judgement.check("policy_refreshes", False, f"the scale asks for {cycles} refreshes; the layout holds 1..8")
        judgement.check("grouped_trajectory_identity", False, "no evidence layout for this scale")
        _vllm(evidence, judgement)
        return
    refreshes = [_refreshes_of(engine, evidence, scale) for engine in ENGINES]
    for engine, (ok, _) in zip(ENGINES, refreshes, strict=True):
        judgement.metrics[f"refresh_{engine}_chain_ok"] = ok
    judgement.check("policy_refreshes", all(ok for ok, _ in refreshes), "; ".join(d for _, d in refreshes))
    grouped = [_groups_of(engine, evidence, scale) for engine in ENGINES]
    judgement.check("grouped_trajectory_identity", all(ok for ok, _ in grouped), "; ".join(d for _, d in grouped))
    _vllm(evidence, judgement)
